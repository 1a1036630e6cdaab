"""Adaptive micro-batches: small batches on the driver, large ones on Spark, exactly once.

The promise under test: whatever mix of engines a job's batches run on, and
wherever it stops and replays, its sinks hold what a from-scratch oracle
says, once. The state one engine wrote is what the other reads next (the
executors' loaded state catches up with the driver's changelogs, and the
driver's with the executors').
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle as pyspark_cloudpickle

import sparkjet
from sparkjet.aggregate import counting
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from tests.conftest import TEST_SPARK
from tests.conftest import wait_until as wait_for

# Spark's workers cannot import the tests package: ship this module's functions by value.
pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: A micro-batch of at most this many items runs on the driver in these tests.
SMALL = 10

#: How the batches run: small ones (at most SMALL items) and large ones.
small_batch = st.integers(1, SMALL)
large_batch = st.integers(SMALL + 5, 4 * SMALL)


def connect(store: Path) -> sparkjet.Client:
    return sparkjet.connect(store={"url": str(store)}, spark=TEST_SPARK,
                            engine={"local_max_items": SMALL})


class Poison:
    """A map that fails once on item ``-1`` (a marker file says it did), then lets it pass."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        if event["n"] == -1:
            marker = Path(self.marker)
            if not marker.exists():
                marker.write_text("failed once")
                raise RuntimeError("poisoned batch")
        return event


def pipeline(marker: Path) -> Pipeline:
    p = Pipeline.create()
    counts = (p.read_from(StreamSource("events")).map(Poison(marker)).set_name("poison")
              .group_by(lambda e: e["k"]).aggregate(counting()).set_name("per-key"))
    counts.write_to(Pipeline.to_map("counts"))
    counts.write_to(Pipeline.to_list("updates"))
    return p


def check_against_oracle(client: sparkjet.Client, oracle: dict[Any, int]) -> None:
    """The map equals the oracle; the list holds each key's rising counts once, ending there."""
    wait_for(lambda: dict(client.get_map("counts").entry_set()) == oracle, timeout=120,
             what="the map to match the oracle")
    updates: list[tuple[Any, int]] = wait_for(
        lambda: (u := client.get_list("updates").get_all())
        and {k: n for k, n in u} == oracle and u, timeout=60, what="the list's last updates")
    seen: dict[Any, int] = {}
    for key, n in updates:
        assert n > seen.get(key, 0), f"update {(key, n)} repeats or goes back: {updates}"
        seen[key] = n


def end(job: Any) -> None:
    """Cancel ``job``; one that failed on its own raises its error here."""
    if job.status is JobStatus.FAILED:
        job.join(timeout=10)  # raises the job's error
    job.cancel()
    wait_for(job.is_terminal, what="the job to end")


@pytest.mark.slow
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(st.one_of(small_batch, large_batch),
                  st.sampled_from(["go on", "go on", "suspend", "fail"])),
        min_size=4, max_size=7),
    seed=st.integers(0, 2**16),
)
@pytest.mark.spark
def test_any_mix_of_engines_and_stops_is_exactly_once(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[int, str]], seed: int
) -> None:
    where = tmp_path_factory.mktemp("adaptive")
    client = connect(where / "store")
    stream = client.get_stream("events", partitions=2)
    job = client.get_jet().submit(pipeline(where / "poisoned"), JobConfig(
        name="adaptive", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=1, suspend_on_failure=True))
    rng = random.Random(seed)
    oracle: dict[Any, int] = {}
    n = 0
    try:
        wait_for(lambda: job.status is JobStatus.RUNNING, what="the job to run")
        for size, then in steps:
            events = []
            for _ in range(size):
                events.append({"k": rng.randrange(5), "n": n})
                n += 1
            poisoned = then == "fail" and not (where / "poisoned").exists()
            if poisoned:
                events.append({"k": 0, "n": -1})  # the batch fails once, then replays
            stream.publish_all(events)
            for e in events:
                oracle[e["k"]] = oracle.get(e["k"], 0) + 1
            if poisoned:
                wait_for(lambda: job.status is JobStatus.SUSPENDED, what="suspended on failure")
                job.resume()
            check_against_oracle(client, oracle)
            if then == "suspend":
                job.suspend()
                wait_for(lambda: job.status is JobStatus.SUSPENDED, what="suspended")
                job.resume()
        check_against_oracle(client, oracle)
    finally:
        end(job)


@pytest.mark.spark
def test_small_batches_run_on_the_driver_and_large_ones_on_spark(tmp_path: Path) -> None:
    client = connect(tmp_path / "store")
    stream = client.get_stream("events", partitions=2)
    job = client.get_jet().submit(pipeline(tmp_path / "poisoned"), JobConfig(
        name="mixed", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=1))
    oracle: dict[Any, int] = {}
    try:
        wait_for(lambda: job.status is JobStatus.RUNNING, what="the job to run")
        n = 0
        for size in (3, 30, 2, 1, 25, 4):
            events = [{"k": (n + i) % 4, "n": n + i} for i in range(size)]
            n += size
            stream.publish_all(events)
            for e in events:
                oracle[e["k"]] = oracle.get(e["k"], 0) + 1
            check_against_oracle(client, oracle)
        metrics = wait_for(lambda: (m := job.get_metrics())["localBatches"] >= 3 and m,
                           what="the small batches to be counted")
        assert metrics["sparkBatches"] >= 2
    finally:
        end(job)
