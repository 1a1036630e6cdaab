"""Windowed aggregation against the plain-Python oracle, without Spark.

Runs the engine's own pieces a micro-batch is made of (the fused map-side
pass, the shuffle's grouping, the state fold and emission, the watermark from
the event-time record, the state pickled between batches) over randomized
out-of-order streams split into partitions and batches, and compares every
window emitted, and the late items counted, with :mod:`tests.window_oracle`.
"""

from __future__ import annotations

from typing import Any

import cloudpickle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkjet.aggregate import AggregateOperation, counting, summing, to_list
from sparkjet.core.pipeline.event_time import NO_WATERMARK, EventTime, WindowClock, stage_watermark
from sparkjet.core.pipeline.fusion import FusedPass, Stamp, StampKind
from sparkjet.core.pipeline.keyed import fold_into, folded_records, group_parts
from sparkjet.core.pipeline.window_fold import Frames, WindowFold, reshaped
from sparkjet.core.pipeline.windows import KeyedWindowResult, Timestamps, WindowDefinition
from sparkjet.errors import PipelineDefinitionError
from tests import window_oracle as oracle

TS = Timestamps(lambda e: e[1], 0, idle_timeout_ms=10**12)


class Simulated:
    """One windowed stage run batch by batch as a micro-batch runs it."""

    def __init__(self, definition: WindowDefinition, operation: AggregateOperation,
                 lag: int, keyed: bool = True) -> None:
        self.definition, self.operation, self.keyed = definition, operation, keyed
        self.timestamps = Timestamps(TS.fn, lag, TS.idle_timeout_ms)
        self.values: dict[Any, Any] = {}
        self.event_time = EventTime()
        self.late = 0
        self.time_ms = 1000

    def batch(self, events: list[oracle.Event], early: bool = False) -> list[Any]:
        """Run one micro-batch of ``events``; the windows it emitted."""
        self.time_ms += 1
        previous = self.event_time.watermarks.get("w", NO_WATERMARK)
        current = stage_watermark(self.event_time, "w", {"src": self.timestamps}, self.time_ms)
        fold = WindowFold(self.definition, self.operation, self.keyed,
                          WindowClock(previous, current, early))
        key_fn = (lambda e: e[2]) if self.keyed else None
        fused = FusedPass([], fold.terminal("w", key_fn), False,
                          Stamp(StampKind.FN, "src", TS.fn))
        records: list[Any] = []
        seen: dict[str, int] = {}
        for partition in sorted({e[0] for e in events}):
            state: dict[str, Any] = {"pidx": partition, "wm": fold.clock.late_before}
            mine = [e for e in events if e[0] == partition]
            records.extend(folded_records(fused, state, iter(mine), {}))
            self.late += state.get("late", 0)
            seen[str(partition)] = state["hi"]
        records = cloudpickle.loads(cloudpickle.dumps(records))  # through the shuffle
        changed: list[Any] = []
        removed: list[Any] = []
        out = fold_into(fold, group_parts(records), self.values, {}, 0, None, changed, removed)
        assert not set(changed) & set(removed)
        assert set(changed) <= set(self.values) and not set(removed) & set(self.values)
        self.values = cloudpickle.loads(cloudpickle.dumps(self.values))  # to the state file
        self.event_time = self.event_time.after({"src": seen}, self.time_ms, {"w": current})
        return out


def _run(sim: Simulated, batches: list[list[oracle.Event]]) -> list[Any]:
    out = []
    for batch in [*batches, []]:  # and a batch without input, as the loop runs when due
        out.extend(sim.batch(batch))
    return out


def _rows(results: list[Any]) -> list[tuple[Any, ...]]:
    return sorted((r.start, r.end, r.key, r.result) for r in results)


events = st.tuples(st.integers(0, 2), st.integers(-20, 120), st.integers(0, 3),
                   st.integers(1, 5))
runs = st.lists(st.lists(events, max_size=25), min_size=1, max_size=5)
frames_defs = st.one_of(
    st.integers(1, 12).map(WindowDefinition.tumbling),
    st.tuples(st.integers(1, 6), st.integers(1, 4)).map(
        lambda p: WindowDefinition.sliding(p[0] * p[1], p[0])),
)


def _summing_without_combine() -> AggregateOperation:
    return AggregateOperation.of(lambda acc, e: acc + e[3], 0)


@settings(max_examples=300, deadline=None)
@given(runs, frames_defs, st.integers(0, 30),
       st.sampled_from(["deduct", "combine", "listing"]))
def test_sliding_and_tumbling_windows_equal_the_oracle(
    batches: list[list[oracle.Event]], definition: WindowDefinition, lag: int, how: str
) -> None:
    op = {"deduct": summing(lambda e: e[3]),
          "combine": AggregateOperation(lambda: 0, lambda a, e: a + e[3], lambda a, b: a + b),
          "listing": _summing_without_combine()}[how]
    sim = Simulated(definition, op, lag)
    emitted = _run(sim, batches)
    marks = oracle.watermarks(batches, lag)
    slide = definition.slide
    kept, late = oracle.kept(batches, marks, lambda ts, w: oracle.frame_end(ts, slide) <= w)
    expected = oracle.sliding(kept, definition.size, slide, marks[-1])
    assert _rows(emitted) == expected
    assert sim.late == late
    assert all(isinstance(r, KeyedWindowResult) and not r.is_early for r in emitted)
    # State follows the open windows: no frame is older than the last emitted window needs.
    horizon = marks[-1] - definition.size + slide
    assert all(f > horizon for _k, state in sim.values.values() for f in state.frames)


