"""Keyed state kept loaded in a worker process between micro-batches.

A state task loads its key groups' state from the checkpoint, folds a batch
in and writes what changed; keeping the loaded state in the process makes the
next batch's update cheap (it is caught up by the changelogs other processes
wrote since, see :meth:`StatePaths.catch_up`). This module is that cache, one
per process, and the three rules it keeps:

- **Out of the collector's way.** PySpark runs ``gc.collect()`` in a reused
  Python worker after every task, and a full collection walks every container
  object alive in the process: a million keys of window frames made every
  task in the application, sparkjet's or not, take seconds. After a state task
  puts its state here, the process collects once and then *freezes* what is
  alive (:func:`gc.freeze`): later collections skip it, so a task's cost no
  longer grows with the state cached. Frozen objects are still freed by
  reference counting when a key's value is replaced or its entry dropped;
  only garbage *cycles* inside frozen state wait until a job's entries are
  dropped, when the process unfreezes, collects once and freezes again.
- **Owned by its job.** Each entry names its job (:class:`CacheOwner`). While
  the process holds entries, a daemon thread reads each owning job's record
  every :data:`SWEEP_SECONDS` (:data:`REMOTE_SWEEP_SECONDS` on S3 and GCS, where
  each read is billed) and drops the entries of a job that is no longer
  running (suspended, completed, failed or cancelled, or its record gone), so
  the memory goes back without any task running here. A record that cannot be
  read keeps its entries (the store may be briefly away).
- **Bounded.** A job's entries in one process hold at most
  :attr:`CacheOwner.budget` bytes (``JobConfig.state_cache_bytes``), by an
  estimate from a sample of keys; the least recently used ranges are dropped
  first and reload from the checkpoint when their task next runs here. A
  range larger than the whole budget is not kept at all.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import itertools
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from sparkjet.core.model import JobStatus
from sparkjet.core.state.files import RangeState
from sparkjet.core.store import requests as store_requests
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords

__all__ = ["CACHE", "SWEEP_SECONDS", "CacheOwner", "StateCache", "estimate_bytes"]

log = logging.getLogger(__name__)

#: Held around each freeze and each unfreeze-collect-freeze: another thread's
#: freeze between a reclaim's unfreeze and its collect would keep dropped state alive.
_GC_LOCK = threading.Lock()

#: How often the sweeper reads the records of the jobs whose state is cached here.
SWEEP_SECONDS = 5.0
#: On S3 or GCS, where reading a job's record is a billed GET, the sweeper
#: reads each job's record this often at most (its entries may then stay up
#: to this long after the job stopped).
REMOTE_SWEEP_SECONDS = 30.0
#: Keys sampled (half from the oldest, half from the newest) to estimate a range's size.
SAMPLE_KEYS = 64
#: The statuses of a job that runs no micro-batch now, nor soon.
_STOPPED = frozenset({
    JobStatus.SUSPENDED, JobStatus.SUSPENDED_EXPORTING_SNAPSHOT,
    JobStatus.COMPLETED, JobStatus.FAILED,
})

#: What identifies a cached range: ``(state root, stage, lo, hi)``.
RangeKey = tuple[str, str, int, int]


@dataclass(frozen=True)
class CacheOwner:
    """The job a state task works for, as the cache needs it; picklable.

    ``budget`` is the most bytes of the job's state one process keeps loaded
    (0: keep nothing).
    """

    store: Store
    job_id: str
    budget: int

    def running(self) -> bool | None:
        """Whether the job may still run micro-batches; None when its record cannot be read."""
        try:
            record = JobRecords(self.store).read(self.job_id)
        except Exception:  # the store may be briefly away: keep the entries
            return None
        if record is None:
            return False
        try:
            status = JobStatus(record.get("status"))
        except ValueError:
            return None
        return status not in _STOPPED


def _object_store(store: Any) -> bool:
    """Whether ``store`` is S3, GCS or the like (requests are billed); False if it cannot tell."""
    try:
        return bool(getattr(store, "object_store", False))
    except Exception:
        return False


class Entry(NamedTuple):
    """One cached range."""

    #: The batch the state is as of.
    batch: int
    state: RangeState
    owner: CacheOwner
    #: The estimated bytes the state takes in this process.
    nbytes: int


def _deep_size(obj: Any, seen: set[int], budget: list[int]) -> int:
    """Bytes of ``obj`` and what it holds (containers, ``__dict__``, slots), each object once.

    ``budget`` caps how many objects are visited (a huge value is sampled, not walked).
    """
    if id(obj) in seen or budget[0] <= 0:
        return 0
    seen.add(id(obj))
    budget[0] -= 1
    size = sys.getsizeof(obj, 64)
    if isinstance(obj, (str, bytes, bytearray, int, float, bool, type(None))):
        return size
    if isinstance(obj, dict):
        return size + sum(_deep_size(k, seen, budget) + _deep_size(v, seen, budget)
                          for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return size + sum(_deep_size(item, seen, budget) for item in obj)
    held = getattr(obj, "__dict__", None)
    if held is not None:
        size += _deep_size(held, seen, budget)
    for name in getattr(type(obj), "__slots__", ()):
        size += _deep_size(getattr(obj, name, None), seen, budget)
    return size


def _sample(values: dict[Any, Any]) -> list[tuple[Any, Any]]:
    """Up to :data:`SAMPLE_KEYS` items: the oldest half and the newest half (O(sample))."""
    if len(values) <= SAMPLE_KEYS:
        return list(values.items())
    half = SAMPLE_KEYS // 2
    oldest = list(itertools.islice(values.items(), half))
    newest = [(k, values[k]) for k in itertools.islice(reversed(values), half)]
    return oldest + newest


def estimate_bytes(state: RangeState) -> int:
    """The bytes ``state`` takes in this process, estimated from a sample of its keys.

    Its timer indexes count too: a set slot per key filed, about as much again
    as the dict of values.
    """
    values, touched = state.values, state.touched
    size = sys.getsizeof(values) + sys.getsizeof(touched)
    if state.timers:
        size += sum(index.nbytes() for index in state.timers.values())
    sample = _sample(values)
    if not sample:
        return size
    seen: set[int] = set()
    budget = [100_000]
    sampled = sum(_deep_size(k, seen, budget) + _deep_size(v, seen, budget) for k, v in sample)
    per_key = sampled / len(sample)
    if touched:
        per_key += 64  # an int of milliseconds and its slot
    return size + int(per_key * len(values))


def _trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc), so the process's RSS falls."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).malloc_trim(0)


class StateCache:
    """Key groups' state kept loaded in this process; see the module docstring."""

    def __init__(self, sweep_seconds: float = SWEEP_SECONDS) -> None:
        self.sweep_seconds = sweep_seconds
        self._entries: OrderedDict[RangeKey, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._sweeper: threading.Thread | None = None
        self._pid = os.getpid()
        #: When (monotonic) the sweeper last read each job's record.
        self._asked: dict[str, float] = {}

    def take(self, key: RangeKey) -> Entry | None:
        """Take the entry for a range out (a task works on it; a failed task leaves none)."""
        with self._lock:
            return self._entries.pop(key, None)

    @staticmethod
    def loaded() -> None:
        """A task has just read a range's state from files to keep it: freeze it now.

        What is alive then is the loaded state and the task's input, so the
        collection :meth:`put` runs walks only what the batch made, not the
        millions of objects just read (750 ms at 500k keys of window frames).
        """
        with _GC_LOCK:
            gc.freeze()

    def put(self, key: RangeKey, batch: int, state: RangeState, owner: CacheOwner) -> None:
        """Keep ``state`` (as of ``batch``) for the range's next task, within the owner's budget.

        Then, if it is kept, collects once and freezes what is alive, so later
        collections in this process skip it; a range that is not kept (over the
        budget, or a budget of 0) costs the task no collection.
        """
        nbytes = estimate_bytes(state) if owner.budget > 0 else 0
        kept = 0 < nbytes <= owner.budget
        with self._lock:
            self._entries.pop(key, None)
            if kept:
                self._entries[key] = Entry(batch, state, owner, nbytes)
                self._evict_over_budget(owner)
                self._start_sweeper()
        if kept:
            with _GC_LOCK:
                gc.collect()
                gc.freeze()

    def offer(self, ranges: Mapping[RangeKey, RangeState], batch: int, owner: CacheOwner) -> int:
        """Keep ``ranges`` (each as of ``batch``) where this process keeps none of them yet.

        For state loaded ahead of need (:mod:`sparkjet.core.state.warming`): a
        range a task put meanwhile is newer and stays. Within the owner's
        budget, then collects and freezes once, as :meth:`put`. Returns how
        many of ``ranges`` are kept.
        """
        sizes = {key: estimate_bytes(state) if owner.budget > 0 else 0
                 for key, state in ranges.items()}
        with self._lock:
            added = [key for key, nbytes in sizes.items()
                     if key not in self._entries and 0 < nbytes <= owner.budget]
            for key in added:
                self._entries[key] = Entry(batch, ranges[key], owner, sizes[key])
            if added:
                self._evict_over_budget(owner)
                self._start_sweeper()
            kept = sum(1 for key in added if key in self._entries)
        if added:
            with _GC_LOCK:
                gc.collect()
                gc.freeze()
        return kept

    def _evict_over_budget(self, owner: CacheOwner) -> None:
        """Drop the job's least recently used ranges until they fit its budget (under the lock)."""
        mine = [(k, e) for k, e in self._entries.items() if e.owner.job_id == owner.job_id]
        total = sum(e.nbytes for _, e in mine)
        for key, entry in mine:
            if total <= owner.budget:
                break
            del self._entries[key]
            total -= entry.nbytes

    def clear(self) -> None:
        """Drop everything (this process is short of memory)."""
        with self._lock:
            self._entries.clear()
        self._reclaim()

    def drop_job(self, job_id: str) -> int:
        """Drop a job's entries; returns how many there were."""
        with self._lock:
            keys = [k for k, e in self._entries.items() if e.owner.job_id == job_id]
            for key in keys:
                del self._entries[key]
        if keys:
            self._reclaim()
        return len(keys)

    def jobs(self) -> dict[str, tuple[int, int]]:
        """Per job id, the ranges cached here and their estimated bytes."""
        out: dict[str, tuple[int, int]] = {}
        with self._lock:
            for entry in self._entries.values():
                ranges, nbytes = out.get(entry.owner.job_id, (0, 0))
                out[entry.owner.job_id] = (ranges + 1, nbytes + entry.nbytes)
        return out

    def sweep(self) -> list[str]:
        """Drop the entries of jobs no longer running; returns their ids."""
        with self._lock:
            owners = {e.owner.job_id: e.owner for e in self._entries.values()}
        stopped = []
        now = time.monotonic()
        for job, owner in owners.items():
            if (_object_store(owner.store)
                    and now - self._asked.get(job, float("-inf")) < REMOTE_SWEEP_SECONDS):
                continue
            self._asked[job] = now
            with store_requests.working_for(job):  # the job's requests: it keeps the entries
                if owner.running() is False:
                    stopped.append(job)
        for job in set(self._asked) - set(owners):
            del self._asked[job]
        for job in stopped:
            dropped = self.drop_job(job)
            # DEBUG: housekeeping on a background thread, which must not reach the
            # stderr of a CLI command running in the same process
            log.debug("dropped %d cached state range(s) of job %s: it no longer runs",
                      dropped, job)
        return stopped

    @staticmethod
    def _reclaim() -> None:
        """Free what dropped entries held, cycles too, and return the heap's free pages."""
        with _GC_LOCK:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        _trim_heap()

    def _start_sweeper(self) -> None:
        """Run the sweeper while entries are held (under the lock)."""
        if self._pid != os.getpid():  # a forked copy: the parent's thread is not here
            self._pid, self._sweeper = os.getpid(), None
        if self._sweeper is not None and self._sweeper.is_alive():
            return
        self._sweeper = threading.Thread(target=self._sweep_loop, name="sparkjet-state-sweeper",
                                         daemon=True)
        self._sweeper.start()

    def _sweep_loop(self) -> None:
        while True:
            time.sleep(self.sweep_seconds)
            try:
                self.sweep()
            except Exception:  # a sweep that fails is tried again later
                log.exception("the state cache's sweep failed")
            with self._lock:
                if not self._entries:
                    self._sweeper = None
                    return


#: This process's cache.
CACHE = StateCache()
