"""Built-in plugins: list, map and logger sources and sinks.

They use only the public plugin API (:mod:`sparkjet.plugin`) and are loaded
by the same plugin manager as third-party plugins.
"""
