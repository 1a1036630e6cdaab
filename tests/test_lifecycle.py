"""The job lifecycle on the in-process engine: statuses, control, take-over, cluster policy.

No Spark and no JVM here (``test_lifecycle_runs_without_java`` proves it):
jobs run their real tasks on the in-process engine
(:class:`tests.engine_knobs.ControlledEngine`, which also reports the
executors a test sets), against a real store in a temporary folder, with the
real runner, streaming loop and checkpoint. What a job *is* — which status
follows which, who may act on it from where, what happens when its driver
dies or its executors go — is tested here, in milliseconds; and where a job
was resumed, restarted or taken over, what its sink holds says no item was
lost or written twice.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkjet.core.client import Client
from sparkjet.core.jobs import heartbeat as heartbeat_module
from sparkjet.core.jobs import stream_run as streaming_module
from sparkjet.core.jobs.lifecycle import (
    ACTION_FROM,
    TRANSITIONS,
    Action,
    IllegalTransition,
    check_action,
    check_transition,
)
from sparkjet.core.jobs.policy import ClusterWatch
from sparkjet.core.jobs.record import Answer, Driver, Failure, JobRecord, this_driver
from sparkjet.errors import (
    JobCancelledError,
    JobFailedError,
    JobStateError,
    TimeoutException,
)
from sparkjet.job import Job, JobConfig, JobStatus, JobStatusEvent, ProcessingGuarantee
from sparkjet.pipeline import Pipeline
from sparkjet.plugin import hookimpl
from tests.conftest import wait_until
from tests.engine_knobs import (
    Clients,
    ControlledEngine,
    Gate,
    Raises,
    RaisesOnce,
    sink_items,
    stream_pipeline,
)

S = JobStatus
EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE


# --- the transition table and the action rules (pure) ----------------------------


def test_terminal_statuses_have_no_way_out_and_every_other_can_fail() -> None:
    for status in JobStatus:
        if status.is_terminal():
            assert TRANSITIONS[status] == frozenset()
        else:
            assert S.FAILED in TRANSITIONS[status], status  # a cancel ends any live job


def test_only_jets_moves_are_allowed() -> None:
    check_transition("j", S.NOT_RUNNING, S.STARTING)
    check_transition("j", S.RUNNING, S.COMPLETING)
    check_transition("j", S.SUSPENDED, S.STARTING)
    for old, new in [(S.COMPLETED, S.RUNNING), (S.SUSPENDED, S.RUNNING),
                     (S.NOT_RUNNING, S.COMPLETED), (S.COMPLETING, S.SUSPENDED)]:
        with pytest.raises(IllegalTransition, match=f"job j: {old.value} -> {new.value}"):
            check_transition("j", old, new)


@pytest.mark.parametrize(
    ("action", "status", "streaming", "message"),
    [
        (Action.CANCEL, S.COMPLETED, True, "cannot cancel job j: it has already COMPLETED"),
        (Action.SUSPEND, S.SUSPENDED, True, "cannot suspend job j: it is SUSPENDED, not RUNNING "
         "or STARTING"),
        (Action.SUSPEND, S.RUNNING, False, "cannot suspend job j: it is a batch job"),
        (Action.RESUME, S.RUNNING, True, "cannot resume job j: it is RUNNING, not SUSPENDED"),
        (Action.RESTART, S.STARTING, True, "cannot restart job j: it is STARTING, not RUNNING"),
        (Action.UPDATE_CONFIG, S.RUNNING, True, "cannot update the configuration of job j: it "
         "is RUNNING, not SUSPENDED"),
        (Action.EXPORT_SNAPSHOT, S.FAILED, True, "cannot export a snapshot of job j: it is "
         "FAILED, not RUNNING or SUSPENDED"),
        # One wording whichever rule refuses it (a slow batch job read RUNNING gave
        # "cannot export_snapshot job j" on Spark 4.0).
        (Action.EXPORT_SNAPSHOT, S.RUNNING, False, "cannot export a snapshot of job j: it is a "
         "batch job"),
    ],
)
def test_actions_refused_name_the_job_and_its_status(
    action: Action, status: JobStatus, streaming: bool, message: str
) -> None:
    with pytest.raises(JobStateError) as info:
        check_action(action, status, streaming=streaming, label="j")
    assert str(info.value) == message


def test_every_allowed_action_is_accepted() -> None:
    for action, statuses in ACTION_FROM.items():
        for status in statuses:
            check_action(action, status, streaming=True, label="j")


# --- the cluster policy (pure) ----------------------------------------------------


def config(**changes: Any) -> JobConfig:
    return JobConfig(processing_guarantee=EXACTLY_ONCE, **changes)


def test_cluster_watch_takes_a_baseline_and_ignores_local_mode() -> None:
    watch = ClusterWatch()
    assert watch.check(None, config(auto_scaling_enabled=False), "j") is None
    assert watch.check({"1", "2"}, config(auto_scaling_enabled=False), "j") is None  # baseline
    assert watch.started == 2
    assert watch.check({"1", "2", "3"}, config(auto_scaling_enabled=False), "j") is None


def test_a_lost_executor_suspends_without_auto_scaling_and_fails_a_job_without_guarantee() -> None:
    watch = ClusterWatch()
    watch.check({"1", "2"}, config(auto_scaling_enabled=False), "j")
    cause = watch.check({"1", "3"}, config(auto_scaling_enabled=False), "j")  # 2 replaced by 3
    assert cause == "executor(s) 2 were lost (2 of 3 left) and auto-scaling is off"
    assert watch.check({"1", "2"}, config(auto_scaling_enabled=True), "j") is None

    none = ClusterWatch()
    plain = JobConfig(auto_scaling_enabled=False)
    none.check({"1", "2"}, plain, "j")
    with pytest.raises(JobFailedError, match="job j failed: executor"):
        none.check({"1"}, plain, "j")


def test_split_brain_protection_needs_half_plus_one() -> None:
    watch = ClusterWatch()
    guarded = config(split_brain_protection_enabled=True)
    watch.check({"1", "2", "3", "4"}, guarded, "j")
    assert watch.check({"1", "2", "3"}, guarded, "j") is None
    assert watch.check({"1", "2"}, guarded, "j") == (
        "split-brain protection: 2 of the 4 executors the job started with are left, fewer "
        "than the 3 it needs"
    )
    watch.reset()
    assert watch.check({"1"}, guarded, "j") is None  # a resumed job counts what it has


# --- jobs on the in-process engine ----------------------------------------------------


@pytest.fixture(autouse=True)
def _fast_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming_module, "CLUSTER_CHECK_SECONDS", 0.0)
    monkeypatch.setattr(heartbeat_module, "CONTROL_POLL_SECONDS", 0.02)


@pytest.fixture
def engine() -> ControlledEngine:
    return ControlledEngine()


_clients = Clients()
make_client = _clients.make


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test() -> Iterator[None]:
    yield
    _clients.close()


@pytest.fixture
def client(store_url: str, engine: ControlledEngine) -> Client:
    """This module's client: its jobs run in process, on :func:`engine`, whatever
    ``SPARKJET_TEST_ENGINE`` says (the lifecycle runs without a JVM)."""
    return make_client(store_url, engine)


def batch_pipeline(*stages: tuple[str, Any]) -> Pipeline:
    """List ``numbers`` (1, 2, 3) into list ``out``, through ``(name, function)`` map stages."""
    p = Pipeline.create()
    flow = p.read_from(Pipeline.from_list("numbers", [1, 2, 3]))
    for name, function in stages:
        flow = flow.map(function).set_name(name)
    flow.write_to(Pipeline.to_list("out"))
    return p


def record_events(job: Job) -> list[tuple[JobStatus, JobStatus]]:
    seen: list[tuple[JobStatus, JobStatus]] = []

    def listener(event: JobStatusEvent) -> None:
        seen.append((event.previous_status, event.new_status))

    job.add_status_listener(listener)
    return seen


def submit_stream(client: Client, name: str, *stages: tuple[str, Any], **changes: Any) -> Job:
    changes.setdefault("snapshot_interval_millis", 10)
    job = client.get_jet().submit(
        stream_pipeline(*stages),
        JobConfig(name=name, processing_guarantee=EXACTLY_ONCE, **changes),
    )
    wait_until(lambda: job.status is S.RUNNING, timeout=10, what=f"{name} to run")
    return job


def wait_for_sink(client: Client, expected: list[Any], what: str) -> None:
    """Wait until list ``out`` holds as many items as ``expected``, then check it holds those.

    Exactly those, each once: a lost item times out, a duplicate fails the check.
    """
    wait_until(lambda: len(sink_items(client)) >= len(expected), timeout=10, what=what)
    assert sink_items(client) == sorted(expected)


def test_batch_job_goes_through_jets_statuses(client: Client) -> None:
    gate = Gate()
    job = client.get_jet().submit(batch_pipeline(("gate", gate)), JobConfig(name="batch"))
    seen = record_events(job)
    wait_until(gate.reached, timeout=10, what="the job to reach its gate")
    assert job.status is S.RUNNING
    gate.open()
    job.join(timeout=10)
    full = [(S.NOT_RUNNING, S.STARTING), (S.STARTING, S.RUNNING),
            (S.RUNNING, S.COMPLETING), (S.COMPLETING, S.COMPLETED)]
    # The listener was added while the job started: it saw the moves from then on.
    assert len(seen) >= 2 and seen == full[-len(seen):]
    assert job.status is S.COMPLETED and not job.is_streaming() and job.is_driven_here()
    assert sink_items(client) == [1, 2, 3]  # one run, committed once
    metrics = job.get_metrics()
    assert 0 < metrics["executionStartTime"] <= metrics["executionCompletionTime"]
    assert set(metrics["stages"]) == {"from-list(numbers)", "gate", "to-list(out)"}


def test_a_failing_batch_job_fails_and_tells_the_plugins(client: Client) -> None:
    errors: list[BaseException] = []

    class Observer:
        @hookimpl
        def on_job_error(self, job: Job, error: BaseException) -> None:
            errors.append(error)

    client.register_plugin(Observer(), "observer")
    job = client.get_jet().submit(batch_pipeline(("x", Raises(ValueError, "boom"))))
    with pytest.raises(JobFailedError, match="boom") as info:
        job.join(timeout=10)
    assert info.value.stage == "x"
    assert job.status is S.FAILED and job.get_failure() == "stage 'x' failed: ValueError: boom"
    assert errors == [info.value]
    assert sink_items(client) == []  # a failed job commits nothing


def test_cancel_stops_a_running_batch_job_through_the_engine(
    client: Client, engine: ControlledEngine
) -> None:
    gate = Gate()
    job = client.get_jet().submit(batch_pipeline(("gate", gate)), JobConfig(name="slow"))
    wait_until(gate.reached, timeout=10, what="the job to reach its gate")
    assert job.status is S.RUNNING
    with pytest.raises(TimeoutException, match=r"'slow'.*did not finish within 0.05 s"):
        job.join(timeout=0.05)
    job.cancel()
    gate.open()  # the function returns; the engine finds the cancel before the next item
    with pytest.raises(JobCancelledError):
        job.join(timeout=10)
    assert job.is_user_cancelled() and job.id in engine.cancelled_jobs
    assert engine.bound  # the job thread tagged its work before running it
    assert sink_items(client) == []  # stopped before its sink committed
    with pytest.raises(JobStateError, match="it has already FAILED"):
        job.cancel()


def test_streaming_job_suspends_resumes_restarts_and_is_cancelled(
    client: Client, engine: ControlledEngine
) -> None:
    stream = client.get_stream("events", partitions=2)
    # Published before the job starts: a publish writes one partition after the
    # other, and a running loop may plan a batch between the two.
    stream.publish_all(range(10))
    job = submit_stream(client, "clicks")
    seen = record_events(job)
    wait_until(lambda: job.get_metrics()["lastCommittedBatch"] >= 0, timeout=10, what="a batch")
    first = engine.micro_batches(job.id)[0]
    assert first.batch == 0 and first.committed == -1
    assert first.source_ranges == {"events": ([0, 0], [5, 5])}
    assert sink_items(client) == sorted(range(10))

    job.suspend()
    assert job.wait_for_status(S.SUSPENDED, timeout=10) is S.SUSPENDED
    assert job.get_suspension_cause() == "Requested by user"
    with pytest.raises(JobStateError, match="it is SUSPENDED, not RUNNING or STARTING"):
        job.suspend()
    stream.publish_all(range(4))
    job.resume()
    assert job.wait_for_status(S.RUNNING, timeout=10) is S.RUNNING
    wait_until(lambda: len(engine.micro_batches(job.id)) >= 2, timeout=10, what="batch 1")
    second = engine.micro_batches(job.id)[1]
    # The resumed job continues after the last committed batch, from its end offsets.
    assert (second.batch, second.committed) == (1, 0)
    assert second.source_ranges == {"events": ([5, 5], [7, 7])}
    wait_for_sink(client, [*range(10), *range(4)], "batch 1 in the sink")

    job.restart()
    wait_until(lambda: (S.STARTING, S.RUNNING) in seen[seen.index((S.RUNNING, S.STARTING)):]
               if (S.RUNNING, S.STARTING) in seen else False, timeout=10, what="a restart")
    # The restarted job goes on from its checkpoint: nothing read again, nothing skipped.
    stream.publish_all([100, 101])
    wait_for_sink(client, [*range(10), *range(4), 100, 101], "the restarted job's batch")
    after = [w.batch for w in engine.micro_batches(job.id)][2:]
    assert after and after == list(range(2, 2 + len(after)))  # numbered on from batch 2
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=10)
    assert seen[:4] == [(S.RUNNING, S.SUSPENDED), (S.SUSPENDED, S.STARTING),
                        (S.STARTING, S.RUNNING), (S.RUNNING, S.STARTING)]
    assert seen[-1] == (S.RUNNING, S.FAILED)
    assert not (Path(client.store.root) / "jobs" / job.id / "checkpoint").exists()
    assert sink_items(client) == sorted([*range(10), *range(4), 100, 101])


def test_a_failing_micro_batch_suspends_with_suspend_on_failure(
    client: Client, engine: ControlledEngine, tmp_path: Path
) -> None:
    stream = client.get_stream("events", partitions=1)
    armed = tmp_path / "disk-fails-once"
    armed.touch()
    job = submit_stream(client, "fragile", ("disk", RaisesOnce(str(armed), "disk gone")),
                        suspend_on_failure=True)
    stream.publish_all([1])
    assert job.wait_for_status(S.SUSPENDED, timeout=10) is S.SUSPENDED
    assert job.get_suspension_cause() == "stage 'disk' failed: OSError: disk gone"
    assert engine.micro_batches(job.id) == []  # the failed batch did not commit ...
    assert sink_items(client) == []  # ... nor did its sink
    job.resume()
    wait_until(lambda: job.get_metrics()["lastCommittedBatch"] == 0, timeout=10,
               what="the replay")
    assert [w.batch for w in engine.micro_batches(job.id)] == [0]  # the same batch, replayed
    assert sink_items(client) == [1]  # landed once
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=10)


def test_a_cancel_that_races_the_suspend_ends_the_job(client: Client) -> None:
    """A cancel arriving while the job thread is still stopping (here: from its own
    SUSPENDED listener, before the thread returns) ends the job exactly once."""
    client.get_stream("events", partitions=1)
    job = submit_stream(client, "racing")

    def cancel_on_suspend(event: JobStatusEvent) -> None:
        if event.new_status is S.SUSPENDED:
            job.cancel()

    job.add_status_listener(cancel_on_suspend)
    job.suspend()
    with pytest.raises(JobCancelledError):
        job.join(timeout=10)
    assert job.status is S.FAILED and job.is_user_cancelled()
    with pytest.raises(JobStateError, match="it is FAILED, not SUSPENDED"):
        job.resume()

# --- the control protocol: another process acts through the store ------------------


def test_other_processes_act_through_the_control_folder(
    store_url: str, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    stream = client.get_stream("events", partitions=1)
    job = submit_stream(client, "remote")
    other = make_client(store_url).get_jet().get_job(job.id)
    assert other is not None and not other.is_driven_here() and other.is_driver_alive()
    stream.publish_all(range(3))
    wait_for_sink(client, [0, 1, 2], "the first batch")

    other.suspend()
    assert other.wait_for_status(S.SUSPENDED, timeout=10) is S.SUSPENDED
    other.update_config(snapshot_interval_millis=25)
    wait_until(lambda: job.config.snapshot_interval_millis == 25, timeout=10,
               what="the driver to apply the new configuration")
    with caplog.at_level(logging.WARNING, logger="sparkjet.jobs"):
        client.get_jet().records.request(job.id, "explode")
        other.resume()
        assert other.wait_for_status(S.RUNNING, timeout=10) is S.RUNNING
    assert "ignoring unknown request 'explode'" in caplog.text
    stream.publish_all(range(3, 5))
    wait_for_sink(client, list(range(5)), "the resumed job's batch")
    other.cancel()
    with pytest.raises(JobCancelledError):
        other.join(timeout=10)
    assert job.is_user_cancelled()


def test_a_request_the_driver_refuses_raises_in_the_asking_process(
    store_url: str, client: Client
) -> None:
    """The driver answers every request; a refusal is the caller's JobStateError.

    The asking handle's check passed on what it read; the driver's status
    decides (two processes resuming at once: the second one is refused).
    """
    client.get_stream("events", partitions=1)
    job = submit_stream(client, "answered")
    job.wait_for_status(S.RUNNING, timeout=10)
    other = make_client(store_url).get_jet().get_job(job.id)
    assert other is not None and not other.is_driven_here()
    # What a handle that read SUSPENDED a moment ago sends: the driver refuses it.
    with pytest.raises(JobStateError, match=re.escape(
        f"cannot resume job 'answered' ({job.id}): it is RUNNING, not SUSPENDED"
    )):
        other._ask(Action.RESUME)
    assert job.status is S.RUNNING
    answers = (client.get_jet().records.read(job.id) or {})["answers"]
    assert [Answer.from_json(a).error for a in answers.values()] == [
        f"cannot resume job 'answered' ({job.id}): it is RUNNING, not SUSPENDED"
    ]
    other.suspend()  # accepted: answered without an error
    assert other.wait_for_status(S.SUSPENDED, timeout=10) is S.SUSPENDED
    with pytest.raises(JobStateError, match="it is SUSPENDED, not RUNNING"):
        other._ask(Action.RESTART)
    # What the driver cannot carry out is answered too, not left to time out.
    with pytest.raises(JobStateError, match=r"^ConfigError: .*snapshot_interval_millis"):
        other._ask(Action.UPDATE_CONFIG, {"config": {"snapshot_interval_millis": -5}},
                   timeout=10)
    with pytest.raises(JobStateError, match=r"^malformed export request \{'cancel_job'"):
        other._ask(Action.EXPORT_SNAPSHOT, {"cancel_job": False}, timeout=10)
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=10)
    with pytest.raises(JobStateError, match=re.escape(
        f"job 'answered' ({job.id}) ended (FAILED) before its driver answered the "
        "suspend request"
    )):
        other._ask(Action.SUSPEND)


def test_a_driver_that_never_answers_times_out_naming_it(
    store_url: str, client: Client
) -> None:
    client.get_stream("events", partitions=1)
    job = submit_stream(client, "mute")
    job.wait_for_status(S.RUNNING, timeout=10)
    runner = client.get_jet().runners.get(job.id)
    runner.done.set()  # the watcher stops: nothing takes the control folder any more
    runner.watcher.join(timeout=10)
    other = make_client(store_url).get_jet().get_job(job.id)
    assert other is not None and other.is_driver_alive()  # its pid and heartbeat are fresh
    with pytest.raises(TimeoutException, match=re.escape(
        f"job 'mute' ({job.id}): its driver (pid {os.getpid()}) did not answer the suspend "
        "request within 0.5 s"
    )):
        other._ask(Action.SUSPEND, timeout=0.5)
    runner.done.clear()
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=10)


def test_a_driver_that_dies_before_it_answers_a_resume_is_taken_over(
    store_url: str, client: Client
) -> None:
    stream = client.get_stream("events", partitions=1)
    job = submit_stream(client, "dies-asked")
    stream.publish_all(range(3))
    wait_for_sink(client, [0, 1, 2], "the first batch")
    job.suspend()
    job.wait_for_status(S.SUSPENDED, timeout=10)
    other = make_client(store_url).get_jet().get_job(job.id)
    assert other is not None and other.is_driver_alive()
    runner = client.get_jet().runners.get(job.id)
    runner.done.set()  # this driver takes no more requests ...
    runner.watcher.join(timeout=10)
    asked = threading.Thread(target=other.resume)
    asked.start()
    wait_until(lambda: any(Path(client.store.root, "jobs", job.id, "control").glob(
        "*-resume.req")), timeout=10, what="the resume request")
    kill_driver(client, job)  # ... and dies before it answered
    asked.join(timeout=30)
    assert not asked.is_alive()
    assert other.is_driven_here() and other.wait_for_status(S.RUNNING, timeout=10) is S.RUNNING
    assert (client.get_jet().records.read(job.id) or {})["epoch"] == 1
    stream.publish_all(range(3, 5))
    wait_for_sink(client, list(range(5)), "a batch of the new driver")
    other.cancel()
    with pytest.raises(JobCancelledError):
        other.join(timeout=10)


# --- take-over after the driver died ---------------------------------------------------


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: the pid names no process
    return child.pid


def kill_driver(client: Client, job: Job) -> None:
    """What the store sees when the driving process dies: its lease no longer renewed."""
    runner = client.get_jet().runners.get(job.id)
    runner.done.set()  # the watcher stops renewing the lease
    runner.watcher.join(timeout=10)
    record = dict(client.get_jet().records.read(job.id) or {})
    record["driver"] = {**this_driver().to_json(), "pid": dead_pid()}
    client.get_jet().records.write(record)


def test_a_job_whose_driver_died_is_suspended_and_resumes_elsewhere(
    store_url: str, client: Client, engine: ControlledEngine
) -> None:
    stream = client.get_stream("events", partitions=1)
    job = submit_stream(client, "orphan")
    stream.publish_all(range(3))
    wait_until(lambda: job.get_metrics()["lastCommittedBatch"] == 0, timeout=10, what="batch 0")
    job.suspend()
    job.wait_for_status(S.SUSPENDED, timeout=10)
    kill_driver(client, job)

    engine_b = ControlledEngine()
    orphan = make_client(store_url, engine_b).get_jet().get_job(job.id)
    assert orphan is not None and orphan.status is S.SUSPENDED and not orphan.is_driver_alive()
    assert orphan.get_suspension_cause().endswith("resume() continues it here")
    stream.publish_all(range(2))
    orphan.resume()
    assert orphan.is_driven_here()
    assert orphan.wait_for_status(S.RUNNING, timeout=10) is S.RUNNING
    wait_until(lambda: engine_b.micro_batches(job.id), timeout=10, what="batch 1 on B")
    resumed = engine_b.micro_batches(job.id)[0]
    assert (resumed.batch, resumed.committed) == (1, 0)
    assert resumed.source_ranges == {"events": ([3], [5])}
    wait_for_sink(client, [0, 1, 2, 0, 1], "batch 1 in the sink")
    record = client.get_jet().records.read(job.id) or {}
    assert record["epoch"] == 1 and record["driver"]["pid"] == os.getpid()
    orphan.cancel()
    with pytest.raises(JobCancelledError):
        orphan.join(timeout=10)


def test_a_handle_that_saw_the_dead_driver_is_refused_once_another_took_the_job_over(
    store_url: str, client: Client
) -> None:
    stream = client.get_stream("events", partitions=1)
    job = submit_stream(client, "seen-dead")
    stream.publish_all(range(3))
    wait_for_sink(client, [0, 1, 2], "the first batch")
    job.suspend()
    job.wait_for_status(S.SUSPENDED, timeout=10)
    kill_driver(client, job)
    late = make_client(store_url).get_jet().get_job(job.id)
    first = make_client(store_url).get_jet().get_job(job.id)
    assert late is not None and first is not None
    assert not late.is_driver_alive()  # `late` saw the dead driver at epoch 0 ...
    first.resume()  # ... then another process took the job over (epoch 1) and drives it
    assert first.wait_for_status(S.RUNNING, timeout=10) is S.RUNNING
    with pytest.raises(JobStateError, match="another process took it over already"):
        late._take_over()  # what resume() does when it finds the driver dead
    record = client.get_jet().records.read(job.id) or {}
    assert record["epoch"] == 1  # no second take-over
    stream.publish_all(range(3, 5))
    wait_for_sink(client, list(range(5)), "a batch of the new driver")
    first.cancel()
    with pytest.raises(JobCancelledError):
        first.join(timeout=10)


def test_a_job_its_driver_ended_after_a_handle_saw_it_dead_is_not_taken_over(
    store_url: str, client: Client
) -> None:
    client.get_stream("events", partitions=1)
    job = submit_stream(client, "slow-not-dead")
    job.suspend()
    job.wait_for_status(S.SUSPENDED, timeout=10)
    kill_driver(client, job)
    late = make_client(store_url).get_jet().get_job(job.id)
    assert late is not None and not late.is_driver_alive()  # seen dead at epoch 0 ...
    records = client.get_jet().records
    ended = {**(records.read(job.id) or {}), "status": S.FAILED.value}
    records.write(ended)  # ... but it was only slow, and ended the job (at epoch 0)
    with pytest.raises(JobStateError, match=r"ended \(FAILED\) meanwhile"):
        late._take_over()  # what cancel() does when it finds the driver dead
    assert records.read(job.id) == ended  # not made SUSPENDED again
    assert not any(p.name.startswith("owner-")
                   for p in (Path(client.store.root) / "jobs" / job.id).iterdir())


def test_a_driver_that_died_while_running_reads_suspended_and_only_one_process_takes_over(
    store_url: str, client: Client
) -> None:
    stream = client.get_stream("events", partitions=1)
    job = submit_stream(client, "contested")
    stream.publish_all(range(3))
    wait_for_sink(client, [0, 1, 2], "the first batch")
    job.suspend()
    job.wait_for_status(S.SUSPENDED, timeout=10)
    kill_driver(client, job)
    records = client.get_jet().records
    record = records.read(job.id) or {}
    records.write({**record, "status": S.RUNNING.value})  # it died mid-run

    views = [make_client(store_url).get_jet().get_job(job.id) for _ in range(2)]
    assert all(v is not None and v.status is S.SUSPENDED for v in views)
    assert views[0] is not None
    assert views[0].get_suspension_cause() == (
        "the driver process running the job died; resume() continues it here"
    )
    outcomes: list[str] = []

    def resume(view: Job) -> None:
        try:
            view.resume()
            outcomes.append("took over")
        except JobStateError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=resume, args=(v,)) for v in views]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    # One process wins the claim, drives the job and resumes it; the other loses
    # the claim, or finds the winner's epoch in the record when it adopts, or finds
    # the job already STARTING or RUNNING, or asks the new driver through the
    # control folder, which refuses: it resumed the job already.
    assert len(outcomes) == 2 and outcomes.count("took over") == 1, outcomes
    assert [v.is_driven_here() for v in views if v is not None].count(True) == 1
    claims = sorted(p.name for p in (Path(client.store.root) / "jobs" / job.id).iterdir()
                    if p.name.startswith("owner-"))
    assert claims == ["owner-000001"]
    refused = re.compile(
        rf"(job 'contested' \({job.id}\): another process (is taking|took) it over already"
        rf"|cannot resume job 'contested' \({job.id}\): it is (STARTING|RUNNING), not SUSPENDED)$"
    )
    for outcome in outcomes:
        assert outcome == "took over" or refused.match(outcome), outcome
    winner = next(v for v in views if v is not None and v.is_driven_here())
    assert winner.wait_for_status(S.RUNNING, timeout=10) is S.RUNNING
    stream.publish_all(range(3, 5))  # one driver reads them, and commits them once
    wait_for_sink(client, list(range(5)), "a batch of the winner")
    winner.cancel()
    with pytest.raises(JobCancelledError):
        winner.join(timeout=10)


def test_a_job_record_as_earlier_releases_wrote_it_reads_and_writes_back_the_same() -> None:
    """``job.json`` keeps its keys: JobRecord reads what the dict-based writer wrote."""
    stored: dict[str, Any] = {
        "id": "ab12-cd34-ef56-7890", "name": "old", "status": "FAILED",
        "config": {"name": "old", "arguments": []}, "submission_time": 1, "completion_time": 3,
        "execution_start_time": 2, "user_cancelled": True, "kind": "stream",
        "driver": {"host": "h", "pid": 42}, "stages": ["numbers", "out"], "heartbeat": 1.5,
        "epoch": 2, "restore": {"snapshot": "s", "batch": 4, "stages": {"count": "restored"}},
        "suspension_cause": "Requested by user",
        "failure": {"message": "cancelled", "stage": None, "cancelled": True},
        "answers": {"r1": {"time": 5}, "r2": {"time": 6, "error": "no"},
                    "r3": {"time": 7, "batch": 4}},
        "checkpoint": "scratch-0a1b2c3d", "progress": {"lastCommittedBatch": 4},
        "metrics": {"stages": {}}, "written_by_a_newer_release": [1],
    }
    record = JobRecord.from_json(stored)
    assert (record.status, record.driver, record.failure) == (
        S.FAILED, Driver("h", 42), Failure("cancelled", None, cancelled=True))
    assert record.answers == {"r1": Answer(5), "r2": Answer(6, error="no"),
                              "r3": Answer(7, batch=4)}
    assert record.to_json() == stored
    bare = {"id": "j", "status": "RUNNING"}  # the least a record holds
    assert JobRecord.from_json(bare).to_json() == {
        **bare, "name": None, "config": {}, "submission_time": -1, "completion_time": -1,
        "execution_start_time": -1, "user_cancelled": False, "kind": "batch", "driver": None,
        "stages": [], "heartbeat": 0.0, "epoch": 0}


# --- the cluster policy through the runner ---------------------------------------------


@pytest.mark.parametrize(
    ("guarantee", "ends"),
    [(ProcessingGuarantee.AT_LEAST_ONCE, S.SUSPENDED), (ProcessingGuarantee.NONE, S.FAILED)],
)
def test_losing_an_executor_without_auto_scaling(
    client: Client, engine: ControlledEngine, guarantee: ProcessingGuarantee, ends: JobStatus
) -> None:
    client.get_stream("events", partitions=1)
    engine.executors = frozenset({"1", "2"})
    job = client.get_jet().submit(stream_pipeline(), JobConfig(
        name="fleet", processing_guarantee=guarantee, auto_scaling_enabled=False,
        snapshot_interval_millis=10,
    ))
    wait_until(lambda: job.status is S.RUNNING, timeout=10, what="RUNNING")
    wait_until(lambda: client.get_jet().runners.get(job.id).cluster.started == 2,
               timeout=10, what="the baseline")
    engine.executors = frozenset({"1"})
    assert job.wait_for_status(ends, timeout=10) is ends
    cause = "executor(s) 2 were lost (1 of 2 left) and auto-scaling is off"
    if ends is S.SUSPENDED:
        assert job.get_suspension_cause() == cause
        job.cancel()
    with pytest.raises(JobFailedError, match=re.escape(cause) if ends is S.FAILED else "cancelled"):
        job.join(timeout=10)


def test_a_status_move_outside_the_table_is_refused(client: Client) -> None:
    client.get_stream("events", partitions=1)
    job = submit_stream(client, "strict")
    job.suspend()
    job.wait_for_status(S.SUSPENDED, timeout=10)
    runner = client.get_jet().runners.get(job.id)
    with pytest.raises(IllegalTransition, match="SUSPENDED -> COMPLETED"):
        runner.set_status(S.COMPLETED)
    assert job.status is S.SUSPENDED
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=10)


# --- no JVM needed ------------------------------------------------------------------------


@pytest.mark.slow
def test_lifecycle_runs_without_java(tmp_path: Path) -> None:
    """This file's tests pass with no java on PATH and never import pyspark."""
    repo = Path(__file__).resolve().parent.parent
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not (Path(d) / "java").exists()]
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME")}
    env["PATH"] = os.pathsep.join(path)
    assert shutil.which("java", path=env["PATH"]) is None
    script = (
        "import sys, pytest\n"
        f"code = pytest.main(['-q', '-p', 'no:cacheprovider', '-m', 'not slow', {__file__!r}])\n"
        "spark = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j'))\n"
        "print('SPARK MODULES:', spark)\n"
        "sys.exit(code or (3 if spark else 0))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=repo, env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "SPARK MODULES: []" in done.stdout
    assert " passed" in done.stdout
