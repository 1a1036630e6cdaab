"""The upkeep thread: a micro-batch's tidying after the batch, in order, drained on close.

And in a job: no micro-batch waits for a fold of its sink's log or a prune of
its checkpoint (their requests are not in any batch's tally), yet both are
done, and a job that stops leaves no upkeep thread behind.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sparkjet.aggregate import counting
from sparkjet.core.client import Client
from sparkjet.core.config import load_config
from sparkjet.core.engine.inprocess.engine import InProcessEngine
from sparkjet.core.state.checkpoint import KEEP_LOG
from sparkjet.core.store import requests, stream_chunks
from sparkjet.core.store.commit_log import FOLD_EVERY
from sparkjet.core.store.upkeep import Upkeep, later
from sparkjet.errors import JobCancelledError
from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.testing import StoreLocation


def test_outside_an_upkeep_work_runs_at_once_and_its_failure_propagates() -> None:
    ran: list[str] = []
    later("k", lambda: ran.append("now"), "noting")
    assert ran == ["now"]
    with pytest.raises(ValueError, match="bad"):
        later("k", _raise(ValueError("bad")), "failing")


def _raise(exc: Exception) -> Any:
    def work() -> None:
        raise exc
    return work


def test_work_runs_on_the_upkeep_thread_in_order_and_close_drains_it() -> None:
    ran: list[tuple[str, str]] = []
    gate = threading.Event()
    with Upkeep("sparkjet-upkeep-test") as upkeep:
        later("first", lambda: (gate.wait(10), ran.append(
            ("first", threading.current_thread().name))), "first")
        later("second", lambda: ran.append(("second", threading.current_thread().name)),
              "second")
        assert ran == []  # queued: the caller does not wait
        gate.set()
    # Leaving the block waited for both, and the worker has ended.
    assert ran == [("first", "sparkjet-upkeep-test"), ("second", "sparkjet-upkeep-test")]
    assert upkeep.ran == 2
    assert not [t for t in threading.enumerate() if t.name == "sparkjet-upkeep-test"]
    later("after", lambda: ran.append(("after", threading.current_thread().name)), "after")
    assert ran[-1] == ("after", threading.current_thread().name)  # closed: inline again


def test_a_newer_item_of_a_key_replaces_the_one_still_waiting() -> None:
    ran: list[str] = []
    gate = threading.Event()
    with Upkeep("sparkjet-upkeep-keys") as upkeep:
        later("busy", lambda: gate.wait(10), "blocking")
        later("fold", lambda: ran.append("fold 1"), "fold")
        later("prune", lambda: ran.append("prune"), "prune")
        later("fold", lambda: ran.append("fold 2"), "fold")  # replaces fold 1, keeps its turn
        gate.set()
    assert ran == ["fold 2", "prune"]
    assert upkeep.ran == 3


def test_a_failure_is_logged_naming_the_work_and_later_work_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[str] = []
    with (caplog.at_level(logging.WARNING, logger="sparkjet.store"),
          Upkeep("sparkjet-upkeep-fails") as upkeep):
        later("a", _raise(OSError("the server went away")), "pruning checkpoint c-1")
        later("b", lambda: ran.append("b"), "folding list out")
    assert ran == ["b"] and upkeep.failed == 1
    assert any("pruning checkpoint c-1 failed" in r.getMessage()
               and "the server went away" in r.getMessage() for r in caplog.records)


def test_queued_work_counts_its_requests_for_the_job_that_queued_it() -> None:
    def work() -> None:
        requests.count("delete")

    before = requests.by_kind("upkeep-job")["delete"]
    with (requests.working_for("upkeep-job"), requests.tally() as spent,
          Upkeep("sparkjet-upkeep-counts")):
        later("k", work, "deleting")
    assert requests.by_kind("upkeep-job")["delete"] == before + 1
    assert spent["delete"] == 0  # not in the tally of the thread that queued it


# --- in a job -------------------------------------------------------------------------------


def test_no_micro_batch_waits_for_a_fold_or_a_prune_and_both_are_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every micro-batch's tally is free of deletes; the checkpoint and the sink stay short."""
    # Equal tallies need each batch's read to find the chunk its look kept (for
    # READ_AHEAD_SECONDS); a loaded machine must not make one batch read it again.
    monkeypatch.setattr(stream_chunks, "READ_AHEAD_SECONDS", 600.0)
    client = Client(load_config({"store": StoreLocation(str(tmp_path / "s")).connect_overrides()}),
                    engine=InProcessEngine(2))
    stream = client.get_stream("clicks", partitions=1)
    p = Pipeline.create()
    (p.read_from(StreamSource("clicks", partitions=1)).group_by(lambda c: c["user"])
     .aggregate(counting()).set_name("per-user").write_to(Pipeline.to_map("per-user")))
    job = client.get_jet().submit(p, JobConfig(
        name="upkept", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=1))
    runner = job._runner
    assert runner is not None
    tallies: list[dict[str, int]] = []
    batches = FOLD_EVERY + 2 * KEEP_LOG + 5  # past a fold of the sink and several prunes
    try:
        for n in range(batches):
            stream.publish({"user": f"u{n % 3}"})
            deadline = time.monotonic() + 60
            while int(job.get_metrics()["lastCommittedBatch"]) < n:
                assert time.monotonic() < deadline, f"micro-batch {n} did not commit"
                time.sleep(0.002)
            tallies.append(dict(runner.stream.progress.batch_requests))
    finally:
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(timeout=60)
    assert len(tallies) == batches
    # After the first, every batch asks the store the same: none of them folds the
    # sink's log (every FOLD_EVERY records), prunes the checkpoint (every KEEP_LOG
    # batches) or removes the changelogs a full copy replaced (every 40th).
    steady = tallies[1]
    assert steady["delete"] == 0, steady
    assert all(t == steady for t in tallies[1:]), [
        (n, t) for n, t in enumerate(tallies) if n and t != steady]
    # The job stopped: its upkeep ran to the end and its thread is gone.
    assert not [t for t in threading.enumerate() if t.name.startswith("sparkjet-upkeep-")]
    store = client.store
    root = runner._checkpoint().root
    commits = store.listdir(f"{root}/commits")
    assert len(commits) <= 2 * KEEP_LOG, commits  # pruned, every KEEP_LOG batches
    assert client.get_map("per-user").get("u0") == len(range(0, batches, 3))
    assert store.listdir(store.layout.map_paths("per-user").bases), "the sink was never folded"
