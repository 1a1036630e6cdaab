"""Shared harness: one Spark session, timed runs, a ratio table, streaming contenders.

Every benchmark runs sparkjet, hand-written PySpark and plain Python on the
same data in the same process, and prints the best of ``--repeat`` runs (after
one warm-up run each) with the ratios against the baselines.

The streaming benchmarks (``latency.py``, ``stream_rolling.py``,
``windows.py``) run each contender as one long-lived query: a
:class:`JobContender` (a sparkjet job fed through a sparkjet stream) or a
:class:`NativeContender` (hand-written Structured Streaming fed JSON-lines
files). The script's subclass builds the query and reads its sink; starting,
publishing, checking for failure and stopping are here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def parse_args(description: str, default_n: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-n", type=int, default=default_n, help="number of items")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per contender")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    return parser.parse_args()


def connect(master: str, engine: dict[str, Any] | None = None) -> Any:
    """A sparkjet client on a temporary store, and its (shared) Spark session.

    ``engine``: overrides of the ``[engine]`` table (where micro-batches run).
    """
    import sparkjet

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    store = tempfile.mkdtemp(prefix="sparkjet-bench-")
    client = sparkjet.connect(
        store={"url": store},
        spark={"master": master, "conf": {"spark.ui.enabled": "false"}},
        **({"engine": engine} if engine else {}),
    )
    client.spark.sparkContext.setLogLevel("ERROR")
    return client


def measure(label: str, fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    result = fn()  # warm-up: JVM JIT, Python workers
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    best = min(times)
    print(f"  {label:<34} best {best:7.3f} s   median {statistics.median(times):7.3f} s",
          flush=True)
    return best, result


def report(n: int, timings: dict[str, float], subject: str = "sparkjet") -> None:
    print()
    print(f"{'contender':<36}{'items/s':>14}{'vs ' + subject:>14}")
    for label, seconds in timings.items():
        ratio = seconds / timings[subject]
        print(f"{label:<36}{n / seconds / 1e6:>11.2f} M/s{ratio:>13.2f}x")
    print(f"\n(ratio = contender time / {subject} time; above 1.00x means {subject} is faster)")


class JsonLinesFolder:
    """A folder Spark's file source reads: a producer writes each JSON-lines file aside,
    then moves it in whole."""

    def __init__(self, prefix: str) -> None:
        self.root = tempfile.mkdtemp(prefix=prefix)
        self.folder = os.path.join(self.root, "in")
        self.staging = os.path.join(self.root, "staging")
        os.makedirs(self.folder)
        os.makedirs(self.staging)
        self.files = 0

    @staticmethod
    def encode(events: list[Any]) -> bytes:
        return "".join(json.dumps(e) + "\n" for e in events).encode()

    def publish(self, payload: bytes) -> None:
        name = f"part-{self.files:06d}.json"
        self.files += 1
        staged = os.path.join(self.staging, name)
        with open(staged, "wb") as f:
            f.write(payload)
        os.rename(staged, os.path.join(self.folder, name))

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank, rounded down)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def submit_running(client: Any, pipeline: Any, config: Any, label: str) -> Any:
    """Submit a job and wait until it runs; raise if it ends or has not started in 60 s."""
    from sparkjet.job import JobStatus

    job = client.get_jet().submit(pipeline, config)
    deadline = time.monotonic() + 60
    while job.status is not JobStatus.RUNNING:
        if job.is_terminal() or time.monotonic() > deadline:
            job.join(0)
            raise RuntimeError(f"{label}: job is {job.status.value}")
        time.sleep(0.01)
    return job


@contextlib.contextmanager
def kafka_client(
    master: str, bootstrap: str | None, engine: dict[str, Any] | None = None
) -> Iterator[tuple[Any, str, bool]]:
    """A client with the Kafka plugin, the broker's address, and whether it is Tansu.

    The broker is ``bootstrap`` when given, else a Tansu broker started on
    127.0.0.1 for the run (``tests/kafka_broker.py``) and stopped after it.
    ``engine``: overrides of the ``[engine]`` table, as for :func:`connect`.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.kafka_broker
    from tests.kafka_broker import TansuBroker

    from sparkjet.contrib import kafka

    broker = None if bootstrap else TansuBroker()
    try:
        client = connect(master, engine)
        if "kafka" not in {info.name for info in client.list_plugins()}:
            client.register_plugin(kafka, "kafka")
        yield client, bootstrap or (broker.bootstrap if broker else ""), broker is not None
    finally:
        if broker is not None:
            broker.stop()


@contextlib.contextmanager
def s3_client(master: str) -> Iterator[Any]:
    """A sparkjet client whose store is on moto's S3 server on 127.0.0.1, as the tests use."""
    with store_client("s3", master) as client:
        yield client


