"""Warming the driver's copy of a job's keyed state in the background.

A micro-batch runs on the driver only while the job's state is small enough
(:func:`sparkjet.core.engine.adaptive.choose_local`): at most ``driver_state_bytes``
while the driver holds some of it loaded, at most ``cold_state_bytes`` while
it holds none, since a batch that found none would first read all of it on
the loop's path (about a second for 2M keys of counts). A job whose state
lies between the two would stay on Spark for good: each small batch paying a
Spark job (150-250 ms), and a read of a whole range whenever PySpark gives a
state task a Python worker that does not hold it.

So when a batch goes to Spark for that reason alone
(:func:`~sparkjet.core.engine.adaptive.worth_warming`), the adaptive engine asks
for a warm-up
(:meth:`Warming.start`): a daemon thread reads each range of the job's keyed
stages as of the last committed batch, as its state tasks would (the same
listing, only the files that count), and offers them to the driver's
:data:`~sparkjet.core.state.cache.CACHE` where no task put a range since.
From then on the driver holds the state and small batches run here; each
state task brings its range up to date with the changelogs written since
(:meth:`~sparkjet.core.state.files.StatePaths.catch_up`), or reads it again
if its files were replaced meanwhile, exactly as a task does with a range
its worker kept. A warm-up writes nothing: one that fails (a file removed
under it by a newer full copy) costs only time and is tried again later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from sparkjet.core.state.cache import CACHE, CacheOwner, RangeKey, StateCache
from sparkjet.core.state.files import RangeState, StatePaths
from sparkjet.core.state.keygroups import task_range

__all__ = ["MAX_RETRY_SECONDS", "RETRY_SECONDS", "WARMING", "Warming", "warm_ranges"]

log = logging.getLogger(__name__)

#: After a warm-up of a checkpoint's state, the least time before the next one
#: (it failed, or its ranges were dropped since); doubled after each one whose
#: ranges the cache did not keep (over the job's ``state_cache_bytes``), up to
#: :data:`MAX_RETRY_SECONDS`.
RETRY_SECONDS = 10.0
MAX_RETRY_SECONDS = 600.0


def warm_ranges(
    paths: StatePaths,
    stages: Sequence[str],
    tasks: int,
    committed: int,
    owner: CacheOwner,
    cache: StateCache = CACHE,
    stopped: Callable[[], bool] = lambda: False,
) -> int:
    """Read each of ``tasks`` ranges of ``stages`` as of batch ``committed`` into ``cache``.

    ``paths`` knows which files count (:meth:`StatePaths.with_counted`). The
    ranges are those ``tasks`` state tasks own (:func:`task_range`); a range
    with no files is left out. They are offered together once all are read
    (:meth:`StateCache.offer`); ``stopped`` is asked before each read, and
    True leaves the cache as it was. Returns how many ranges the cache kept.
    """
    loaded: dict[RangeKey, RangeState] = {}
    for stage in stages:
        for task in range(tasks):
            lo, hi = task_range(task, tasks, paths.key_groups)
            chain = StatePaths.chain(paths.versions(stage, lo, hi), committed, lo, hi)
            if not chain:
                continue
            if stopped():
                return 0
            loaded[(paths.root, stage, lo, hi)] = paths.read_chain(stage, lo, hi, chain)
            cache.loaded()  # out of the collector's walk at once, as a task's fresh read
    return cache.offer(loaded, committed, owner) if loaded else 0


class Warming:
    """One process's warm-ups, at most one per checkpoint at a time (see the module docstring)."""

    def __init__(self, cache: StateCache = CACHE) -> None:
        self.cache = cache
        self._lock = threading.Lock()
        #: The running warm-up of each checkpoint (by its state root).
        self._running: dict[str, threading.Thread] = {}
        #: Per checkpoint: when the next warm-up may start, and the pause after it.
        self._not_before: dict[str, tuple[float, float]] = {}

    def start(
        self,
        paths: StatePaths,
        stages: Sequence[str],
        tasks: int,
        committed: int,
        owner: CacheOwner,
        stopped: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Warm ``stages``' state under ``paths`` as of batch ``committed``, in ``tasks`` ranges.

        ``paths`` is where a micro-batch's state tasks read (which files
        count: a copy is taken). Returns at once: False when a warm-up of the
        same state runs, or the last one ended less than its pause ago;
        otherwise starts one on a daemon thread and returns True. ``stopped``:
        the job stops (asked between ranges).
        """
        root = paths.root
        now = time.monotonic()
        with self._lock:
            if root in self._running or now < self._not_before.get(root, (0.0, 0.0))[0]:
                return False
            thread = threading.Thread(
                target=self._warm,
                args=(paths.with_counted(dict(paths.counted)), list(stages), tasks, committed,
                      owner, stopped),
                name=f"sparkjet-state-warming-{owner.job_id}", daemon=True)
            self._running[root] = thread
        thread.start()
        return True

    def running(self, root: str) -> threading.Thread | None:
        """The warm-up of the state under ``root`` (a checkpoint's state root) running now."""
        with self._lock:
            return self._running.get(root)

    def _warm(
        self,
        paths: StatePaths,
        stages: list[str],
        tasks: int,
        committed: int,
        owner: CacheOwner,
        stopped: Callable[[], bool],
    ) -> None:
        root = paths.root
        kept = 0
        started = time.monotonic()
        try:
            if committed >= 0:
                kept = warm_ranges(paths, stages, tasks, committed, owner, self.cache, stopped)
                log.info("job %s: loaded %d range(s) of its state as of micro-batch %d into "
                         "the driver in %.1f s", owner.job_id, kept, committed,
                         time.monotonic() - started)
        except Exception as exc:  # files replaced under it: only the warm-up is lost
            log.info("job %s: loading its state into the driver failed (%s: %s); tried again "
                     "in %.0f s at the earliest", owner.job_id, type(exc).__name__, exc,
                     RETRY_SECONDS)
        with self._lock:
            del self._running[root]
            previous = self._not_before.get(root)
            pause = (RETRY_SECONDS if kept or previous is None
                     else min(2 * previous[1], MAX_RETRY_SECONDS))
            self._not_before[root] = (time.monotonic() + pause, pause)


#: This process's warm-ups.
WARMING = Warming()
