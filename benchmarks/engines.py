"""Where a micro-batch should run: its time on the driver and on Spark, by size.

Adaptive micro-batches run a batch on the driver (the in-process engine)
when its input is at most ``[engine] local_max_items`` (and its bytes at most
``local_max_bytes``), and on Spark otherwise. This script measures where
the two cross, to set those defaults from figures.

Two long-lived jobs in one process, each a keyed running count
``group_by(user).aggregate(counting())`` into a map, EXACTLY_ONCE,
``snapshot_interval_millis=1``, each reading its own 1-partition stream:

- driver: adaptive micro-batches on, the thresholds raised past every size
  here, so every batch runs on the driver (checked with its
  ``localBatches`` metric);
- spark: ``adaptive_micro_batches=False``, every batch a Spark job (checked:
  ``sparkBatches``);

and, as the floor, plain Python: the same count in a dict, in this process.

For each size N, each repeat publishes N events as one chunk to an idle job
and times it from the publish call until the batch committed (the job's
batch counter moved on); the job's own ``batchDurationsMillis`` (offsets to
sink commit) is printed beside it. The map's counts are checked against the
events at the end.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from typing import Any

from _harness import connect

from sparkjet.aggregate import counting
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource

TIMEOUT = 300.0
#: Past every size here: the driver job runs every batch on the driver.
UNLIMITED = 1 << 40


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,5000,20000,50000,200000",
                        help="comma-separated events per micro-batch")
    parser.add_argument("--repeat", type=int, default=5, help="timed batches per size and job")
    parser.add_argument("--keys", type=int, default=1000, help="distinct users")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    return parser.parse_args()


def wait(condition: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.001)


class Runner:
    """One job and its stream: publish a batch, time it to its commit."""

    def __init__(self, client: Any, name: str, adaptive: bool) -> None:
        self.name = name
        self.adaptive = adaptive
        self.stream = client.get_stream(f"engines-{name}", partitions=1)
        self.counts = client.get_map(f"engines-{name}-counts")
        p = Pipeline.create()
        (p.read_from(StreamSource(f"engines-{name}")).group_by(lambda e: e)
         .aggregate(counting()).set_name("per-user").write_to(Pipeline.to_map(self.counts.name)))
        self.job = client.get_jet().submit(p, JobConfig(
            name=f"engines-{name}", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_millis=1, adaptive_micro_batches=adaptive,
        ))
        wait(lambda: self.job.status is JobStatus.RUNNING, f"the {name} job to run")
        #: What the map should hold: the events published to this job, counted.
        self.expected: Counter[str] = Counter()

    def engines(self) -> tuple[int, int]:
        metrics = self.job.get_metrics()
        return int(metrics["localBatches"]), int(metrics["sparkBatches"])

    def batch(self, events: list[str]) -> tuple[float, float]:
        """Seconds from publishing ``events`` to their batch's commit, and the
        job's own duration of that batch (offsets to sink commit)."""
        before = sum(self.engines())
        started = time.perf_counter()
        self.stream.publish_all(events)
        wait(lambda: sum(self.engines()) > before, f"the {self.name} job's batch")
        took = time.perf_counter() - started
        self.expected.update(events)
        if sum(self.engines()) != before + 1:
            raise RuntimeError(f"{self.name}: {len(events)} events took more than one batch")
        return took, self.job.get_metrics()["batchDurationsMillis"][-1] / 1000

    def check(self) -> None:
        got = dict(self.counts.entry_set())
        if got != dict(self.expected):
            raise RuntimeError(f"{self.name}: the counts differ from the events published")
        local, spark = self.engines()
        if (self.adaptive and spark > 1) or (not self.adaptive and local):
            raise RuntimeError(f"{self.name}: batches ran on the wrong engine "
                               f"({local} on the driver, {spark} on Spark)")


def plain_python(events: list[str]) -> float:
    """Seconds the same count takes in a dict in this process."""
    started = time.perf_counter()
    counts: dict[str, int] = {}
    for e in events:
        counts[e] = counts.get(e, 0) + 1
    return time.perf_counter() - started


def main() -> None:
    args = parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    client = connect(args.master, engine={
        "local_max_items": UNLIMITED, "local_max_bytes": UNLIMITED,
        "driver_state_bytes": UNLIMITED, "cold_state_bytes": UNLIMITED,
    })
    runners = [Runner(client, "driver", True), Runner(client, "spark", False)]

    def events(n: int) -> list[str]:
        return [f"user-{i % args.keys}" for i in range(n)]

    # Warm-up: the driver job's first batch runs on Spark (its state size is
    # not known yet), and Spark starts its Python workers.
    for runner in runners:
        for _ in range(3):
            runner.batch(events(1000))
    rows = []
    print(f"1-partition stream, {args.keys:,} keys, {args.repeat} batches per size and job "
          f"(median; publish to commit, and the job's own batch time)", flush=True)
    for n in sizes:
        row: dict[str, Any] = {"n": n}
        for runner in runners:
            timed = [runner.batch(events(n)) for _ in range(args.repeat)]
            row[runner.name] = statistics.median(t for t, _ in timed)
            row[runner.name + " batch"] = statistics.median(b for _, b in timed)
        row["python"] = statistics.median(plain_python(events(n)) for _ in range(args.repeat))
        rows.append(row)
        print(f"  {n:>9,} events: driver {row['driver'] * 1000:8.1f} ms "
              f"(batch {row['driver batch'] * 1000:7.1f}), spark {row['spark'] * 1000:8.1f} ms "
              f"(batch {row['spark batch'] * 1000:7.1f}), plain Python "
              f"{row['python'] * 1000:6.2f} ms", flush=True)
    print()
    print(f"{'events':>10}{'driver':>11}{'spark':>11}{'spark/driver':>14}"
          f"{'driver/python':>15}{'driver µs/event':>17}")
    for row in rows:
        print(f"{row['n']:>10,}{row['driver'] * 1000:>8.1f} ms{row['spark'] * 1000:>8.1f} ms"
              f"{row['spark'] / row['driver']:>13.2f}x{row['driver'] / row['python']:>14.0f}x"
              f"{row['driver'] / row['n'] * 1e6:>17.1f}")
    print("\n(publish to commit, median; spark/driver above 1.00x: the driver is faster; "
          "driver/python: the driver batch over the same count in a plain dict)")
    cross = [row["n"] for row in rows if row["spark"] < row["driver"]]
    print(f"smallest size Spark was faster at: {cross[0]:,} events" if cross
          else "the driver was faster at every size measured")
    for runner in runners:
        runner.check()
        runner.job.cancel()
    print(f"checked: each job's counts match the {sum(runners[0].expected.values()):,} "
          "events it was sent, and its batches ran where they should")


if __name__ == "__main__":
    main()
