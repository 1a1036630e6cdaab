"""Windowed stages in real jobs: batch and streaming against the oracle, upgrades, bad input."""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sparkjet
from sparkjet import aggregate as agg
from sparkjet.core.pipeline.graph import SourceSpec
from sparkjet.errors import JobFailedError, PipelineDefinitionError, StateIncompatibleError
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import (
    KeyedWindowResult,
    Pipeline,
    StreamSource,
    WindowDefinition,
    WindowResult,
)
from tests import window_oracle as oracle
from tests.conftest import wait_until

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE


def _event(e: oracle.Event) -> dict[str, Any]:
    return {"p": e[0], "ts": e[1], "k": e[2], "v": e[3]}


def _rows(results: list[Any]) -> list[tuple[Any, ...]]:
    return sorted((r.start, r.end, r.key, r.result) for r in results)


def _windowed(source: Any, definition: WindowDefinition, name: str, sink: str,
              lag: int = 0) -> Pipeline:
    p = Pipeline.create()
    (p.read_from(source).with_timestamps(lambda e: e["ts"], allowed_lag_ms=lag)
     .window(definition).group_by(lambda e: e["k"]).aggregate(agg.summing(lambda e: e["v"]))
     .set_name(name).write_to(Pipeline.to_list(sink)))
    return p


# --- batch jobs --------------------------------------------------------------------------

batch_events = st.lists(st.tuples(st.just(0), st.integers(-30, 80), st.integers(0, 4),
                                  st.integers(1, 9)), max_size=60)
definitions = st.one_of(
    st.integers(1, 15).map(WindowDefinition.tumbling),
    st.tuples(st.integers(1, 6), st.integers(1, 4)).map(
        lambda p: WindowDefinition.sliding(p[0] * p[1], p[0])),
    st.integers(1, 12).map(WindowDefinition.session),
)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch_events, definitions)
def test_batch_windows_equal_the_oracle(
    jet: Any, client: sparkjet.Client, events: list[oracle.Event], definition: WindowDefinition
) -> None:
    """A batch job's input is one range of event time: every window, nothing late."""
    out = client.get_list("out")
    out.clear()
    jet.submit(_windowed(Pipeline.from_list("in", [_event(e) for e in events]),
                         definition, "w", "out")).join()
    got = out.get_all()
    if definition.is_session:
        want = oracle.sessions(events, definition.timeout, oracle.NO_WATERMARK * -1)
    else:
        want = oracle.sliding(events, definition.size, definition.slide, -oracle.NO_WATERMARK)
    assert _rows(got) == want
    # In order of end, then of the key's first item.
    firsts = {e[2]: i for i, e in reversed(list(enumerate(events)))}
    assert [(r.end, firsts[r.key]) for r in got] == sorted((r.end, firsts[r.key]) for r in got)


def test_batch_windows_through_the_shuffle_and_without_a_combiner(
    jet: Any, client: sparkjet.Client, reduce_path: str
) -> None:
    rng = random.Random(7)
    events = [(0, rng.randrange(0, 500), rng.randrange(40), rng.randrange(1, 9))
              for _ in range(3000)]
    p = Pipeline.create()
    stamped = p.read_from(Pipeline.from_list("in", [_event(e) for e in events])) \
        .with_timestamps(lambda e: e["ts"], 0)
    # No combiner: frames keep the items, folded when the window is emitted.
    (stamped.window(WindowDefinition.sliding(30, 10)).group_by(lambda e: e["k"])
     .aggregate(accumulator=lambda acc, e: acc + e["v"], initial=0)
     .set_name("no-combiner").write_to(Pipeline.to_list("a")))
    (stamped.window(WindowDefinition.tumbling(50)).aggregate(agg.counting())
     .set_name("global").write_to(Pipeline.to_list("b")))
    job = jet.submit(p)
    job.join()
    assert _rows(client.get_list("a").get_all()) == oracle.sliding(events, 30, 10, 10**9)
    got = client.get_list("b").get_all()
    # Each window result counted once (the shuffle path's sort once ran the reduce thrice).
    stages = job.get_metrics()["stages"]
    assert stages["no-combiner"]["emittedCount"] == len(client.get_list("a").get_all())
    assert stages["global"]["emittedCount"] == len(got)
    assert all(isinstance(r, WindowResult) for r in got)
    counts = Counter(ts // 50 for _p, ts, _k, _v in events)
    assert [(r.start, r.end, r.result) for r in got] == [
        (w * 50, w * 50 + 50, counts[w]) for w in sorted(counts)]


def test_a_window_result_that_cannot_be_pickled_names_its_stage(
    jet: Any, client: sparkjet.Client, reduce_path: str
) -> None:
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("in", list(range(20)))).with_timestamps(lambda x: x, 0)
     .window(WindowDefinition.tumbling(5)).group_by(lambda x: x % 2)
     .aggregate(accumulator=lambda n, _x: n + 1, initial=0, combiner=lambda a, b: a + b,
                finisher=lambda _n: threading.Lock())
     .set_name("locked").write_to(Pipeline.to_list("out")))
    with pytest.raises(JobFailedError, match=r"stage 'locked'.*_thread.lock.* cannot be pickled"):
        jet.submit(p).join()


