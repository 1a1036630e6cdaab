"""Optional plugins that need extra dependencies (installed with extras).

They register through the ``sparkjet`` entry-point group like any third-party
plugin. None ship yet.
"""
