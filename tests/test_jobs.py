"""Job handles, the jet service, configuration and metrics."""

from __future__ import annotations

import time

import pytest

import sparkjet
from sparkjet.errors import (
    ConfigError,
    JobAlreadyExistsError,
    JobCancelledError,
    JobStateError,
    TimeoutException,
)
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline
from tests.conftest import TEST_SPARK


def slow_pipeline(n: int = 400, delay: float = 0.02, sink: str = "slow") -> Pipeline:
    def sleepy(x: int) -> int:
        time.sleep(delay)
        return x

    p = Pipeline.create()
    p.read_from(Pipeline.from_list("in", range(n))).map(sleepy).write_to(Pipeline.to_list(sink))
    return p


def quick_pipeline(sink: str = "quick") -> Pipeline:
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("in", [1, 2, 3])).write_to(Pipeline.to_list(sink))
    return p


def test_job_config_defaults_follow_jet() -> None:
    config = JobConfig()
    assert config.processing_guarantee is ProcessingGuarantee.NONE
    assert config.snapshot_interval_millis == 10_000
    assert config.auto_scaling_enabled is True
    assert config.split_brain_protection_enabled is False
    assert config.suspend_on_failure is False
    assert config.initial_snapshot_name is None
    assert config.metrics_enabled is True
    assert config.store_metrics_after_job_completion is False
    config.initial_snapshot_name = "checkpoint-1"  # the reference sets it after construction
    assert JobConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("snapshot_interval_millis", 0, "positive int"),
        ("snapshot_interval_millis", True, "positive int"),
        ("processing_guarantee", "twice", "must be one of"),
        ("auto_scaling_enabled", "yes", "a bool"),
        ("name", "", "non-empty string"),
        ("arguments", [object()], "JSON-serialisable"),
        ("adaptive_micro_batches", "no", "a bool or None"),
        ("adaptive_micro_batches", 0, "a bool or None"),
    ],
)
def test_job_config_is_validated(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=f"JobConfig.{field}.*{message}"):
        JobConfig(**{field: value})  # type: ignore[arg-type]
    config = JobConfig()
    with pytest.raises(ConfigError):
        setattr(config, field, value)


def test_adaptive_micro_batches_defaults_to_the_configuration_and_round_trips() -> None:
    assert JobConfig().adaptive_micro_batches is None  # None: [engine] adaptive decides
    config = JobConfig(adaptive_micro_batches=False)
    assert config.to_dict()["adaptive_micro_batches"] is False
    assert JobConfig.from_dict(config.to_dict()) == config
    older = config.to_dict()
    del older["adaptive_micro_batches"]  # a job record written before the field
    assert JobConfig.from_dict(older).adaptive_micro_batches is None


def test_guarantee_parses_jet_spellings() -> None:
    assert JobConfig(processing_guarantee="exactlyOnce").processing_guarantee is (  # type: ignore[arg-type]
        ProcessingGuarantee.EXACTLY_ONCE
    )
    assert ProcessingGuarantee.parse("at_least_once") is ProcessingGuarantee.AT_LEAST_ONCE


def test_status_values_and_terminal() -> None:
    assert len(JobStatus) == 8
    assert {s for s in JobStatus if s.is_terminal()} == {JobStatus.COMPLETED, JobStatus.FAILED}


def test_job_lifecycle_listener_and_metrics(client, jet) -> None:  # type: ignore[no-untyped-def]
    events = []
    job = jet.submit(quick_pipeline(), JobConfig(name="quick"))
    job.add_status_listener(lambda e: events.append(e.new_status))
    job.join(timeout=120)
    assert job.status is JobStatus.COMPLETED and job.is_terminal()
    assert not job.is_user_cancelled()
    assert events[-1] is JobStatus.COMPLETED
    assert job.name == "quick" and job.config.name == "quick"
    assert len(job.id) == 19 and job.submission_time <= int(time.time() * 1000)
    metrics = job.get_metrics()
    assert metrics["executionStartTime"] > 0
    assert metrics["executionCompletionTime"] >= metrics["executionStartTime"]
    assert metrics["stages"]["to-list(quick)"]["receivedCount"] == 3


