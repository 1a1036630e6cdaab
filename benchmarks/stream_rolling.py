"""Streaming, rolling count: 1M events {"user": f"u{i % 10000}"}, a running count per user.

- sparkjet NONE: stream source -> group_by(user).aggregate(counting()) -> map sink,
  micro-batches back to back
- sparkjet EXACTLY_ONCE: the same, checkpointed, a micro-batch at most every
  --interval-ms (snapshot_interval_millis)
- native Structured Streaming: JSON-lines files -> readStream.json ->
  groupBy("user").count() in update mode -> foreachBatch upserting the batch's
  rows into a sparkjet map (the same sink); RocksDB state store, a
  processingTime trigger of --interval-ms

Each contender runs as one long-lived query: a warm-up, then the throughput
phase (all events published in --chunks chunks, timed until the sink holds
every count), then the latency phase (a probe of --probe-size events about every
--probe-every-ms for --latency-seconds, each timed from publishing until its
marker key shows in the sink; by default the pace leaves every contender idle
between probes, so the figure is one micro-batch's latency, not queueing).

The producer's work is the same for all: sparkjet's publish_all pickles
inside the throughput timer; native's JSON lines are encoded before it (which
favours native) and each file is written and moved in inside it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from _harness import JobContender, NativeContender, connect, percentile, s3_client, wait_for

from sparkjet.aggregate import counting
from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource

TARGET_RATE = 300_000  # events/s, sparkjet
TARGET_LATENCY_RATIO = 1.3  # sparkjet median latency / native median latency
# Two halves of 20,000, 10,000 per stream partition: over [engine] local_max_items
# (5,000) even when the job wakes on one partition's append, so with adaptive
# micro-batches the warm-up still runs on Spark and starts its Python workers
# (a warm-up on the driver would leave that to the timed throughput phase).
WARMUP = 40_000
TIMEOUT = 300.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000_000, help="events in the throughput phase")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct users")
    parser.add_argument("--chunks", type=int, default=20,
                        help="publish calls (files for native) the events arrive in")
    parser.add_argument("--latency-seconds", type=float, default=30.0,
                        help="length of each latency phase")
    parser.add_argument("--probe-every-ms", type=int, default=1000,
                        help="mean pace of the latency probes (each interval ±25%%)")
    parser.add_argument("--probe-size", type=int, default=100, help="events per latency probe")
    parser.add_argument("--poll-ms", type=int, default=10, help="how often the sink is polled")
    parser.add_argument("--interval-ms", type=int, default=100,
                        help="EXACTLY_ONCE snapshot interval and native processingTime trigger")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--s3", action="store_true",
                        help="also run sparkjet EXACTLY_ONCE with the store on S3 (moto's "
                        "server on 127.0.0.1, from sparkjet.testing)")
    parser.add_argument("--no-adaptive", dest="adaptive", action="store_false",
                        help="run every sparkjet micro-batch on Spark "
                        "(JobConfig.adaptive_micro_batches=False); by default a small one "
                        "runs on the driver")
    return parser.parse_args()


class SparkjetQuery(JobContender):
    def __init__(self, client: Any, guarantee: ProcessingGuarantee, interval_ms: int,
                 adaptive: bool = True) -> None:
        tag = guarantee.value.lower()
        super().__init__(client, f"sparkjet {guarantee.value}"
                         + ("" if adaptive else " (adaptive off)"),
                         client.get_stream(f"events-{tag}", partitions=2))
        self.guarantee = guarantee
        self.interval_ms = interval_ms
        self.adaptive = adaptive
        self.sink = client.get_map(f"counts-{tag}")
        self.map_name = f"counts-{tag}"

    def start(self) -> None:
        p = Pipeline.create()
        (p.read_from(StreamSource(self.stream.name))
         .group_by(lambda e: e["user"]).aggregate(counting())
         .set_name("per-user").write_to(Pipeline.to_map(self.map_name)))
        self.submit(p, JobConfig(name=f"rolling-{self.guarantee.value}",
                                 processing_guarantee=self.guarantee,
                                 snapshot_interval_millis=self.interval_ms,
                                 **({} if self.adaptive else {"adaptive_micro_batches": False})))

    def breakdown(self, batches: int) -> list[str]:
        """Where a micro-batch's time goes: the job does not say."""
        return []


