"""Where a batch job runs: on the driver when its input is known and small, else on Spark.

With adaptive micro-batches on (:func:`~sparkjet.core.engine.adaptive.resolve_adaptive`)
and an in-process engine in this process, the runner (:mod:`.runner`) asks
each source of a batch plan its estimated size and runs the job on the driver
when the rules of :mod:`sparkjet.core.engine.adaptive` say it is small; otherwise,
and always without them, on the engine.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from sparkjet.core.config import EngineSettings
from sparkjet.core.engine.adaptive import ask_sizes, choose_local, resolve_adaptive
from sparkjet.core.engine.boundary import Engine
from sparkjet.core.host.contracts import JobContext
from sparkjet.core.pipeline.graph import SourceSpec, Transform
from sparkjet.core.pipeline.planner import Plan

log = logging.getLogger("sparkjet.jobs")


def batch_engine(
    plan: Plan, contexts: Callable[[Transform], JobContext], adaptive: bool | None,
    engine: Engine, local: Engine | None, settings: EngineSettings, label: str,
) -> Engine:
    """The engine a batch job runs on: ``local`` when its input is known and small, else ``engine``.

    ``adaptive`` is the job's ``JobConfig.adaptive_micro_batches``; ``local``
    the in-process engine (None: there is none); ``label`` names the job in
    the log.
    """
    if local is None or not resolve_adaptive(adaptive, settings):
        return engine
    sizes = ask_sizes({
        plan.name(node): functools.partial(node.spec.source.estimated_size, contexts(node))
        for node in plan.nodes if isinstance(node.spec, SourceSpec)})
    small, reason = choose_local(sizes, state_bytes=0, driver_holds_state=False,
                                 settings=settings, enabled=True)
    log.debug("job %s runs %s: %s", label, "on the driver" if small else "on Spark", reason)
    return local if small else engine
