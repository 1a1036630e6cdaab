"""Upkeep a micro-batch need not wait for: folding a sink's log, pruning a checkpoint's log.

Some of a commit's work is tidying, not committing: every
:data:`~sparkjet.core.store.commit_log.FOLD_EVERY` records a commit log is
folded into a base, and every :data:`~sparkjet.core.state.checkpoint.KEEP_LOG`
batches a checkpoint's old plans, records and uncounted state files are
removed. Inline, that work made every tenth batch the slowest (on S3 and GCS
a fold reads a hundred records and a prune lists every state folder: the
p99 of a one-event batch was set by them). Both are cumulative and safe
beside commits, readers and other processes (a fold is created only if
absent and complete before anything is removed; a prune removes only what
no longer counts), so they may run later, on another thread.

A thread that runs micro-batches opens an :class:`Upkeep` around them; while
it is open :func:`later` queues the work on the upkeep's own thread, one item
after the other. Work with the same key waiting to start is replaced by the
newer (a fold or prune covers all that the one before would have). Closing
the upkeep waits until what was queued has run, so a job that stops leaves
no thread and no pending tidying behind. Outside an upkeep :func:`later`
runs the work at once, as before. Requests made by queued work count for the
job that queued it (:mod:`.requests`), not in a batch's tally; a failure is
logged, naming the work, and the next turn of the same work tries again.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Hashable
from types import TracebackType

from sparkjet.core.store import requests

__all__ = ["Upkeep", "later"]

log = logging.getLogger("sparkjet.store")

_active: contextvars.ContextVar[Upkeep | None] = contextvars.ContextVar(
    "sparkjet_upkeep", default=None)


def later(key: Hashable, work: Callable[[], None], what: str) -> None:
    """Run ``work`` on this thread's :class:`Upkeep` if one is open, else now.

    ``key`` names the work (a newer item of the same key replaces one still
    waiting); ``what`` says what it does, for the log when it fails. Run now,
    a failure propagates to the caller, as it did before upkeep existed.
    """
    upkeep = _active.get()
    if upkeep is None:
        work()
    else:
        upkeep.add(key, work, what)


class Upkeep:
    """One thread running queued tidying in order, for the thread that opened it.

    Used as a context manager on the thread that commits; ``name`` names
    the worker thread (``sparkjet-upkeep-<job>``).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Condition()
        #: Waiting work by key, in the order first queued: (work, what, job).
        self._pending: dict[Hashable, tuple[Callable[[], None], str, str | None]] = {}
        self._busy = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._token: contextvars.Token[Upkeep | None] | None = None
        #: How many items ran, and how many of them failed (for tests and metrics).
        self.ran = 0
        self.failed = 0

    def __enter__(self) -> Upkeep:
        self._token = _active.set(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._token is not None:
            _active.reset(self._token)
            self._token = None
        self.close()

    def add(self, key: Hashable, work: Callable[[], None], what: str) -> None:
        """Queue ``work`` (replacing the waiting item of ``key``, if any)."""
        with self._lock:
            if self._closing:
                raise RuntimeError(f"{self.name}: closed, cannot take {what}")
            self._pending[key] = (work, what, requests.current_job())
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until nothing is waiting or running; False if ``timeout`` passed first."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self) -> None:
        """Run what is queued, then end the worker thread."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: bool(self._pending) or self._closing)
                if not self._pending:
                    return  # closing, and nothing left
                key = next(iter(self._pending))
                work, what, job = self._pending.pop(key)
                self._busy = True
            try:
                with requests.working_for(job):
                    work()
            except Exception as exc:  # tidying only: the next turn tries again
                self.failed += 1
                log.warning("%s: %s failed (tried again next time): %s: %s",
                            self.name, what, type(exc).__name__, exc)
            finally:
                with self._lock:
                    self.ran += 1
                    self._busy = False
                    self._lock.notify_all()
