"""Spark Connect against classic Spark: the same sparkjet jobs on a classic session and on Connect.

One run measures each workload on two sides, each side in a process of its
own (a process that made a Connect session cannot make a classic one):

- classic: ``sparkjet.connect(spark={"master": "local[2]"})``, and the same
  work written by hand with PySpark RDDs on that session as the baseline;
- connect: ``sparkjet.connect(spark={"remote": url})`` on a Spark Connect
  server the script starts for the run (``tests/connect_server.py``: the
  pyspark wheel's own server, ``local[2]``, on 127.0.0.1), once the classic
  side has finished, and stops after it.

Workloads (the throughput ones with adaptive micro-batches off,
``[engine] adaptive = false``, so every job and micro-batch is work on Spark):

- W1, batch stateless (as ``batch_stateless.py``): ints, ``map(x * 2)``,
  ``filter(x % 3 == 0)``, a list sink; baseline ``parallelize -> map -> filter
  -> collect``;
- W2, batch grouped (as ``batch_grouped.py``): dicts ``{"k": i % 1000, "v": i
  % 7}``, ``group_by(k).aggregate(summing(v))``, a list sink; baseline
  ``reduceByKey``;
- W3, streaming rolling count (as ``stream_rolling.py``): EXACTLY_ONCE,
  a 2-partition stream, ``group_by(user).aggregate(counting())`` into a map,
  ``--stream-n`` events published in ``--chunks`` chunks as fast as the
  producer goes, timed until the map's counts cover them (on one
  long-lived job: a warm-up, one untimed run, then ``--repeat`` timed runs);
- latency (as ``latency.py``, adaptive micro-batches on, the default): a
  rolling count EXACTLY_ONCE with ``snapshot_interval_millis=1``; one event
  at a time to the idle job, timed from its publish call until its count
  shows in the map (polled every --poll-ms); its micro-batches must run on
  the driver on both sides (checked).

Each side also times what a job costs before any data: a trivial query
(``range(1).collect()``), a trivial Python UDF query (``mapInArrow`` over
two rows), and a 10-item sparkjet job (W1's pipeline) on Spark.

Targets (the Connect engine's issue): Connect at least 0.8x classic's
throughput, and the small micro-batch latency unchanged (judged here as a
Connect p50 within 1.25x or 5 ms of classic's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from operator import add
from pathlib import Path
from typing import Any

from _harness import JobContender, measure, percentile, report, wait_for

from sparkjet.aggregate import counting, summing
from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource

ROOT = Path(__file__).resolve().parent.parent
TARGET_THROUGHPUT = 0.8  # Connect's throughput / classic's, at least
TARGET_LATENCY_RATIO = 1.25  # Connect's p50 / classic's, at most (or within the slack)
LATENCY_SLACK_MS = 5.0
TIMEOUT = 300.0
#: Events of W3's warm-up, in two halves (as stream_rolling.py).
WARMUP = 40_000
#: The sizes of a full run and of --quick.
FULL = {"n": 1_000_000, "stream_n": 1_000_000, "probes": 100, "repeat": 3}
QUICK = {"n": 200_000, "stream_n": 100_000, "probes": 20, "repeat": 2}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"smaller sizes: {', '.join(f'{k}={v:,}' for k, v in QUICK.items())}")
    parser.add_argument("-n", type=int, help=f"items of W1 and W2 (default {FULL['n']:,})")
    parser.add_argument("--stream-n", type=int,
                        help=f"events per W3 throughput run (default {FULL['stream_n']:,})")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct users of W3")
    parser.add_argument("--chunks", type=int, default=20, help="publish calls per W3 run")
    parser.add_argument("--probes", type=int,
                        help=f"one-event latency probes (default {FULL['probes']})")
    parser.add_argument("--poll-ms", type=float, default=2.0,
                        help="how often a latency probe's map is read")
    parser.add_argument("--repeat", type=int,
                        help=f"timed runs per contender (default {FULL['repeat']})")
    parser.add_argument("--master", default="local[2]", help="the classic side's Spark master")
    parser.add_argument("--remote", help="an sc:// URL: use this Connect server, start none")
    parser.add_argument("--server-memory", default="1g",
                        help="the started server's spark.driver.memory (classic's default heap "
                        "is 1g too)")
    parser.add_argument("--side", choices=("classic", "connect"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    for key, value in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


# --- one side ------------------------------------------------------------------------


def open_client(args: argparse.Namespace, engine: dict[str, Any] | None = None) -> Any:
    """A sparkjet client of this side on a temporary store (as ``_harness.connect``)."""
    import sparkjet

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    store = tempfile.mkdtemp(prefix="sparkjet-bench-")
    spark = ({"remote": args.remote, "conf": {}} if args.side == "connect"
             else {"master": args.master, "conf": {"spark.ui.enabled": "false"}})
    client = sparkjet.connect(store={"url": store}, spark=spark,
                              **({"engine": engine} if engine else {}))
    if args.side == "classic":
        client.spark.sparkContext.setLogLevel("ERROR")
    return client


def stateless(client: Any, args: argparse.Namespace) -> dict[str, float]:
    """W1: map -> filter -> list sink (and, on classic, the RDD baseline)."""
    data = list(range(args.n))
    expected_len = sum(1 for x in data if (x * 2) % 3 == 0)
    jet = client.get_jet()
    results = client.get_list("w1-results")
    print(f"\nW1 batch stateless: {args.n:,} ints, map -> filter -> list sink", flush=True)

    def sparkjet_job() -> None:
        results.clear()
        p = Pipeline.create()
        (p.read_from(Pipeline.from_list("numbers", data))
         .map(lambda x: x * 2).filter(lambda x: x % 3 == 0)
         .write_to(Pipeline.to_list("w1-results")))
        jet.submit(p, JobConfig(metrics_enabled=True)).join()

    timings = {}
    timings["sparkjet"], _ = measure(f"sparkjet on {args.side}", sparkjet_job, args.repeat)
    assert results.size() == expected_len, "sparkjet produced a wrong result"
    if args.side == "classic":
        sc = client.spark.sparkContext

        def rdd_collect() -> int:
            return len(sc.parallelize(data).map(lambda x: x * 2).filter(lambda x: x % 3 == 0)
                       .collect())

        timings["pyspark rdd collect"], got = measure("pyspark rdd .collect()", rdd_collect,
                                                      args.repeat)
        assert got == expected_len
        report(args.n, timings)
    return timings


def grouped(client: Any, args: argparse.Namespace) -> dict[str, float]:
    """W2: group_by(k).aggregate(summing(v)) -> list sink (and, on classic, reduceByKey)."""
    data = [{"k": i % 1000, "v": i % 7} for i in range(args.n)]
    expected: dict[int, int] = {}
    for d in data:
        expected[d["k"]] = expected.get(d["k"], 0) + d["v"]
    jet = client.get_jet()
    results = client.get_list("w2-sums")
    print(f"\nW2 batch grouped: {args.n:,} dicts, {len(expected)} keys, group-sum -> list sink",
          flush=True)

    def sparkjet_job() -> None:
        results.clear()
        p = Pipeline.create()
        (p.read_from(Pipeline.from_list("events", data))
         .group_by(lambda d: d["k"]).aggregate(summing(lambda d: d["v"]))
         .write_to(Pipeline.to_list("w2-sums")))
        jet.submit(p, JobConfig()).join()

    timings = {}
    timings["sparkjet"], _ = measure(f"sparkjet on {args.side}", sparkjet_job, args.repeat)
    assert results.get_all() == list(expected.items()), "sparkjet produced a wrong result"
    if args.side == "classic":
        sc = client.spark.sparkContext

        def rdd() -> dict[int, int]:
            return dict(sc.parallelize(data).map(lambda d: (d["k"], d["v"]))
                        .reduceByKey(add).collect())

        timings["pyspark rdd reduceByKey"], got = measure("pyspark rdd reduceByKey", rdd,
                                                          args.repeat)
        assert got == expected
        report(args.n, timings)
    return timings


class RollingCount(JobContender):
    """A keyed running count ``group_by(user).aggregate(counting())`` into a map, EXACTLY_ONCE."""

    def __init__(self, client: Any, name: str, partitions: int, interval_ms: int) -> None:
        super().__init__(client, name, client.get_stream(f"{name}-events",
                                                         partitions=partitions))
        self.sink = client.get_map(f"{name}-counts")
        self.interval_ms = interval_ms

    def start(self) -> None:
        p = Pipeline.create()
        (p.read_from(StreamSource(self.stream.name))
         .group_by(lambda e: e["user"]).aggregate(counting())
         .set_name("per-user").write_to(Pipeline.to_map(self.sink.name)))
        self.submit(p, JobConfig(name=self.label,
                                 processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                                 snapshot_interval_millis=self.interval_ms))


def rolling(client: Any, args: argparse.Namespace) -> dict[str, Any]:
    """W3: throughput of a rolling count on Spark (adaptive off), best of --repeat runs."""
    keys = args.keys
    print(f"\nW3 streaming rolling count: {args.stream_n:,} events per run over {keys:,} users, "
          f"{args.chunks} chunks, EXACTLY_ONCE, snapshot interval 100 ms", flush=True)
    job = RollingCount(client, "w3", 2, 100)
    job.start()
    sink = job.sink
    published = 0

    def total() -> int:
        return sum(sink.values())

    try:
        started = time.perf_counter()
        warm = [{"user": f"u{i % keys}"} for i in range(WARMUP)]
        for half in (warm[: WARMUP // 2], warm[WARMUP // 2:]):
            published += len(half)
            job.publish(half)
            wait_for(job, lambda seen=published: total() == seen, "the warm-up",
                     timeout=TIMEOUT, pause=0.01)
        print(f"  warm-up ({WARMUP:,} events)          {time.perf_counter() - started:7.3f} s",
              flush=True)
        events = [{"user": f"u{i % keys}"} for i in range(args.stream_n)]
        size = -(-args.stream_n // args.chunks)
        chunks = [events[i:i + size] for i in range(0, args.stream_n, size)]
        rates, batches = [], []
        for run in range(args.repeat + 1):  # the first, a warm-up, is not counted
            before = job.batches()
            started = time.perf_counter()
            for chunk in chunks:
                job.publish(chunk)
            published += args.stream_n
            done = wait_for(job, lambda seen=published: total() == seen, "all events",
                            timeout=TIMEOUT, pause=0.01)
            rate, took = args.stream_n / (done - started), job.batches() - before
            print(f"  {'warm-up run' if run == 0 else 'run'}: {args.stream_n:,} events in "
                  f"{done - started:.3f} s = {rate / 1e3:,.0f}k events/s ({took} micro-batches)",
                  flush=True)
            if run:
                rates.append(rate)
                batches.append(took)
        got = dict(sink.entry_set())
        want = {f"u{k}": WARMUP // keys + (k < WARMUP % keys)
                + (args.repeat + 1) * (args.stream_n // keys + (k < args.stream_n % keys))
                for k in range(keys)}
        assert got == want, f"W3 on {args.side}: wrong counts"
        local, spark = job.engines()
        assert local == 0, f"W3 on {args.side}: {local} micro-batches ran on the driver"
        batch_ms = statistics.median(job.batch_millis()[-sum(batches):])
        print(f"  best {max(rates) / 1e3:,.0f}k events/s, median "
              f"{statistics.median(rates) / 1e3:,.0f}k; {spark} micro-batches in all, all on "
              f"Spark (timed runs: median batch {batch_ms:.0f} ms)", flush=True)
        return {"rate": max(rates), "median": statistics.median(rates), "batches": batches,
                "batch_ms": batch_ms}
    finally:
        job.stop()


def latency(client: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One event at a time through a rolling count, adaptive micro-batches on (the default)."""
    users = 10
    poll = args.poll_ms / 1000
    print(f"\nlatency: one event at a time to an idle rolling count, EXACTLY_ONCE, "
          f"snapshot interval 1 ms, adaptive on, {args.probes} probes (map read every "
          f"{args.poll_ms:g} ms)", flush=True)
    job = RollingCount(client, "latency", 1, 1)
    job.start()
    counts: dict[str, int] = {}
    pace = random.Random(7)

    def probe(j: int) -> float:
        user = f"u{j % users}"
        counts[user] = counts.get(user, 0) + 1
        want = counts[user]
        sent = time.perf_counter()
        job.publish([{"user": user}])
        seen = wait_for(job, lambda: (job.sink.get(user) or 0) >= want, f"probe {j}",
                        timeout=TIMEOUT, pause=poll)
        return seen - sent

    try:
        for j in range(10):  # warm-up: the first batch, with its state unknown, may go to Spark
            probe(j)
        local0, spark0 = job.engines()
        millis = []
        for j in range(10, 10 + args.probes):
            time.sleep(pace.uniform(0.03, 0.07))  # the job idle again
            millis.append(probe(j) * 1000)
        local, spark = job.engines()
        local, spark = local - local0, spark - spark0
        assert dict(job.sink.entry_set()) == counts, f"latency on {args.side}: wrong counts"
        assert spark == 0, f"latency on {args.side}: {spark} micro-batches ran on Spark"
        batch = statistics.median(job.batch_millis()[-local:]) if local else 0.0
        row = {"p50": percentile(millis, 0.5), "p90": percentile(millis, 0.9),
               "p99": percentile(millis, 0.99), "local": local, "batch_ms": batch}
        print(f"  p50 {row['p50']:.1f} ms, p90 {row['p90']:.1f} ms, p99 {row['p99']:.1f} ms; "
              f"{local} micro-batches on the driver (median {batch:.0f} ms), 0 on Spark",
              flush=True)
        return row
    finally:
        job.stop()


