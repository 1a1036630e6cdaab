"""Dead letters: a stateless stage's error policy, and the letters' way to their stream.

The kernel tests run the generated pass alone (no Spark); the job tests run
real Spark jobs, batch and streaming, the streaming one through a sink commit
that fails after landing, so its micro-batch is replayed and must not write
its letters twice.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle as pyspark_cloudpickle

import sparkjet
from sparkjet.aggregate import counting
from sparkjet.cli import main
from sparkjet.core.pipeline.fusion import FusedPass, Op, Stamp, StampKind, Terminal, TerminalKind
from sparkjet.core.pipeline.graph import OpKind
from sparkjet.errors import ConfigError, JobFailedError, PipelineDefinitionError
from sparkjet.job import Job, JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import KeyedWindowResult, Pipeline, StreamSource, WindowDefinition
from tests.conftest import wait_until
from tests.faults import flaky_sink
from tests.test_cli import write_config


def parse(text: str) -> int:
    return int(text)


# Spark's workers cannot import tests/: this module's functions travel by value.
pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])


def tenth(n: int) -> int:
    return 10 // (n - 2)


# --- the kernel ------------------------------------------------------------------------------


def run_pass(ops: list[Op], items: list[Any]) -> tuple[list[Any], dict[str, Any], dict[str, int]]:
    counts: dict[str, int] = {}
    state: dict[str, Any] = {}
    out = list(FusedPass(ops).run(iter(items), counts, state))
    return out, state, counts


def test_a_dead_letter_map_sets_the_bad_items_aside_and_counts_what_it_emits() -> None:
    ops = [Op(OpKind.MAP, "parse", parse, dead=True), Op(OpKind.MAP, "double", lambda n: 2 * n)]
    out, state, counts = run_pass(ops, ["1", "x", "3", "y"])
    assert out == [2, 6]
    letters = state["dead"]
    assert [(d["stage"], d["item"], d["index"]) for d in letters] == [
        ("parse", "x", 1), ("parse", "y", 3)]
    assert letters[0]["error"] == "ValueError: invalid literal for int() with base 10: 'x'"
    # The traceback starts at the user's function, not in the generated pass.
    assert letters[0]["traceback"].splitlines()[1].endswith("in parse")
    assert "sparkjet-fused" not in letters[0]["traceback"]
    assert FusedPass(ops).stage_counts(counts) == {"parse": (4, 2), "double": (2, 2)}


def test_filter_flat_map_and_peek_set_items_aside_too() -> None:
    seen: list[Any] = []

    def small(n: int) -> bool:
        if n == 3:
            raise KeyError("three")
        return n < 5

    def pairs(n: int) -> Iterator[int]:
        yield n
        if n == 2:
            raise RuntimeError("half done")  # part-way: nothing of 2 goes on
        yield -n

    def look(n: int) -> None:
        if n == -1:
            raise ValueError("no -1")
        seen.append(n)

    ops = [Op(OpKind.FILTER, "small", small, dead=True),
           Op(OpKind.FLAT_MAP, "pairs", pairs, dead=True),
           Op(OpKind.PEEK, "look", look, dead=True)]
    out, state, counts = run_pass(ops, [1, 2, 3, 4, 9])
    assert out == [1, 4, -4]
    assert [(d["stage"], d["item"], d["index"]) for d in state["dead"]] == [
        ("look", -1, 0), ("pairs", 2, 1), ("small", 3, 2)]
    assert FusedPass(ops).stage_counts(counts) == {
        "small": (5, 3), "pairs": (3, 4), "look": (4, 3)}


def test_a_stage_without_the_policy_still_fails_and_an_unpicklable_item_is_kept_as_repr() -> None:
    with pytest.raises(ValueError, match="invalid literal"):
        run_pass([Op(OpKind.MAP, "parse", parse)], ["x"])
    lock = threading.Lock()
    holds_a_lambda = {"fn": lambda: 0}  # cloudpickle takes it; the stream log's pickle does not
    _, state, _ = run_pass([Op(OpKind.MAP, "boom", lambda x: 1 / 0, dead=True)],
                           [lock, holds_a_lambda])
    assert [(d["item_pickled"], d["item"]) for d in state["dead"]] == [
        (False, repr(lock)), (False, repr(holds_a_lambda))]


@pytest.mark.parametrize("kind", [TerminalKind.FRAMES, TerminalKind.SESSIONS])
def test_a_window_pass_sets_late_items_aside_when_asked(kind: TerminalKind) -> None:
    """Frames: late when the frame (slide 10) ends at or before 50; sessions: below 50."""
    terminal = Terminal(kind, "w", None, list, lambda acc, x: [*acc, x], span=10,
                        late_letters=True)
    fused = FusedPass([], terminal, stamp=Stamp(StampKind.FN, "src", lambda e: e["t"]))
    state: dict[str, Any] = {"accs": {}, "firsts": {}, "wm": 50}
    items = [{"t": 60}, {"t": 49}, {"t": 55}, {"t": 3}]
    list(fused.run(iter(items), {}, state))
    assert [(d["index"], d["item"], d["timestamp"], d["watermark"], d["traceback"])
            for d in state["dead"]] == [(1, {"t": 49}, 49, 50, None), (3, {"t": 3}, 3, 50, None)]
    assert state["late"] == 2 and all(d["stage"] == "w" for d in state["dead"])
    quiet = FusedPass([], Terminal(kind, "w", None, list, lambda acc, x: [*acc, x], span=10),
                      stamp=Stamp(StampKind.FN, "src", lambda e: e["t"]))
    state = {"accs": {}, "firsts": {}, "wm": 50}
    list(quiet.run(iter(items), {}, state))
    assert state["late"] == 2 and "dead" not in state  # counted only


def test_bad_policies_are_refused_naming_the_stage() -> None:
    p = Pipeline.create()
    source = p.read_from(Pipeline.from_list("raw", ["1"]))
    with pytest.raises(PipelineDefinitionError, match="on_error\\(\\) on stage 'parse': the "
                       "policy is 'fail' or 'dead-letter', got 'skip'"):
        source.map(parse).set_name("parse").on_error("skip")
    grouped = source.group_by(len).aggregate(counting()).set_name("per-len")
    with pytest.raises(PipelineDefinitionError, match=r"apply to map, filter, flat_map and peek "
                       r"stages, service calls, windowed aggregations and interval .*'per-len' "
                       r"is a group_aggregate stage"):
        grouped.on_error("dead-letter")
    with pytest.raises(PipelineDefinitionError, match="'from-list\\(raw\\)' is a source stage"):
        source.on_error("dead-letter")
    with pytest.raises(ConfigError, match=r"JobConfig.error_policy: expected 'fail' or "
                       r"'dead-letter', got 'skip'"):
        JobConfig(error_policy="skip")


# --- jobs ------------------------------------------------------------------------------------


def letters_of(client: sparkjet.Client, stream: str) -> list[dict[str, Any]]:
    log = client.get_stream(stream)
    return [letter for p in range(len(log.end_offsets())) for letter in log.read(p)]


@pytest.mark.usefixtures("engine_kind")
def test_a_batch_job_writes_its_dead_letters_and_counts_them(client: sparkjet.Client) -> None:
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("raw", ["1", "2", "x", "4", "y", "6"]))
      .map(parse).set_name("parse").on_error("dead-letter")
      .map(tenth).set_name("tenth")                   # fails on 2: the job default applies
      .write_to(Pipeline.to_list("out")))
    job = client.get_jet().submit(p, JobConfig(name="nums", error_policy="dead-letter",
                                               dead_letter_stream="bad-nums"))
    job.join()
    assert sorted(client.get_list("out").get_all()) == sorted([10 // -1, 10 // 2, 10 // 4])
    stages = job.get_metrics()["stages"]
    assert stages["parse"]["deadLetters"] == 2 and stages["parse"]["emittedCount"] == 4
    assert stages["tenth"]["deadLetters"] == 1 and stages["tenth"]["emittedCount"] == 3
    letters = letters_of(client, "bad-nums")
    assert sorted((d["stage"], d["item"]) for d in letters) == [
        ("parse", "x"), ("parse", "y"), ("tenth", 2)]
    for letter in letters:
        assert letter["job"] == "nums" and letter["job_id"] == job.id
        assert letter["batch"] is None
        assert letter["source"] == "from-list(raw)" and letter["partition"] == "0"
        assert letter["offset"] is None  # a list source cannot tell
    by_item = {d["item"]: d for d in letters}
    assert by_item[2]["error"] == "ZeroDivisionError: integer division or modulo by zero"
    assert "in tenth" in by_item[2]["traceback"]


@pytest.mark.usefixtures("engine_kind")
def test_the_branches_of_a_merge_keep_all_their_letters(client: sparkjet.Client) -> None:
    """Both branches' passes run under the merge's name, on the same partition numbers."""
    p = Pipeline.create()
    left = p.read_from(Pipeline.from_list("left", ["1", "x", "3"])).map(parse).set_name("l")
    right = p.read_from(Pipeline.from_list("right", ["y", "5", "z"])).map(parse).set_name("r")
    left.merge(right).write_to(Pipeline.to_list("out"))
    job = client.get_jet().submit(p, JobConfig(name="both", error_policy="dead-letter"))
    job.join()
    assert sorted(client.get_list("out").get_all()) == [1, 3, 5]
    letters = letters_of(client, "both.dead-letters")
    assert sorted((d["stage"], d["item"]) for d in letters) == [
        ("l", "x"), ("r", "y"), ("r", "z")]


@pytest.mark.usefixtures("engine_kind")
def test_a_stage_that_says_fail_fails_the_job_under_a_dead_letter_default(
    client: sparkjet.Client,
) -> None:
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("raw", ["1", "x"]))
      .map(parse).set_name("strict").on_error("fail")
      .write_to(Pipeline.to_list("out")))
    job = client.get_jet().submit(p, JobConfig(error_policy="dead-letter"))
    with pytest.raises(JobFailedError, match="stage 'strict' failed: ValueError"):
        job.join()
    assert not client.get_stream(f"{job.id}.dead-letters").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("engine_kind")
def test_a_replayed_micro_batch_writes_its_dead_letters_once(
    client: sparkjet.Client, tmp_path: Path, cancel_at_end: list[Job]
) -> None:
    """The sink's commit of batch 2 fails after landing; resume() replays batch 2.

    Its letters were appended before the sinks committed: the replay finds
    them and the stream holds each bad item once, with its stream offset.
    """
    flaky_sink.register(client)
    stream = client.get_stream("events", partitions=1)
    p = Pipeline.create()
    (p.read_from(StreamSource("events"))
      .map(lambda e: 100 // (e % 7)).set_name("divide")   # every seventh item fails
      .write_to(flaky_sink.FlakyListSink("out", str(tmp_path / "failed"), fail_batch=2,
                                         when="after")))
    job = client.get_jet().submit(p, JobConfig(
        name="divider", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=100, suspend_on_failure=True, error_policy="dead-letter"))
    cancel_at_end.append(job)

    def committed() -> int:
        return int(job.get_metrics().get("lastCommittedBatch", -1))

    for batch in range(3):  # one publish per micro-batch
        stream.publish_all(range(batch * 20, batch * 20 + 20))
        if batch < 2:
            wait_until(lambda b=batch: committed() >= b, 60, f"micro-batch {batch}")
    wait_until(lambda: job.status is JobStatus.SUSPENDED, 60, "the failed commit to suspend")
    assert os.path.exists(tmp_path / "failed")
    job.resume()
    wait_until(lambda: committed() >= 2, 60, "the replayed micro-batch")
    bad = [n for n in range(60) if n % 7 == 0]
    letters = letters_of(client, "divider.dead-letters")
    assert Counter(d["item"] for d in letters) == Counter(bad)   # once each
    assert all(d["offset"] == d["item"] for d in letters)        # item n is at offset n
    assert {d["batch"] for d in letters} == {0, 1, 2}
    assert all(d["partition"] == "0" and d["source"] == "from-stream(events)" for d in letters)
    out = client.get_list("out").get_all()
    assert Counter(out) == Counter(100 // (n % 7) for n in range(60) if n % 7)
    wait_until(lambda: job.get_metrics()["stages"]["divide"].get("deadLetters", 0) > 0, 30,
               "the stage's count")


@pytest.mark.usefixtures("engine_kind")
def test_a_window_with_the_dead_letter_policy_sets_its_late_items_aside(
    client: sparkjet.Client, cancel_at_end: list[Job]
) -> None:
    """Late items of a dead-letter window become letters; another window only counts its own.

    Both windows drop the late item from their results and count it in
    ``lateEventsDropped``; only the one whose policy says so writes it, once,
    with its timestamp and the watermark it was judged by.
    """
    stream = client.get_stream("clicks", partitions=1)
    p = Pipeline.create()
    clicks = p.read_from(StreamSource("clicks")).with_timestamps(lambda e: e["ts"], 0)
    (clicks.window(WindowDefinition.tumbling(100)).group_by(lambda e: e["k"])
     .aggregate(counting()).set_name("per-100").on_error("dead-letter")
     .write_to(Pipeline.to_list("per-100")))
    (clicks.window(WindowDefinition.session(30)).group_by(lambda e: e["k"])
     .aggregate(counting()).set_name("sessions")
     .write_to(Pipeline.to_list("sessions")))
    job = client.get_jet().submit(p, JobConfig(
        name="late-letters", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=100))
    cancel_at_end.append(job)
    out = client.get_list("per-100")
    stream.publish_all([{"ts": t, "k": "a"} for t in (5, 50, 120, 150)])
    wait_until(lambda: KeyedWindowResult(0, 100, "a", 2) in out.get_all(), 60,
               "[0, 100) once the watermark (150) passed 100")
    stream.publish_all([{"ts": 40, "k": "a"}, {"ts": 260, "k": "a"}])  # 40 is late for both
    wait_until(lambda: KeyedWindowResult(100, 200, "a", 2) in out.get_all(), 60,
               "[100, 200) complete")
    stages = wait_until(
        lambda: (m := job.get_metrics()["stages"])["sessions"]["lateEventsDropped"] == 1
        and m["per-100"]["lateEventsDropped"] == 1 and m, 60, "the late item counted")
    assert stages["per-100"]["deadLetters"] == 1 and "deadLetters" not in stages["sessions"]
    [letter] = letters_of(client, "late-letters.dead-letters")
    assert letter["stage"] == "per-100" and letter["item"] == {"ts": 40, "k": "a"}
    assert (letter["timestamp"], letter["watermark"]) == (40, 150)
    assert letter["error"] == "late: timestamp 40 is behind the watermark 150"
    assert letter["traceback"] is None
    # The source feeds two windows: read once and shared, so the origin is unknown (as
    # documented for letters behind a branch).
    assert (letter["source"], letter["partition"], letter["offset"]) == (None, None, None)
    assert [r for r in out.get_all() if r.start == 0] == [KeyedWindowResult(0, 100, "a", 2)]


@pytest.mark.spark
def test_the_cli_submits_with_a_policy_and_reads_the_letters(
    client: sparkjet.Client, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    job_file = tmp_path / "amounts.py"
    job_file.write_text(
        "from sparkjet.pipeline import Pipeline\n"
        "pipeline = Pipeline.create()\n"
        "(pipeline.read_from(Pipeline.from_list('raw', ['5', 'five', '7']))\n"
        " .map(int).set_name('parse').write_to(Pipeline.to_list('amounts')))\n",
        encoding="utf-8",
    )
    write_config(client)
    assert main(["submit", "-n", "amounts", "--on-error", "dead-letter", str(job_file)]) == 0
    capsys.readouterr()
    assert main(["get", "stream", "amounts.dead-letters", "--json"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    shown = json.loads(line)
    assert (shown["partition"], shown["offset"]) == (0, 0)
    letter = shown["item"]
    assert (letter["stage"], letter["item"], letter["index"]) == ("parse", "five", 1)
    assert client.get_list("amounts").get_all() == [5, 7]
    assert main(["submit", "--on-error", "skip", str(job_file)]) == 2
    assert "invalid choice: 'skip'" in capsys.readouterr().err
