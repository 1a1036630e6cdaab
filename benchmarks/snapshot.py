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

Then, on a real Spark session (``--master``; ``--parts`` picks what runs):

- **A running job's export**: a streaming job holding ``--live-mb`` of keyed
  state while a producer keeps publishing (``--live-seconds`` before it);
  the gaps between its committed micro-batches before and during
  ``job.export_snapshot()``. The export runs beside the micro-batch loop,
  so the longest gap during it is set against the export's own time (what
  the job would have waited had the export run in its loop).
- **The throughput cost of periodic snapshots**: events per second through
  a rolling count with EXACTLY_ONCE and ``snapshot_interval_millis=1000``
  (every committed micro-batch is a snapshot) against NONE, in the same
  process.

And (``--parts migrate``, no Spark) ``migrate-snapshot`` of a snapshot of
``--migrate-keys`` keys (the same rolling count, 4 ranges of 16 key groups):
an identity transform (every key read, called, rebucketed and written
again) and a rename alone (files copied byte for byte), each against the
export of the same state and a plain fsspec copy of the snapshot's bytes,
in the same process (local folder, and S3 with ``--s3``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import connect

from sparkjet.aggregate import counting
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.pipeline.planner import Plan, plan
from sparkjet.core.state.checkpoint import BatchPlan, Checkpoint, CommitRecord
from sparkjet.core.state.export import cut_export, export_state, release_cut
from sparkjet.core.state.files import RangeState
from sparkjet.core.state.keygroups import task_range
from sparkjet.core.state.restore import SourceOffsets, seed_checkpoint
from sparkjet.core.state.snapshots import SnapshotStore
from sparkjet.core.state.snapshots.migrate import migrate_snapshot
from sparkjet.core.state.versions import StateRange
from sparkjet.errors import JobCancelledError
from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.testing import StoreLocation

GROUPS, TASKS, STAGE = 16, 4, "counts"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="10,100", help="comma-separated MB of state")
    parser.add_argument("--s3", action="store_true", help="also on moto's S3 server")
    parser.add_argument("--parts", default="copy,live,throughput,migrate",
                        help="which parts to run: copy (export and restore against a copy), "
                             "live (a running job's export), throughput (snapshots vs NONE), "
                             "migrate (migrate-snapshot against export and copy)")
    parser.add_argument("--migrate-keys", type=int, default=1_000_000,
                        help="keys of the snapshot migrated")
    parser.add_argument("--live-mb", type=int, default=100,
                        help="MB of state of the running job exported")
    parser.add_argument("--live-seconds", type=float, default=21.0,
                        help="seconds the running job's producer publishes before the export "
                             "(its changelogs pile up: the export has them to fold)")
    parser.add_argument("-n", type=int, default=1_000_000,
                        help="events in each throughput run")
    parser.add_argument("--repeat", type=int, default=2, help="throughput runs per guarantee")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    return parser.parse_args()


def the_plan() -> Any:
    p = Pipeline.create()
    (p.read_from(StreamSource("events")).set_name("events").group_by(lambda e: e)
     .aggregate(counting()).set_name(STAGE).write_to(Pipeline.to_list("out")))
    return plan(p, PluginHost(), ProcessingGuarantee.EXACTLY_ONCE)


