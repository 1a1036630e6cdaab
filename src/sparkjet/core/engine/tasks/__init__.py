"""Engine-neutral task code: the per-partition work of a job, without Spark.

What runs on one partition (read a source range, the fused passes, map-side
folds, a state task over its key groups, a sink's write, dead letters and
event times) lives here and imports neither pyspark nor an engine, so an
engine other than Spark can run the very same task objects. The Spark
wiring (RDDs, shuffles, accumulators) stays in :mod:`sparkjet.core.engine.spark`.
"""
