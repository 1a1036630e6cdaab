"""Calls to outside services: map_using_service and map_using_service_async.

Exact outputs against plain Python, in batch and streaming jobs; one service
per process, job and stage (counted through a file every process appends
to); the bound on calls in flight; order kept or not; timeouts and errors
through the stage's error policy; the refusals at definition and submit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle as pyspark_cloudpickle

import sparkjet
from sparkjet.errors import JobFailedError, PipelineDefinitionError
from sparkjet.job import Job, JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, ServiceFactory, StreamSource
from tests.conftest import cancel_job, in_process_client, run_pipeline, wait_until

# Spark's workers cannot import tests/: this module's functions travel by value.
pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE
ITEMS = list(range(40))


# --- services that say what happened to them ---------------------------------------------


class Tracker:
    """A service: a factor, and how many of its calls are in flight (on the service loop)."""

    def __init__(self, factor: int) -> None:
        self.factor = factor
        self.now = 0
        self.most = 0


def note(log: str, *words: Any) -> None:
    """Append a line to ``log``: every process (driver, Spark workers) writes there."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(" ".join(str(w) for w in words) + "\n")


def lines(log: str | Path) -> list[list[str]]:
    path = Path(log)
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def recorded(log: str, tag: str, factor: int = 10) -> ServiceFactory:
    """A factory whose services note their making and destruction (with their most in flight)."""
    def create() -> Tracker:
        note(log, "create", tag, os.getpid())
        return Tracker(factor)

    def destroy(service: Tracker) -> None:
        note(log, "destroy", tag, os.getpid(), service.most)

    return ServiceFactory.of(create).with_destroy(destroy)


def times(service: Tracker, x: int) -> Any:
    """The synchronous call: None (dropped) for multiples of 7."""
    return None if x % 7 == 0 else x * service.factor


async def plus(service: Tracker, x: int) -> int:
    """The asynchronous call: a few milliseconds, its service counting what is in flight."""
    service.now += 1
    service.most = max(service.most, service.now)
    try:
        await asyncio.sleep(0.001 * (x % 4))
        return x + service.factor
    finally:
        service.now -= 1


def oracle(items: list[int]) -> list[int]:
    """map_using_service(times) then map_using_service_async(plus), in plain Python."""
    out = []
    for x in items:
        y = None if x % 7 == 0 else x * 10
        if y is not None:
            out.append(y + 10)
    return out


def enrich(stage: Any, log: str, *, preserve_order: bool = True, limit: int = 4) -> Any:
    return (stage.map_using_service(recorded(log, "sync"), times).set_name("sync")
            .map_using_service_async(recorded(log, "async"), plus, max_concurrent_ops=limit,
                                     preserve_order=preserve_order).set_name("async"))


def batch(client: sparkjet.Client, items: list[Any], build: Any, name: str = "out") -> list[Any]:
    client.get_list(name).clear()
    p = Pipeline.create()
    build(p.read_from(Pipeline.from_list("items", items))).write_to(Pipeline.to_list(name))
    run_pipeline(client, p)
    return client.get_list(name).get_all()


def made_per_process(log: str) -> Counter[tuple[str, str]]:
    """How many services each process made, by ``(stage tag, pid)``."""
    return Counter((w[1], w[2]) for w in lines(log) if w[0] == "create")


# --- batch jobs ------------------------------------------------------------------------------


