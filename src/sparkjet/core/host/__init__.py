"""The plugin host: the hooks sparkjet calls and the classes plugins implement.

- :mod:`.manager`: loads plugins from entry points and collects what they register;
- :mod:`.hookspecs`: every hook, in one module (the plugin author's reference);
- :mod:`.contracts`: the plugin base classes, the contexts hooks receive, and
  the store as a plugin sees it.

The public face is :mod:`sparkjet.plugin`.
"""
