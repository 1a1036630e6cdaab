"""Windowed aggregation, NEXMark-style: bids per auction over a sliding and a tumbling window.

Bids ``{"auction": a, "price": p, "ts": ms}`` arrive in event-time order, give
or take a little (each up to --jitter-ms older than the newest), with
--auctions auctions. Two queries, each through both contenders on the same
generated data in one run:

- sliding: bids per auction over a 10 s window sliding by 1 s (NEXMark Q5's
  window);
- tumbling: bids per auction over a tumbling 10 s window.

Contenders:

- sparkjet EXACTLY_ONCE: a 2-partition stream -> with_timestamps(ts, lag) ->
  window(...).group_by(auction).aggregate(counting()) -> a list sink, a
  micro-batch at most every --interval-ms;
- native Structured Streaming: JSON-lines files -> readStream.json ->
  withWatermark(lag) -> groupBy(window(...), auction).count() in append mode ->
  foreachBatch appending the rows to a sparkjet list (the same sink); RocksDB
  state store, a processingTime trigger of --interval-ms.

Phases, per contender and query: a warm-up; throughput (all bids published in
--chunks chunks, then one closing bid per partition far ahead in event time,
timed until the sink holds every window the closing watermark completes, each
checked against a plain-Python count); latency (every --probe-every-ms a probe
of bids one second of event time later than the last, so the watermark passes
a window end per probe; each probe is timed from publishing to the sink
showing the window whose end it passed). State held: sparkjet's
``snapshotKeys`` / ``snapshotBytes`` of the windowed stage, Spark's
``numRowsTotal`` / ``memoryUsedBytes`` of its state operator, after the
throughput phase.

``--idle-keys N`` runs a micro-benchmark of the reduce side instead (no
Spark): a range holding N keys of the sliding query, none of them due, and
one watermark step of a slide, timed with the range's due-time index (window
timers) and with the scan of every key, in one process; then a batch of
--fold-keys keys folded into that range with and without the index (the
per-key cost the index adds).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from _harness import JobContender, NativeContender, connect, wait_for

from sparkjet.aggregate import counting
from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource, WindowDefinition

TIMEOUT = 300.0
SECOND = 1000
QUERIES = {"sliding": (10 * SECOND, SECOND), "tumbling": (10 * SECOND, 10 * SECOND)}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=300_000, help="bids in the throughput phase")
    parser.add_argument("--auctions", type=int, default=1_000, help="distinct auctions")
    parser.add_argument("--rate", type=int, default=5_000,
                        help="bids per second of event time (how much a window holds)")
    parser.add_argument("--jitter-ms", type=int, default=500,
                        help="how much older than the newest bid a bid may be")
    parser.add_argument("--chunks", type=int, default=20, help="publish calls (files)")
    parser.add_argument("--latency-seconds", type=float, default=30.0)
    parser.add_argument("--probe-every-ms", type=int, default=1000)
    parser.add_argument("--probe-size", type=int, default=100, help="bids per probe")
    parser.add_argument("--interval-ms", type=int, default=100,
                        help="sparkjet's snapshot interval and native's trigger")
    parser.add_argument("--queries", default="sliding,tumbling")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--idle-keys", type=int, default=0,
                        help="instead: time a watermark step over this many idle keys")
    parser.add_argument("--fold-keys", type=int, default=100_000,
                        help="with --idle-keys: keys of the batch folded in")
    return parser.parse_args()


def bids(n: int, start_ms: int, rate: int, auctions: int, jitter: int, seed: int
         ) -> list[dict[str, int]]:
    rng = random.Random(seed)
    step = SECOND / rate
    out = []
    for i in range(n):
        ts = start_ms + int(i * step) - rng.randrange(jitter + 1)
        out.append({"auction": rng.randrange(auctions), "price": rng.randrange(1, 500),
                    "ts": max(start_ms, ts)})
    return out


def expected_windows(events: list[dict[str, int]], size: int, slide: int, until: int
                     ) -> Counter[tuple[int, int]]:
    """``(window end, auction) -> bids`` of every window ending at or before ``until``."""
    out: Counter[tuple[int, int]] = Counter()
    for e in events:
        first = e["ts"] - e["ts"] % slide + slide
        for end in range(first, first + size, slide):
            if end <= until:
                out[(end, e["auction"])] += 1
    return out


class Sparkjet(JobContender):
    def __init__(self, client: Any, interval_ms: int, query: str) -> None:
        super().__init__(client, "sparkjet EXACTLY_ONCE",
                         client.get_stream(f"bids-{query}", partitions=2))
        self.interval_ms = interval_ms
        self.sink = client.get_list(f"windows-{query}")
        self.sink.clear()
        self.query = query

    def start(self, size: int, slide: int, lag: int) -> None:
        p = Pipeline.create()
        (p.read_from(StreamSource(self.stream.name))
         .with_timestamps(lambda b: b["ts"], allowed_lag_ms=lag)
         .window(WindowDefinition.sliding(size, slide)).group_by(lambda b: b["auction"])
         .aggregate(counting()).set_name("bids-per-auction")
         .write_to(Pipeline.to_list(self.sink.name)))
        self.submit(p, JobConfig(
            name=f"windows-{self.query}", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_millis=self.interval_ms))

    def windows(self) -> list[tuple[int, int, int]]:
        """``(end, auction, count)`` of every window result in the sink."""
        return [(r.end, r.key, r.result) for r in self.sink.get_all()]

    def state(self) -> tuple[int, int]:
        stage = self.job.get_metrics()["stages"]["bids-per-auction"]
        return stage.get("snapshotKeys", 0), stage.get("snapshotBytes", 0)


class Native(NativeContender):
    def __init__(self, client: Any, interval_ms: int, query: str) -> None:
        super().__init__(client, "sparkjet-bench-windows-")
        self.interval_ms = interval_ms
        self.sink = client.get_list(f"native-windows-{query}")
        self.sink.clear()
        self._writer = client.get_list(f"native-windows-{query}")

    def start(self, size: int, slide: int, lag: int) -> None:
        from pyspark.sql import functions as F

        self.shuffle_per_core()
        self.spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                            "org.apache.spark.sql.execution.streaming.state."
                            "RocksDBStateStoreProvider")
        writer = self._writer

        def append(batch: Any, batch_id: int) -> None:
            rows = batch.collect()
            if rows:
                writer.add_all([(int(r["window"]["end"].timestamp() * 1000), r["auction"],
                                 r["count"]) for r in rows])

        events = (self.spark.readStream.schema("auction INT, price INT, ts LONG")
                  .json(self.input.folder)
                  .withColumn("et", F.timestamp_millis("ts"))
                  .withWatermark("et", f"{lag} milliseconds"))
        counts = events.groupBy(F.window("et", f"{size} milliseconds", f"{slide} milliseconds"),
                                "auction").count()
        self.query = (counts.writeStream.outputMode("append").foreachBatch(append)
                      .trigger(processingTime=f"{self.interval_ms} milliseconds")
                      .option("checkpointLocation", self.checkpoint).start())

    def windows(self) -> list[tuple[int, int, int]]:
        return [tuple(r) for r in self.sink.get_all()]  # type: ignore[misc]

    def state(self) -> tuple[int, int]:
        ops = (self.query.lastProgress or {}).get("stateOperators", [])
        return (sum(int(op["numRowsTotal"]) for op in ops),
                sum(int(op["memoryUsedBytes"]) for op in ops))


Contender = Sparkjet | Native


def run(contender: Contender, args: argparse.Namespace, size: int, slide: int
        ) -> dict[str, Any]:
    print(f"\n{contender.label}", flush=True)
    lag = args.jitter_ms
    contender.start(size, slide, lag)
    try:
        # Warm-up: a second of event time, then a closing bid that completes its windows.
        warm = bids(args.rate, 0, args.rate, args.auctions, args.jitter_ms, 1)
        contender.publish(contender.encode(warm))
        close = [{"auction": 0, "price": 1, "ts": 3 * size}] * 2
        contender.publish(contender.encode(close))
        wait_for(contender, lambda: len(contender.windows()) > 0, "the warm-up's windows",
                 timeout=TIMEOUT)
        before = len(contender.windows())

        # Throughput: event time from 10 windows on, n bids, then a closing bid per partition.
        start = 10 * size
        events = bids(args.n, start, args.rate, args.auctions, args.jitter_ms, 2)
        newest = max(e["ts"] for e in events)
        closing_ts = newest + 2 * size + lag
        want = expected_windows(events, size, slide, closing_ts - lag)
        step = -(-args.n // args.chunks)
        chunks = [contender.encode(events[i:i + step]) for i in range(0, args.n, step)]
        closing = contender.encode([{"auction": 0, "price": 1, "ts": closing_ts}] * 2)
        started = time.perf_counter()
        for chunk in chunks:
            contender.publish(chunk)
        contender.publish(closing)
        peak = [0, 0]

        def sample() -> None:  # the state held while the windows are open
            keys, size = contender.state()
            peak[0], peak[1] = max(peak[0], keys), max(peak[1], size)

        done = wait_for(contender, lambda: len(contender.windows()) >= before + len(want),
                        f"{len(want)} windows", timeout=TIMEOUT, sample=sample)
        seconds = done - started
        got = Counter({(end, a): c for end, a, c in contender.windows()[before:] if end >= start})
        assert got == want, f"{contender.label}: wrong windows ({len(got)} vs {len(want)})"
        keys, state_bytes = peak
        after = contender.state()
        print(f"  throughput: {args.n:,} bids in {seconds:.3f} s = {args.n / seconds / 1e3:,.0f}k"
              f" bids/s; {len(want):,} windows; state at most {keys:,} rows, "
              f"{state_bytes / 1e6:.2f} MB; after: {after[0]:,} rows", flush=True)

        # Latency: each probe moves event time a second on; the watermark passes one end.
        latencies: list[float] = []
        event_time = -(-(closing_ts + 2 * size) // SECOND) * SECOND
        stamps = [event_time]
        contender.publish(contender.encode(
            [{"auction": 1, "price": 1, "ts": event_time}] * args.probe_size))
        time.sleep(1.0)
        probes = max(1, int(args.latency_seconds * 1000 / args.probe_every_ms))
        for _ in range(probes):
            event_time += SECOND
            stamps.append(event_time)
            # The window this probe completes: the last end at or below its watermark.
            end = (event_time - lag) - (event_time - lag) % slide
            holds_bids = any(end - size <= t < end for t in stamps)
            probe = [{"auction": 1, "price": 1, "ts": event_time}] * args.probe_size
            count_before = len(contender.windows())
            sent = time.perf_counter()
            contender.publish(contender.encode(probe))
            if holds_bids and end > event_time - SECOND - lag:
                arrived = wait_for(contender, lambda e=end, c=count_before: any(
                    w[0] == e for w in contender.windows()[c:]), "a probe's window",
                    timeout=TIMEOUT)
                latencies.append(arrived - sent)
            time.sleep(max(0.0, args.probe_every_ms / 1000 - (time.perf_counter() - sent)))
        median = statistics.median(latencies) * 1000 if latencies else float("nan")
        print(f"  latency (bid publishing the watermark past a window's end -> its result): "
              f"median {median:.0f} ms over {len(latencies)} windows", flush=True)
        return {"rate": args.n / seconds, "latency": median, "keys": keys,
                "bytes": state_bytes}
    finally:
        contender.stop()


def _idle_range(keys: int, slide: int, end: int) -> dict[Any, Any]:
    """A range of ``keys`` keys, each with one frame ending at ``end``."""
    from sparkjet.core.pipeline.window_fold import Frames

    return {k: (k, Frames(slide, {end: 1})) for k in range(keys)}


def _timed(run: Callable[[], Any], times: int) -> float:
    """The median seconds of ``times`` runs."""
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def idle_keys(args: argparse.Namespace) -> None:
    """One watermark step over ``--idle-keys`` keys, with the index and by the scan."""
    from sparkjet.core.pipeline.event_time import WindowClock
    from sparkjet.core.pipeline.keyed import fold_into
    from sparkjet.core.pipeline.timers import DueIndex
    from sparkjet.core.pipeline.window_fold import WindowFold

    size, slide = QUERIES["sliding"]
    definition = WindowDefinition.sliding(size, slide)
    n = args.idle_keys
    far = 1000 * slide  # every key's frame ends far ahead: no window of theirs closes
    values = _idle_range(n, slide, far)
    timers: dict[str, DueIndex] = {}
    step = iter(range(10**6))

    def fold(clock: WindowClock) -> WindowFold:
        return WindowFold(definition, counting(), True, clock)

    gc.collect()
    gc.freeze()  # as the state cache keeps a range: out of the collector's way
    started = time.perf_counter()
    fold_into(fold(WindowClock(0, slide)), {}, values, {}, 0, None, [], [], timers)
    built = time.perf_counter() - started
    gc.collect()
    gc.freeze()

    def advance(indexed: bool) -> None:
        w = slide * (2 + next(step))
        changed: list[Any] = []
        removed: list[Any] = []
        out = fold_into(fold(WindowClock(w - slide, w)), {}, values, {}, 0, None, changed,
                        removed, timers if indexed else None)
        assert not out
        assert not changed
        assert not removed
        assert len(values) == n

    indexed = _timed(lambda: advance(True), 5)
    scanned = _timed(lambda: advance(False), 3)
    print(f"{n:,} idle keys of a {size} ms window sliding by {slide} ms; one watermark step "
          f"of a slide:")
    print(f"  with the index  {indexed * 1e3:10.3f} ms   (index built once from the keys: "
          f"{built * 1e3:.0f} ms)")
    print(f"  scan every key  {scanned * 1e3:10.3f} ms   ratio {scanned / indexed:,.0f}x")

    k = min(args.fold_keys, n)

    def fold_batch(indexed: bool) -> None:
        groups = {key: [(0, key, key, {far: 1})] for key in range(k)}
        w = slide * 2
        fold_into(fold(WindowClock(w, w)), groups, values, {}, 0, None, [], [],
                  timers if indexed else None)

    with_index = _timed(lambda: fold_batch(True), 5)
    without = _timed(lambda: fold_batch(False), 5)
    print(f"a batch folding {k:,} of those keys (one part each), the watermark not moving:")
    print(f"  with the index  {with_index * 1e3:10.1f} ms  ({with_index / k * 1e9:,.0f} ns/key, "
          f"filing each key included)")
    print(f"  without         {without * 1e3:10.1f} ms  ({without / k * 1e9:,.0f} ns/key)")


def main() -> None:
    args = parse_args()
    if args.idle_keys:
        idle_keys(args)
        return
    client = connect(args.master)
    print(f"{args.n:,} bids over {args.auctions:,} auctions, {args.rate:,} bids per second of "
          f"event time, up to {args.jitter_ms} ms out of order (the allowed lag), on "
          f"{args.master}, Spark {client.spark.version}; trigger {args.interval_ms} ms")
    table = []
    for query in args.queries.split(","):
        size, slide = QUERIES[query]
        print(f"\n=== {query}: window {size} ms, slide {slide} ms ===")
        ours = run(Sparkjet(client, args.interval_ms, query), args, size, slide)
        native = run(Native(client, args.interval_ms, query), args, size, slide)
        table.append((query, ours, native))
    print()
    print(f"{'query':<10}{'sparkjet':>12}{'native':>12}{'vs native':>11}"
          f"{'latency':>10}{'native':>9}{'ratio':>8}{'state MB':>10}{'native':>8}")
    for query, ours, native in table:
        print(f"{query:<10}{ours['rate'] / 1e3:>10,.0f}k/s{native['rate'] / 1e3:>8,.0f}k/s"
              f"{ours['rate'] / native['rate']:>10.2f}x{ours['latency']:>7.0f} ms"
              f"{native['latency']:>6.0f} ms{ours['latency'] / native['latency']:>7.2f}x"
              f"{ours['bytes'] / 1e6:>10.2f}{native['bytes'] / 1e6:>8.2f}")
    print("\n(throughput vs native: above 1.00x is faster; latency ratio: below 1.00x is "
          "faster; state: the most held while windows were open, sparkjet's state files and "
          "Spark's state store memory)")


if __name__ == "__main__":
    main()