def overhead(client: Any, args: argparse.Namespace, rounds: int = 7) -> dict[str, float]:
    """Median ms of a trivial query, a trivial Python UDF query and a 10-item sparkjet job."""
    import pyarrow as pa

    spark = client.spark
    jet = client.get_jet()
    tiny = list(range(10))

    def passthrough(batches: Any) -> Any:
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"id": batch.column("id").to_pylist()})

    def tiny_job() -> None:
        p = Pipeline.create()
        (p.read_from(Pipeline.from_list("tiny", tiny))
         .map(lambda x: x * 2).filter(lambda x: x % 3 == 0)
         .write_to(Pipeline.to_list("tiny-results")))
        jet.submit(p, JobConfig()).join()

    out = {}
    print(f"\nfixed costs on {args.side} (median of {rounds}, after a warm-up)", flush=True)
    for label, fn in (
        # Connect asks the server to parse a DDL schema and for the child's columns.
        ("mapInArrow DataFrame, no action", lambda: spark.range(0, 2, 1, 2)
         .mapInArrow(passthrough, "id long")),
        ("range(1).collect()", lambda: spark.range(1).collect()),
        ("mapInArrow over 2 rows", lambda: spark.range(0, 2, 1, 2)
         .mapInArrow(passthrough, "id long").collect()),
        ("sparkjet 10-item job on Spark", tiny_job),
    ):
        fn()
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1000)
        out[label] = statistics.median(times)
        print(f"  {label:<34} {out[label]:7.1f} ms", flush=True)
    return out