@settings(max_examples=300, deadline=None)
@given(runs, st.integers(1, 15), st.integers(0, 30), st.booleans())
def test_session_windows_equal_the_oracle(
    batches: list[list[oracle.Event]], timeout: int, lag: int, combine: bool
) -> None:
    op = summing(lambda e: e[3]) if combine else _summing_without_combine()
    sim = Simulated(WindowDefinition.session(timeout), op, lag)
    emitted = _run(sim, batches)
    marks = oracle.watermarks(batches, lag)
    kept, late = oracle.kept(batches, marks, lambda ts, w: ts < w)
    assert _rows(emitted) == oracle.sessions(kept, timeout, marks[-1])
    assert sim.late == late
    # Emitted sessions are gone from the state; open ones stay.
    assert all(s[1] + timeout > marks[-1] for _k, state in sim.values.values()
               for s in state.sessions)


@settings(max_examples=100, deadline=None)
@given(runs, st.integers(1, 10), st.integers(0, 10))
def test_windows_without_a_key_equal_the_oracle(
    batches: list[list[oracle.Event]], size: int, lag: int
) -> None:
    sim = Simulated(WindowDefinition.tumbling(size), counting(), lag, keyed=False)
    emitted = _run(sim, batches)
    marks = oracle.watermarks(batches, lag)
    kept, _ = oracle.kept(batches, marks, lambda ts, w: oracle.frame_end(ts, size) <= w)
    one_key = [(p, ts, 0, 1) for p, ts, _k, _v in kept]
    expected = [(s, e, r) for s, e, _k, r in oracle.sliding(one_key, size, size, marks[-1])]
    assert sorted((r.start, r.end, r.result) for r in emitted) == expected


def test_a_window_is_emitted_once_when_the_watermark_passes_its_end() -> None:
    sim = Simulated(WindowDefinition.tumbling(10), counting(), lag=0)
    assert sim.batch([(0, 1, "a", 1), (0, 4, "a", 1)]) == []
    assert sim.batch([(0, 9, "a", 1)]) == []  # the watermark (4) has not reached 10
    assert sim.batch([(0, 10, "a", 1)]) == []  # watermark 9 < 10 still
    assert sim.batch([]) == [KeyedWindowResult(0, 10, "a", 3)]  # watermark 10
    assert sim.batch([]) == []  # never twice
    assert sim.batch([(0, 3, "a", 1)]) == [] and sim.late == 1  # late: dropped, counted
    assert list(sim.values) == ["a"]  # [10, 20) is open


def test_empty_windows_emit_nothing_and_state_is_purged() -> None:
    sim = Simulated(WindowDefinition.sliding(4, 2), summing(lambda e: e[3]), lag=0)
    sim.batch([(0, 1, "k", 5)])
    out = sim.batch([(0, 100, "k", 1)])
    out += sim.batch([])
    # [-2, 2) and [0, 4) hold the event; the 47 windows between them and 100 hold nothing.
    assert [(r.start, r.end, r.result) for r in out] == [(-2, 2, 5), (0, 4, 5)]
    (_key, state), = sim.values.values()
    assert sorted(state.frames) == [102]  # only the frame of the event at 100 is kept


def test_early_results_emit_open_windows_with_is_early() -> None:
    sim = Simulated(WindowDefinition.tumbling(10).early_results(1000), counting(), lag=0)
    sim.batch([(0, 1, "a", 1), (0, 12, "a", 1)])
    out = sim.batch([], early=True)  # watermark 12: [0, 10) complete, [10, 20) early
    assert out == [KeyedWindowResult(0, 10, "a", 1), KeyedWindowResult(10, 20, "a", 1, True)]
    assert sim.batch([], early=False) == []


def test_reshaping_reassigns_frames_by_their_end() -> None:
    op = summing()
    state = Frames(2, {2: 1, 4: 10, 6: 100, 8: 1000})
    assert reshaped(state, WindowDefinition.sliding(12, 4), op) == Frames(4, {4: 11, 8: 1100})
    assert reshaped(state, WindowDefinition.tumbling(3), op) == Frames(3, {3: 1, 6: 110,
                                                                       9: 1000})
    assert reshaped(state, WindowDefinition.sliding(8, 2), op) is state


def test_negative_timestamps_floor_toward_minus_infinity() -> None:
    sim = Simulated(WindowDefinition.tumbling(10), counting(), lag=0)
    sim.batch([(0, -1, "a", 1), (0, -10, "a", 1), (0, -11, "a", 1)])
    out = sim.batch([(0, 50, "a", 1)]) + sim.batch([])
    assert _rows(out) == [(-20, -10, "a", 1), (-10, 0, "a", 2)]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: WindowDefinition.sliding(10, 3), "must be a multiple of its slide"),
    (lambda: WindowDefinition.tumbling(0), "tumbling window's size must be a positive int"),
    (lambda: WindowDefinition.tumbling(1.5), "got 1.5"),
    (lambda: WindowDefinition.session(-1), "session window's timeout"),
    (lambda: WindowDefinition.tumbling(10).early_results(0), "early_results() period"),
])
def test_bad_definitions_are_refused(make: Any, message: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=message.replace("(", r"\(").replace(
            ")", r"\)")):
        make()


def test_definitions_round_trip_and_describe_themselves() -> None:
    for definition in (WindowDefinition.tumbling(60_000),
                       WindowDefinition.sliding(3_600_000, 60_000).early_results(10_000),
                       WindowDefinition.session(30_000)):
        assert WindowDefinition.from_json(definition.to_json()) == definition
    assert WindowDefinition.sliding(10, 10).kind == "tumbling"
    assert WindowDefinition.sliding(20, 10).early_results(5).describe() == (
        "sliding(size=20, slide=10, early=5)")
    assert WindowDefinition.from_json({"kind": "hopping"}) is None
    assert to_list().deduct is None and counting().deduct is not None
