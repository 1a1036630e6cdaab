"""The Spark boundary: the only package that imports pyspark.

Everything Spark-specific (sessions, RDD plans, job groups, accumulators)
lives here, so the graph, planner, jobs and store are testable without a JVM
and a Spark Connect runtime can be added beside this one later.
"""
