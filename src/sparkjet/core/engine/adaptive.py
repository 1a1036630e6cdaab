"""The adaptive engine: each micro-batch and batch job on the driver when small, else on Spark.

:class:`AdaptiveEngine` is an :class:`~sparkjet.core.engine.boundary.Engine`
made by the client from two others, Spark's and the in-process one, and the
``[engine]`` settings (:class:`~sparkjet.core.config.EngineSettings`). The
services hand it every batch job and micro-batch as they would to any
engine; it decides where each runs, from what is known before it runs: the
input size each source planned (items and bytes, each possibly unknown),
the bytes of keyed state the job holds (:attr:`BatchWork.state_bytes`),
whether the driver holds any of it loaded already (the process's
:data:`~sparkjet.core.state.cache.CACHE`), and the settings. The execution
it returns says where it ran (``on_driver``). The decision itself is the pure
:func:`choose_local`.

Local only when every rule says so, checked in this order (the first that
fails is the reason given):

1. adaptive micro-batches are on (:func:`resolve_adaptive`);
2. every source's size is known: a size, with its item count, is given;
3. the items of all sources add up to at most ``local_max_items``;
4. their known bytes add up to at most ``local_max_bytes`` (a source that
   knows its items but not its bytes counts for its items only);
5. the job's state is at most ``driver_state_bytes`` while the driver holds
   some of it loaded, at most ``cold_state_bytes`` while it holds none (the
   driver would first read all of it from the checkpoint).

The reason is a short line for logs and metrics: ``"small: 12 items"``,
``"large: 9000 items > 5000"``, ``"size unknown for source 'clicks'"``.

While a stateful job's state size is not known yet (the first batch of a run
of its loop from an existing checkpoint), its micro-batch goes to Spark.

A batch that goes to Spark only because the driver holds none of a state
that fits ``driver_state_bytes`` (rule 5's second half) is the case
:func:`worth_warming` names: the engine then loads the state into the driver
in the background (:mod:`sparkjet.core.state.warming`), so the next small
batches find it there.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping

from sparkjet.core.config import EngineSettings
from sparkjet.core.engine.boundary import (
    BatchWork,
    Engine,
    Execution,
    JobRun,
    MicroBatch,
    RunHooks,
)
from sparkjet.core.pipeline.graph import KeyedSpec
from sparkjet.core.state.cache import CACHE, StateCache
from sparkjet.core.state.warming import WARMING, Warming

log = logging.getLogger("sparkjet.adaptive")

#: One source's planned input: ``(items, bytes)``, either unknown (None), or
#: None when the source cannot say at all. ``contracts.InputSize`` is such a pair.
PlannedSize = tuple[int | None, int | None] | None


def ask_sizes(askers: Mapping[str, Callable[[], PlannedSize]]) -> dict[str, PlannedSize]:
    """Each source's planned size, by stage name: a source that raises is unknown.

    ``askers`` call the source's ``range_size`` (a micro-batch) or
    ``estimated_size`` (a batch job). A failure is logged naming the source
    and taken as None, so the work runs on Spark rather than fail here.
    """
    sizes: dict[str, PlannedSize] = {}
    for name, ask in askers.items():
        try:
            sizes[name] = ask()
        except Exception as exc:
            log.warning("source %r could not say how big its read is (%s: %s); the work "
                        "runs on Spark", name, type(exc).__name__, exc)
            sizes[name] = None
    return sizes


def resolve_adaptive(job: bool | None, settings: EngineSettings) -> bool:
    """Whether adaptive micro-batches are on for a job.

    ``job`` is its ``JobConfig.adaptive_micro_batches``: None follows the
    configuration's ``[engine] adaptive``, a bool overrides it.
    """
    return settings.adaptive if job is None else job


def choose_local(
    sizes: Mapping[str, PlannedSize],
    *,
    state_bytes: int,
    driver_holds_state: bool,
    settings: EngineSettings,
    enabled: bool,
) -> tuple[bool, str]:
    """Whether a micro-batch runs on the driver, and why (see the module's rules).

    ``sizes``: each source stage's planned input, by stage name, in the order
    the reason should look at them. ``state_bytes``: the bytes of keyed state
    the job holds (0 for a stateless job). ``driver_holds_state``: whether
    the driver process has some of the job's state loaded already.
    ``enabled``: :func:`resolve_adaptive`'s answer. A negative count is taken
    as unknown.
    """
    if not enabled:
        return False, "adaptive micro-batches off"
    items = 0
    known_bytes = 0
    for source, size in sizes.items():
        count, nbytes = size if size is not None else (None, None)
        if count is None:
            return False, f"size unknown for source {source!r}"
        if count < 0 or (nbytes is not None and nbytes < 0):
            return False, f"size unknown for source {source!r} (negative: {size!r})"
        items += count
        known_bytes += nbytes or 0
    if items > settings.local_max_items:
        return False, f"large: {items} items > {settings.local_max_items}"
    if known_bytes > settings.local_max_bytes:
        return False, f"large: {known_bytes} bytes > {settings.local_max_bytes}"
    if driver_holds_state:
        if state_bytes > settings.driver_state_bytes:
            return False, (f"large state: {state_bytes} bytes > "
                           f"{settings.driver_state_bytes} (driver_state_bytes)")
    elif state_bytes > settings.cold_state_bytes:
        return False, (f"large state: {state_bytes} bytes > {settings.cold_state_bytes} "
                       f"(cold_state_bytes: the driver holds none of it)")
    shown = f"small: {items} items"
    if known_bytes:
        shown += f", {known_bytes} bytes"
    return True, shown


def worth_warming(
    sizes: Mapping[str, PlannedSize],
    *,
    state_bytes: int,
    driver_holds_state: bool,
    settings: EngineSettings,
) -> bool:
    """Whether to load the job's state into the driver in the background.

    True when this batch goes to Spark only because the driver holds none of
    the state and it is over ``cold_state_bytes`` (a read on the loop would
    hold the batch up), while it fits ``driver_state_bytes``: the batch
    would run on the driver if the state were loaded there. Asked with the
    same arguments as :func:`choose_local` (adaptive micro-batches on).
    """
    if driver_holds_state or state_bytes <= settings.cold_state_bytes:
        return False
    local, _ = choose_local(sizes, state_bytes=state_bytes, driver_holds_state=True,
                            settings=settings, enabled=True)
    return local


class AdaptiveEngine:
    """Runs each batch job and micro-batch on ``local`` when it is small, else on ``spark``.

    See the module docstring. Everything but the choice is Spark's: the
    parallelism a job sees (``local`` spreads a run over as many partitions),
    the version a snapshot records, the executors the cluster policy
    watches, and the job groups a cancel stops (``local``'s runs ask the
    job's ``cancelled`` themselves).
    """

    def __init__(
        self,
        spark: Engine,
        local: Engine,
        settings: EngineSettings,
        *,
        cache: StateCache = CACHE,
        warming: Warming = WARMING,
    ) -> None:
        self.spark, self.local, self.settings = spark, local, settings
        self._cache, self._warming = cache, warming

    def parallelism(self) -> int:
        return self.spark.parallelism()

    def version(self) -> str:
        return self.spark.version()

    def live_executors(self) -> frozenset[str] | None:
        return self.spark.live_executors()

    def bind(self, job_id: str, description: str) -> None:
        self.spark.bind(job_id, description)

    def cancel(self, job_id: str) -> bool:
        return self.spark.cancel(job_id)

    def batch(self, job: JobRun, hooks: RunHooks) -> Execution:
        """A batch job on the driver when every source's estimated input is small."""
        if not resolve_adaptive(job.adaptive, self.settings):
            return self.spark.batch(job, hooks)
        plan = job.plan
        # A tables-only run reads only the hash joins' build sides.
        read = plan.build_sources() if job.tables_only else plan.sources()
        sizes = ask_sizes({
            plan.name(node): functools.partial(spec.source.estimated_size, job.job_context(node))
            for node, spec in read.items()})
        local, reason = choose_local(sizes, state_bytes=0, driver_holds_state=False,
                                     settings=self.settings, enabled=True)
        log.debug("job %s runs %s: %s", job.label, "on the driver" if local else "on Spark",
                  reason)
        return (self.local if local else self.spark).batch(job, hooks)

    def micro_batch(self, job: JobRun, work: BatchWork, hooks: RunHooks) -> MicroBatch:
        """One micro-batch on the driver when its planned input and the job's state are small.

        One that goes to Spark only because the driver holds none of a state
        that would fit there starts loading it into the driver meanwhile.
        """
        local, reason = self._choose(job, work, hooks)
        log.debug("job %s: micro-batch %d runs %s: %s", job.label, work.batch,
                  "on the driver" if local else "on Spark", reason)
        return (self.local if local else self.spark).micro_batch(job, work, hooks)

    def _choose(self, job: JobRun, work: BatchWork, hooks: RunHooks) -> tuple[bool, str]:
        if not resolve_adaptive(job.adaptive, self.settings):
            return False, "adaptive micro-batches off"
        if work.state_bytes is None:
            return False, "the size of the job's state is not known yet"
        plan = job.plan
        sizes = ask_sizes({
            plan.name(node): functools.partial(
                spec.source.range_size, *work.source_ranges[plan.name(node)],
                job.job_context(node))
            for node, spec in plan.sources().items()})
        owner = job.cache_owner
        holds = owner is not None and owner.job_id in self._cache.jobs()
        local, reason = choose_local(sizes, state_bytes=work.state_bytes,
                                     driver_holds_state=holds, settings=self.settings,
                                     enabled=True)
        if owner is not None and owner.budget > 0 and worth_warming(
                sizes, state_bytes=work.state_bytes, driver_holds_state=holds,
                settings=self.settings):
            stages = [plan.name(n) for n in plan.nodes if isinstance(n.spec, KeyedSpec)]
            if self._warming.start(work.state, stages, work.tasks, work.committed, owner,
                                   hooks.cancelled):
                reason += "; loading the state into the driver meanwhile"
        return local, reason
