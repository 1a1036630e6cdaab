"""A job's metrics as ``Job.get_metrics()`` and the record's ``progress`` show them.

Pure functions of the plan and of what was counted: a batch job's counts come
from its engine execution, a streaming job's from the loop's totals and its
:class:`~sparkjet.core.microbatch.loop.StreamProgress` (state sizes, source
lags, watermarks). This module is the one reader of the per-stage counts
(:class:`~sparkjet.core.model.StageCount`: emitted items, dead letters, late
items): the runner only says which counts and which progress to show.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkjet.core.jobs.record import JobRecord
from sparkjet.core.microbatch.loop import StreamProgress
from sparkjet.core.model import StageCount
from sparkjet.core.pipeline.event_time import NO_WATERMARK
from sparkjet.core.pipeline.graph import SinkSpec, TimedSpec
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.store import requests

__all__ = ["job_metrics", "progress_metrics", "recorded_metrics", "stage_metrics"]


def stage_metrics(
    plan: Plan, counts: Mapping[StageCount, int], progress: StreamProgress | None,
) -> dict[str, dict[str, int]]:
    """Each stage's metrics by stage name, from ``counts`` (the job's per-stage counts).

    ``progress`` is a streaming job's (None for a batch job): its stages also
    show their state's keys and bytes, their source lag and their watermark.
    """
    stages: dict[str, dict[str, int]] = {}
    names = plan.names
    dead = plan.dead_letters
    for node in plan.nodes:
        name = names[node]
        received = sum(counts.get(StageCount(names[i], "items"), 0) for i in node.inputs)
        emitted = 0 if isinstance(node.spec, SinkSpec) else counts.get(StageCount(name, "items"), 0)
        stage = {"receivedCount": received, "emittedCount": emitted}
        if progress is not None and name in progress.state:
            keys, size = progress.state[name]
            stage.update(snapshotKeys=keys, snapshotBytes=size)
        if progress is not None and name in progress.lag:
            stage["sourceLag"] = progress.lag[name]
        if dead is not None and name in dead.stages:
            stage["deadLetters"] = counts.get(StageCount(name, "dead"), 0)
        if isinstance(node.spec, TimedSpec):
            stage["lateEventsDropped"] = counts.get(StageCount(name, "late"), 0)
            if progress is not None:
                stage["watermark"] = progress.watermarks.get(name, NO_WATERMARK)
        stages[name] = stage
    return stages


def progress_metrics(
    plan: Plan, progress: StreamProgress, enabled: bool,
    store_requests: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A streaming job's record ``progress``: the loop's metrics now, and its stages'.

    The stages are empty when the job's metrics are off (``enabled`` False).
    ``store_requests``: the job's store requests by kind, shown as
    ``storeRequests`` (see :func:`job_metrics`).
    """
    stages = stage_metrics(plan, progress.stage_totals, progress) if enabled else {}
    shown = {**progress.as_metrics(), "stages": stages}
    if store_requests is not None:
        shown["storeRequests"] = requests.as_metrics(store_requests)
    return shown


def job_metrics(
    start_ms: int, completion_ms: int, stages: dict[str, dict[str, int]],
    progress: StreamProgress | None, restore: Mapping[str, Any] | None,
    store_requests: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The whole of ``Job.get_metrics()`` for a job running here (see there).

    A streaming job (``progress`` given) adds the loop's metrics and, if it
    started from a snapshot, which stages that restored (``restore``, from
    its record). ``store_requests``: the requests the job's driver made to
    the store, by kind (:mod:`sparkjet.core.store.requests`), shown as
    ``storeRequests``: ``{"total": n, "byKind": {"list": n, "get": n,
    "head": n, "put": n, "delete": n}}``.
    """
    metrics: dict[str, Any] = {
        "executionStartTime": start_ms,
        "executionCompletionTime": completion_ms,
        "stages": stages,
    }
    if store_requests is not None:
        metrics["storeRequests"] = requests.as_metrics(store_requests)
    if progress is not None:
        metrics.update(progress.as_metrics())
        if restore:
            # Which stages the job's initial snapshot restored, started empty or dropped.
            metrics["snapshotRestore"] = dict(restore)
    return metrics


def recorded_metrics(record: JobRecord) -> dict[str, Any]:
    """``Job.get_metrics()`` for a job driven in another process: what its record holds.

    All of a completed job's metrics where it stored them
    (``store_metrics_after_job_completion``); else its times, a streaming
    job's progress, and which stages its initial snapshot restored.
    """
    if record.metrics:
        return dict(record.metrics)
    metrics = {
        "executionStartTime": record.execution_start_time,
        "executionCompletionTime": record.completion_time,
        "stages": {},
        **record.progress,
    }
    if record.restore:
        metrics["snapshotRestore"] = dict(record.restore)
    return metrics
