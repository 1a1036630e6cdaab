"""Waiting for appends to a stream: wake-ups here, stats of local folders, polls of S3 and GCS.

:meth:`StreamWaiting.wait_for_append` says when items may be past the end
offsets a caller knows. Appends in this process wake it at once
(:mod:`~sparkjet.core.store.notify`); a local store's partition folders are
stat'ed; on an object store, where only a listing can tell, each caller
(a thread) looks once per poll interval, which backs off while the stream
stays idle (:class:`PollSettings`; the intervals are kept in :data:`_BACKOFF`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkjet.core.store import notify
from sparkjet.core.store.stream_follow import _LISTED, _POLLED_AT, StreamEnds, _stamp

#: On an object store (S3, GCS), how long :meth:`StreamLog.wait_for_append`
#: first waits before saying data may be there (other processes' appends are
#: seen only by listing): the default of ``[engine] stream_poll_seconds``.
REMOTE_POLL_SECONDS = 0.05
#: While a stream stays idle, the remote poll interval grows up to this:
#: the default of ``[engine] idle_poll_max_seconds``.
IDLE_POLL_MAX_SECONDS = 5.0
#: Each look that finds nothing makes the next interval this many times as long
#: (0.05 s, 0.2, 0.8, 3.2, then the most: at the most after 4.25 idle seconds).
BACKOFF_FACTOR = 4.0
#: On a local store, how often a waiter stats the partition folders for
#: appends by other processes (a chunk's create changes its folder's mtime).
LOCAL_STAT_SECONDS = 0.005
#: A folder's mtime is the kernel's coarse clock: a change within this long of
#: it may leave it as it was, so a waiter that saw one this recent lists again
#: once this much time has passed.
_MTIME_SETTLE_NS = 20_000_000


@dataclass(frozen=True)
class PollSettings:
    """How often a waiter on an object store lists a stream's partitions.

    The first look comes ``first`` seconds after the last; each look that
    finds nothing new makes the interval :data:`BACKOFF_FACTOR` times as
    long, up to ``most``; data (the
    caller's offsets moved, or an append in this process) starts it over.
    """

    first: float = REMOTE_POLL_SECONDS
    most: float = IDLE_POLL_MAX_SECONDS


def poll_settings(store: Any) -> PollSettings:
    """The poll settings a store carries (a client's configuration), or the defaults."""
    settings = getattr(store, "poll", None)
    return settings if isinstance(settings, PollSettings) else PollSettings()



class StreamWaiting(StreamEnds):
    """Waiting until a stream's partitions may have moved past known end offsets."""

    def wait_for_append(self, ends: Sequence[int], timeout: float) -> bool:
        """Wait until items may be past ``ends`` (True) or ``timeout`` seconds pass (False).

        ``ends``: the end offsets the caller knows, one per partition. True
        means "may be there": the caller lists (:meth:`end_offsets`) to see.
        Appends in this process wake it at once (:mod:`.notify`). Appends by
        other processes: on a local store it stats the partition folders every
        :data:`LOCAL_STAT_SECONDS` (a few microseconds each); on an object
        store it cannot tell without a listing, so it returns True once this
        caller's (thread's) poll interval has passed since its last look,
        False at an earlier ``timeout``; the interval backs off while the
        stream is idle (:meth:`_poll_due`, :class:`PollSettings`). Never spins.

        What this process saw when it last listed a partition (its end offset,
        the generation of the stream's wake-ups, the folder's stamp, all taken
        before the listing) is the baseline where it matches ``ends``;
        otherwise the wait takes a baseline and lists once.
        """
        deadline = time.monotonic() + max(timeout, 0.0)
        key = self.paths.folder
        kind = self._where()
        folders = [self.paths.partition(p) for p in range(len(ends))]
        known = [_LISTED.get(folder) for folder in folders]
        if folders and all(k is not None and k[0] == end
                           for k, end in zip(known, ends, strict=True)):
            seen = min(k[1] for k in known if k is not None)
            stamps = [k[2] for k in known if k is not None]
            relist = _relist_at([(k[2], k[3]) for k in known if k is not None])
            fresh = False
        else:
            seen = notify.generation(key)
            at = time.time_ns()
            stamps = [_stamp(f) for f in folders] if kind == "local" else [None] * len(folders)
            relist = _relist_at([(stamp, at) for stamp in stamps])
            fresh = True
        with notify.Waiter(key, seen) as waiter:
            if kind == "remote":
                return self._poll_due(waiter, ends, deadline)
            if fresh and self._past(ends):
                return True
            if kind == "memory":  # every writer is in this process, so every append signals
                return waiter.wait(deadline - time.monotonic())
            while True:
                rest = deadline - time.monotonic()
                if rest <= 0:
                    return False
                if waiter.wait(min(rest, LOCAL_STAT_SECONDS)):
                    return True
                if [_stamp(f) for f in folders] != stamps:
                    return True
                if relist is not None and time.monotonic() >= relist:
                    relist = None
                    if self._past(ends):
                        return True

    def _poll_due(self, waiter: notify.Waiter, ends: Sequence[int], deadline: float) -> bool:
        """On an object store: wait until this caller's next look is due (True) or ``deadline``.

        A caller is a thread (a job's loop): one waiting in short slices (a
        loop asking several sources in turn) lists once per interval, not
        once per slice. The interval backs off while the stream stays idle
        (:class:`PollSettings`): it starts at ``first`` after the caller's
        offsets moved (data came) or an append in this process woke it, and
        grows :data:`BACKOFF_FACTOR`-fold after each look that found nothing,
        up to ``most``. Any
        listing of the stream by the caller (:meth:`end_offsets`) counts as
        a look.
        """
        settings = poll_settings(self.store)
        caller = (self.paths.folder, threading.get_ident())
        now = time.monotonic()
        last = _POLLED_AT.setdefault(caller, now)
        interval, seen = _BACKOFF.get(caller, (settings.first, None))
        if seen is not None and seen != list(ends):
            interval = settings.first  # data came since the last look
        _BACKOFF[caller] = (interval, list(ends))
        due = last + interval
        if waiter.wait(min(deadline, due) - now):
            _BACKOFF[caller] = (settings.first, list(ends))  # an append here: look now
            _POLLED_AT[caller] = time.monotonic()
            return True
        if time.monotonic() < due:
            return False
        _POLLED_AT[caller] = time.monotonic()
        _BACKOFF[caller] = (min(max(interval * BACKOFF_FACTOR, settings.first), settings.most),
                            list(ends))
        return True

    def _past(self, ends: Sequence[int]) -> bool:
        """Whether the stream's end offsets are other than ``ends`` now (one listing)."""
        return self.end_offsets() != list(ends)


#: On an object store, each caller's poll interval now and the offsets it
#: waited past then (:meth:`StreamLog._poll_due`).
_BACKOFF: dict[tuple[str, int], tuple[float, list[int] | None]] = {}


def _relist_at(stamps: list[tuple[tuple[int, int] | None, int]]) -> float | None:
    """When (monotonic) to list again because a folder's stamp cannot be trusted, or None.

    ``stamps``: each folder's stamp and the wall time (ns) it was taken. A
    folder's mtime comes from the kernel's coarse clock: a create in the same
    tick as the one that set it leaves it as it was. A stamp taken that close
    to its mtime may hide a create that came after the look; once the tick
    has passed any create changes it, so one listing then closes the gap.
    """
    close = [stamp[0] for stamp, at in stamps
             if stamp is not None and at - stamp[0] < _MTIME_SETTLE_NS]
    if not close:
        return None
    settled = max(close) + _MTIME_SETTLE_NS - time.time_ns()
    return time.monotonic() + max(settled, 0) / 1e9
