"""State scaling: does a small increment cost the same with 10k, 1M or 5M keys of state?

A rolling count per key (``group_by(key).aggregate(counting())``, EXACTLY_ONCE,
``--interval-ms`` snapshot interval) first builds state holding N keys; then
``--probes`` increments of ``--increment`` events on random existing keys are
published one at a time, each into one partition of the stream's two (in
turn), and timed from publishing until the job has committed a micro-batch
that covers it; the script says where those micro-batches ran (the driver or
Spark) and how long each took. Beside it, in the same process, Spark's native
update-mode ``groupBy().count()`` with the RocksDB state store holding the same
keys, each increment timed from the moment its JSON-lines file is moved in until
the query has processed it.

Targets: at the largest size the increment's median latency at most 1.5x its
latency at the smallest (the durable-state issue: 5M against 10k keys; issue
32: 2M against 10k, and under 300 ms), and no slower than the native query at
the same state size.

Second part, what cached state costs everything else in the application: a
windowed job (a 1-hour tumbling window counting per key, EXACTLY_ONCE) holds
N keys in the Python workers; meanwhile a trivial two-stage RDD job
(``parallelize(range(100), 2).map(...).reduceByKey(add).collect()``, median
of ``--trivial-runs``, 9) is timed, once no compaction child shares the cores,
in the same session, as a ratio to its time with nothing cached, and the
workers' memory (PSS, from ``/proc``) is read before the job, while it holds
the keys, and after it is cancelled. Target (the worker-state issue): at most
1.2x at 1M keys, and memory back near where it was after the cancel.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import statistics
import tempfile
import time
from operator import add
from typing import Any

from _harness import connect

from sparkjet.aggregate import counting
from sparkjet.errors import JobCancelledError
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource, WindowDefinition

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
TIMEOUT = 900.0
BUILD_CHUNK = 250_000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,1000000,5000000",
                        help="comma-separated numbers of keys of state")
    parser.add_argument("--increment", type=int, default=1_000, help="events per increment")
    parser.add_argument("--probes", type=int, default=6, help="increments timed per size")
    parser.add_argument("--interval-ms", type=int, default=100,
                        help="snapshot interval, and the native query's trigger")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--skip-native", action="store_true", help="sparkjet only")
    parser.add_argument("--cached-sizes", default="10000,1000000,5000000",
                        help="comma-separated keys of windowed state held beside the trivial "
                             "job (empty: skip that part)")
    parser.add_argument("--cache-bytes", type=int, default=16 << 30,
                        help="JobConfig.state_cache_bytes of the windowed job (per worker)")
    parser.add_argument("--cold-state-bytes", type=int, default=None,
                        help="[engine] cold_state_bytes (default: the configuration's): the "
                        "most keyed state a micro-batch may run on the driver with while the "
                        "driver holds none of it loaded")
    parser.add_argument("--driver-state-bytes", type=int, default=None,
                        help="[engine] driver_state_bytes (default: the configuration's)")
    parser.add_argument("--trivial-runs", type=int, default=9,
                        help="runs of the trivial job per measure (its median is taken)")
    parser.add_argument("--skip-increments", action="store_true",
                        help="only the cached-state part")
    return parser.parse_args()


def wait(condition: Any, what: str, poll: float = 0.005) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(poll)


def sparkjet_run(client: Any, size: int, args: argparse.Namespace) -> list[float]:
    from sparkjet.core.state.checkpoint import Checkpoint

    tag = f"scale-{size}"
    stream = client.get_stream(tag, partitions=2)
    p = Pipeline.create()
    (p.read_from(StreamSource(tag)).group_by(lambda e: e).aggregate(counting())
     .set_name("per-key").write_to(Pipeline.to_map(f"counts-{tag}")))
    job = client.get_jet().submit(p, JobConfig(
        name=tag, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=args.interval_ms,
    ))
    wait(lambda: job.status is JobStatus.RUNNING, "the job to run")
    checkpoint = Checkpoint(client.store, client.store.layout.checkpoint(job.id, "checkpoint"))
    log = client.store.stream_log(tag)

    def committed_through(ends: list[int]) -> bool:
        last = checkpoint.last_commit()
        if last < 0:
            return False
        (got,) = checkpoint.commit_record(last).ends.values()  # the one source
        return all(g >= e for g, e in zip(got, ends, strict=True))

    try:
        started = time.monotonic()
        for lo in range(0, size, BUILD_CHUNK):
            stream.publish_all(range(lo, min(size, lo + BUILD_CHUNK)))
        ends = log.end_offsets()
        wait(lambda: committed_through(ends), "the state to be built", poll=0.05)
        stage = job.get_metrics()["stages"].get("per-key", {})
        print(f"  sparkjet: {size:,} keys built in {time.monotonic() - started:.1f} s; state "
              f"{stage.get('snapshotBytes', 0) / 1e6:.1f} MB", flush=True)
        rng = random.Random(size)
        times = []
        local, spark = engines(job)
        for probe in range(args.probes):
            time.sleep(args.interval_ms / 1000 * 3)  # idle: one increment, one batch
            events = [rng.randrange(size) for _ in range(args.increment)]
            started = time.monotonic()
            # One partition's chunk, so one micro-batch covers it: spread over
            # both, the job may plan a batch between the two appends and run
            # the second part an interval later (+100 ms at any state size).
            log.publish_all(events, partition_of=lambda _, p=probe: p)
            ends = log.end_offsets()
            wait(lambda e=ends: committed_through(e), "an increment to commit")
            times.append((time.monotonic() - started) * 1000)
        now_local, now_spark = engines(job)
        took = job.get_metrics()["batchDurationsMillis"][-(now_local - local + now_spark - spark):]
        print(f"  sparkjet: the increments' micro-batches: {now_local - local} on the driver, "
              f"{now_spark - spark} on Spark, each {', '.join(str(t) for t in took)} ms",
              flush=True)
        return times
    finally:
        if not job.is_terminal():
            job.cancel()
            with contextlib.suppress(JobCancelledError):
                job.join(120)


def native_run(client: Any, size: int, args: argparse.Namespace) -> list[float]:
    spark = client.spark
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set("spark.sql.shuffle.partitions", str(spark.sparkContext.defaultParallelism))
    root = tempfile.mkdtemp(prefix="sparkjet-bench-scale-")
    folder, staging = os.path.join(root, "in"), os.path.join(root, "staging")
    os.makedirs(folder)
    os.makedirs(staging)
    files = 0

    def publish(keys: Any) -> None:
        nonlocal files
        name = f"part-{files:06d}.json"
        files += 1
        with open(os.path.join(staging, name), "w") as fh:
            fh.writelines(f'{{"key": {k}}}\n' for k in keys)
        os.rename(os.path.join(staging, name), os.path.join(folder, name))

    rows = {"n": 0}

    def processed(batch: Any, batch_id: int) -> None:
        rows["n"] += batch.count()  # the updated counts reach the driver, like a sink

    query = (spark.readStream.schema("key LONG").json(folder).groupBy("key").count()
             .writeStream.outputMode("update").foreachBatch(processed)
             .trigger(processingTime=f"{args.interval_ms} milliseconds")
             .option("checkpointLocation", os.path.join(root, "checkpoint")).start())
    try:
        started = time.monotonic()
        for lo in range(0, size, BUILD_CHUNK):
            publish(range(lo, min(size, lo + BUILD_CHUNK)))
        wait(lambda: rows["n"] >= size, "the native state to be built", poll=0.05)
        print(f"  native:   {size:,} keys built in {time.monotonic() - started:.1f} s")
        rng = random.Random(size)
        times = []
        for _ in range(args.probes):
            time.sleep(args.interval_ms / 1000 * 3)
            keys = sorted({rng.randrange(size) for _ in range(args.increment)})
            before = rows["n"]
            started = time.monotonic()
            publish(rng.choice(keys) for _ in range(args.increment))
            wait(lambda b=before: rows["n"] > b, "an increment to be processed")
            times.append((time.monotonic() - started) * 1000)
            if query.exception() is not None:
                raise RuntimeError(f"native query failed: {query.exception()}")
        return times
    finally:
        query.stop()
        shutil.rmtree(root, ignore_errors=True)


def descendants(marker: str) -> list[int]:
    """The processes under this one whose command line holds ``marker``."""
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                commands[int(entry)] = fh.read().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        if marker in commands.get(pid, ""):
            found.append(pid)
    return found


def workers_memory() -> int:
    """Bytes of memory PySpark's Python workers under this process take (PSS, else RSS)."""
    total = 0
    for pid in descendants("pyspark.daemon"):
        for name, field in (("smaps_rollup", "Pss:"), ("status", "VmRSS:")):
            try:
                with open(f"/proc/{pid}/{name}") as fh:
                    found = [line for line in fh if line.startswith(field)]
            except OSError:
                continue
            if found:
                total += int(found[0].split()[1]) * 1024
                break
    return total


