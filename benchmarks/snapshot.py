"""Snapshot export and restore: how close to simply copying the same bytes?

A streaming job's checkpoint holding ``--sizes-mb`` of keyed state (a rolling
count per key, its state in 4 ranges of 16 key groups, as 4 state tasks
leave it) is exported as a snapshot (``export_state``, what
``job.export_snapshot`` runs between two micro-batches), then restored into
a new checkpoint (``snapshot.verify()`` as submit does, then
``seed_checkpoint``, what the new job's first start runs). The limit, in the
same process: copying the checkpoint's state files to another folder with
fsspec (read whole, write whole), the bytes an export must move at least.

Run on a local folder and, with ``--s3``, on moto's S3 server on 127.0.0.1.
Printed: seconds, MB/s, and each against the plain copy.

The throughput cost of running with periodic snapshots (every committed
micro-batch is one) is ``stream_rolling.py --interval-ms 1000``: EXACTLY_ONCE
beside NONE in one process.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkjet.aggregate import counting
from sparkjet.core.checkpoint import Checkpoint, RangeState, task_range
from sparkjet.core.exports import cut_export, export_state, release_cut, seed_checkpoint
from sparkjet.core.planner import Plan, plan
from sparkjet.core.plugins import PluginHost
from sparkjet.core.snapshots import SnapshotStore
from sparkjet.job import ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.testing import StoreLocation

GROUPS, TASKS, STAGE = 16, 4, "counts"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="10,100", help="comma-separated MB of state")
    parser.add_argument("--s3", action="store_true", help="also on moto's S3 server")
    return parser.parse_args()


def the_plan() -> Any:
    p = Pipeline.create()
    (p.read_from(StreamSource("events")).set_name("events").group_by(lambda e: e)
     .aggregate(counting()).set_name(STAGE).write_to(Pipeline.to_list("out")))
    return plan(p, PluginHost(), ProcessingGuarantee.EXACTLY_ONCE)


def build(checkpoint: Checkpoint, megabytes: int, planned: Any) -> tuple[int, list[str]]:
    """A checkpoint whose batch 0 holds ``megabytes`` of state; its keys and state files."""
    checkpoint.key_groups(GROUPS, list(planned.names.values()))
    paths = checkpoint.state(GROUPS)
    per_key = 38  # bytes a key's entry takes pickled, about (checked below)
    keys = megabytes * 1_000_000 // per_key
    names: dict[str, str] = {}
    files = []
    total = 0
    for task in range(TASKS):
        lo, hi = task_range(task, TASKS, GROUPS)
        values = {f"user-{i:012d}": (f"user-{i:012d}", i) for i in range(
            task * keys // TASKS, (task + 1) * keys // TASKS)}
        after = paths.write(STAGE, lo, hi, 0, RangeState(values, {}, []), [], [], [])
        written = after.chain[-1]
        names[f"{lo}-{hi}"] = written.name
        files.append(paths.path(STAGE, written))
        total += written.size
    checkpoint.write_plan(0, {"batch": 0, "starts": {"events": [0]}, "ends": {"events": [0]},
                              "time": 0, "tasks": TASKS})
    checkpoint.write_commit(0, {"ends": {"events": [0]}, "time": 0, "duration_ms": 0,
                                "state": {STAGE: names}})
    return total, files


def add_changelogs(checkpoint: Checkpoint, batches: int) -> None:
    """``batches`` more committed batches, each changing 1% of every range's keys."""
    paths = checkpoint.state(GROUPS)
    for batch in range(1, batches + 1):
        names = {}
        for task in range(TASKS):
            lo, hi = task_range(task, TASKS, GROUPS)
            versions = paths.versions(STAGE, lo, hi)
            state, _ = paths.read(STAGE, lo, hi, batch - 1)
            changed = list(state.values)[:: 100]
            for key in changed:
                state.values[key] = (key, state.values[key][1] + 1)
            after = paths.write(STAGE, lo, hi, batch, state, changed, [], versions)
            names[f"{lo}-{hi}"] = after.chain[-1].name
        checkpoint.write_plan(batch, {"batch": batch, "starts": {"events": [0]},
                                      "ends": {"events": [0]}, "time": 0, "tasks": TASKS})
        checkpoint.write_commit(batch, {"ends": {"events": [0]}, "time": 0, "duration_ms": 0,
                                        "state": {STAGE: names}})


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def export(checkpoint: Checkpoint, planned: Plan, snapshots: SnapshotStore) -> None:
    """What a job's export does: pin the last committed batch, export it, unpin."""
    cut = cut_export(checkpoint, planned, "bench", "bench")
    try:
        export_state(checkpoint, cut, planned, snapshots, "bench", job_id="bench",
                     job_name=None, versions=("bench", "bench"))
    finally:
        release_cut(checkpoint, cut)


def measure(label: str, location: StoreLocation, megabytes: int) -> None:
    planned = the_plan()
    store = location.store()
    checkpoint = Checkpoint(store, store.path("jobs", "bench", "checkpoint"))
    size, files = build(checkpoint, megabytes, planned)
    snapshots = SnapshotStore(location.fresh().snapshot_backend())

    def plain_copy() -> None:
        for path in files:
            store.write_bytes(path.replace("/bench/", "/copy/"), store.read_bytes(path))

    copy = timed(plain_copy)
    export = timed(lambda: export(checkpoint, planned, snapshots))
    snapshot = snapshots.get("bench")
    verify = timed(snapshot.verify)
    target = Checkpoint(store, store.path("jobs", "restored", "checkpoint"))
    seed = timed(lambda: seed_checkpoint(target, planned, snapshot, lambda source: [0], GROUPS))
    restored = target.state(GROUPS).read(STAGE, 0, GROUPS, 0)[0].values
    if len(restored) != sum(s.key_count for s in snapshot.manifest.stages):
        raise SystemExit("the restored state does not hold the exported keys")
    # The same state as a full copy plus 3 changelogs per range: the export folds them.
    add_changelogs(checkpoint, 3)
    folded = timed(lambda: export(checkpoint, planned, snapshots))
    mb = size / 1e6
    print(f"\n{label}: {mb:,.1f} MB of state, {len(restored):,} keys")
    print(f"{'':34}{'seconds':>9}{'MB/s':>9}{'vs copy':>9}")
    for name, seconds in (("fsspec copy of the bytes (limit)", copy),
                          ("export: one full copy per range", export),
                          ("export: + 3 changelogs per range", folded),
                          ("restore: verify checksums", verify),
                          ("restore: seed the checkpoint", seed),
                          ("restore: both", verify + seed)):
        print(f"{name:34}{seconds:>9.2f}{mb / seconds:>9.1f}{seconds / copy:>8.2f}x")


def main() -> None:
    args = parse_args()
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    with tempfile.TemporaryDirectory() as workdir:
        for megabytes in sizes:
            measure("local folder", StoreLocation(str(Path(workdir) / f"local-{megabytes}")),
                    megabytes)
        if args.s3:
            from sparkjet.testing import moto_s3_server

            with moto_s3_server(Path(workdir)) as location:
                for megabytes in sizes:
                    measure("S3 (moto on 127.0.0.1)", location.fresh(), megabytes)


if __name__ == "__main__":
    main()
