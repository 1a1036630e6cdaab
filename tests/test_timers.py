"""The due-time index (core/pipeline/timers.py) against a brute-force model, and window timers."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import cloudpickle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkjet.aggregate import AggregateOperation, summing
from sparkjet.core.pipeline.event_time import NO_WATERMARK, WindowClock
from sparkjet.core.pipeline.fusion import FusedPass, Stamp, StampKind
from sparkjet.core.pipeline.keyed import GroupAggregate, fold_into, folded_records, group_parts
from sparkjet.core.pipeline.timers import DueIndex
from sparkjet.core.pipeline.window_fold import Frames, Sessions, WindowFold, reshaped
from sparkjet.core.pipeline.windows import Timestamps, WindowDefinition
from sparkjet.core.state.files import RangeState, StatePaths
from sparkjet.core.store.fs import Store

keys = st.integers(0, 12)
ops = st.lists(st.one_of(
    st.tuples(st.just("add"), keys, st.integers(-5, 40)),
    st.tuples(st.just("pop"), st.integers(-10, 50)),
    st.tuples(st.just("changes")),
), max_size=60)


def _model_entries(model: dict[int, set[int]]) -> set[tuple[int, int]]:
    return {(due, key) for key, dues in model.items() for due in dues}


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_index_pops_what_a_brute_force_model_says_is_due(steps: list[Any]) -> None:
    index = DueIndex("w")
    model: dict[int, set[int]] = {}  # key -> every due time it is filed under
    replayed = DueIndex("w")  # the index as files rebuild it: a full copy, then changelogs
    for step in steps:
        if step[0] == "add":
            _, key, due = step
            index.add(key, due)
            model.setdefault(key, set()).add(due)
        elif step[0] == "pop":
            upto = step[1]
            popped = index.pop_due(upto)
            expected = {k for k, dues in model.items() if any(d <= upto for d in dues)}
            assert set(popped) == expected and len(popped) == len(expected)
            earliest = [min(d for d in model[k] if d <= upto) for k in popped]
            assert earliest == sorted(earliest)  # earliest first
            for k in expected:
                model[k] = {d for d in model[k] if d > upto}
        else:
            replayed.apply_changes(cloudpickle.loads(cloudpickle.dumps(index.changes())))
        assert set(index.entries()) == _model_entries(model)
        assert len(index) == len(_model_entries(model))
        due = [d for dues in model.values() for d in dues]
        assert index.next_due() == (min(due) if due else None)
    # A full copy round-trips exactly.
    copy = DueIndex.from_state(cloudpickle.loads(cloudpickle.dumps(index.to_state())))
    assert copy.of == "w" and not copy.synced
    assert set(copy.entries()) == set(index.entries())
    assert copy.next_due() == index.next_due()
    # Changelogs replayed keep every key filed at or before its last due time.
    replayed.apply_changes(index.changes())
    last: dict[int, int] = {}
    for step in steps:
        if step[0] == "add":
            last[step[1]] = step[2]
    live = {(d, k) for d, k in index.entries()}
    for due, key in live:
        if last.get(key) == due:
            assert any(k == key and d <= due for d, k in replayed.entries())


def test_an_empty_pop_touches_nothing() -> None:
    index = DueIndex()
    index.add("a", 10)
    index.changes()
    assert index.pop_due(9) == []
    assert index.changes() == {"upto": None, "due": {}}
    assert index.pop_due(10) == ["a"]
    assert index.next_due() is None


# --- window timers: a windowed stage through the index equals the scan of every key ---------

WIN_TS = Timestamps(lambda e: e[1], 0, idle_timeout_ms=10**12)


def _records(fold: WindowFold, events: list[Any]) -> list[Any]:
    """The batch's shuffled parts for ``fold``'s stage (late events dropped by its clock)."""
    fused = FusedPass([], fold.terminal("w", lambda e: e[2]), False,
                      Stamp(StampKind.FN, "src", WIN_TS.fn))
    records: list[Any] = []
    for partition in sorted({e[0] for e in events}):
        state: dict[str, Any] = {"pidx": partition, "wm": fold.clock.late_before}
        mine = [e for e in events if e[0] == partition]
        records.extend(folded_records(fused, state, iter(mine), {}))
    return records


def _results(out: list[Any]) -> list[tuple[Any, ...]]:
    return sorted((r.start, r.end, r.key, r.result, r.is_early) for r in out)


def _live(values: dict[Any, Any], fold: WindowFold) -> dict[Any, Any]:
    """What of a range's state can still be emitted: frames in an open window, open sessions.

    (The scan purges a frame as soon as no open window holds it; the index when
    the key is next due, before any window could hold it.)
    """
    definition, current = fold.definition, fold.clock.current
    horizon = current - definition.size + definition.slide
    live = {}
    for group_key, (key, stored) in values.items():
        state = reshaped(stored, definition, fold.operation)
        if isinstance(state, Frames):
            kept = {f: a for f, a in state.frames.items() if f > horizon}
        else:
            kept = [s for s in state.sessions if s[1] + state.timeout > current]
        if kept:
            live[group_key] = (key, kept)
    return live


win_events = st.lists(st.tuples(st.integers(0, 1), st.integers(-10, 150), st.integers(0, 5),
                                st.integers(1, 5)), max_size=20)
win_batches = st.lists(st.tuples(win_events, st.integers(0, 25), st.booleans(),
                                 st.sampled_from(["kept", "read", "compact"])),
                       min_size=1, max_size=8)
frame_defs = st.one_of(
    st.integers(1, 12).map(WindowDefinition.tumbling),
    st.tuples(st.integers(1, 6), st.integers(1, 4)).map(
        lambda p: WindowDefinition.sliding(p[0] * p[1], p[0])),
)
session_defs = st.integers(1, 15).map(WindowDefinition.session)
two_defs = st.one_of(st.tuples(frame_defs, frame_defs), st.tuples(session_defs, session_defs))


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(win_batches, two_defs, st.integers(0, 8), st.booleans())
def test_window_timers_emit_and_keep_what_the_scan_of_every_key_does(
    tmp_path: Path, batches: list[Any], defs: tuple[WindowDefinition, WindowDefinition],
    reshape_at: int, combine_only: bool,
) -> None:
    op = (AggregateOperation(lambda: 0, lambda a, e: a + e[3], lambda a, b: a + b)
          if combine_only else summing(lambda e: e[3]))
    paths = StatePaths(Store(str(tmp_path)), f"{tmp_path}/state-{uuid.uuid4().hex}", key_groups=2)
    # Idle keys, so that most batches write changelogs rather than full copies.
    first = defs[0]
    idle = {f"idle{i}": (f"idle{i}", Sessions(first.timeout, [[10**5 + i, 10**5 + i, 1]])
                         if first.is_session else Frames(first.slide, {first.slide * 10**4: 1}))
            for i in range(40)}
    scanned: dict[Any, Any] = dict(idle)
    state = RangeState(dict(idle), {}, [], {})
    watermark = NO_WATERMARK
    for batch, (events, step, early, how) in enumerate([*batches, ([], 10**6, False, "kept")]):
        definition = defs[1] if batch >= reshape_at else defs[0]
        current = (events[0][1] if events else 0) if watermark == NO_WATERMARK else watermark + step
        clock = WindowClock(watermark, current, early)
        by_scan, by_index = (WindowFold(definition, op, True, clock) for _ in range(2))
        records = cloudpickle.dumps(_records(by_scan, events))
        out = fold_into(by_scan, group_parts(cloudpickle.loads(records)), scanned, {}, 0, None)
        if batch and (how == "read" or (how == "compact" and paths.compact("s", 0, 2, batch - 1))):
            state = paths.read("s", 0, 2, batch - 1)[0]
        changed: list[Any] = []
        removed: list[Any] = []
        assert state.timers is not None
        got = fold_into(by_index, group_parts(cloudpickle.loads(records)), state.values,
                        state.touched, 0, None, changed, removed, timers=state.timers)
        assert _results(got) == _results(out)
        assert _live(state.values, by_index) == _live(scanned, by_scan)
        assert set(changed) <= set(state.values) and not set(removed) & set(state.values)
        if changed or removed or not state.chain:
            state = paths.write("s", 0, 2, batch, state, changed, removed,
                                paths.versions("s", 0, 2))
        watermark = max(watermark, current)
    assert not _live(state.values, by_index) and not scanned


def test_a_state_file_without_timers_is_indexed_on_load_and_emits_like_the_scan(
    tmp_path: Path,
) -> None:
    paths = StatePaths(Store(str(tmp_path)), str(tmp_path / "state"), key_groups=1)
    definition = WindowDefinition.sliding(20, 10)
    frames = {k: (k, Frames(10, {10 * (k % 7) + 10: k, 10 * (k % 7) + 20: 1})) for k in range(50)}
    # Written as before there were timers: the file holds values and touched only.
    paths.write("s", 0, 1, 0, RangeState(dict(frames), {}, []), list(frames), [], [])
    (old,) = paths.versions("s")
    assert set(cloudpickle.loads(Path(paths.path("s", old)).read_bytes())) == {"values",
                                                                                "touched"}
    state = paths.read("s", 0, 1, 0)[0]
    assert state.timers == {}
    clock = WindowClock(25, 45)
    scanned = dict(frames)
    out = fold_into(WindowFold(definition, summing(), True, clock), {}, scanned, {}, 0, None)
    changed: list[Any] = []
    removed: list[Any] = []
    fold = WindowFold(definition, summing(), True, clock)
    got = fold_into(fold, {}, state.values, {}, 0, None, changed, removed, timers=state.timers)
    assert out and _results(got) == _results(out)
    assert state.timers["window"].of == fold.timers_for
    # The next file holds the index, and a reader takes it as is.
    after = paths.write("s", 0, 1, 1, state, changed, removed, paths.versions("s"))
    data = cloudpickle.loads(Path(paths.path("s", after.chain[-1])).read_bytes())
    assert "timers" in data or "due" in data
    again = paths.read("s", 0, 1, 1)[0]
    assert again.timers is not None and set(again.timers) == {"window"}
    assert {k for _d, k in again.timers["window"].entries()} >= set(again.values)


def test_an_index_kept_for_another_window_is_rebuilt() -> None:
    values = {k: (k, Frames(10, {100: 1})) for k in range(10)}
    old = DueIndex("tumbling size=10 slide=10 timeout=0")  # files nothing: would hide every key
    timers = {"window": old}
    fold = WindowFold(WindowDefinition.tumbling(20), summing(), True, WindowClock(0, 200))
    out = fold_into(fold, {}, values, {}, 0, None, timers=timers)
    assert timers["window"] is not old and len(out) == 10 and not values


def test_an_advance_over_idle_keys_pops_nothing_and_costs_far_less_than_the_scan() -> None:
    keys = 100_000
    values = {k: (k, Frames(1000, {10_000: 1})) for k in range(keys)}
    timers: dict[str, DueIndex] = {}
    definition = WindowDefinition.tumbling(1000)
    clock = WindowClock(1000, 2000)
    fold_into(WindowFold(definition, summing(), True, WindowClock(0, 1000)), {}, values, {}, 0,
              None, timers=timers)  # builds the index (and the window at 1000 was due)
    started = time.perf_counter()
    out = fold_into(WindowFold(definition, summing(), True, clock), {}, values, {}, 0, None,
                    timers=timers)
    indexed = time.perf_counter() - started
    started = time.perf_counter()
    scan = fold_into(WindowFold(definition, summing(), True, clock), {}, values, {}, 0, None)
    scanned = time.perf_counter() - started
    assert out == scan == [] and len(values) == keys
    assert indexed < 0.05 and indexed * 10 < scanned


# --- TTL: keys expired through the index equal the scan of every key's touched -------------

ttl_batches = st.lists(st.tuples(st.lists(st.integers(0, 30), max_size=8), st.integers(0, 40),
                                 st.sampled_from(["kept", "read", "compact"])),
                       min_size=1, max_size=10)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ttl_batches, st.integers(1, 60), st.booleans())
def test_a_ttl_through_the_index_expires_what_the_scan_does(
    tmp_path: Path, batches: list[Any], ttl: int, start_without: bool,
) -> None:
    fold = GroupAggregate(summing())
    paths = StatePaths(Store(str(tmp_path)), f"{tmp_path}/state-{uuid.uuid4().hex}", key_groups=2)
    # Many keys touched long ago and a few lately, so that changelogs are written.
    touched0 = {f"old{i}": i for i in range(30)}
    scanned, scanned_touched = {k: (k, 1) for k in touched0}, dict(touched0)
    state = RangeState(dict(scanned), dict(touched0), [], {})
    if not start_without:  # else: state files written before there were timers
        fold_into(fold, {}, state.values, state.touched, 0, ttl, timers=state.timers)
    now = 0
    for batch, (keys, step, how) in enumerate(batches):
        now += step
        parts = [(0, i, k, 1) for i, k in enumerate(keys)]
        if batch and (how == "read" or (how == "compact" and paths.compact("s", 0, 2, batch - 1))):
            state = paths.read("s", 0, 2, batch - 1)[0]
        assert state.timers is not None
        scan_removed: list[Any] = []
        out = fold_into(fold, group_parts((p[2], p) for p in parts), scanned, scanned_touched,
                        now, ttl, [], scan_removed)
        changed: list[Any] = []
        removed: list[Any] = []
        got = fold_into(fold, group_parts((p[2], p) for p in parts), state.values,
                        state.touched, now, ttl, changed, removed, timers=state.timers)
        assert got == out
        assert sorted(map(str, removed)) == sorted(map(str, scan_removed))
        assert state.values == scanned and state.touched == scanned_touched
        if changed or removed or not state.chain:
            state = paths.write("s", 0, 2, batch, state, changed, removed,
                                paths.versions("s", 0, 2))
