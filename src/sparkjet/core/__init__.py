"""sparkjet's internals: free to change between releases; users import the public modules.

The modules here sit in tiers (checked by import-linter, see
``[tool.importlinter]`` in ``pyproject.toml`` and ``docs/architecture.md``),
top to bottom: the job services (the client, jobs, gc, the micro-batch loop,
the Spark runtime and the engine boundary); state, checkpoint and snapshots;
the pipeline model and the plugin host; the store and the shared model. The
services talk to the engine only through :mod:`sparkjet.core.engine.boundary`; the
Spark runtime (:mod:`sparkjet.core.engine.spark`) is the only code that imports
pyspark.
"""