@pytest.mark.parametrize("engine_kind", ["spark", "in-process"], indirect=True)
def test_batch_outputs_equal_the_oracle_on_each_engine(
        client: sparkjet.Client, engine_kind: str, tmp_path: Path) -> None:
    log = str(tmp_path / "services.log")
    assert batch(client, ITEMS, lambda s: enrich(s, log)) == oracle(ITEMS)
    unordered = batch(client, ITEMS, lambda s: enrich(s, log, preserve_order=False))
    assert sorted(unordered) == sorted(oracle(ITEMS))
    made = made_per_process(log)
    # One service per process, job and stage: two jobs, so at most two per process and stage.
    assert made and all(n <= 2 for n in made.values()), made
    if engine_kind == "in-process":  # both jobs in this process: one each, let go at its end
        assert made == Counter({("sync", str(os.getpid())): 2, ("async", str(os.getpid())): 2})
        destroyed = [w for w in lines(log) if w[0] == "destroy"]
        assert len(destroyed) == 4
        assert all(int(w[3]) <= 4 for w in destroyed if w[1] == "async")
    else:  # on Spark's workers the sweeper lets them go once the jobs' records say COMPLETED
        wait_until(lambda: Counter((w[1], w[2]) for w in lines(log) if w[0] == "destroy")
                   == made, 60, "the workers' services destroyed")


async def held(service: Tracker, x: int) -> int:
    """5 ms per call, counting what is in flight."""
    service.now += 1
    service.most = max(service.most, service.now)
    try:
        await asyncio.sleep(0.005)
        return x
    finally:
        service.now -= 1


def test_calls_in_flight_stay_within_max_concurrent_ops(store_url: str, tmp_path: Path) -> None:
    client = in_process_client(store_url)  # one task at a time, each keeping its window full
    log = str(tmp_path / "services.log")
    for limit in (1, 3, 8):
        out = batch(client, ITEMS, lambda s, limit=limit: s.map_using_service_async(
            recorded(log, f"limit{limit}"), held, max_concurrent_ops=limit))
        assert out == ITEMS
    most = {w[1]: int(w[3]) for w in lines(log) if w[0] == "destroy"}
    assert most == {"limit1": 1, "limit3": 3, "limit8": 8}


async def reversed_delays(service: Any, x: int) -> int:
    await asyncio.sleep(0.004 * (8 - x % 8))  # in each window of 8, the last is done first
    return x


def test_preserve_order_keeps_the_input_order_and_false_emits_as_calls_finish(
        client: sparkjet.Client) -> None:
    factory = ServiceFactory.of(lambda: None)
    kept = batch(client, ITEMS, lambda s: s.map_using_service_async(
        factory, reversed_delays, max_concurrent_ops=8))
    assert kept == ITEMS
    finished = batch(client, ITEMS, lambda s: s.map_using_service_async(
        factory, reversed_delays, max_concurrent_ops=8, preserve_order=False))
    assert sorted(finished) == ITEMS and finished != ITEMS


def pooled_square(pool: concurrent.futures.ThreadPoolExecutor, x: int) -> Any:
    return pool.submit(lambda: x * x)


def test_a_function_may_return_a_concurrent_future(client: sparkjet.Client) -> None:
    pools = ServiceFactory.of(lambda: concurrent.futures.ThreadPoolExecutor(4)).with_destroy(
        lambda pool: pool.shutdown())
    out = batch(client, ITEMS, lambda s: s.map_using_service_async(pools, pooled_square))
    assert out == [x * x for x in ITEMS]


def test_a_window_after_async_calls_keeps_event_time(client: sparkjet.Client) -> None:
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import WindowDefinition

    client.get_list("out").clear()
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("events", [(t, t % 2) for t in range(25)]))
     .with_timestamps(lambda e: e[0], 0)
     .map_using_service_async(ServiceFactory.of(lambda: 1), lambda one, e: asyncio.sleep(0, e))
     .window(WindowDefinition.tumbling(10)).aggregate(counting())
     .map(lambda r: (r.start, r.result)).write_to(Pipeline.to_list("out")))
    run_pipeline(client, p)
    assert sorted(client.get_list("out").get_all()) == [(0, 10), (10, 10), (20, 5)]


# --- streams ---------------------------------------------------------------------------------


