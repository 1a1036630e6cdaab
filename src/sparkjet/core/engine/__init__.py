"""The engine wing: the boundary the job services talk to, and the engines behind it.

- :mod:`.boundary`: the ``Engine`` protocol and the small values it is handed;
- :mod:`.adaptive`: the engine that decides per micro-batch (and per batch job)
  whether the work runs on the driver or on Spark;
- :mod:`.spark`: the Spark engine, the only code that imports pyspark;
- :mod:`.inprocess`: the in-process engine, which runs the same tasks in the
  driver process;
- :mod:`.tasks`: the per-partition task code both engines run, engine-neutral.

The services import :mod:`.boundary` and :mod:`.adaptive` only; the client
(the composition root) builds the engines.
"""
