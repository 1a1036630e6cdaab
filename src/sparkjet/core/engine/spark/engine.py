"""The Spark engine: an :class:`~sparkjet.core.engine.boundary.Engine` on the process's session.

It fits the protocol structurally (it imports only the boundary's job, work,
hooks and result types); the client hands it to the services. The session starts on
first use, and pyspark is imported only then, so creating the engine costs
nothing and needs no pyspark (a client that never reaches Spark runs without it).
"""

from __future__ import annotations

import time
from typing import Any

from sparkjet.core.config import Config
from sparkjet.core.engine.boundary import BatchWork, JobRun, RunHooks
from sparkjet.core.engine.spark import session
from sparkjet.core.engine.tasks.runs import MicroBatchRun, PlanRun
from sparkjet.core.host.manager import PluginHost

#: How long the engine's parallelism is taken as it was last asked.
PARALLELISM_SECONDS = 1.0


class SparkEngine:
    """Runs batch plans and micro-batches as Spark RDD work; see the module docstring."""

    def __init__(self, config: Config, plugins: PluginHost) -> None:
        self._config = config
        self._plugins = plugins
        self._context: Any = None
        self._parallelism: tuple[float, int] | None = None

    @property
    def _sc(self) -> Any:
        # Looking the session up costs a JVM round trip (about 7 ms): keep its
        # context, and look again only once it has been stopped.
        sc = self._context
        if sc is None or sc._jsc is None:
            sc = self._context = session.get_session(self._config, self._plugins).sparkContext
        return sc

    def parallelism(self) -> int:
        # A JVM round trip (about 1 ms), asked for every micro-batch's plan: kept
        # for PARALLELISM_SECONDS, so a cluster that grows is seen that much later.
        now = time.monotonic()
        cached = self._parallelism
        if cached is None or now - cached[0] > PARALLELISM_SECONDS or self._sc._jsc is None:
            cached = self._parallelism = (now, max(1, int(self._sc.defaultParallelism)))
        return cached[1]

    def version(self) -> str:
        return str(self._sc.version)

    def live_executors(self) -> frozenset[str] | None:
        ids = session.executor_ids(self._sc)
        return None if ids is None else frozenset(ids)

    def bind(self, job_id: str, description: str) -> None:
        session.set_job_group(self._sc, job_id, description)

    def cancel(self, job_id: str) -> bool:
        return session.cancel_job_group(job_id)

    def batch(self, job: JobRun, hooks: RunHooks) -> PlanRun:
        """A batch job's whole plan as Spark work."""
        from sparkjet.core.engine.spark.batch import spark_batch  # imports pyspark

        return spark_batch(self._sc, job, hooks)

    def micro_batch(self, job: JobRun, work: BatchWork, hooks: RunHooks) -> MicroBatchRun:
        """One micro-batch as one Spark job."""
        from sparkjet.core.engine.spark.batch import spark_micro_batch

        return spark_micro_batch(self._sc, job, work, hooks)
