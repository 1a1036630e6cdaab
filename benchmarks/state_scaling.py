"""State scaling: does a small increment cost the same with 10k, 1M or 5M keys of state?

A rolling count per key (``group_by(key).aggregate(counting())``, EXACTLY_ONCE,
``--interval-ms`` snapshot interval) first builds state holding N keys; then
``--probes`` increments of ``--increment`` events on random existing keys are
published one at a time, each timed from publishing until the job has committed
a micro-batch that covers it. Beside it, in the same process, Spark's native
update-mode ``groupBy().count()`` with the RocksDB state store holding the same
keys, each increment timed from the moment its JSON-lines file is moved in until
the query has processed it.

Target (the durable-state issue): at 5M keys the increment's median latency at
most 1.5x its latency at 10k keys, and no slower than the native query at the
same state size.
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
from typing import Any

from _harness import connect

from sparkjet.aggregate import counting
from sparkjet.errors import JobCancelledError
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource

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
    return parser.parse_args()


def wait(condition: Any, what: str, poll: float = 0.005) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(poll)


def sparkjet_run(client: Any, size: int, args: argparse.Namespace) -> list[float]:
    from sparkjet.core.checkpoint import Checkpoint

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
        print(f"  sparkjet: {size:,} keys built in {time.monotonic() - started:.1f} s")
        rng = random.Random(size)
        times = []
        for _ in range(args.probes):
            time.sleep(args.interval_ms / 1000 * 3)  # idle: one increment, one batch
            events = [rng.randrange(size) for _ in range(args.increment)]
            started = time.monotonic()
            stream.publish_all(events)
            ends = log.end_offsets()
            wait(lambda e=ends: committed_through(e), "an increment to commit")
            times.append((time.monotonic() - started) * 1000)
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


def main() -> None:
    args = parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    client = connect(args.master)
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
    print(f"\ntargets: largest/smallest <= 1.50x: {largest['sparkjet'] / base:.2f}x; "
          + (f"sparkjet/native at {sizes[-1]:,} keys <= 1.00x: "
             f"{largest['sparkjet'] / largest['native']:.2f}x" if "native" in largest else ""))


if __name__ == "__main__":
    main()