class NativeQuery(NativeContender):
    def __init__(self, client: Any, interval_ms: int) -> None:
        super().__init__(client, "sparkjet-bench-native-")
        self.interval_ms = interval_ms
        self.sink = client.get_map("native-counts")
        self._writer = client.get_map("native-counts")  # used by foreachBatch's thread

    def start(self) -> None:
        self.shuffle_per_core()
        writer = self._writer

        def upsert(batch: Any, batch_id: int) -> None:
            writer.put_all([(row["user"], row["count"]) for row in batch.collect()])
            self.calls += 1

        counts = (self.spark.readStream.schema("user STRING").json(self.input.folder)
                  .groupBy("user").count())
        self.query = (counts.writeStream.outputMode("update").foreachBatch(upsert)
                      .trigger(processingTime=f"{self.interval_ms} milliseconds")
                      .option("checkpointLocation", self.checkpoint).start())

    def batch_millis(self) -> list[int]:
        return [int(p["durationMs"]["triggerExecution"]) for p in self.query.recentProgress
                if p["numInputRows"]]

    def breakdown(self, batches: int) -> list[str]:
        """Median of each part of Spark's durationMs over the last ``batches`` batches."""
        recent = [p["durationMs"] for p in self.query.recentProgress if p["numInputRows"]]
        recent = recent[-batches:]
        parts = sorted({k for d in recent for k in d} - {"triggerExecution"})
        out = [f"{k} {statistics.median(d.get(k, 0) for d in recent):.0f} ms" for k in parts]
        states = self.query.lastProgress["stateOperators"]
        shards = sum(int(op["numShufflePartitions"]) for op in states)
        return [*out, f"(state partitions: {shards})"]


Contender = SparkjetQuery | NativeQuery