def stream_pipeline(log: str, fail: dict[str, bool] | None = None) -> Pipeline:
    def checked(x: Any) -> Any:
        if fail is not None and fail["on"]:
            raise RuntimeError("the sink's host is down")
        note(log, "out", x)
        return x

    p = Pipeline.create()
    enrich(p.read_from(StreamSource("numbers", partitions=2)), log) \
        .map_using_service(ServiceFactory.of(lambda: log), noted).set_name("noted") \
        .map(checked).set_name("check").write_to(Pipeline.to_list("out"))
    return p


def noted(log: str, x: int) -> int:
    """A call that notes itself (calls are at least once)."""
    note(log, "call", x)
    return x


@pytest.mark.usefixtures("engine_kind")
def test_a_stream_enriches_every_item_exactly_once(
        client: sparkjet.Client, tmp_path: Path, cancel_at_end: list[Job]) -> None:
    log = str(tmp_path / "services.log")
    stream = client.get_stream("numbers", partitions=2)
    job = client.get_jet().submit(stream_pipeline(log), JobConfig(
        name="enrich", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=100))
    cancel_at_end.append(job)
    for chunk in (ITEMS[:25], ITEMS[25:]):
        stream.publish_all(chunk)
        upto = ITEMS[:ITEMS.index(chunk[-1]) + 1]
        wait_until(lambda upto=upto: sorted(client.get_list("out").get_all())
                   == sorted(oracle(upto)), 120, "every item enriched once")
    made = made_per_process(log)
    assert made and all(n == 1 for n in made.values()), made  # across micro-batches
    cancel_job(job)
    if str(os.getpid()) in {pid for _, pid in made}:  # the driver's: let go at the job's end
        destroyed = {(w[1], w[2]) for w in lines(log) if w[0] == "destroy"}
        assert {key for key in made if key[1] == str(os.getpid())} <= destroyed


def test_a_replayed_micro_batch_calls_again_and_outputs_once(
        store_url: str, tmp_path: Path, cancel_at_end: list[Job]) -> None:
    """A batch fails after its calls; resumed, it replays them: calls at least once, output once."""
    client = in_process_client(store_url)  # the driver's services, and a flag it flips
    log = str(tmp_path / "services.log")
    stream = client.get_stream("numbers", partitions=2)
    fail = {"on": False}
    job = client.get_jet().submit(stream_pipeline(log, fail), JobConfig(
        name="replay", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=100,
        suspend_on_failure=True))
    cancel_at_end.append(job)
    stream.publish_all(ITEMS[:10])
    wait_until(lambda: sorted(client.get_list("out").get_all()) == oracle(ITEMS[:10]), 60,
               "the first batch")
    fail["on"] = True
    stream.publish_all(ITEMS[10:20])
    wait_until(lambda: job.status is JobStatus.SUSPENDED, 60, "the failed batch to suspend")
    # Suspended on the driver: its services were let go with the run.
    assert len([w for w in lines(log) if w[0] == "destroy"]) == 2  # ("noted" has no destroy_fn)
    fail["on"] = False
    job.resume()
    wait_until(lambda: sorted(client.get_list("out").get_all()) == oracle(ITEMS[:20]), 60,
               "the replay")
    assert Counter(client.get_list("out").get_all()) == Counter(oracle(ITEMS[:20]))
    calls = Counter(int(w[1]) for w in lines(log) if w[0] == "call")
    assert all(calls[y] == 1 for y in oracle(ITEMS[:10]))  # committed the first time
    # The failed try called until its first failure; the replay called every item again.
    replayed = oracle(ITEMS[10:20])
    assert all(calls[y] >= 1 for y in replayed) and any(calls[y] == 2 for y in replayed), calls
    # Made again after the resume, once per stage.
    assert made_per_process(log) == Counter({("sync", str(os.getpid())): 2,
                                             ("async", str(os.getpid())): 2})


# --- timeouts and errors ----------------------------------------------------------------------


async def slow_three(service: Any, x: int) -> int:
    await asyncio.sleep(5 if x == 3 else 0)
    return x