@contextlib.contextmanager
def store_client(kind: str, master: str) -> Iterator[Any]:
    """A sparkjet client whose store is on S3 (moto) or GCS (fake-gcs-server) on 127.0.0.1."""
    import sparkjet
    from sparkjet.testing import fake_gcs_server, moto_s3_server

    server = {"s3": moto_s3_server, "gcs": fake_gcs_server}[kind]
    with tempfile.TemporaryDirectory() as workdir, server(Path(workdir)) as location:
        yield sparkjet.connect(store=location.fresh().connect_overrides(),
                               spark={"master": master})


class Contender:
    """One long-lived streaming query: publish events to it, read its sink, stop it.

    The script's subclass adds ``start`` (its own query, with its own
    parameters) and the reads of its sink.
    """

    label = ""
    sink: Any = None

    def encode(self, events: list[Any]) -> Any:
        """What the producer hands to :meth:`publish` (done outside the timers)."""
        return events

    def publish(self, payload: Any) -> None:
        raise NotImplementedError

    def batches(self) -> int:
        """Micro-batches completed so far."""
        raise NotImplementedError

    def check(self) -> None:
        """Raise if the query has failed."""

    def stop(self) -> None:
        raise NotImplementedError


class JobContender(Contender):
    """A sparkjet job reading a sparkjet stream; the subclass's ``start`` calls :meth:`submit`."""

    def __init__(self, client: Any, label: str, stream: Any) -> None:
        self.client = client
        self.label = label
        self.stream = stream
        self.job: Any = None

    def submit(self, pipeline: Any, config: Any) -> None:
        """Submit the job and wait until it runs; raise if it ends or has not started in 60 s."""
        self.job = submit_running(self.client, pipeline, config, self.label)

    def publish(self, payload: Any) -> None:
        self.stream.publish_all(payload)  # pickles: counted in any timer around it

    def batches(self) -> int:
        return int(self.job.get_metrics()["lastCommittedBatch"]) + 1

    def engines(self) -> tuple[int, int]:
        """Micro-batches run so far on the driver (adaptive) and on Spark (the job's metrics)."""
        metrics = self.job.get_metrics()
        return int(metrics["localBatches"]), int(metrics["sparkBatches"])

    def batch_millis(self) -> list[int]:
        """Durations of recent micro-batches (offsets to sink commit)."""
        return list(self.job.get_metrics()["batchDurationsMillis"])

    def check(self) -> None:
        if self.job.is_terminal():
            self.job.join(0)  # raises the failure
            raise RuntimeError(f"{self.label}: the job ended")

    def stop(self) -> None:
        from sparkjet.errors import JobCancelledError

        if self.job is None or self.job.is_terminal():
            return
        self.job.cancel()
        with contextlib.suppress(JobCancelledError):
            self.job.join(60)


class NativeContender(Contender):
    """Hand-written Structured Streaming reading a :class:`JsonLinesFolder`.

    The subclass's ``start`` sets :attr:`query` (checkpointed in :attr:`checkpoint`)
    and counts its foreachBatch calls in :attr:`calls`.
    """

    label = "native structured streaming"

    def __init__(self, client: Any, prefix: str) -> None:
        self.spark = client.spark
        self.input = JsonLinesFolder(prefix)
        self.checkpoint = os.path.join(self.input.root, "checkpoint")
        self.calls = 0  # micro-batches that reached the sink
        self.query: Any = None

    def shuffle_per_core(self) -> None:
        """As many state partitions as sparkjet's state shards (defaultParallelism)."""
        shards = max(1, int(self.spark.sparkContext.defaultParallelism))
        self.spark.conf.set("spark.sql.shuffle.partitions", str(shards))

    def encode(self, events: list[Any]) -> Any:
        return self.input.encode(events)

    def publish(self, payload: Any) -> None:
        self.input.publish(payload)

    def batches(self) -> int:
        return self.calls

    def check(self) -> None:
        if self.query.exception() is not None:
            raise RuntimeError(f"native query failed: {self.query.exception()}")

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
        self.input.remove()


def wait_for(contender: Contender, condition: Callable[[], bool], what: str, *,
             timeout: float, pause: float = 0.01,
             sample: Callable[[], None] | None = None) -> float:
    """Wait until ``condition()`` holds, checking the contender, ``pause`` s apart.

    ``sample`` runs before each check. Returns :func:`time.perf_counter` when
    the condition held; raises :class:`TimeoutError` after ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if sample is not None:
            sample()
        contender.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{contender.label}: timed out waiting for {what}")
        time.sleep(pause)
    return time.perf_counter()
