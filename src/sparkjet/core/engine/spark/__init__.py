"""The Spark engine: the only package that imports pyspark.

Everything Spark-specific (the session, RDD plans, job groups, accumulators)
lives here, so the graph, planner, jobs and store are testable without a JVM,
and another engine can run the same tasks (:mod:`sparkjet.core.engine.tasks`).
"""