def test_ingestion_timestamps_put_a_batch_job_in_one_window(jet: Any, client: sparkjet.Client
                                                            ) -> None:
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("in", list(range(10)))).with_ingestion_timestamps()
     .window(WindowDefinition.tumbling(10**12)).aggregate(agg.summing())
     .write_to(Pipeline.to_list("out")))
    jet.submit(p).join()
    (result,) = client.get_list("out").get_all()
    assert result.result == 45 and result.start <= result.end - 10**12 + 1


# --- bad input ------------------------------------------------------------------------------


def test_a_window_without_timestamps_is_refused_naming_stage_and_source(jet: Any) -> None:
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("in", [1])).set_name("numbers").map(lambda x: x)
     .window(WindowDefinition.tumbling(10)).aggregate(agg.counting()).set_name("per-10")
     .write_to(Pipeline.to_list("out")))
    with pytest.raises(PipelineDefinitionError,
                       match=r"stage 'per-10' windows items that have no timestamps.*'numbers'"):
        jet.submit(p)
    # Nor after a keyed stage, whose output has no timestamps.
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("in", [1])).with_timestamps(lambda x: x, 0)
     .group_by(lambda x: x).aggregate(agg.counting()).set_name("counts")
     .window(WindowDefinition.tumbling(10)).aggregate(agg.counting()).set_name("w")
     .write_to(Pipeline.to_list("out")))
    with pytest.raises(PipelineDefinitionError, match=r"stage 'w' windows.*'counts'"):
        jet.submit(p)


def test_timestamps_go_on_a_source_stage_only() -> None:
    p = Pipeline.create()
    mapped = p.read_from(Pipeline.from_list("in", [1])).map(lambda x: x).set_name("m")
    with pytest.raises(PipelineDefinitionError, match="stage 'm' is a map stage"):
        mapped.with_timestamps(lambda x: x, 0)
    source = p.read_from(Pipeline.from_list("in2", [1]))
    with pytest.raises(PipelineDefinitionError, match="allowed_lag_ms must be an int"):
        source.with_timestamps(lambda x: x, -1)
    with pytest.raises(PipelineDefinitionError, match="takes a function"):
        source.with_timestamps(5, 0)  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="takes a WindowDefinition"):
        source.window(10)  # type: ignore[arg-type]
    spec = source.with_timestamps(lambda x: x, 0).without_timestamps()._node.spec
    assert isinstance(spec, SourceSpec) and spec.timestamps is None


def test_a_timestamp_of_the_wrong_type_fails_naming_the_source(jet: Any) -> None:
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("in", [{"ts": "2026-01-01"}])).set_name("orders")
     .with_timestamps(lambda e: e["ts"], 0)
     .window(WindowDefinition.tumbling(10)).aggregate(agg.counting())
     .write_to(Pipeline.to_list("out")))
    with pytest.raises(JobFailedError, match="stage 'orders' failed: TypeError"):
        jet.submit(p).join()


def test_a_failing_key_function_names_the_windowed_stage(jet: Any) -> None:
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("in", [{"ts": 1}])).with_timestamps(lambda e: e["ts"], 0)
     .window(WindowDefinition.tumbling(10)).group_by(lambda e: e["missing"])
     .aggregate(agg.counting()).set_name("per-user").write_to(Pipeline.to_list("out")))
    with pytest.raises(JobFailedError, match="stage 'per-user' failed: KeyError"):
        jet.submit(p).join()


# --- streaming jobs ---------------------------------------------------------------------------


