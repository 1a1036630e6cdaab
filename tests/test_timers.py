"""The due-time index (core/timers.py) against a brute-force model."""

from __future__ import annotations

from typing import Any

import cloudpickle
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkjet.core.timers import DueIndex

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
