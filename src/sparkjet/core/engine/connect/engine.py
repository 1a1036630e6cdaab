"""The Spark Connect engine: an :class:`~sparkjet.core.engine.boundary.Engine` on a Connect server.

Batch plans and micro-batches run as DataFrame work (:mod:`.datasets`) on
the session of ``[spark] remote``; it touches no RDD, SparkContext,
accumulator or JVM gateway, which managed Connect-only platforms do not
offer. Jobs are tagged with their id (Connect's operation tags, per thread)
so a cancel interrupts their running work. The session is made, and the
server checked, on first use (:meth:`ConnectEngine.check` at submit).
"""

from __future__ import annotations

import re
import time
from typing import Any

from sparkjet.core.config import Config
from sparkjet.core.engine.boundary import BatchWork, JobRun, RunHooks
from sparkjet.core.engine.connect import session
from sparkjet.core.engine.connect.datasets import ConnectDatasets
from sparkjet.core.engine.tasks.runs import MicroBatchRun, PlanRun
from sparkjet.core.host.manager import PluginHost

__all__ = ["ConnectEngine"]

#: How long the server's parallelism is taken as it was last asked (asking runs a query).
PARALLELISM_SECONDS = 60.0

_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def job_tag(job_id: str) -> str:
    """The Connect operation tag of a job's work (tags may not hold commas)."""
    return "sparkjet-" + _TAG_UNSAFE.sub("_", job_id)


class ConnectEngine:
    """Runs batch plans and micro-batches on a Spark Connect server; see the module docstring."""

    def __init__(self, config: Config, plugins: PluginHost) -> None:
        self._config = config
        self._plugins = plugins
        self._parallelism: tuple[float, int] | None = None

    @property
    def _spark(self) -> Any:
        return session.remote_session(self._config, self._plugins)

    def check(self, frozen: bytes | None = None) -> None:
        """Connect now (a ConfigError names what is wrong); ship the pipeline's own modules.

        ``frozen``: the pickled pipeline, whose modules the server's workers
        must import (those they cannot are shipped).
        """
        spark = self._spark
        if frozen is not None:
            where = f"{self._config.source or 'configuration'}: [spark] remote"
            session.ensure_modules(spark, session.user_modules(frozen), where)

    def parallelism(self) -> int:
        now = time.monotonic()
        cached = self._parallelism
        if cached is None or now - cached[0] > PARALLELISM_SECONDS:
            cached = self._parallelism = (now, self._ask_parallelism())
        return cached[1]

    def _ask_parallelism(self) -> int:
        spark = self._spark
        for key in ("spark.default.parallelism", "spark.sql.leafNodeDefaultParallelism"):
            value = spark.conf.get(key, None)
            if value:
                return max(1, int(value))
        from pyspark.sql import functions as F

        # A range without a partition count gets the server's default parallelism, and its
        # last partition holds rows: the last row's partition id is that count less one.
        # The id is a column before it is read (Spark's analyzer refuses it inside an
        # aggregate's arguments, a max: AGGREGATE_FUNCTION_WITH_NONDETERMINISTIC_EXPRESSION),
        # and tail(1) reads the last partition alone: one task, no shuffle.
        ids = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p"))
        return max(1, int(ids.tail(1)[0]["p"]) + 1)

    def version(self) -> str:
        return str(self._spark.version)

    def live_executors(self) -> frozenset[str] | None:
        # Connect shows no executors: nothing to watch (a lost executor's work is Spark's to retry).
        return None

    def bind(self, job_id: str, description: str) -> None:
        spark = self._spark
        spark.clearTags()
        spark.addTag(job_tag(job_id))

    def cancel(self, job_id: str) -> bool:
        spark = session.current(self._config)
        if spark is not None:
            spark.interruptTag(job_tag(job_id))
        # Only running work is interrupted: the caller cancels again until its runner saw it.
        return False

    def batch(self, job: JobRun, hooks: RunHooks) -> PlanRun:
        """A batch job's whole plan as Connect work."""
        return PlanRun(ConnectDatasets(self._spark, self.parallelism), job, hooks)

    def micro_batch(self, job: JobRun, work: BatchWork, hooks: RunHooks) -> MicroBatchRun:
        """One micro-batch as Connect work."""
        return MicroBatchRun(ConnectDatasets(self._spark, self.parallelism), job, work, hooks)