def _start(jet: Any, pipeline: Pipeline, name: str, **config: Any) -> Any:
    config.setdefault("snapshot_interval_millis", 100)
    job = jet.submit(pipeline, JobConfig(name=name, processing_guarantee=EXACTLY_ONCE, **config))
    wait_until(lambda: job.status is JobStatus.RUNNING, what=f"{name} to run")
    return job


def _stop(job: Any) -> None:
    if not job.is_terminal():
        job.cancel()


def _stream_in_lag(rng: random.Random, n: int, lag: int, keys: int) -> list[oracle.Event]:
    """Out-of-order events, none older than the newest before it minus ``lag``."""
    events = []
    newest = 0
    for _ in range(n):
        ts = max(0, newest - rng.randrange(lag + 1)) if rng.random() < 0.4 else (
            newest + rng.randrange(5))
        newest = max(newest, ts)
        events.append((0, ts, rng.randrange(keys), rng.randrange(1, 5)))
    return events


def test_several_windowed_stages_from_one_stream_equal_the_oracle(
    jet: Any, client: sparkjet.Client
) -> None:
    rng = random.Random(11)
    lag = 20
    events = _stream_in_lag(rng, 600, lag, 5)
    stream = client.get_stream("events", partitions=3)
    p = Pipeline.create()
    stamped = p.read_from(StreamSource("events")).with_timestamps(lambda e: e["ts"], lag)
    for name, definition in [("tumbling", WindowDefinition.tumbling(25)),
                             ("sliding", WindowDefinition.sliding(40, 10)),
                             ("session", WindowDefinition.session(6))]:
        (stamped.window(definition).group_by(lambda e: e["k"])
         .aggregate(agg.summing(lambda e: e["v"])).set_name(name)
         .write_to(Pipeline.to_list(name)))
    stamped.filter(lambda e: e["v"] > 2).window(WindowDefinition.tumbling(100)) \
        .aggregate(agg.counting()).set_name("global").write_to(Pipeline.to_list("global"))
    job = _start(jet, p, "windows")
    try:
        for chunk in range(0, len(events), 150):  # over several micro-batches
            stream.publish_all([_event(e) for e in events[chunk:chunk + 150]])
            time.sleep(0.3)
        newest = max(ts for _p, ts, _k, _v in events)
        # The watermark: the lowest partition's newest event minus the lag.
        wait_until(lambda: job.get_metrics()["stages"]["tumbling"].get("watermark", -1)
                   >= newest - lag - 10, what="the watermark to catch up", timeout=90)
        watermark = job.get_metrics()["stages"]["tumbling"]["watermark"]
        wait_until(lambda: _rows(client.get_list("tumbling").get_all())
                   == oracle.sliding(events, 25, 25, watermark), what="tumbling windows")
        assert _rows(client.get_list("sliding").get_all()) == oracle.sliding(
            events, 40, 10, watermark)
        assert _rows(client.get_list("session").get_all()) == oracle.sessions(
            events, 6, watermark)
        big = [e for e in events if e[3] > 2]
        counts = Counter(ts // 100 for _p, ts, _k, _v in big)
        assert sorted((r.start, r.result) for r in client.get_list("global").get_all()) == [
            (w * 100, n) for w, n in sorted(counts.items()) if w * 100 + 100 <= watermark]
        metrics = job.get_metrics()["stages"]
        assert metrics["sliding"]["lateEventsDropped"] == 0
        assert metrics["sliding"]["snapshotKeys"] <= 5  # purged: open windows only
    finally:
        _stop(job)


def test_late_events_are_dropped_and_counted_and_early_results_flagged(
    jet: Any, client: sparkjet.Client
) -> None:
    stream = client.get_stream("clicks", partitions=1)
    p = Pipeline.create()
    (p.read_from(StreamSource("clicks")).with_timestamps(lambda e: e["ts"], 0)
     .window(WindowDefinition.tumbling(100).early_results(300)).group_by(lambda e: e["k"])
     .aggregate(agg.counting()).set_name("per-100").write_to(Pipeline.to_list("out")))
    job = _start(jet, p, "late")
    out = client.get_list("out")
    try:
        stream.publish_all([{"ts": t, "k": "a"} for t in (5, 50, 120, 150)])
        wait_until(lambda: KeyedWindowResult(0, 100, "a", 2) in out.get_all(),
                   what="[0, 100) once the watermark (150) passed 100")
        # [100, 200) is open: early results for it come every 300 ms of wall-clock time.
        wait_until(lambda: KeyedWindowResult(100, 200, "a", 2, True) in out.get_all(),
                   what="an early result of [100, 200)")
        stream.publish_all([{"ts": 40, "k": "a"}, {"ts": 260, "k": "a"}])  # 40 is late
        wait_until(lambda: KeyedWindowResult(100, 200, "a", 2) in out.get_all(),
                   what="[100, 200) complete")
        # The batch that drops 40 judges it by the watermark before it (150); the
        # metrics show 260 once a batch has run with it.
        stage = wait_until(lambda: (m := job.get_metrics()["stages"]["per-100"])[
            "lateEventsDropped"] == 1 and m["watermark"] == 260 and m,
            what="the late event counted, and the watermark at 260")
        assert stage["lateEventsDropped"] == 1
        finals = [r for r in out.get_all() if not r.is_early]
        assert finals == [KeyedWindowResult(0, 100, "a", 2), KeyedWindowResult(100, 200, "a", 2)]
    finally:
        _stop(job)


def test_suspend_and_resume_neither_repeat_nor_lose_a_window(
    jet: Any, client: sparkjet.Client
) -> None:
    stream = client.get_stream("events", partitions=2)
    job = _start(jet, _windowed(StreamSource("events"), WindowDefinition.tumbling(10), "w",
                                "out"), "resumable")
    out = client.get_list("out")
    try:
        stream.publish_all([{"ts": t, "k": 0, "v": 1} for t in range(0, 40)])
        wait_until(lambda: out.size() >= 3, what="three windows")
        job.suspend()
        wait_until(lambda: job.status is JobStatus.SUSPENDED, what="suspended")
        stream.publish_all([{"ts": t, "k": 0, "v": 1} for t in range(40, 80)])
        job.resume()
        wait_until(lambda: out.size() >= 7, what="seven windows")
        assert _rows(out.get_all()) == [(s, s + 10, 0, 10) for s in range(0, 70, 10)]
    finally:
        _stop(job)


# --- upgrades -------------------------------------------------------------------------------


def test_an_upgrade_that_changes_a_window_equals_the_oracle_after_the_transition(
    jet: Any, client: sparkjet.Client
) -> None:
    """v1 counts per 10 ms; v2, from its snapshot, per 20 ms, and adds a session window."""
    stream = client.get_stream("events", partitions=2)
    out = client.get_list("out")
    v1 = _windowed(StreamSource("events"), WindowDefinition.tumbling(10), "w", "out")
    job = _start(jet, v1, "v1")
    stream.publish_all([{"ts": t, "k": t % 2, "v": 1} for t in range(0, 55)])
    wait_until(lambda: out.size() >= 10, what="v1's windows up to 50")
    snapshot = job.cancel_and_export_snapshot("v1")
    assert {k: sorted(state.frames) for k, state in snapshot.read_state("w").items()} == {
        0: [60], 1: [60]}
    assert snapshot.event_time().watermarks == {"w": 53}

    v2 = _windowed(StreamSource("events"), WindowDefinition.tumbling(20), "w", "out")
    stamped = v2.transforms[0]
    from sparkjet.core.pipeline.graph import Stage
    (Stage(stamped).window(WindowDefinition.session(1)).group_by(lambda e: e["k"])
     .aggregate(agg.counting()).set_name("sessions").write_to(Pipeline.to_list("sessions")))
    rows = {r.stage: r for r in jet.check_upgrade(v2, "v1")}
    assert rows["w"].status == "restored" and "the window grows (10 -> 20 ms)" in rows["w"].note
    assert rows["sessions"].status == "new"
    out.clear()
    config = JobConfig(name="v2", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=100)
    config.initial_snapshot_name = "v1"
    job2 = jet.submit(v2, config)
    try:
        stream.publish_all([{"ts": t, "k": t % 2, "v": 1} for t in range(55, 130)])
        wait_until(lambda: out.size() >= 8, what="v2's windows up to 120")
        got = _rows(out.get_all())
        # The transition: [40, 60) is the first window of 20; the frame [40, 50) was purged
        # under the old size (its window was emitted), so it holds only [50, 60): 5 events
        # per key. Every window after it equals the oracle of the whole stream.
        all_events = [(0, t, t % 2, 1) for t in range(130)]
        want = [(40, 60, 0, 5), (40, 60, 1, 5)] + [
            w for w in oracle.sliding(all_events, 20, 20, 128) if w[1] > 60]
        assert got == want
        # The new stage starts empty: one session per event of v2 (a key's events are 2 ms
        # apart, the timeout 1 ms), each emitted once the watermark (128) reached its end.
        wait_until(lambda: client.get_list("sessions").size() >= 73, what="v2's sessions")
        sessions = client.get_list("sessions").get_all()
        assert sorted(r.start for r in sessions) == list(range(55, 128))
    finally:
        _stop(job2)


def test_sliding_to_session_is_refused_naming_the_stage_and_both_signatures(
    jet: Any, client: sparkjet.Client
) -> None:
    stream = client.get_stream("events", partitions=1)
    job = _start(jet, _windowed(StreamSource("events"), WindowDefinition.sliding(20, 10),
                                "per-user", "out"), "v1")
    stream.publish_all([{"ts": 1, "k": 0, "v": 1}])
    wait_until(lambda: job.get_metrics()["lastCommittedBatch"] >= 0, what="a batch")
    job.cancel_and_export_snapshot("s1")
    v2 = _windowed(StreamSource("events"), WindowDefinition.session(10), "per-user", "out")
    (row,) = [r for r in jet.check_upgrade(v2, "s1") if r.stage == "per-user"]
    assert row.status == "incompatible"
    config = JobConfig(name="v2", processing_guarantee=EXACTLY_ONCE)
    config.initial_snapshot_name = "s1"
    with pytest.raises(StateIncompatibleError, match=r"stage 'per-user' keeps state .*\"window\": "
                       r"\"frames\".* in the snapshot but .*\"window\": \"session\""):
        jet.submit(v2, config)


# --- the command line -------------------------------------------------------------------------

WINDOWED = """
    from sparkjet import aggregate as agg
    from sparkjet.pipeline import Pipeline, StreamSource, WindowDefinition

    pipeline = Pipeline.create()
    (pipeline.read_from(StreamSource("events")).with_timestamps(lambda e: e["ts"], 0)
     .window(WindowDefinition.{definition}).group_by(lambda e: e["k"])
     .aggregate(agg.summing(lambda e: e["v"])).set_name("w").write_to(Pipeline.to_list("out")))
"""


def test_check_upgrade_and_inspect_snapshot_show_windows_and_the_watermark(
    capsys: pytest.CaptureFixture[str], jet: Any, client: sparkjet.Client
) -> None:
    from sparkjet.cli import main
    from tests.test_cli import write_config, write_file

    write_config(client)
    stream = client.get_stream("events", partitions=1)
    job = _start(jet, _windowed(StreamSource("events"), WindowDefinition.tumbling(10), "w",
                                "out"), "v1")
    stream.publish_all([{"ts": t, "k": 0, "v": 1} for t in range(35)])
    wait_until(lambda: client.get_list("out").size() >= 3, what="three windows")
    job.cancel_and_export_snapshot("wv1")

    assert main(["inspect-snapshot", "wv1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^Watermarks: +w: 34$", out, re.M), out
    assert re.search(r"^Event time: +from-stream\(events\): highest timestamp by partition: "
                     r"0: 34$", out, re.M), out

    write_file("v2.py", WINDOWED.format(definition="sliding(20, 5).early_results(1000)"))
    assert main(["check-upgrade", "-s", "wv1", "v2.py"]) == 0
    out = capsys.readouterr().out
    assert ("  'w': tumbling(size=10) -> sliding(size=20, slide=5, early=1000): frames are "
            "reassigned to the new slide by their end (10 -> 5 ms)") in out
    assert "the window grows (10 -> 20 ms)" in out and "early results are switched on" in out

    write_file("v3.py", WINDOWED.format(definition="session(10)"))
    assert main(["check-upgrade", "-s", "wv1", "v3.py"]) == 2
    captured = capsys.readouterr()
    assert "  'w': tumbling(size=10) -> session(timeout=10): refused" in captured.out
    assert captured.err == ("ERROR: v3.py cannot start from snapshot 'wv1': 1 row refused "
                            "('w'); see above (1 restored, 1 incompatible)\n")
    assert "  'w' incompatible: stage 'w' keeps state {" in captured.out