def slow_pipeline(policy: str | None) -> Pipeline:
    p = Pipeline.create()
    stage = p.read_from(Pipeline.from_list("items", list(range(6)))).map_using_service_async(
        ServiceFactory.of(lambda: None), slow_three, timeout_ms=50).set_name("lookup")
    if policy is not None:
        stage = stage.on_error(policy)
    stage.write_to(Pipeline.to_list("out"))
    return p


def letters_of(client: sparkjet.Client, stream: str) -> list[dict[str, Any]]:
    log = client.get_stream(stream)
    return [letter for p in range(len(log.end_offsets())) for letter in log.read(p)]


def test_a_timeout_fails_the_job_naming_the_stage(client: sparkjet.Client) -> None:
    with pytest.raises(JobFailedError, match=r"stage 'lookup' failed: TimeoutError: the call "
                                             r"took longer than timeout_ms=50") as caught:
        run_pipeline(client, slow_pipeline(None))
    assert isinstance(caught.value.__cause__, TimeoutError)
    assert client.get_list("out").get_all() == []


def test_a_timeout_makes_a_dead_letter_with_on_error(client: sparkjet.Client) -> None:
    job = run_pipeline(client, slow_pipeline("dead-letter"), name="slow")
    assert client.get_list("out").get_all() == [0, 1, 2, 4, 5]
    [letter] = letters_of(client, "slow.dead-letters")
    assert (letter["stage"], letter["item"]) == ("lookup", 3)
    assert letter["error"] == "TimeoutError: the call took longer than timeout_ms=50 and was " \
                              "cancelled"
    assert letter["source"] == "from-list(items)"
    assert job.get_metrics()["stages"]["lookup"]["deadLetters"] == 1


def refuse_two(service: Any, x: int) -> int:
    if x == 2:
        raise ValueError("no 2 here")
    return x


async def refuse_two_later(service: Any, x: int) -> int:
    await asyncio.sleep(0)
    return refuse_two(service, x)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_error_fails_the_job_with_the_users_exception_chained(
        client: sparkjet.Client, kind: str) -> None:
    factory = ServiceFactory.of(lambda: None)
    with pytest.raises(JobFailedError, match="stage 'call' failed: ValueError: no 2 here") \
            as caught:
        batch(client, [1, 2, 3], lambda s: (
            s.map_using_service(factory, refuse_two) if kind == "sync"
            else s.map_using_service_async(factory, refuse_two_later)).set_name("call"))
    assert isinstance(caught.value.__cause__, ValueError)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_error_makes_a_dead_letter_with_on_error(client: sparkjet.Client, kind: str) -> None:
    factory = ServiceFactory.of(lambda: None)
    p = Pipeline.create()
    stage = p.read_from(Pipeline.from_list("items", [1, 2, 3]))
    called = (stage.map_using_service(factory, refuse_two) if kind == "sync"
              else stage.map_using_service_async(factory, refuse_two_later))
    called.set_name("call").on_error("dead-letter").write_to(Pipeline.to_list("out"))
    run_pipeline(client, p, name="errs")
    assert client.get_list("out").get_all() == [1, 3]
    [letter] = letters_of(client, "errs.dead-letters")
    assert (letter["stage"], letter["item"], letter["error"]) == (
        "call", 2, "ValueError: no 2 here")
    assert "in refuse_two" in letter["traceback"]
    assert "asyncio" not in letter["traceback"].splitlines()[1]


def broken_create() -> Any:
    raise ConnectionError("the host is down")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_service_that_cannot_be_made_fails_the_job_whatever_the_policy(
        client: sparkjet.Client, kind: str) -> None:
    factory = ServiceFactory.of(broken_create)
    with pytest.raises(JobFailedError, match="stage 'call' failed: ConnectionError") as caught:
        batch(client, [1, 2], lambda s: (
            s.map_using_service(factory, refuse_two) if kind == "sync"
            else s.map_using_service_async(factory, refuse_two_later))
            .set_name("call").on_error("dead-letter"))
    cause = caught.value.__cause__
    assert isinstance(cause, ConnectionError)
    assert any("making the service of stage 'call'" in n for n in cause.__notes__)


