"""Every request the store makes, counted per job and by kind.

Object stores bill per request (S3: LIST $0.005 and GET $0.0004 per 1,000),
so sparkjet counts them where :class:`~sparkjet.core.store.fs.Store` talks
to fsspec: each call that reaches the server counts once under its kind,
``list``, ``get``, ``head``, ``put`` or ``delete``. A local folder counts
too (its calls are what S3 or GCS would be asked), so a local run shows
what the same job would cost remotely.

Attribution: a process-wide counter keyed by job. The threads that work for a
job (its loop, which runs the in-process engine's tasks and the driver's
side of Spark's micro-batches; its watcher; its exports) run inside
:func:`working_for`, and every request made on them counts for that job;
requests outside any job (a publisher, a CLI call) count under ``None``.
Spark executors in other processes (the Python workers of a micro-batch run
on Spark) count in their own process and are not part of a job's counts.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

#: The kinds of request, in the order they are shown.
KINDS = ("list", "get", "head", "put", "delete")

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "sparkjet_store_job", default=None)
#: Where the requests made inside :func:`tally` on this thread are also counted.
_tallies: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar(
    "sparkjet_store_tally", default=None)
_lock = threading.Lock()
#: Per job id (None: no job), the count of each kind.
_counts: dict[str | None, dict[str, int]] = {}


def count(kind: str, n: int = 1) -> None:
    """Count ``n`` requests of ``kind`` for the job this thread works for."""
    job = _current.get()
    tally = _tallies.get()
    with _lock:
        counts = _counts.get(job)
        if counts is None:
            counts = _counts[job] = dict.fromkeys(KINDS, 0)
        counts[kind] += n
        if tally is not None:
            tally[kind] += n


@contextlib.contextmanager
def tally() -> Iterator[dict[str, int]]:
    """The requests made inside, on this thread, by kind (a micro-batch's, for its metrics).

    Counted for the thread's job as well; requests of other threads (the
    job's watcher) are not in it.
    """
    counts = dict.fromkeys(KINDS, 0)
    token = _tallies.set(counts)
    try:
        yield counts
    finally:
        _tallies.reset(token)


@contextlib.contextmanager
def working_for(job_id: str | None) -> Iterator[None]:
    """Count the requests made inside (on this thread) for ``job_id``."""
    token = _current.set(job_id)
    try:
        yield
    finally:
        _current.reset(token)


def current_job() -> str | None:
    """The job this thread's requests count for, or None."""
    return _current.get()


def by_kind(job_id: str | None) -> dict[str, int]:
    """The requests counted for ``job_id`` so far, by kind (zeros if none)."""
    with _lock:
        return dict(_counts.get(job_id) or dict.fromkeys(KINDS, 0))


def every_job() -> dict[str | None, dict[str, int]]:
    """Every job's counts by kind (None: requests outside any job)."""
    with _lock:
        return {job: dict(counts) for job, counts in _counts.items()}


def as_metrics(counts: Mapping[str, int]) -> dict[str, object]:
    """A job's counts as its metrics show them: ``{"total": n, "byKind": {...}}``."""
    return {"total": sum(counts.values()), "byKind": {k: int(counts.get(k, 0)) for k in KINDS}}


def carried(target: Callable[..., Any]) -> Callable[..., Any]:
    """``target`` made to count for the job this thread works for, on any thread it runs.

    For a thread started from a job's thread (an export): a new thread
    starts outside any job.
    """
    job = _current.get()

    def run(*args: Any, **kwargs: Any) -> Any:
        with working_for(job):
            return target(*args, **kwargs)

    return run
