"""The Spark engine: :class:`~sparkjet.core.engine.Engine` on the process-wide Spark session.

It fits the protocol structurally (the runtime does not import the services'
boundary module); the client hands it to the services. The session starts on
first use, so creating the engine costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sparkjet.core.checkpoint import StatePaths
from sparkjet.core.config import Config
from sparkjet.core.contracts import JobContext
from sparkjet.core.graph import Transform
from sparkjet.core.planner import Plan
from sparkjet.core.plugin_manager import PluginHost
from sparkjet.core.runtime import session
from sparkjet.core.runtime.batch import BatchRun
from sparkjet.core.runtime.microbatch import MicroBatch


class SparkEngine:
    """Runs batch plans and micro-batches as Spark RDD work; see the module docstring."""

    def __init__(self, config: Config, plugins: PluginHost) -> None:
        self._config = config
        self._plugins = plugins
        self._context: Any = None

    @property
    def _sc(self) -> Any:
        # Looking the session up costs a JVM round trip (about 7 ms): keep its
        # context, and look again only once it has been stopped.
        sc = self._context
        if sc is None or sc._jsc is None:
            sc = self._context = session.get_session(self._config, self._plugins).sparkContext
        return sc

    def parallelism(self) -> int:
        return max(1, int(self._sc.defaultParallelism))

    def version(self) -> str:
        return str(self._sc.version)

    def live_executors(self) -> frozenset[str] | None:
        ids = session.executor_ids(self._sc)
        return None if ids is None else frozenset(ids)

    def bind(self, job_id: str, description: str) -> None:
        session.set_job_group(self._sc, job_id, description)

    def cancel(self, job_id: str) -> bool:
        return session.cancel_job_group(job_id)

    def batch(
        self,
        plan: Plan,
        job_context: Callable[[Transform], JobContext],
        *,
        metrics: bool,
        cancelled: Callable[[], bool],
        on_commit: Callable[[], None] | None,
    ) -> BatchRun:
        return BatchRun(plan, self._sc, job_context, metrics, cancelled, on_commit)

    def micro_batch(
        self,
        plan: Plan,
        job_context: Callable[[Transform], JobContext],
        *,
        metrics: bool,
        cancelled: Callable[[], bool],
        batch: int,
        committed: int,
        source_ranges: Mapping[str, tuple[Any, Any]],
        state: StatePaths,
        tasks: int,
        now_ms: int,
        on_commit: Callable[[], None] | None = None,
    ) -> MicroBatch:
        return MicroBatch(
            plan, self._sc, job_context, metrics, batch=batch, committed=committed,
            source_ranges=dict(source_ranges), state=state, tasks=tasks,
            cancelled=cancelled, now_ms=now_ms, on_commit=on_commit,
        )