def test_an_async_function_returning_no_awaitable_goes_to_the_policy(
        client: sparkjet.Client) -> None:
    with pytest.raises(JobFailedError, match="must return an awaitable"):
        batch(client, [1], lambda s: s.map_using_service_async(
            ServiceFactory.of(lambda: None), lambda service, x: x).set_name("call"))


# --- refused at definition and at submit -----------------------------------------------------


def test_bad_arguments_are_refused_naming_the_stage() -> None:
    stage = Pipeline.create().read_from(Pipeline.from_list("a", [1])).set_name("orders")
    factory = ServiceFactory.of(lambda: None)
    with pytest.raises(PipelineDefinitionError, match="'orders' takes a ServiceFactory"):
        stage.map_using_service(lambda: None, times)  # type: ignore[arg-type]
    for method in (stage.map_using_service, stage.map_using_service_async):
        with pytest.raises(PipelineDefinitionError, match=r"'orders' takes a function fn"):
            method(factory, "nope")  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="create_fn must be a function"):
        stage.map_using_service(ServiceFactory(3), times)  # type: ignore[arg-type]
    for bad in (0, -1, True, 2.5, None):
        with pytest.raises(PipelineDefinitionError,
                           match="'orders': max_concurrent_ops must be a positive int"):
            stage.map_using_service_async(factory, plus, max_concurrent_ops=bad)  # type: ignore[arg-type]
    for bad in (0, -5, True, 1.5, "1s"):
        with pytest.raises(PipelineDefinitionError,
                           match="'orders': timeout_ms must be a positive int"):
            stage.map_using_service_async(factory, plus, timeout_ms=bad)  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="preserve_order must be a bool"):
        stage.map_using_service_async(factory, plus, preserve_order="yes")  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match=r"ServiceFactory.of\(\) takes a function"):
        ServiceFactory.of(3)  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="with_destroy"):
        factory.with_destroy(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("part", ["create_fn", "destroy_fn", "function"])
def test_what_cannot_be_pickled_is_refused_at_submit_naming_the_stage(
        client: sparkjet.Client, part: str) -> None:
    lock = threading.Lock()

    def holding(*_: Any) -> Any:
        return lock  # a closure over a lock: cloudpickle cannot ship it

    factory = ServiceFactory.of(holding if part == "create_fn" else (lambda: None))
    if part == "destroy_fn":
        factory = factory.with_destroy(holding)
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("a", [1])).map_using_service(
        factory, holding if part == "function" else times).set_name("svc") \
        .write_to(Pipeline.to_list("out"))
    label = part if part == "function" else f"service factory's {part}"
    with pytest.raises(PipelineDefinitionError, match=f"stage 'svc': its {label} .* cannot be "
                                                      "pickled"):
        client.get_jet().submit(p)
    assert client.get_jet().get_jobs() == []


def test_the_sweeper_destroys_the_services_of_a_job_that_no_longer_runs(tmp_path: Path) -> None:
    """How a Spark worker lets a job's services go: the job's record says it stopped."""
    from sparkjet.core.engine.tasks import services
    from sparkjet.core.store.fs import Store

    log = str(tmp_path / "services.log")
    ref = services.ServiceRef(Store(str(tmp_path / "store")), "gone-job", "svc",
                              recorded(log, "svc"))
    first = ref()
    assert ref() is first  # one per process, job and stage
    assert services.sweep() == ["gone-job"]  # no record: the job no longer runs
    assert [w[:2] for w in lines(log)] == [["create", "svc"], ["destroy", "svc"]]
    assert ref() is not first  # made again on its next use
    assert services.sweep() == ["gone-job"]
