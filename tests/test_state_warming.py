"""Warming the driver's copy of a job's state: the ranges read as the state tasks read them.

The first part drives :func:`warm_ranges` over state files written here; the
second runs a real job whose state is over ``cold_state_bytes`` and checks
that its small batches move to the driver once the state is warm, exactly.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle as pyspark_cloudpickle

import sparkjet
from sparkjet.aggregate import counting
from sparkjet.core.state.cache import CacheOwner, StateCache
from sparkjet.core.state.files import RangeState, StatePaths
from sparkjet.core.state.keygroups import key_group
from sparkjet.core.state.warming import warm_ranges
from sparkjet.core.store.fs import Store
from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from tests.conftest import TEST_SPARK, cancel_job, wait_until

# Spark's workers cannot import the tests package: ship this module's functions by value.
pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

GROUPS = 4
RANGES = [(0, 2), (2, 4)]


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """A warm-up freezes this process's objects (as a state put does); thaw them after."""
    yield
    gc.unfreeze()


@pytest.fixture
def paths(tmp_path: Path) -> StatePaths:
    """Stage "s" over 4 key groups in 2 ranges: batch 0 full copies, batches 1 and 2 changelogs."""
    paths = StatePaths(Store(str(tmp_path / "store")), "checkpoint/state", GROUPS)
    for lo, hi in RANGES:
        keys = [k for k in range(40) if lo <= key_group(k, GROUPS) < hi]
        for batch, changed in ((0, keys), (1, keys[:1]), (2, keys[1:2])):
            state, _ = paths.read("s", lo, hi, committed=batch - 1)
            for key in changed:
                state.values[key] = state.values.get(key, 0) + 1
            paths.write("s", lo, hi, batch, state, changed, [], paths.versions("s", lo, hi))
    return paths


def owner(tmp_path: Path, budget: int = 1 << 30) -> CacheOwner:
    return CacheOwner(Store(str(tmp_path / "store")), "j", budget)


def test_each_range_is_warmed_as_of_the_committed_batch_and_catches_up_from_there(
    paths: StatePaths, tmp_path: Path
) -> None:
    cache = StateCache()
    assert warm_ranges(paths, ["s"], 2, 1, owner(tmp_path), cache) == 2
    for lo, hi in RANGES:
        entry = cache.take((paths.root, "s", lo, hi))
        assert entry is not None and entry.batch == 1
        as_of_1, _ = paths.read("s", lo, hi, committed=1)
        assert entry.state.values == as_of_1.values  # batch 2's change is not committed
        assert entry.state.chain == as_of_1.chain
        # What a state task of batch 3 does with it: catch up with batch 2's changelog.
        listed = StatePaths.chain(paths.versions("s", lo, hi), 2, lo, hi)
        caught = paths.catch_up("s", lo, hi, entry.state, listed)
        as_of_2, _ = paths.read("s", lo, hi, committed=2)
        assert caught is not None and caught.values == as_of_2.values


def test_a_range_a_task_kept_meanwhile_is_newer_and_stays(
    paths: StatePaths, tmp_path: Path
) -> None:
    cache = StateCache()
    newer = RangeState({"from a task": 1}, {}, [])
    cache.put((paths.root, "s", 0, 2), 2, newer, owner(tmp_path))
    assert warm_ranges(paths, ["s"], 2, 1, owner(tmp_path), cache) == 1
    kept = cache.take((paths.root, "s", 0, 2))
    assert kept is not None and kept.batch == 2 and kept.state is newer
    warmed = cache.take((paths.root, "s", 2, 4))
    assert warmed is not None and warmed.batch == 1


def test_a_stopped_job_or_no_budget_or_no_files_warms_nothing(
    paths: StatePaths, tmp_path: Path
) -> None:
    cache = StateCache()
    assert warm_ranges(paths, ["s"], 2, 1, owner(tmp_path), cache, stopped=lambda: True) == 0
    assert warm_ranges(paths, ["s"], 2, 1, owner(tmp_path, budget=0), cache) == 0
    assert warm_ranges(paths, ["other"], 2, 1, owner(tmp_path), cache) == 0
    assert cache.jobs() == {}


# --- a real job -------------------------------------------------------------------------


@pytest.mark.spark
def test_small_batches_move_to_the_driver_once_a_state_over_the_cold_budget_is_warm(
    tmp_path: Path, cancel_at_end: list[Any]
) -> None:
    """Every byte of state is over ``cold_state_bytes`` 0: without the warm-up the driver
    would never hold any, and every small batch would stay on Spark."""
    client = sparkjet.connect(store={"url": str(tmp_path / "store")}, spark=TEST_SPARK,
                              engine={"local_max_items": 10, "cold_state_bytes": 0})
    stream = client.get_stream("events", partitions=2)
    p = Pipeline.create()
    (p.read_from(StreamSource("events")).group_by(lambda e: e % 5).aggregate(counting())
     .set_name("per-key").write_to(Pipeline.to_map("counts")))
    job = client.get_jet().submit(p, JobConfig(
        name="warmed", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=1))
    cancel_at_end.append(job)
    oracle: dict[int, int] = {}

    def publish(events: list[int]) -> None:
        stream.publish_all(events)
        for e in events:
            oracle[e % 5] = oracle.get(e % 5, 0) + 1
        wait_until(lambda: dict(client.get_map("counts").entry_set()) == oracle,
                   what="the counts to match")

    publish(list(range(30)))  # a large batch: on Spark, and the state's size is known
    for n in range(30, 50):
        publish([n])
        if job.get_metrics()["localBatches"]:
            break
    metrics = job.get_metrics()
    assert metrics["localBatches"] >= 1, metrics
    assert metrics["sparkBatches"] >= 2  # the build, and the small one that started the warm-up
    publish([50, 51, 52])  # on the driver, from the warmed and caught-up state
    cancel_job(job)
