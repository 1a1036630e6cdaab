"""sparkjet's internals: free to change between releases; users import the public modules.

The packages and modules here sit in layers (checked by import-linter, see
``[tool.importlinter]`` in ``pyproject.toml`` and ``docs/architecture.md``):
the client wires the services (jobs, the streaming loop) to an engine; the
services talk to the engine only through :mod:`sparkjet.core.engine`; the
Spark runtime (:mod:`sparkjet.core.runtime`) is the only code that imports
pyspark; below them all is the model they share (graph, planner, contracts,
checkpoint format, store).
"""
