"""Compaction off the critical path: a state task's chain folded in a process of its own.

A state task writes one changelog per batch; every :data:`COMPACT_EVERY`
changelogs the range's files are folded into one full copy
(:meth:`StatePaths.compact`). Done inline, that unpickles and repickles the
range's whole state inside a micro-batch, which at millions of keys costs a
second or more every tenth batch. Here the state task hands it to a short-lived
child process on the same machine instead (like the background maintenance of
Spark's RocksDB state store and Flink's compaction threads, but a process: a
thread would hold the Python worker's GIL while pickling) and returns at once.

The child reads only committed files and writes one new file; it never
removes anything, so a child that fails, is killed or races another does no
harm: the chain just stays longer until a later compaction, or the task's own
full copy at :data:`COMPACT_LIMIT`, shortens it. Only one child per range
runs from one process, but two processes (the driver's in-process engine and a
Spark worker, or two workers) may compact one range at once, or the task may
write a full copy itself: the next write then removes the chain a child is
still reading. Such a child gives up quietly (superseded, said at DEBUG; see
:meth:`StatePaths.compact`). Stores that other processes cannot see
(``memory://``) compact inline.

The child runs :func:`main` (``python -c`` importing it: ``-m`` would run a
second copy of this module where the package's imports loaded it already);
it reads its request,
pickled, on standard input, and says on standard error (the worker's log)
what it did not do and why.

A snapshot export uses the same children (:func:`compact_now`): the ranges
of its cut that carry changelogs are folded by as many children at once as
the machine has cores, and the export then copies each range's one full
copy byte for byte.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import cloudpickle

from sparkjet.core.state.files import COMPACT_EVERY, COMPACT_LIMIT, StatePaths
from sparkjet.core.state.versions import StateVersion

__all__ = ["COMPACT_EVERY", "COMPACT_LIMIT", "compact_now", "running", "shared", "start"]

#: Ranges with a compaction under way from this process: (state root, stage, lo, hi).
_RUNNING: set[tuple[str, str, int, int]] = set()
_LOCK = threading.Lock()
#: How much lower a child's scheduling priority is than its parent's.
NICENESS = 10
#: What a child process runs.
_CHILD = "import sys; from sparkjet.core.state.compaction import main; sys.exit(main())"


def shared(paths: StatePaths) -> bool:
    """Whether another process on this machine sees the store's files (not ``memory://``)."""
    protocol = paths.store.fs.protocol
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    return "memory" not in protocols


def due(chain: list[StateVersion]) -> bool:
    """Whether a range whose committed state is ``chain`` should be compacted."""
    return sum(1 for v in chain if not v.full) >= COMPACT_EVERY


def running() -> int:
    """How many compactions this process has under way."""
    with _LOCK:
        return len(_RUNNING)


def start(paths: StatePaths, stage: str, lo: int, hi: int, committed: int) -> bool:
    """Compact key groups ``[lo, hi)`` as of ``committed`` in a child process.

    Returns at once; False when one for this range is already under way from
    this process (or the child could not be started, which is reported on
    standard error: the task's own full copy at :data:`COMPACT_LIMIT` stands
    behind it).
    """
    key = (paths.root, stage, lo, hi)
    with _LOCK:
        if key in _RUNNING:
            return False
        _RUNNING.add(key)
    request = cloudpickle.dumps((paths, stage, lo, hi, committed))
    try:
        child = _child(request)
    except OSError as exc:
        with _LOCK:
            _RUNNING.discard(key)
        print(f"sparkjet: cannot start compaction of stage {stage!r} key groups "
              f"[{lo}, {hi}): {exc}", file=sys.stderr)
        return False

    def reap() -> None:
        child.wait()
        with _LOCK:
            _RUNNING.discard(key)

    threading.Thread(target=reap, name="sparkjet-compaction", daemon=True).start()
    return True


def _child(request: bytes) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, close_fds=True,
    )
    assert child.stdin is not None
    try:
        with child.stdin:
            child.stdin.write(request)
    except OSError:
        pass  # the child died before reading; its exit status says so
    return child


def compact_now(
    paths: StatePaths, ranges: list[tuple[str, int, int]], committed: int,
    workers: int | None = None,
) -> int:
    """Compact each ``(stage, lo, hi)`` as of ``committed``; wait for all; how many failed.

    ``workers`` children at a time (default: the machine's cores). A child
    that fails says why on standard error; its range keeps its chain.
    """
    workers = max(1, workers or os.cpu_count() or 1)
    pending = list(ranges)
    running_now: list[subprocess.Popen[bytes]] = []
    failed = 0
    try:
        while pending or running_now:
            while pending and len(running_now) < workers:
                stage, lo, hi = pending.pop(0)
                try:
                    running_now.append(_child(cloudpickle.dumps((paths, stage, lo, hi,
                                                                 committed))))
                except OSError as exc:
                    failed += 1
                    print(f"sparkjet: cannot start compaction of stage {stage!r} key groups "
                          f"[{lo}, {hi}): {exc}", file=sys.stderr)
            child = running_now.pop(0)
            failed += child.wait() != 0
    finally:
        for child in running_now:  # interrupted: no child outlives the wait
            child.kill()
            child.wait()
    return failed


def main(stream: Any = None) -> int:
    """The child: compact the range named on standard input; exit 0 or 1.

    At a lower scheduling priority (nice 10): the job's batches share the
    machine's cores with it, and they come first.
    """
    if stream is None and hasattr(os, "nice"):
        os.nice(NICENESS)
    paths, stage, lo, hi, committed = cloudpickle.loads((stream or sys.stdin.buffer).read())
    try:
        paths.compact(stage, lo, hi, committed)
    except Exception as exc:  # reported; the chain stays as it is
        print(paths.store.redact(
            f"sparkjet: compaction of stage {stage!r} key groups [{lo}, {hi}) as of batch "
            f"{committed} not done: {type(exc).__name__}: {exc}"), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
