"""Stream-stream interval join: two timestamped streams of N events, pairs by key within [0, 5] ms.

Left event i is {"id": i, "k": i % K, "ts": S + i}, right event i is
{"id": i, "k": i % K, "ts": S + i + 3} (S: where the throughput phase's event
time starts, 10 lags after the warm-up's, which starts at EPOCH_MS); a pair
is left at t, right at t2 with t + 0 <= t2 <= t + 5, so with K > 5 left i
pairs with right i alone. With --hows left, every tenth right event
(i % 10 == 0) is left out, so those left events pair with nothing and give a
left outer row (i, None) once the watermark passes t + 5. Every contender's
output is checked against a plain-Python count of the pairs (a hash join of
the same events).

Contenders, one long-lived query each, per join mode:

- sparkjet EXACTLY_ONCE: two 2-partition streams -> with_timestamps(ts,
  --lag-ms) -> group_by(k).interval_join(group_by(k), 0, 5, (lid, rid),
  how) -> a list sink, a micro-batch at most every --interval-ms;
- native Structured Streaming: two folders of JSON-lines files -> two
  readStream.json sources -> ts to a timestamp with F.timestamp_millis (exact;
  a cast of ts / 1000 goes through a double: in a batch check with event times
  from 0 it lost 2,463 of 400,000 pairs at the bounds) -> withWatermark(--lag-ms) on
  both -> join on lk = rk AND rts BETWEEN lts + INTERVAL 0 MILLISECONDS AND
  lts + INTERVAL 5 MILLISECONDS (inner or leftOuter) -> foreachBatch counting
  the batch's rows in one aggregate (rows, outer rows, rows with lid = rid, the
  sum of lid); RocksDB state store, spark.sql.shuffle.partitions = Spark's
  parallelism (sparkjet's state shards), a processingTime trigger of
  --interval-ms.

Phases, per contender and mode: a warm-up (--warmup events per side, every
one paired, on Spark) then the throughput phase: both inputs published as
fast as the producer goes, in --chunks chunks each (left chunk, right chunk,
...), then a closing event far ahead in event time on every partition of both
streams (the left ones at T, the right ones at T + 1000: they pair with
nothing), timed from the first publish until the sink holds every pair and
outer row. sparkjet's publish_all pickles inside the timer; native's JSON
lines are encoded before it (which favours native). Throughput is events/s
over both inputs (left and right events / seconds).

State: the most either contender held while the phase ran, polled
(sparkjet: the join stage's snapshotKeys / snapshotBytes, one key per join
key held; native: stateOperators numRowsTotal / memoryUsedBytes over its
progresses, one row per buffered event plus one per key and side), and what
is left once the closing watermark has passed every bound: for sparkjet that
should be the closing key alone.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections import Counter
from datetime import datetime
from typing import Any

from _harness import JobContender, JsonLinesFolder, NativeContender, connect, wait_for

from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource

TARGET = 2.0  # sparkjet's events/s / Structured Streaming's, at least
TIMEOUT = 600.0
LOWER, UPPER = 0, 5  # ms: a pair is left at t, right at t2, t + LOWER <= t2 <= t + UPPER
SKEW = 3  # ms: right i is 3 ms after left i
OMIT_EVERY = 10  # with how="left": right i left out when i % OMIT_EVERY == 0
CLOSE_KEY = -1  # the closing events' key: no data event has it
CLOSE_GAP = 1000  # ms between the left and the right closing events: they never pair
WARMUP_BASE = 1_000_000_000  # the warm-up's ids, apart from the throughput phase's
#: Where event time starts (2023-11-14): Spark drops an event at the epoch itself as
#: late in the first micro-batch (its watermark is 0 there, and late is "<= watermark").
EPOCH_MS = 1_700_000_000_000
PARTITIONS = 2
#: Sizes per mode; a flag given on the command line wins.
FULL = {"n": 300_000, "keys": 10_000, "chunks": 20, "warmup": 20_000, "warmup_rounds": 2,
        "hows": "inner,left"}
QUICK = {"n": 100_000, "keys": 10_000, "chunks": 10, "warmup": 20_000, "warmup_rounds": 2,
         "hows": "inner,left"}
# The test's run, under 40 s: no warm-up (Structured Streaming's first micro-batch
# alone takes 3-8 s here), the inner join alone.
TOY = {"n": 2_000, "keys": 200, "chunks": 2, "warmup": 0, "warmup_rounds": 1, "hows": "inner"}


def _sizes(mode: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in mode.items())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true",
                       help=f"smaller: {_sizes(QUICK)}")
    sizes.add_argument("--toy", action="store_true",
                       help="what tests/test_benchmarks.py runs: "
                       f"{_sizes(TOY)}")
    parser.add_argument("-n", type=int, help=f"events per input in the throughput phase "
                        f"(default {FULL['n']:,})")
    parser.add_argument("--keys", type=int, help=f"distinct keys (default {FULL['keys']:,})")
    parser.add_argument("--chunks", type=int, help=f"publish calls (native: files) per input "
                        f"in the throughput phase (default {FULL['chunks']})")
    parser.add_argument("--warmup", type=int,
                        help=f"warm-up events per input (default {FULL['warmup']:,})")
    parser.add_argument("--warmup-rounds", type=int,
                        help=f"micro-batches the warm-up is published in, one after the other "
                        f"(default {FULL['warmup_rounds']})")
    parser.add_argument("--hows", help=f"join modes to run, of inner,left (default "
                        f"{FULL['hows']})")
    parser.add_argument("--lag-ms", type=int, default=1000,
                        help="allowed lag (sparkjet) and watermark delay (native) of both inputs")
    parser.add_argument("--interval-ms", type=int, default=100,
                        help="EXACTLY_ONCE snapshot interval and native processingTime trigger")
    parser.add_argument("--poll-ms", type=int, default=20,
                        help="how often the sink and the state are polled")
    parser.add_argument("--skip-native", action="store_true", help="run sparkjet alone")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    args = parser.parse_args()
    mode = TOY if args.toy else QUICK if args.quick else FULL
    for key, value in mode.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    assert args.keys > UPPER - LOWER + SKEW, "with so few keys an event pairs with several"
    for how in args.hows.split(","):
        assert how in ("inner", "left"), f"--hows: {how!r} is not inner or left"
    return args


# --- the data and the oracle ---------------------------------------------------------


def make_events(base: int, n: int, keys: int, start: int, how: str, omit: bool
                ) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """``n`` left and right events with ids from ``base``, event time from ``start``."""
    lefts = [{"id": base + i, "k": i % keys, "ts": start + i} for i in range(n)]
    rights = [{"id": base + i, "k": i % keys, "ts": start + i + SKEW} for i in range(n)
              if not (omit and how == "left" and i % OMIT_EVERY == 0)]
    return lefts, rights


def oracle(lefts: list[dict[str, int]], rights: list[dict[str, int]], how: str
           ) -> Counter[tuple[int, int | None]]:
    """``(left id, right id or None) -> times``: a plain-Python hash join on k, then the bounds."""
    by_key: dict[int, list[dict[str, int]]] = {}
    for r in rights:
        by_key.setdefault(r["k"], []).append(r)
    out: Counter[tuple[int, int | None]] = Counter()
    for left in lefts:
        t = left["ts"]
        found = False
        for r in by_key.get(left["k"], ()):
            if t + LOWER <= r["ts"] <= t + UPPER:
                out[(left["id"], r["id"])] += 1
                found = True
        if not found and how == "left":
            out[(left["id"], None)] += 1
    return out


def closing(at: int) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """One far-future event per partition of each input; left and right never pair."""
    return ([{"id": -1, "k": CLOSE_KEY, "ts": at}] * PARTITIONS,
            [{"id": -1, "k": CLOSE_KEY, "ts": at + CLOSE_GAP}] * PARTITIONS)


def left_key(e: dict[str, int]) -> int:
    return e["k"]


def event_time(e: dict[str, int]) -> int:
    return e["ts"]


def ids(left: Any, right: Any) -> tuple[int, int | None]:
    return (left["id"], None if right is None else right["id"])


# --- the contenders ------------------------------------------------------------------


class SparkjetJoin(JobContender):
    """A sparkjet job joining two streams; :meth:`publish` takes ``(left, right)``."""

    def __init__(self, client: Any, how: str, args: argparse.Namespace) -> None:
        super().__init__(client, "sparkjet EXACTLY_ONCE",
                         client.get_stream(f"ij-left-{how}", partitions=PARTITIONS))
        self.right = client.get_stream(f"ij-right-{how}", partitions=PARTITIONS)
        self.sink = client.get_list(f"ij-joined-{how}")
        self.sink.clear()
        self.how, self.args = how, args

    def start(self) -> None:
        lag = self.args.lag_ms
        p = Pipeline.create()
        left = (p.read_from(StreamSource(self.stream.name)).set_name("left")
                .with_timestamps(event_time, allowed_lag_ms=lag))
        right = (p.read_from(StreamSource(self.right.name)).set_name("right")
                 .with_timestamps(event_time, allowed_lag_ms=lag))
        (left.group_by(left_key)
         .interval_join(right.group_by(left_key), LOWER, UPPER, ids, how=self.how)
         .set_name("interval-join")
         .write_to(Pipeline.to_list(self.sink.name)))
        self.submit(p, JobConfig(
            name=f"interval-join-{self.how}",
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_millis=self.args.interval_ms))

    def publish(self, payload: Any) -> None:
        left, right = payload
        if left:
            self.stream.publish_all(left)
        if right:
            self.right.publish_all(right)

    def rows(self) -> int:
        return int(self.sink.size())

    def output(self) -> list[tuple[int, int | None]]:
        return list(self.sink.get_all())

    def stage(self) -> dict[str, Any]:
        return dict(self.job.get_metrics()["stages"].get("interval-join", {}))

    def state(self) -> tuple[int, int]:
        stage = self.stage()
        return int(stage.get("snapshotKeys", 0)), int(stage.get("snapshotBytes", 0))


class NativeJoin(NativeContender):
    """Structured Streaming's stream-stream join of two JSON-lines folders."""

    def __init__(self, client: Any, how: str, args: argparse.Namespace) -> None:
        super().__init__(client, "sparkjet-bench-interval-join-")
        self.right = JsonLinesFolder("sparkjet-bench-interval-join-right-")
        self.how, self.args = how, args
        self._lock = threading.Lock()
        # rows, outer rows (rid null), rows with lid = rid, sum of lid: over the real ids
        self.counts = [0, 0, 0, 0]

    def encode(self, events: Any) -> Any:
        left, right = events
        return (self.input.encode(left) if left else b"",
                self.right.encode(right) if right else b"")

    def publish(self, payload: Any) -> None:
        left, right = payload
        if left:
            self.input.publish(left)
        if right:
            self.right.publish(right)

    def start(self) -> None:
        from pyspark.sql import functions as F

        self.shuffle_per_core()
        self.spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                            "org.apache.spark.sql.execution.streaming.state."
                            "RocksDBStateStoreProvider")
        lag = f"{self.args.lag_ms} milliseconds"
        contender = self

        def side(folder: str, prefix: str) -> Any:
            return (self.spark.readStream.schema("id LONG, k LONG, ts LONG").json(folder)
                    .select(F.col("id").alias(f"{prefix}id"), F.col("k").alias(f"{prefix}k"),
                            F.timestamp_millis("ts").alias(f"{prefix}ts"))
                    .withWatermark(f"{prefix}ts", lag))

        def count(batch: Any, batch_id: int) -> None:
            real = F.col("lid") >= 0
            row = batch.agg(
                F.count(F.when(real, 1)).alias("rows"),
                F.count(F.when(real & F.col("rid").isNull(), 1)).alias("outer"),
                F.count(F.when(real & (F.col("lid") == F.col("rid")), 1)).alias("same"),
                F.sum(F.when(real, F.col("lid"))).alias("lids"),
            ).collect()[0]
            with contender._lock:
                for i, name in enumerate(("rows", "outer", "same", "lids")):
                    contender.counts[i] += int(row[name] or 0)
                contender.calls += 1

        condition = F.expr(f"lk = rk AND rts BETWEEN lts + INTERVAL {LOWER} MILLISECONDS "
                           f"AND lts + INTERVAL {UPPER} MILLISECONDS")
        joined = (side(self.input.folder, "l")
                  .join(side(self.right.folder, "r"), condition,
                        "inner" if self.how == "inner" else "leftOuter")
                  .select("lid", "rid"))
        self.query = (joined.writeStream.outputMode("append").foreachBatch(count)
                      .trigger(processingTime=f"{self.args.interval_ms} milliseconds")
                      .option("checkpointLocation", self.checkpoint).start())

    def rows(self) -> int:
        with self._lock:
            return self.counts[0]

    def batches(self) -> int:
        with self._lock:
            return self.calls

    @staticmethod
    def _state(progress: Any) -> tuple[int, int]:
        ops = (progress or {}).get("stateOperators", [])
        return (sum(int(op["numRowsTotal"]) for op in ops),
                sum(int(op["memoryUsedBytes"]) for op in ops))

    def state(self) -> tuple[int, int]:
        return self._state(self.query.lastProgress)

    def recent_states(self, from_batch: int) -> list[tuple[int, int]]:
        """The state of every recent progress from micro-batch ``from_batch`` on."""
        return [self._state(p) for p in self.query.recentProgress
                if int(p["batchId"]) >= from_batch]

    def watermark(self) -> int:
        """The event-time watermark (ms) of the last progress's micro-batch, -1 before one."""
        progress = self.query.lastProgress
        mark = ((progress or {}).get("eventTime") or {}).get("watermark")
        if not mark:
            return -1
        return int(datetime.fromisoformat(mark).timestamp() * 1000)

    def batch_millis(self, first: int, count: int) -> list[int]:
        """Durations of micro-batches ``first`` to ``first + count - 1``."""
        return [int(p["batchDuration"]) for p in self.query.recentProgress
                if first <= int(p["batchId"]) < first + count]

    def last_batch(self) -> int:
        progress = self.query.lastProgress
        return int(progress["batchId"]) if progress else -1

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.right.remove()