def test_join_timeout_then_cancel(client, jet) -> None:  # type: ignore[no-untyped-def]
    job = jet.submit(slow_pipeline(), JobConfig(name="slow"))
    with pytest.raises(TimeoutException, match=r"'slow'.*did not finish within 0.5 s"):
        job.join(timeout=0.5)
    assert isinstance(TimeoutException("x"), TimeoutError)
    # Same name while active: refused, and new_job_if_absent returns the active one.
    with pytest.raises(JobAlreadyExistsError, match="'slow' is already active"):
        jet.submit(quick_pipeline(), JobConfig(name="slow"))
    assert jet.new_job_if_absent(quick_pipeline(), JobConfig(name="slow")).id == job.id
    started = time.monotonic()
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=60)
    assert time.monotonic() - started < 30, "cancel must stop the Spark work, not wait it out"
    assert job.status is JobStatus.FAILED and job.is_user_cancelled()
    assert client.get_list("slow").get_all() == []
    with pytest.raises(JobStateError, match="already FAILED"):
        job.cancel()
    # The name is free again.
    again = jet.submit(quick_pipeline(), JobConfig(name="slow"))
    again.join(timeout=120)
    assert again.status is JobStatus.COMPLETED


def test_another_client_sees_jobs_through_the_store(client, jet, store_url) -> None:  # type: ignore[no-untyped-def]
    config = JobConfig(name="seen", store_metrics_after_job_completion=True)
    job = jet.submit(quick_pipeline(), config)
    job.join(timeout=120)
    other = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK).get_jet()
    found = other.get_job(job.id)
    assert found is not None and found is not job
    assert found.status is JobStatus.COMPLETED
    assert other.get_job_by_name("seen").id == job.id  # type: ignore[union-attr]
    assert [j.id for j in other.get_jobs()] == [job.id]
    assert found.get_metrics()["stages"]["to-list(quick)"]["receivedCount"] == 3
    found.join(timeout=5)  # completed: returns at once
    assert other.get_job("0000-0000-0000-0000") is None
    assert other.get_job_by_name("nope") is None


def test_metrics_disabled(client, jet) -> None:  # type: ignore[no-untyped-def]
    job = jet.submit(quick_pipeline(), JobConfig(metrics_enabled=False))
    job.join(timeout=120)
    assert job.get_metrics()["stages"] == {}
    assert client.get_list("quick").get_all() == [1, 2, 3]


def test_batch_jobs_accept_every_guarantee(client, jet) -> None:  # type: ignore[no-untyped-def]
    for guarantee in ProcessingGuarantee:
        sink = f"g-{guarantee.value}"
        jet.submit(quick_pipeline(sink), JobConfig(processing_guarantee=guarantee)).join(120)
        assert client.get_list(sink).get_all() == [1, 2, 3]


def test_cancel_before_spark_work_starts(client, jet) -> None:  # type: ignore[no-untyped-def]
    job = jet.submit(slow_pipeline(n=200, delay=0.05, sink="early"), JobConfig(name="early"))
    job.cancel()  # at once: the job is NOT_RUNNING or STARTING
    with pytest.raises(JobCancelledError):
        job.join(timeout=60)
    assert job.is_user_cancelled()
    assert client.get_list("early").get_all() == []


@pytest.mark.spark
def test_job_names_are_unique_across_clients(client, jet, store_url) -> None:  # type: ignore[no-untyped-def]
    job = jet.submit(slow_pipeline(n=100, sink="held"), JobConfig(name="held"))
    # Another client on the same store stands for another process.
    other = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK).get_jet()
    with pytest.raises(JobAlreadyExistsError, match="'held' is already active"):
        other.submit(quick_pipeline(), JobConfig(name="held"))
    assert other.new_job_if_absent(quick_pipeline(), JobConfig(name="held")).id == job.id
    job.join(timeout=120)
    again = other.submit(quick_pipeline("held2"), JobConfig(name="held"))
    again.join(timeout=120)
    assert again.status is JobStatus.COMPLETED
