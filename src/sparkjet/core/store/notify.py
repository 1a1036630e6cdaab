"""Wake-ups for code waiting on new data in the store, within one process.

A generation counter per *key* (a stream's folder in its store) and the
waiters on it. A writer that made data visible calls :func:`signal`; a
reader notes :func:`generation` *before* it looks at the data, and a
:class:`Waiter` made with that number wakes as soon as the counter moved.
So a publisher in the same process as a waiting job (a test, a benchmark,
``IStream.publish`` in the driver, a job's stream sink feeding another job)
wakes it in well under a millisecond. Nobody spins: a waiter sleeps on a lock
of its own that :func:`signal` releases, one system call per wait.

Writers in other processes cannot signal here; a waiter on a local store
stats the folders between short waits (see
:meth:`sparkjet.core.store.stream_log.StreamLog.wait_for_append`), and on an
object store it polls.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType

_guard = threading.Lock()
_generations: dict[str, int] = {}
_waiters: dict[str, set[Waiter]] = {}


def _after_fork() -> None:
    """A forked child starts with a fresh guard (a parent thread may have held it), no waiters."""
    global _guard
    _guard = threading.Lock()
    _waiters.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def generation(key: str) -> int:
    """How many times ``key`` was signalled in this process; read it before looking at the data."""
    return _generations.get(key, 0)


def signal(key: str) -> None:
    """Say that new data under ``key`` is visible now: every waiter on it wakes."""
    with _guard:
        _generations[key] = _generations.get(key, 0) + 1
        for waiter in _waiters.get(key, ()):
            waiter.wake()


class Waiter:
    """Waits for ``key`` to be signalled after generation ``seen``; use it in a ``with`` block.

    While the block runs, :func:`signal` on ``key`` releases the waiter's
    lock, so :meth:`wait` returns at once; a signal that came before the
    wait leaves the lock released, so no wake-up is lost.
    """

    __slots__ = ("_lock", "key", "seen")

    def __init__(self, key: str, seen: int) -> None:
        self.key = key
        self.seen = seen
        self._lock = threading.Lock()
        self._lock.acquire()

    def __enter__(self) -> Waiter:
        with _guard:
            _waiters.setdefault(self.key, set()).add(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        with _guard:
            waiting = _waiters.get(self.key)
            if waiting is not None:
                waiting.discard(self)
                if not waiting:
                    del _waiters[self.key]

    def changed(self) -> bool:
        """Whether ``key`` was signalled since generation ``seen``."""
        return _generations.get(self.key, 0) != self.seen

    def wake(self) -> None:
        """Release the lock :meth:`wait` sleeps on (a no-op if it is released already)."""
        if self._lock.locked():  # signals hold the guard: none releases it in between
            self._lock.release()

    def wait(self, timeout: float) -> bool:
        """Sleep until a signal or ``timeout`` seconds; True if ``key`` was signalled."""
        if self.changed():
            return True
        if timeout > 0:
            self._lock.acquire(timeout=timeout)
        return self.changed()