def settle() -> None:
    """Wait until no compaction child shares the cores (they follow a build's batches)."""
    deadline = time.monotonic() + TIMEOUT
    while descendants("sparkjet.core.state.compaction") and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)


def trivial_job(client: Any, runs: int = 9) -> float:
    """Median seconds of a trivial two-stage RDD job in the session."""
    sc = client.spark.sparkContext
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        sc.parallelize(range(100), 2).map(lambda x: (x % 10, 1)).reduceByKey(add).collect()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def event_time(e: str) -> int:
    """A held key's event time is 1; a tick's (``tick-<millis>-<n>``) is its millis."""
    return int(e.split("-")[1]) if e.startswith("tick-") else 1


def engines(job: Any) -> tuple[int, int]:
    """Micro-batches the job ran so far on the driver and on Spark."""
    metrics = job.get_metrics()
    return int(metrics["localBatches"]), int(metrics["sparkBatches"])


def watermark_steps(job: Any, stream: Any, steps: int = 5) -> tuple[float, list[float], str]:
    """Seconds from publishing a tick that moves the watermark (closing no window,
    all keys idle) to the job's watermark showing it: one micro-batch over every held key.

    Returns the median, every step's time, and where the steps' micro-batches ran
    (adaptive micro-batches: on the driver if the job's state fits its budget).
    """
    times = []
    local, spark = engines(job)
    for step in range(1, steps + 1):
        at = step * 1000  # well inside the 1-hour window: nothing closes
        started = time.perf_counter()
        stream.publish_all([f"tick-{at}-0", f"tick-{at}-1"])  # one per partition
        wait(lambda at=at: job.get_metrics()["stages"].get("per-key", {}).get("watermark", -1)
             >= at,
             "the watermark to move")
        times.append(time.perf_counter() - started)
    now_local, now_spark = engines(job)
    batches = now_local - local + now_spark - spark
    took = job.get_metrics()["batchDurationsMillis"][-batches:] if batches else []
    where = (f"{now_local - local} on the driver, {now_spark - spark} on Spark, each "
             f"{', '.join(str(t) for t in took)} ms (offsets to sink commit)")
    return statistics.median(times), times, where


