"""The in-process engine: a job's tasks run in the driver process, without Spark.

The very tasks of :mod:`sparkjet.core.engine.tasks`, over partitions held as lists
(:mod:`.datasets`), so a small micro-batch costs milliseconds instead of a
Spark job. Same plan, same state files and changelogs, same sink commits
and batch ids, same metrics as on Spark (:mod:`.engine`).
"""