StreamContender = SparkjetJoin | NativeJoin


def wait_rows(contender: StreamContender, want: int, what: str, args: argparse.Namespace,
              sample: Any = None) -> float:
    return wait_for(contender, lambda: contender.rows() >= want, what, timeout=TIMEOUT,
                    pause=args.poll_ms / 1000, sample=sample)


def run(contender: StreamContender, how: str, args: argparse.Namespace) -> dict[str, Any]:
    n, keys = args.n, args.keys
    print(f"\n{contender.label}", flush=True)
    started = time.perf_counter()
    contender.start()
    print(f"  started in {time.perf_counter() - started:.3f} s", flush=True)
    try:
        # Warm-up: every left event paired (none left out), in rounds, on Spark.
        warm_l, warm_r = make_events(WARMUP_BASE, args.warmup, keys, EPOCH_MS, how, omit=False)
        size = max(1, -(-args.warmup // args.warmup_rounds))
        expected = 0
        started = time.perf_counter()
        for i in range(0, args.warmup, size):
            expected += len(warm_l[i:i + size])
            contender.publish(contender.encode((warm_l[i:i + size], warm_r[i:i + size])))
            wait_rows(contender, expected, "the warm-up's pairs", args)
        if args.warmup:
            print(f"  warm-up ({args.warmup:,} events per input, {args.warmup_rounds} rounds) "
                  f"{time.perf_counter() - started:.3f} s", flush=True)
        before = contender.rows()
        assert before == args.warmup, f"{contender.label}: warm-up gave {before:,} rows"

        # Throughput: both inputs, chunk by chunk, then the closing events.
        start = EPOCH_MS + args.warmup + 10 * args.lag_ms
        lefts, rights = make_events(0, n, keys, start, how, omit=True)
        want = oracle(lefts, rights, how)
        step = -(-n // args.chunks)
        rstep = -(-len(rights) // args.chunks)
        chunks = [contender.encode((lefts[i * step:(i + 1) * step],
                                    rights[i * rstep:(i + 1) * rstep]))
                  for i in range(args.chunks)]
        close_at = start + n + 10 * args.lag_ms
        close = contender.encode(closing(close_at))
        expected = before + sum(want.values())
        batches_before = contender.batches()
        native_from = contender.last_batch() + 1 if isinstance(contender, NativeJoin) else 0
        peak = [0, 0]

        def sample() -> None:
            rows, size = contender.state()
            peak[0], peak[1] = max(peak[0], rows), max(peak[1], size)

        started = time.perf_counter()
        for chunk in chunks:
            contender.publish(chunk)
        contender.publish(close)
        published = time.perf_counter()
        done = wait_rows(contender, expected, f"{expected - before:,} rows", args, sample)
        seconds = done - started
        batches = contender.batches() - batches_before
        rate = (n + len(rights)) / seconds
        if isinstance(contender, SparkjetJoin):  # the last 100 batches' durations
            durations = contender.batch_millis()[-batches:] if batches else []

        # What is left once the closing watermark has passed every bound.
        if isinstance(contender, SparkjetJoin):
            wait_for(contender, lambda: contender.state()[0] == 1,
                     "the join to hold the closing key alone", timeout=120,
                     pause=args.poll_ms / 1000, sample=sample)
            after = contender.state()
            late = int(contender.stage().get("lateEventsDropped", 0))
            assert late == 0, f"{contender.label}: {late} late events dropped"
            local, spark = contender.engines()
        else:
            # Spark evicts in the micro-batch after the one whose input moved the
            # watermark (a no-data batch), whose progress reports that watermark.
            wait_for(contender, lambda: contender.watermark() >= close_at - args.lag_ms,
                     "the closing watermark's micro-batch", timeout=120,
                     pause=args.poll_ms / 1000, sample=sample)
            after = contender.state()
            durations = contender.batch_millis(native_from, batches)
            for rows, size in contender.recent_states(native_from):
                peak[0], peak[1] = max(peak[0], rows), max(peak[1], size)

        # Check against the oracle (sparkjet: every row; native: its counts).
        outer = sum(c for (_l, r), c in want.items() if r is None)
        pairs = sum(want.values()) - outer
        time.sleep(max(0.5, 3 * args.interval_ms / 1000))  # a late duplicate would show now
        contender.check()
        if isinstance(contender, SparkjetJoin):
            got = Counter(r for r in contender.output() if 0 <= r[0] < WARMUP_BASE)
            assert got == want, (f"{contender.label}: {sum(got.values()):,} rows, "
                                 f"{len(got - want):,} unexpected, {len(want - got):,} missing")
            got_pairs = sum(c for (_l, r), c in got.items() if r is not None)
            got_outer = sum(got.values()) - got_pairs
        else:
            with contender._lock:
                rows, got_outer, same, lids = (a - b for a, b in zip(
                    contender.counts, [before, 0, before, sum(range(WARMUP_BASE,
                                                                    WARMUP_BASE + before))],
                    strict=True))
            got_pairs = rows - got_outer
            want_lids = sum(lid * c for (lid, _r), c in want.items())
            want_same = sum(c for (lid, r), c in want.items() if lid == r)
            assert (got_pairs, got_outer, same, lids) == (pairs, outer, want_same, want_lids), \
                (f"{contender.label}: {got_pairs:,} pairs, {got_outer:,} outer rows, {same:,} "
                 f"with lid = rid, sum of lid {lids:,}; the oracle: {pairs:,}, {outer:,}, "
                 f"{want_same:,}, {want_lids:,}")
        print(f"  throughput: {n:,} + {len(rights):,} events in {seconds:.3f} s = "
              f"{rate / 1e3:,.1f}k events/s ({batches} micro-batches: "
              f"{', '.join(f'{d:,}' for d in durations)} ms; publishing took "
              f"{published - started:.3f} s); {got_pairs:,} pairs, {got_outer:,} outer rows",
              flush=True)
        unit = "keys" if isinstance(contender, SparkjetJoin) else "rows"
        print(f"  state: at most {peak[0]:,} {unit}, {peak[1] / 1e6:.2f} MB; after the closing "
              f"watermark {after[0]:,} {unit}, {after[1] / 1e6:.2f} MB", flush=True)
        if isinstance(contender, SparkjetJoin):
            print(f"  engines (all phases): {local} micro-batches on the driver, {spark} on "
                  f"Spark; late events dropped: {late}", flush=True)
        return {"rate": rate, "batches": batches, "peak": peak, "after": after, "unit": unit,
                "pairs": got_pairs, "outer": got_outer, "want": (pairs, outer)}
    finally:
        contender.stop()


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    args = parse_args()
    client = connect(args.master)
    print(f"interval join benchmark: {args.n:,} events per input ({args.keys:,} keys, right "
          f"{SKEW} ms after left, bounds [{LOWER}, {UPPER}] ms, lag {args.lag_ms} ms, "
          f"{args.chunks} chunks per input), on {args.master}, Spark {client.spark.version}, "
          f"{os.cpu_count()} cores, load average {load()}; EXACTLY_ONCE snapshot interval and "
          f"native trigger {args.interval_ms} ms")
    table = []
    for how in args.hows.split(","):
        print(f"\n=== how={how!r}" + (f" (right i left out when i % {OMIT_EVERY} == 0)"
                                     if how == "left" else ""))
        results = {"sparkjet EXACTLY_ONCE": run(SparkjetJoin(client, how, args), how, args)}
        if not args.skip_native:
            results["native structured streaming"] = run(NativeJoin(client, how, args), how,
                                                         args)
        table.append((how, results))

    print()
    print(f"{'how':<7}{'contender':<30}{'events/s':>11}{'vs native':>11}{'batches':>9}"
          f"{'peak state':>16}{'MB':>8}{'after':>12}{'pairs':>10}{'outer':>8}")
    lines = []
    for how, results in table:
        native = results.get("native structured streaming")
        for label, r in results.items():
            vs = f"{r['rate'] / native['rate']:>10.2f}x" if native else f"{'-':>11}"
            print(f"{how:<7}{label:<30}{r['rate'] / 1e3:>10,.1f}k{vs}{r['batches']:>9}"
                  f"{r['peak'][0]:>11,} {r['unit']:<4}{r['peak'][1] / 1e6:>8.2f}"
                  f"{r['after'][0]:>7,} {r['unit']:<4}{r['pairs']:>10,}{r['outer']:>8,}")
        if native:
            ratio = results["sparkjet EXACTLY_ONCE"]["rate"] / native["rate"]
            lines.append(f"  {how}: sparkjet EXACTLY_ONCE / structured streaming events/s "
                         f"{ratio:.2f}x, goal >= {TARGET:.2f}x: "
                         f"{'met' if ratio >= TARGET else 'MISSED'}")
    pairs = ", ".join(f"{how} {results['sparkjet EXACTLY_ONCE']['want'][0]:,} pairs + "
                      f"{results['sparkjet EXACTLY_ONCE']['want'][1]:,} outer rows"
                      for how, results in table)
    print("\n(events/s over both inputs; vs native: above 1.00x is faster; batches: "
          "micro-batches of the throughput phase; peak state: the most held while it ran, "
          "sparkjet's join keys and state files, Spark's state rows and state store memory; "
          "after: once the closing watermark passed every bound)")
    print(f"checked: each contender's pairs and outer rows equal the plain-Python oracle's "
          f"({pairs}; sparkjet row for row, native by count, lid = rid and the sum of lid)")
    print(f"\nload average at the end {load()} (other processes share the cores)")
    if lines:
        print("\ngoal:")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