def cached_run(client: Any, size: int, args: argparse.Namespace) -> dict[str, float]:
    """The trivial job's time and the workers' memory before, while and after N keys are held."""
    tag = f"held-{size}"
    stream = client.get_stream(tag, partitions=2)
    p = Pipeline.create()
    (p.read_from(StreamSource(tag)).with_timestamps(event_time, 0)
     .window(WindowDefinition.tumbling(3_600_000)).group_by(lambda e: e)
     .aggregate(counting()).set_name("per-key").write_to(Pipeline.to_list(f"{tag}-out")))
    settle()
    runs = args.trivial_runs
    row = {"before": trivial_job(client, runs), "mem before": workers_memory()}
    job = client.get_jet().submit(p, JobConfig(
        name=tag, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=args.interval_ms, state_cache_bytes=args.cache_bytes,
    ))
    on_spark = True
    try:
        started = time.monotonic()
        for lo in range(0, size, BUILD_CHUNK):
            stream.publish_all([f"user-{i}" for i in range(lo, min(size, lo + BUILD_CHUNK))])
        wait(lambda: job.get_metrics()["stages"].get("per-key", {}).get("snapshotKeys") == size,
             "the windowed state to be built", poll=0.1)
        print(f"  held:     {size:,} keys of windows built in {time.monotonic() - started:.1f} s")
        settle()
        row["during"] = trivial_job(client, runs)
        row["mem during"] = workers_memory()
        row["watermark step"], steps, where = watermark_steps(job, stream)
        state = job.get_metrics()["stages"].get("per-key", {}).get("snapshotBytes")
        print(f"  watermark steps: {', '.join(f'{t * 1000:.0f}' for t in steps)} ms; "
              f"their micro-batches: {where}; state {state} bytes", flush=True)
        on_spark = engines(job)[1] > 0
    finally:
        if not job.is_terminal():
            job.cancel()
            with contextlib.suppress(JobCancelledError):
                job.join(120)
    from sparkjet.core.state.cache import SWEEP_SECONDS

    if on_spark:  # else no worker held any of the job's state
        time.sleep(2 * SWEEP_SECONDS + 1)  # the workers' sweepers see the job cancelled
    row["after"] = trivial_job(client, runs)
    row["mem after"] = workers_memory()
    return row