def build(
    checkpoint: Checkpoint, megabytes: int, planned: Any, keys: int | None = None
) -> tuple[int, list[str]]:
    """A checkpoint whose batch 0 holds ``megabytes`` (or ``keys`` keys) of state; its files."""
    checkpoint.key_groups(GROUPS, list(planned.names.values()))
    paths = checkpoint.state(GROUPS)
    per_key = 38  # bytes a key's entry takes pickled, about (checked below)
    keys = megabytes * 1_000_000 // per_key if keys is None else keys
    names: dict[StateRange, str] = {}
    files = []
    total = 0
    for task in range(TASKS):
        lo, hi = task_range(task, TASKS, GROUPS)
        values = {f"user-{i:012d}": (f"user-{i:012d}", i) for i in range(
            task * keys // TASKS, (task + 1) * keys // TASKS)}
        after = paths.write(STAGE, lo, hi, 0, RangeState(values, {}, []), [], [], [])
        written = after.chain[-1]
        names[StateRange(STAGE, lo, hi)] = written.name
        files.append(paths.path(STAGE, written))
        total += written.size
    checkpoint.write_plan(BatchPlan(0, {"events": [0]}, {"events": [0]}, 0, TASKS))
    checkpoint.write_commit(CommitRecord(0, {"events": [0]}, 0, 0, names))
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
            names[StateRange(STAGE, lo, hi)] = after.chain[-1].name
        checkpoint.write_plan(BatchPlan(batch, {"events": [0]}, {"events": [0]}, 0, TASKS))
        checkpoint.write_commit(CommitRecord(batch, {"events": [0]}, 0, 0, names))


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def export_cut(checkpoint: Checkpoint, planned: Plan, snapshots: SnapshotStore) -> None:
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
    export = timed(lambda: export_cut(checkpoint, planned, snapshots))
    snapshot = snapshots.get("bench")
    verify = timed(snapshot.verify)
    target = Checkpoint(store, store.path("jobs", "restored", "checkpoint"))
    offsets = SourceOffsets(lambda source: [0], lambda source: [0],
                            lambda source, at: [str(p) for p in range(len(at))])
    seed = timed(lambda: seed_checkpoint(target, planned, snapshot, offsets, GROUPS))
    restored = target.state(GROUPS).read(STAGE, 0, GROUPS, 0)[0].values
    if len(restored) != sum(s.key_count for s in snapshot.manifest.stages):
        raise SystemExit("the restored state does not hold the exported keys")
    # The same state as a full copy plus 3 changelogs per range: the export folds them.
    add_changelogs(checkpoint, 3)
    folded = timed(lambda: export_cut(checkpoint, planned, snapshots))
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


def measure_migrate(label: str, location: StoreLocation, keys: int) -> None:
    """``migrate-snapshot`` of ``keys`` keys against their export and a copy of its bytes."""
    planned = the_plan()
    store = location.store()
    checkpoint = Checkpoint(store, store.path("jobs", "bench", "checkpoint"))
    build(checkpoint, 0, planned, keys)
    snapshots = SnapshotStore(location.fresh().snapshot_backend())
    export = timed(lambda: export_cut(checkpoint, planned, snapshots))
    snapshot = snapshots.get("bench")
    backend = snapshots.backend

    def plain_copy() -> None:
        for entry in snapshot.manifest.all_files():
            path = snapshot.path(entry.path)
            backend.write_bytes(f"copy/{entry.path}", backend.read_bytes(path))

    copy = timed(plain_copy)
    identity = timed(lambda: migrate_snapshot(
        snapshots, "bench", "identity", transforms={STAGE: lambda key, value: (key, value)}))
    renamed = timed(lambda: migrate_snapshot(snapshots, "bench", "renamed",
                                             renames={STAGE: "renamed"}))
    for name, stage in (("identity", STAGE), ("renamed", "renamed")):
        migrated = snapshots.get(name).manifest.stage(stage)
        if migrated is None or migrated.key_count != keys:
            raise SystemExit(f"migrate-snapshot ({name}) does not hold the {keys:,} keys")
    if snapshots.get("identity").read_state(STAGE) != snapshot.read_state(STAGE):
        raise SystemExit("the identity migration changed the state")
    mb = snapshot.payload_size / 1e6
    print(f"\n{label}: migrate-snapshot of {keys:,} keys ({mb:,.1f} MB)")
    print(f"{'':36}{'seconds':>9}{'MB/s':>9}{'vs export':>10}{'vs copy':>9}")
    for name, seconds in (("fsspec copy of the bytes (limit)", copy),
                          ("export of the same state", export),
                          ("migrate-snapshot: identity fn", identity),
                          ("migrate-snapshot: rename only", renamed)):
        print(f"{name:36}{seconds:>9.2f}{mb / seconds:>9.1f}{seconds / export:>9.2f}x"
              f"{seconds / copy:>8.2f}x")


def commits_of(job: Any, stop: threading.Event, seen: list[tuple[float, int]]) -> None:
    """Record (time, batch) whenever ``job`` commits a new micro-batch, polling every 5 ms."""
    last = -2
    while not stop.is_set():
        batch = job.get_metrics().get("lastCommittedBatch", -1)
        if batch != last:
            seen.append((time.monotonic(), batch))
            last = batch
        time.sleep(0.005)


def gaps(seen: list[tuple[float, int]], start: float, end: float) -> list[float]:
    """Seconds between consecutive commits seen in [start, end], and up to the first after."""
    times = [t for t, _ in seen]
    inside = [t for t in times if start <= t <= end]
    after = [t for t in times if t > end][:1]
    before = [t for t in times if t < start][-1:]
    points = before + inside + after
    return [b - a for a, b in itertools.pairwise(points)]


def running_export(client: Any, megabytes: int, seconds: float) -> None:
    """A running job's batches while it exports ``megabytes`` of state (see the docstring)."""
    keys = megabytes * 1_000_000 // 30  # a counting() entry pickles to about 30 bytes
    stream = client.get_stream("live", partitions=2)
    p = Pipeline.create()
    (p.read_from(StreamSource("live")).set_name("live").group_by(lambda e: e)
     .aggregate(counting()).set_name(STAGE).filter(lambda kv: False)
     .write_to(Pipeline.to_list("nothing")))
    config = JobConfig(name="live", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                       snapshot_interval_millis=200, key_groups=GROUPS)
    job = client.get_jet().submit(p, config)
    step = 500_000
    for start in range(0, keys, step):
        stream.publish_all(f"u{i:011d}" for i in range(start, min(keys, start + step)))

    def held() -> int:
        stage = job.get_metrics().get("stages", {}).get(STAGE, {})
        return int(stage.get("snapshotKeys", 0))

    deadline = time.monotonic() + 600
    while held() < keys:
        if time.monotonic() > deadline:
            raise SystemExit(f"the job holds {held()} keys of {keys} after 600 s")
        time.sleep(0.2)
    stop = threading.Event()
    rng = random.Random(7)

    def produce() -> None:  # 2,000 events every 100 ms on keys the state holds
        while not stop.is_set():
            stream.publish_all(f"u{rng.randrange(keys):011d}" for _ in range(2_000))
            time.sleep(0.1)

    seen: list[tuple[float, int]] = []
    threads = [threading.Thread(target=produce), threading.Thread(
        target=commits_of, args=(job, stop, seen))]
    for thread in threads:
        thread.start()
    try:
        time.sleep(seconds)  # changelogs pile up in every range: the export has them to fold
        began = time.monotonic()
        snapshot = job.export_snapshot("live")
        ended = time.monotonic()
        time.sleep(2)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        job.cancel()
        with contextlib.suppress(JobCancelledError):
            job.join(timeout=120)
    before = gaps(seen, began - max(1.0, seconds - 1), began)
    during = gaps(seen, began, ended)
    export = ended - began
    print(f"\nrunning job, EXACTLY_ONCE, 200 ms trigger, {snapshot.payload_size / 1e6:,.1f} MB "
          f"of state ({held_keys(snapshot):,} keys), a producer publishing meanwhile")
    print(f"  export_snapshot() took           {export:>7.2f} s "
          f"({snapshot.payload_size / 1e6 / export:,.1f} MB/s)")
    print(f"  batches committed during it      {max(0, len(during) - 1):>7d}")
    print(f"  gaps between batches before it    {statistics.median(before):>6.2f} s median, "
          f"{max(before):.2f} s longest")
    print(f"  longest gap during the export     {max(during):>6.2f} s "
          f"({max(during) / export:.2f}x the export's time, which an export in the loop "
          "would have paused the job for)")


def held_keys(snapshot: Any) -> int:
    return sum(s.key_count for s in snapshot.manifest.stages)


def rate(client: Any, guarantee: ProcessingGuarantee, n: int, tag: str) -> float:
    """Events per second through a rolling count of 10,000 keys, from publish to committed."""
    stream = client.get_stream(f"rate-{tag}", partitions=2)
    p = Pipeline.create()
    (p.read_from(StreamSource(f"rate-{tag}")).set_name("events").group_by(lambda e: e % 10_000)
     .aggregate(counting()).set_name(STAGE).write_to(Pipeline.to_map(f"counts-{tag}")))
    config = JobConfig(name=f"rate-{tag}", processing_guarantee=guarantee,
                       snapshot_interval_millis=1000)
    job = client.get_jet().submit(p, config)

    def received() -> int:
        return int(job.get_metrics().get("stages", {}).get(STAGE, {}).get("receivedCount", 0))

    def wait(total: int) -> None:
        deadline = time.monotonic() + 600
        while received() < total:
            if time.monotonic() > deadline:
                raise SystemExit(f"{tag}: {received()} of {total} events after 600 s")
            time.sleep(0.01)

    try:
        stream.publish_all(range(20_000))  # warm-up
        wait(20_000)
        started = time.perf_counter()
        for chunk in range(20):
            stream.publish_all(range(chunk * n // 20, (chunk + 1) * n // 20))
        wait(20_000 + n)
        return n / (time.perf_counter() - started)
    finally:
        job.cancel()
        with contextlib.suppress(JobCancelledError):
            job.join(timeout=120)


def snapshot_cost(client: Any, n: int, repeat: int) -> None:
    """Best of ``repeat`` runs each: EXACTLY_ONCE with a snapshot every second, and NONE."""
    none, exactly = 0.0, 0.0
    for run in range(repeat):
        none = max(none, rate(client, ProcessingGuarantee.NONE, n, f"none-{run}"))
        exactly = max(exactly, rate(client, ProcessingGuarantee.EXACTLY_ONCE, n, f"eo-{run}"))
    print(f"\nperiodic snapshots: {n:,} events, rolling count of 10,000 keys, best of {repeat}")
    print(f"  NONE (no snapshots)                      {none:>12,.0f} events/s")
    print(f"  EXACTLY_ONCE, a snapshot every 1,000 ms  {exactly:>12,.0f} events/s "
          f"({exactly / none:.2f}x NONE)")


def main() -> None:
    args = parse_args()
    sizes = [int(s) for s in args.sizes_mb.split(",")] if "copy" in args.parts else []
    with tempfile.TemporaryDirectory() as workdir:
        for megabytes in sizes:
            measure("local folder", StoreLocation(str(Path(workdir) / f"local-{megabytes}")),
                    megabytes)
        migrating = "migrate" in args.parts
        if migrating:
            measure_migrate("local folder", StoreLocation(str(Path(workdir) / "migrate")),
                            args.migrate_keys)
        if args.s3 and (sizes or migrating):
            from sparkjet.testing import moto_s3_server

            with moto_s3_server(Path(workdir)) as location:
                for megabytes in sizes:
                    measure("S3 (moto on 127.0.0.1)", location.fresh(), megabytes)
                if migrating:
                    measure_migrate("S3 (moto on 127.0.0.1)", location.fresh(),
                                    args.migrate_keys)
    client = connect(args.master) if {"live", "throughput"} & set(args.parts.split(",")) else None
    if "live" in args.parts:
        running_export(client, args.live_mb, args.live_seconds)
    if "throughput" in args.parts:
        snapshot_cost(client, args.n, args.repeat)


if __name__ == "__main__":
    main()