def expected(k: int, *sizes: int) -> int:
    """The count of user ``u{k}`` after runs of ``sizes[:-1]`` events over ``sizes[-1]`` keys."""
    *runs, keys = sizes
    return sum(n // keys + (k < n % keys) for n in runs)


def total(sink: Any) -> int:
    return sum(sink.values())


def run(contender: Contender, args: argparse.Namespace) -> dict[str, Any]:
    keys = args.keys
    poll = args.poll_ms / 1000
    print(f"\n{contender.label}", flush=True)
    contender.start()
    sink = contender.sink
    try:
        # Warm-up, two micro-batches: JIT, Python workers, every key in the state.
        warm = [{"user": f"u{i % keys}"} for i in range(WARMUP)]
        started = time.perf_counter()
        for half in (warm[: WARMUP // 2], warm[WARMUP // 2 :]):
            seen = total(sink) + len(half)
            contender.publish(contender.encode(half))
            wait_for(contender, lambda seen=seen: total(sink) == seen, "the warm-up",
                     timeout=TIMEOUT, pause=poll)
        print(f"  warm-up ({WARMUP:,} events)       {time.perf_counter() - started:7.3f} s",
              flush=True)

        # Throughput: everything published as fast as the producer goes.
        events = [{"user": f"u{i % keys}"} for i in range(args.n)]
        size = -(-args.n // args.chunks)
        chunks = [contender.encode(events[i : i + size]) for i in range(0, args.n, size)]
        batches_before = contender.batches()
        started = time.perf_counter()
        for chunk in chunks:
            contender.publish(chunk)
        published = time.perf_counter()
        done = wait_for(contender, lambda: total(sink) == WARMUP + args.n, "all events",
                        timeout=TIMEOUT, pause=poll)
        seconds = done - started
        batches = contender.batches() - batches_before
        rate = args.n / seconds
        print(f"  throughput: {args.n:,} events in {seconds:.3f} s = {rate / 1e3:,.0f}k events/s "
              f"({batches} micro-batches; publishing took {published - started:.3f} s)",
              flush=True)
        got = dict(sink.entry_set())
        wrong = [k for k in range(keys) if got.get(f"u{k}") != expected(k, WARMUP, args.n, keys)]
        assert not wrong, f"{contender.label}: wrong counts for {wrong[:5]}"
        assert len(got) == keys, f"{contender.label}: {len(got)} keys, not {keys}"

        # Latency: steady probes of probe_size events, one marker key each.
        latencies: list[float] = []
        sent: dict[str, float] = {}
        every = args.probe_every_ms / 1000
        probes = max(1, int(args.latency_seconds / every))
        batches_before = contender.batches()
        jitter = random.Random(7)  # a steady pace (±25%), not locked to a trigger's phase
        due = begin = time.perf_counter()
        j = 0
        while j < probes or sent:
            now = time.perf_counter()
            if j < probes and now >= due:
                due += every * jitter.uniform(0.75, 1.25)
                marker = f"probe-{j}"
                probe = [{"user": f"u{(j * args.probe_size + i) % keys}"}
                         for i in range(args.probe_size - 1)] + [{"user": marker}]
                sent[marker] = time.perf_counter()
                contender.publish(contender.encode(probe))
                j += 1
            contender.check()
            for marker in list(sent):
                if sink.contains_key(marker):
                    latencies.append(time.perf_counter() - sent.pop(marker))
            if now - begin > args.latency_seconds + TIMEOUT:
                raise TimeoutError(f"{contender.label}: probes never arrived: {sorted(sent)}")
            time.sleep(poll)
        batches = contender.batches() - batches_before
        durations = contender.batch_millis()[-batches:] if batches else []
        median = statistics.median(latencies) * 1000
        p90 = percentile(latencies, 0.9) * 1000
        print(f"  latency: {len(latencies)} probes of {args.probe_size} events every "
              f"{args.probe_every_ms} ms: median {median:.0f} ms, p90 {p90:.0f} ms "
              f"({batches} micro-batches, median batch {statistics.median(durations):.0f} ms)",
              flush=True)
        parts = contender.breakdown(batches)
        if parts:
            print("  median per batch (Spark durationMs): " + ", ".join(parts), flush=True)
        if isinstance(contender, JobContender):
            local, spark = contender.engines()
            print(f"  engines: {local} micro-batches on the driver, {spark} on Spark "
                  f"(all phases)", flush=True)
        return {"rate": rate, "median": median, "p90": p90,
                "batch_ms": statistics.median(durations)}
    finally:
        contender.stop()


def run_on_s3(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """sparkjet EXACTLY_ONCE again, its store (stream, checkpoint, sink) on moto's S3 server."""
    with s3_client(args.master) as client:
        contender = SparkjetQuery(client, ProcessingGuarantee.EXACTLY_ONCE, args.interval_ms,
                                  args.adaptive)
        contender.label += " (store on S3)"
        return {contender.label: run(contender, args)}


def main() -> None:
    args = parse_args()
    client = connect(args.master)
    print(f"{args.n:,} events over {args.keys:,} users, in {args.chunks} chunks, on "
          f"{args.master}, Spark {client.spark.version}; EXACTLY_ONCE snapshot interval and "
          f"native trigger {args.interval_ms} ms, NONE back to back")
    results = {}
    for contender in (
        SparkjetQuery(client, ProcessingGuarantee.NONE, args.interval_ms, args.adaptive),
        SparkjetQuery(client, ProcessingGuarantee.EXACTLY_ONCE, args.interval_ms, args.adaptive),
        NativeQuery(client, args.interval_ms),
    ):
        results[contender.label] = run(contender, args)
    if args.s3:
        results.update(run_on_s3(args))

    native = results["native structured streaming"]
    print()
    print(f"{'contender':<38}{'events/s':>12}{'vs native':>11}{'median':>10}{'p90':>9}"
          f"{'vs native':>11}{'batch':>9}")
    for label, r in results.items():
        print(f"{label:<38}{r['rate'] / 1e3:>11,.0f}k{r['rate'] / native['rate']:>10.2f}x"
              f"{r['median']:>7.0f} ms{r['p90']:>6.0f} ms{r['median'] / native['median']:>10.2f}x"
              f"{r['batch_ms']:>6.0f} ms")
    print("\n(events/s vs native: above 1.00x is faster; latency vs native: below 1.00x is "
          "faster; batch: median micro-batch duration in the latency phase)")
    print(f"\ntargets: sparkjet >= {TARGET_RATE / 1e3:.0f}k events/s, median latency <= "
          f"{TARGET_LATENCY_RATIO}x native")
    for label, r in results.items():
        if label == "native structured streaming":
            continue
        ok_rate = "met" if r["rate"] >= TARGET_RATE else "MISSED"
        ratio = r["median"] / native["median"]
        ok_latency = "met" if ratio <= TARGET_LATENCY_RATIO else "MISSED"
        print(f"  {label:<36} throughput {ok_rate} ({r['rate'] / TARGET_RATE:.2f}x target), "
              f"latency {ok_latency} ({ratio:.2f}x native)")


if __name__ == "__main__":
    main()