def cached_part(client: Any, args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.cached_sizes.split(",") if s]
    if not sizes:
        return
    print(f"\ncached state beside a trivial job: 1-hour tumbling window per key, "
          f"state_cache_bytes {args.cache_bytes:,}")
    for _ in range(3):  # the workers started, the JVM's code warm
        trivial_job(client, args.trivial_runs)
    rows = {size: cached_run(client, size, args) for size in sizes}
    mib = 1 << 20
    smallest = rows[min(rows)]["during"]
    print(f"\n{'keys held':>10}{'trivial job':>13}{'while held':>12}{'ratio':>8}"
          f"{'vs fewest':>11}{'after cancel':>14}{'ratio':>8}"
          f"{'workers MiB before/held/after':>32}")
    for size, row in rows.items():
        print(f"{size:>10,}{row['before'] * 1000:>10.0f} ms{row['during'] * 1000:>9.0f} ms"
              f"{row['during'] / row['before']:>7.2f}x{row['during'] / smallest:>10.2f}x"
              f"{row['after'] * 1000:>11.0f} ms{row['after'] / row['before']:>7.2f}x"
              f"{row['mem before'] / mib:>14.0f} / {row['mem during'] / mib:.0f} / "
              f"{row['mem after'] / mib:.0f}")
    print("(ratio: to the trivial job's time with nothing held; vs fewest: to its time while "
          "the fewest keys were held, which leaves out the running job's own driver work)")
    print(f"\n{'keys held':>10}{'watermark step':>16}{'vs fewest':>11}")
    fewest_step = rows[min(rows)]["watermark step"]
    for size, row in rows.items():
        print(f"{size:>10,}{row['watermark step'] * 1000:>13.0f} ms"
              f"{row['watermark step'] / fewest_step:>10.2f}x")
    print("(watermark step: publish to the watermark shown, one micro-batch whose watermark "
          "moves over every held key while no window closes; with window timers it visits none)")
    under = [size for size in rows if size <= 1_000_000]
    if under:
        row = rows[max(under)]
        print(f"\ntarget: trivial job while {max(under):,} keys are held <= 1.20x: "
              f"{row['during'] / row['before']:.2f}x ({row['during'] / smallest:.2f}x vs "
              f"the fewest held)")


def main() -> None:
    args = parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    engine = {key: value for key, value in (("cold_state_bytes", args.cold_state_bytes),
                                            ("driver_state_bytes", args.driver_state_bytes))
              if value is not None}
    client = connect(args.master, engine)
    if args.skip_increments:
        cached_part(client, args)
        return
    print(f"increments of {args.increment:,} events on random existing keys, "
          f"{args.probes} per size, interval {args.interval_ms} ms, {args.master}")
    results: dict[int, dict[str, float]] = {}
    for size in sizes:
        mine = sparkjet_run(client, size, args)
        row = {"sparkjet": statistics.median(mine)}
        print(f"  sparkjet {size:>9,} keys: median {row['sparkjet']:7.0f} ms  "
              f"({', '.join(f'{t:.0f}' for t in mine)})")
        if not args.skip_native:
            theirs = native_run(client, size, args)
            row["native"] = statistics.median(theirs)
            print(f"  native   {size:>9,} keys: median {row['native']:7.0f} ms  "
                  f"({', '.join(f'{t:.0f}' for t in theirs)})")
        results[size] = row
    base = results[sizes[0]]["sparkjet"]
    print()
    print(f"{'keys of state':>14}{'sparkjet':>12}{'vs smallest':>13}{'native':>10}"
          f"{'vs native':>11}")
    for size in sizes:
        row = results[size]
        native = row.get("native")
        print(f"{size:>14,}{row['sparkjet']:>9.0f} ms{row['sparkjet'] / base:>12.2f}x"
              + (f"{native:>7.0f} ms{row['sparkjet'] / native:>10.2f}x" if native else ""))
    largest = results[sizes[-1]]
    print(f"\ntargets: {sizes[-1]:,} keys / {sizes[0]:,} keys <= 1.50x: "
          f"{largest['sparkjet'] / base:.2f}x; {sizes[-1]:,} keys < 300 ms: "
          f"{largest['sparkjet']:.0f} ms"
          + (f"; sparkjet/native at {sizes[-1]:,} keys <= 1.00x: "
             f"{largest['sparkjet'] / largest['native']:.2f}x" if "native" in largest else ""))
    cached_part(client, args)


if __name__ == "__main__":
    main()