def run_side(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    client = open_client(args, engine={"adaptive": False})
    version = client.spark.version  # on Connect: the session and the server's checks
    client.get_jet()
    session = time.perf_counter() - started
    where = args.remote if args.side == "connect" else args.master
    print(f"\n=== {args.side}: Spark {version} at {where} (session and checks "
          f"{session:.1f} s; load average {load()}) ===", flush=True)
    out: dict[str, Any] = {"version": version, "session_s": session, "load": [load()]}
    out["overhead"] = overhead(client, args)
    out["w1"] = stateless(client, args)
    out["w2"] = grouped(client, args)
    out["w3"] = rolling(client, args)
    out["latency"] = latency(open_client(args), args)
    out["load"].append(load())
    return out


# --- the run -------------------------------------------------------------------------


def side(args: argparse.Namespace, name: str, remote: str | None = None) -> dict[str, Any]:
    """Run one side in a process of its own; its results."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "results.json")
        command = [sys.executable, str(Path(__file__).resolve()), "--side", name, "--out", out,
                   "-n", str(args.n), "--stream-n", str(args.stream_n), "--keys", str(args.keys),
                   "--chunks", str(args.chunks), "--probes", str(args.probes),
                   "--poll-ms", str(args.poll_ms), "--repeat", str(args.repeat),
                   "--master", args.master]
        if remote:
            command += ["--remote", remote]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        for var in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
            env.pop(var, None)
        subprocess.run(command, env=env, check=True)
        with open(out) as f:
            return dict(json.load(f))


def connect_side(args: argparse.Namespace) -> dict[str, Any]:
    """The Connect side, on --remote or on a server started for it (and stopped after)."""
    if args.remote:
        return side(args, "connect", args.remote)
    sys.path.insert(0, str(ROOT))  # tests.connect_server
    from tests import connect_server

    started = time.perf_counter()
    server = connect_server.start(conf={"spark.driver.memory": args.server_memory})
    print(f"\nSpark Connect server at {server.url} (local[2], {args.server_memory} heap; "
          f"started in {time.perf_counter() - started:.1f} s)", flush=True)
    try:
        return side(args, "connect", server.url)
    finally:
        server.stop()


def summary(args: argparse.Namespace, classic: dict[str, Any], remote: dict[str, Any]) -> None:
    # (what, classic, connect, unit): throughput first (higher is better), then times
    rate_rows = [
        ("W1 map -> filter", args.n / classic["w1"]["sparkjet"], args.n / remote["w1"]["sparkjet"],
         "M items/s"),
        ("W2 group-sum", args.n / classic["w2"]["sparkjet"], args.n / remote["w2"]["sparkjet"],
         "M items/s"),
        ("W3 rolling count", classic["w3"]["rate"], remote["w3"]["rate"], "M events/s"),
    ]
    a, b = classic["latency"], remote["latency"]
    time_rows = [(f"latency {q}, adaptive on", a[q], b[q], "ms") for q in ("p50", "p90", "p99")]
    time_rows.append(("W3 median micro-batch", classic["w3"]["batch_ms"],
                      remote["w3"]["batch_ms"], "ms"))
    time_rows += [(label, classic["overhead"][label], remote["overhead"][label], "ms")
                  for label in classic["overhead"]]
    print()
    print(f"{'sparkjet':<34}{'classic':>10}{'connect':>10}  {'unit':<11}{'connect/classic':>16}")
    for what, x, y, unit in rate_rows:
        print(f"{what:<34}{x / 1e6:>10.2f}{y / 1e6:>10.2f}  {unit:<11}{y / x:>15.2f}x")
    for what, x, y, unit in time_rows:
        print(f"{what:<34}{x:>10.1f}{y:>10.1f}  {unit:<11}{y / x:>15.2f}x")
    print(f"\n{'hand-written PySpark on classic':<34}{'M items/s':>10}{'sparkjet classic':>18}"
          f"{'sparkjet connect':>18}")
    for key, label in (("w1", "pyspark rdd collect"), ("w2", "pyspark rdd reduceByKey")):
        base = classic[key][label]
        print(f"{key.upper() + ' ' + label:<34}{args.n / base / 1e6:>10.2f}"
              f"{base / classic[key]['sparkjet']:>17.2f}x{base / remote[key]['sparkjet']:>17.2f}x")
    print("\n(throughput: best of the timed runs, connect/classic above 1.00x: Connect is "
          "faster; times: below 1.00x is faster; the PySpark columns: sparkjet's throughput "
          "over the RDD code's, above 1.00x: sparkjet is faster)")
    print(f"load average (1/5/15 min) at the start and end of each side: classic "
          f"{' -> '.join(classic['load'])}, connect {' -> '.join(remote['load'])}")
    print(f"\ntargets: Connect throughput >= {TARGET_THROUGHPUT:.2f}x classic; small "
          f"micro-batch latency unchanged (p50 within {TARGET_LATENCY_RATIO:.2f}x or "
          f"{LATENCY_SLACK_MS:g} ms of classic)")
    for what, x, y, _ in rate_rows:
        ratio = y / x
        print(f"  {what:<28} {'met' if ratio >= TARGET_THROUGHPUT else 'MISSED'} "
              f"({ratio:.2f}x classic)")
    ratio = b["p50"] / a["p50"]
    ok = ratio <= TARGET_LATENCY_RATIO or b["p50"] - a["p50"] <= LATENCY_SLACK_MS
    print(f"  {'latency p50':<28} {'met' if ok else 'MISSED'} ({ratio:.2f}x classic, "
          f"{b['p50'] - a['p50']:+.1f} ms)")


def main() -> None:
    args = parse_args()
    if args.side:
        results = run_side(args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f)
        return
    print(f"W1/W2 {args.n:,} items, W3 {args.stream_n:,} events x {args.repeat}, "
          f"{args.probes} latency probes; best of {args.repeat} after a warm-up; classic on "
          f"{args.master}, then Connect on a local[2] server; load average {load()}",
          flush=True)
    classic = side(args, "classic")
    remote = connect_side(args)
    summary(args, classic, remote)


if __name__ == "__main__":
    main()
