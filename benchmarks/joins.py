"""Hash joins: N events {"id", "k"} enriched from a T-row table (k -> name), batch and stream.

The events' keys cover 110% of the table's (k = id * 7919 mod 1.1 T): about
one event in eleven finds no row, so every contender runs a left outer join
and emits (id, k, name), name None (null) for a miss. Every contender's
joined rows are checked against the expected ones, row for row.

Batch (best of --repeat after a warm-up run each; the same Python lists in):
- sparkjet (adaptive): from_list(events).hash_join(from_list(table),
  JoinClause.on_keys(k, k).projecting(name), (id, k, name)) -> list sink,
  on the embedded local[2] session with [engine] defaults (adaptive on: 1M
  items run on Spark)
- sparkjet driver_only: the same job on a client with [engine] driver_only
- spark sql broadcast join: both lists to DataFrames (pandas columns, Arrow)
  -> events.join(F.broadcast(table), "k", "left") -> write.parquet, all timed
- spark sql, inputs cached in the JVM: the same join over persisted
  DataFrames -> write.parquet (a lower bound: not the same work)

Stream (one long-lived query each: a warm-up, then the throughput phase, then
the latency phase, as stream_rolling.py):
- sparkjet EXACTLY_ONCE: StreamSource (2 partitions) -> hash_join(from_list(table))
  -> list sink, a micro-batch at most every --interval-ms; the table is read
  once, when the job starts
- native structured streaming: readStream.json(folder) -> join(F.broadcast(static
  table, cached), "k", "left") -> writeStream parquet (append; the file sink's
  metadata log makes it exactly-once), processingTime trigger of --interval-ms

Throughput: the events are published while the query runs, in --chunks
chunks as fast as the producer goes (publish_all, pickling inside the timer;
JSON-lines files, encoded before the timer and moved in inside it), timed
from the first publish until the sink holds every row (sparkjet: the list's
size; native: the rows of the batches its progress events report, each one
reported after the file sink committed it). Latency: a probe of --probe-size
events about every --probe-every-ms, timed from publishing until its rows are
in the sink; per-batch figures are the engines' own micro-batch durations.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from _harness import JobContender, NativeContender, connect, measure, percentile, report, wait_for

from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import JoinClause, Pipeline, StreamSource

TARGET_BATCH = 1.0  # sparkjet's throughput / the Spark SQL broadcast join's, at least
TARGET_STREAM = 2.0  # sparkjet's events/s / Structured Streaming's, at least
TIMEOUT = 300.0
#: Stream ids: the throughput phase's events are 0..N-1; the warm-up's and the
#: probes' come from ranges of their own, so the check can pick the phase out.
WARMUP_BASE = 1_000_000_000
PROBE_BASE = 2_000_000_000
#: Sizes per mode; a flag given on the command line wins.
FULL = {"events": 1_000_000, "table": 100_000, "repeat": 3, "chunks": 20, "warmup": 40_000,
        "latency_seconds": 10.0, "probe_every_ms": 500}
QUICK = {"events": 200_000, "table": 20_000, "repeat": 2, "chunks": 10, "warmup": 40_000,
         "latency_seconds": 5.0, "probe_every_ms": 500}
# The test's run: the batch job's 20,000 items are over [engine] local_max_items
# (5,000), so the adaptive job still runs on Spark and its workers load the table;
# so is each half of the stream's warm-up per stream partition (6,000).
TOY = {"events": 20_000, "table": 2_000, "repeat": 1, "chunks": 2, "warmup": 24_000,
       "latency_seconds": 1.0, "probe_every_ms": 250}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true",
                       help=f"smaller: {', '.join(f'{k}={v:,}' for k, v in QUICK.items())}")
    sizes.add_argument("--toy", action="store_true",
                       help="what tests/test_benchmarks.py runs: "
                       f"{', '.join(f'{k}={v:,}' for k, v in TOY.items())}")
    parser.add_argument("--events", type=int, help=f"events, batch and stream "
                        f"(default {FULL['events']:,})")
    parser.add_argument("--stream-events", type=int,
                        help="events of the stream's throughput phase (default --events)")
    parser.add_argument("--table", type=int, help=f"rows of the table (default {FULL['table']:,})")
    parser.add_argument("--repeat", type=int,
                        help=f"timed batch runs per contender (default {FULL['repeat']})")
    parser.add_argument("--chunks", type=int,
                        help=f"publish calls (native: files) of the throughput phase "
                        f"(default {FULL['chunks']})")
    parser.add_argument("--warmup", type=int,
                        help=f"stream warm-up events, in two halves (default {FULL['warmup']:,})")
    parser.add_argument("--latency-seconds", type=float,
                        help=f"length of each latency phase (default {FULL['latency_seconds']})")
    parser.add_argument("--probe-every-ms", type=int,
                        help=f"mean pace of the latency probes, each interval ±25%% "
                        f"(default {FULL['probe_every_ms']})")
    parser.add_argument("--probe-size", type=int, default=100, help="events per latency probe")
    parser.add_argument("--poll-ms", type=int, default=10, help="how often a sink is polled")
    parser.add_argument("--interval-ms", type=int, default=100,
                        help="EXACTLY_ONCE snapshot interval and native processingTime trigger")
    parser.add_argument("--skip-batch", action="store_true", help="run the stream part only")
    parser.add_argument("--skip-stream", action="store_true", help="run the batch part only")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    args = parser.parse_args()
    mode = TOY if args.toy else QUICK if args.quick else FULL
    for key, value in mode.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.stream_events is None:
        args.stream_events = args.events
    return args


# --- the data and the expected rows ------------------------------------------------


def key_of(i: int, table: int) -> int:
    """Event ``i``'s key: spread over 110% of the table's keys, so some events miss."""
    return (i * 7919) % (table * 11 // 10)


def name_of(k: int) -> str:
    return f"name-{k}"


def make_events(start: int, count: int, table: int) -> list[dict[str, int]]:
    return [{"id": i, "k": key_of(i, table)} for i in range(start, start + count)]


def make_table(table: int) -> list[dict[str, Any]]:
    return [{"k": k, "name": name_of(k)} for k in range(table)]


def expected_rows(events: list[dict[str, int]], table: int) -> list[tuple[int, int, str | None]]:
    return [(e["id"], e["k"], name_of(e["k"]) if e["k"] < table else None) for e in events]


def check_rows(label: str, got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    """Every row, once: the same count and the same rows (compared in id order)."""
    assert len(got) == len(want), f"{label}: {len(got):,} rows, not {len(want):,}"
    got_sorted = sorted(got)
    if got_sorted != want:
        wrong = next(i for i, (a, b) in enumerate(zip(got_sorted, want, strict=True)) if a != b)
        raise AssertionError(f"{label}: row {wrong} is {got_sorted[wrong]}, not {want[wrong]}")


def join_pipeline(events: Any, table_rows: list[dict[str, Any]], sink: str) -> Pipeline:
    """``events`` (a source) hash-joined against the table (a list source) into list ``sink``."""
    p = Pipeline.create()
    table = p.read_from(Pipeline.from_list("table", table_rows)).set_name("table")
    (p.read_from(events).set_name("events")
     .hash_join(table, JoinClause.on_keys(lambda e: e["k"], lambda r: r["k"])
                .projecting(lambda r: r["name"]),
                lambda e, name: (e["id"], e["k"], name)).set_name("enrich")
     .write_to(Pipeline.to_list(sink)))
    return p


def read_parquet_rows(folder: str) -> list[tuple[Any, ...]]:
    """The (id, k, name) rows of a Parquet folder (pyarrow skips ``_`` and ``.`` entries)."""
    import pyarrow.dataset as ds

    table = ds.dataset(folder, format="parquet").to_table(columns=["id", "k", "name"])
    return list(zip(*(table.column(c).to_pylist() for c in ("id", "k", "name")), strict=True))


# --- batch ---------------------------------------------------------------------------


def run_batch(client: Any, args: argparse.Namespace) -> dict[str, float]:
    import pandas as pd
    from pyspark.sql import functions as F

    import sparkjet

    spark = client.spark
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    data = make_events(0, args.events, args.table)
    table = make_table(args.table)
    want = expected_rows(data, args.table)
    misses = sum(1 for row in want if row[2] is None)
    print(f"\n=== batch: {args.events:,} events x a {args.table:,}-row table "
          f"({misses:,} events find no row), on {args.master}, Spark {spark.version}")

    driver_only = sparkjet.connect(store={"url": tempfile.mkdtemp(prefix="sparkjet-bench-")},
                                   engine={"driver_only": True})
    out_dir = tempfile.mkdtemp(prefix="sparkjet-bench-joins-parquet-")

    def sparkjet_job(on: Any) -> Callable[[], Any]:
        def run() -> Any:
            on.get_list("joined").clear()
            job = on.get_jet().submit(join_pipeline(Pipeline.from_list("events", data), table,
                                                    "joined"), JobConfig())
            job.join()
            return job
        return run

    def sql_frames() -> tuple[Any, Any]:
        events = spark.createDataFrame(
            pd.DataFrame({"id": [e["id"] for e in data], "k": [e["k"] for e in data]}),
            "id long, k long")
        names = spark.createDataFrame(
            pd.DataFrame({"k": [r["k"] for r in table], "name": [r["name"] for r in table]}),
            "k long, name string")
        return events, names

    def sql_join(events: Any, names: Any) -> None:
        (events.join(F.broadcast(names), "k", "left").select("id", "k", "name")
         .write.mode("overwrite").parquet(out_dir))

    def sql() -> None:
        sql_join(*sql_frames())

    timings: dict[str, float] = {}
    try:
        timings["sparkjet"], job = measure(
            "sparkjet (adaptive), list sink", sparkjet_job(client), args.repeat)
        stages = job.get_metrics()["stages"]
        check_rows("sparkjet (adaptive)", client.get_list("joined").get_all(), want)
        assert stages["enrich"]["emittedCount"] == args.events, stages

        timings["sparkjet driver_only"], _ = measure(
            "sparkjet driver_only, list sink", sparkjet_job(driver_only), args.repeat)
        check_rows("sparkjet driver_only", driver_only.get_list("joined").get_all(), want)

        timings["spark sql broadcast join"], _ = measure(
            "spark sql broadcast join -> parquet", sql, args.repeat)
        check_rows("spark sql broadcast join", read_parquet_rows(out_dir), want)

        events, names = sql_frames()
        events, names = events.persist(), names.persist()
        events.count()
        names.count()
        try:
            timings["spark sql, inputs cached"], _ = measure(
                "spark sql, inputs cached -> parquet", lambda: sql_join(events, names),
                args.repeat)
            check_rows("spark sql, inputs cached", read_parquet_rows(out_dir), want)
        finally:
            events.unpersist()
            names.unpersist()
        plan = events.join(F.broadcast(names), "k", "left")._jdf.queryExecution()
        assert "BroadcastHashJoin" in plan.executedPlan().toString(), "not a broadcast join"
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)

    report(args.events, timings)
    print("(sparkjet: adaptive, the [engine] default; spark sql, inputs cached: the events and "
          "the table already in the JVM, a lower bound that skips getting the Python lists in)")
    print("checked: every contender's joined rows equal the expected ones (count and every row)")
    return timings


# --- stream --------------------------------------------------------------------------


class SparkjetJoin(JobContender):
    def __init__(self, client: Any, table: list[dict[str, Any]], interval_ms: int) -> None:
        super().__init__(client, "sparkjet EXACTLY_ONCE",
                         client.get_stream("join-events", partitions=2))
        self.table = table
        self.interval_ms = interval_ms
        self.sink = client.get_list("stream-joined")

    def start(self) -> None:
        self.sink.clear()
        self.submit(join_pipeline(StreamSource(self.stream.name), self.table, self.sink.name),
                    JobConfig(name="stream-join",
                              processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                              snapshot_interval_millis=self.interval_ms))

    def rows(self) -> int:
        return int(self.sink.size())

    def output(self) -> list[tuple[Any, ...]]:
        return list(self.sink.get_all())


class NativeJoin(NativeContender):
    def __init__(self, client: Any, table: list[dict[str, Any]], interval_ms: int) -> None:
        super().__init__(client, "sparkjet-bench-joins-native-")
        self.table = table
        self.interval_ms = interval_ms
        self.out = os.path.join(self.input.root, "out")
        self._lock = threading.Lock()
        self._rows = 0
        self._durations: list[int] = []
        self._listener: Any = None
        self._static: Any = None

    def start(self) -> None:
        import pandas as pd
        from pyspark.sql import functions as F
        from pyspark.sql.streaming.listener import StreamingQueryListener

        contender = self

        class Progress(StreamingQueryListener):
            """Counts the rows of every batch the query reports (after its sink commit)."""

            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                progress = event.progress
                if contender.query is None or str(progress.id) != str(contender.query.id):
                    return
                if progress.numInputRows:
                    with contender._lock:
                        contender._rows += int(progress.numInputRows)
                        contender._durations.append(int(progress.batchDuration))
                        contender.calls += 1

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        self._listener = Progress()
        self.spark.streams.addListener(self._listener)
        self.spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
        # The static side read once, as sparkjet reads its build side once per run.
        self._static = self.spark.createDataFrame(
            pd.DataFrame({"k": [r["k"] for r in self.table],
                          "name": [r["name"] for r in self.table]}),
            "k long, name string").persist()
        self._static.count()
        joined = (self.spark.readStream.schema("id LONG, k LONG").json(self.input.folder)
                  .join(F.broadcast(self._static), "k", "left").select("id", "k", "name"))
        self.query = (joined.writeStream.format("parquet").outputMode("append")
                      .option("path", self.out).option("checkpointLocation", self.checkpoint)
                      .trigger(processingTime=f"{self.interval_ms} milliseconds").start())

    def rows(self) -> int:
        with self._lock:
            return self._rows

    def batch_millis(self) -> list[int]:
        with self._lock:
            return list(self._durations)

    def output(self) -> list[tuple[Any, ...]]:
        return read_parquet_rows(self.out)

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self._listener is not None:
                self.spark.streams.removeListener(self._listener)
            if self._static is not None:
                self._static.unpersist()


StreamContender = SparkjetJoin | NativeJoin


def engines(contender: StreamContender) -> tuple[int, int]:
    """sparkjet's micro-batches so far on the driver and on Spark (native's: all on Spark)."""
    return contender.engines() if isinstance(contender, JobContender) else (0, 0)


def run_stream(contender: StreamContender, args: argparse.Namespace) -> dict[str, Any]:
    poll = args.poll_ms / 1000
    n, table = args.stream_events, args.table
    print(f"\n{contender.label}", flush=True)
    started = time.perf_counter()
    contender.start()
    print(f"  started in {time.perf_counter() - started:.3f} s", flush=True)
    expected = 0
    try:
        # Warm-up, two micro-batches: JIT, Python workers, the table loaded in each.
        warm = make_events(WARMUP_BASE, args.warmup, table)
        started = time.perf_counter()
        for half in (warm[: args.warmup // 2], warm[args.warmup // 2 :]):
            expected += len(half)
            contender.publish(contender.encode(half))
            wait_for(contender, lambda want=expected: contender.rows() >= want, "the warm-up",
                     timeout=TIMEOUT, pause=poll)
        print(f"  warm-up ({args.warmup:,} events)        {time.perf_counter() - started:7.3f} s",
              flush=True)

        # Throughput: every event published as fast as the producer goes.
        events = make_events(0, n, table)
        size = -(-n // args.chunks)
        chunks = [contender.encode(events[i : i + size]) for i in range(0, n, size)]
        expected += n
        batches_before = contender.batches()
        durations_before = len(contender.batch_millis())
        engines_before = engines(contender)
        started = time.perf_counter()
        for chunk in chunks:
            contender.publish(chunk)
        published = time.perf_counter()
        done = wait_for(contender, lambda: contender.rows() >= expected, "every event",
                        timeout=TIMEOUT, pause=poll)
        seconds = done - started
        batches = contender.batches() - batches_before
        durations = contender.batch_millis()
        # sparkjet's list holds the last 100 batches' durations; native's holds all.
        through = durations[durations_before:] if isinstance(contender, NativeJoin) \
            else durations[-batches:]
        rate = n / seconds
        print(f"  throughput: {n:,} events in {seconds:.3f} s = {rate / 1e3:,.1f}k events/s "
              f"({batches} micro-batches, median {statistics.median(through):.0f} ms, "
              f"max {max(through)} ms; publishing took {published - started:.3f} s)", flush=True)
        if isinstance(contender, JobContender):
            local, spark = (a - b for a, b in zip(engines(contender), engines_before, strict=True))
            print(f"  engines: {local} of them on the driver, {spark} on Spark", flush=True)

        # Latency: steady probes of probe_size events, each timed until its rows are out.
        latencies: list[float] = []
        every = args.probe_every_ms / 1000
        probes = max(1, int(args.latency_seconds / every))
        jitter = random.Random(7)  # a steady pace (±25%), not locked to a trigger's phase
        batches_before = contender.batches()
        pending: list[tuple[int, float]] = []  # (rows the sink holds once it is out, sent at)
        due = begin = time.perf_counter()
        j = 0
        while j < probes or pending:
            now = time.perf_counter()
            if j < probes and now >= due:
                due += every * jitter.uniform(0.75, 1.25)
                probe = make_events(PROBE_BASE + j * args.probe_size, args.probe_size, table)
                payload = contender.encode(probe)
                expected += args.probe_size
                pending.append((expected, time.perf_counter()))
                contender.publish(payload)
                j += 1
            contender.check()
            rows = contender.rows()
            while pending and rows >= pending[0][0]:
                latencies.append(time.perf_counter() - pending.pop(0)[1])
            if now - begin > args.latency_seconds + TIMEOUT:
                raise TimeoutError(f"{contender.label}: probes never arrived")
            time.sleep(poll)
        batches = contender.batches() - batches_before
        in_latency = contender.batch_millis()[-batches:] if batches else [0]
        median = statistics.median(latencies) * 1000
        p90 = percentile(latencies, 0.9) * 1000
        print(f"  latency: {len(latencies)} probes of {args.probe_size} events every "
              f"{args.probe_every_ms} ms: median {median:.0f} ms, p90 {p90:.0f} ms "
              f"({batches} micro-batches, median batch {statistics.median(in_latency):.0f} ms)",
              flush=True)
        if isinstance(contender, JobContender):
            local, spark = contender.engines()
            print(f"  engines: {local} micro-batches on the driver, {spark} on Spark "
                  f"(all phases)", flush=True)

        # Exactly once: every event's row, once, and the throughput phase's rows as expected.
        time.sleep(max(0.5, 3 * args.interval_ms / 1000))  # a late duplicate would show now
        contender.check()
        got = contender.output()
        assert len(got) == expected, f"{contender.label}: {len(got):,} rows, not {expected:,}"
        check_rows(contender.label, [r for r in got if r[0] < WARMUP_BASE],
                   expected_rows(events, table))
        return {"rate": rate, "batch_ms": statistics.median(through),
                "median": median, "p90": p90, "batch_latency_ms": statistics.median(in_latency)}
    finally:
        contender.stop()


def run_streams(client: Any, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    table = make_table(args.table)
    print(f"\n=== stream: {args.stream_events:,} events (throughput phase, published while "
          f"the query runs, in {args.chunks} chunks) x a {args.table:,}-row table; "
          f"EXACTLY_ONCE snapshot interval and native trigger {args.interval_ms} ms")
    results = {}
    for contender in (SparkjetJoin(client, table, args.interval_ms),
                      NativeJoin(client, table, args.interval_ms)):
        results[contender.label] = run_stream(contender, args)

    native = results["native structured streaming"]
    print()
    print(f"{'contender':<30}{'events/s':>11}{'vs native':>11}{'batch':>9}"
          f"{'latency p50':>13}{'p90':>9}{'vs native':>11}{'batch':>9}")
    for label, r in results.items():
        print(f"{label:<30}{r['rate'] / 1e3:>10,.1f}k{r['rate'] / native['rate']:>10.2f}x"
              f"{r['batch_ms']:>6.0f} ms{r['median']:>10.0f} ms{r['p90']:>6.0f} ms"
              f"{r['median'] / native['median']:>10.2f}x{r['batch_latency_ms']:>6.0f} ms")
    print("\n(events/s vs native: above 1.00x is faster; latency vs native: below 1.00x is "
          "faster; batch: median micro-batch duration, in the throughput phase, then in the "
          "latency phase)")
    print("checked: each sink holds every event's row exactly once, and the throughput "
          "phase's rows equal the expected ones")
    return results


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    args = parse_args()
    client = connect(args.master)
    print(f"hash join benchmark on {args.master}, Spark {client.spark.version}, "
          f"{os.cpu_count()} cores, load average {load()}")
    lines = []
    if not args.skip_batch:
        timings = run_batch(client, args)
        ratio = timings["spark sql broadcast join"] / timings["sparkjet"]
        lines.append(f"  batch: sparkjet (adaptive) / spark sql broadcast join throughput "
                     f"{ratio:.2f}x, goal >= {TARGET_BATCH:.2f}x: "
                     f"{'met' if ratio >= TARGET_BATCH else 'MISSED'}")
    if not args.skip_stream:
        results = run_streams(client, args)
        ratio = results["sparkjet EXACTLY_ONCE"]["rate"] / \
            results["native structured streaming"]["rate"]
        lines.append(f"  stream: sparkjet EXACTLY_ONCE / structured streaming events/s "
                     f"{ratio:.2f}x, goal >= {TARGET_STREAM:.2f}x: "
                     f"{'met' if ratio >= TARGET_STREAM else 'MISSED'}")
    print(f"\nload average at the end {load()} (other processes share the cores)")
    print("\ngoals:")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
