"""Plugins with extra dependencies, written against :mod:`sparkjet.plugin` only.

Each module is one plugin, loaded through the ``sparkjet`` entry-point group
and usable once its extra is installed (``pip install 'sparkjet[kafka]'``,
``'sparkjet[files]'``). A module imports its dependency lazily, so loading it
without the extra works and using it says which extra to install.
"""
