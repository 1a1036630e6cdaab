"""Keyed-operation semantics without Spark: the map side's records and both reduce sides.

The batch reducer folds each key from no state; the streaming reducer folds
into the state kept from earlier micro-batches. Both use one fold per
operation, so splitting the input into micro-batches must not change what a
key ends up with.
"""

from __future__ import annotations

from typing import Any

import pytest

from sparkjet.aggregate import counting, summing, to_list
from sparkjet.core.pipeline.aggregation import AggregateOperation
from sparkjet.core.pipeline.fusion import FOLDING, FusedPass, freeze
from sparkjet.core.pipeline.graph import (
    AggregateSpec,
    DistinctSpec,
    GroupAggregateSpec,
    GroupApplySpec,
    MapStatefulSpec,
    state_ttl_ms,
)
from sparkjet.core.pipeline.keyed import (
    MISSING,
    KeyedFold,
    fold_into,
    folded_records,
    group_parts,
    keyed_fold,
    reduce_batch,
)
from sparkjet.plugin import StatefulTransform


def map_side(fold: KeyedFold, key_fn: Any, partitions: list[list[Any]]) -> list[Any]:
    """The ``(shuffle key, part)`` records the map side emits for ``partitions``."""
    fused = FusedPass([], fold.terminal("stage", key_fn), metrics=False)
    records: list[Any] = []
    for pidx, items in enumerate(partitions):
        if fused.terminal.kind in FOLDING:
            records.extend(folded_records(fused, {"pidx": pidx}, iter(items), {}))
        else:
            records.extend(fused.run(iter(items), {}, {"pidx": pidx}))
    return records


Spec = GroupAggregateSpec | GroupApplySpec | MapStatefulSpec | DistinctSpec | AggregateSpec


def _key_fn(spec: Spec) -> Any:
    return None if isinstance(spec, AggregateSpec) else spec.key_fn


def batch(spec: Spec, partitions: list[list[Any]]) -> Any:
    """Outputs of the batch reduce side, in encounter order (as the runtime restores it)."""
    fold = keyed_fold(spec)
    records = map_side(fold, _key_fn(spec), partitions)
    records.reverse()  # the shuffle promises no order
    return [output for _, output in sorted(reduce_batch(fold, records), key=lambda r: r[0])]


def stream(
    spec: Spec, batches: list[list[list[Any]]], values: dict[Any, Any] | None = None,
) -> tuple[list[list[Any]], dict[Any, Any]]:
    """Per micro-batch outputs of the streaming reduce side, and the final state."""
    fold = keyed_fold(spec)
    values = {} if values is None else values
    touched: dict[Any, int] = {}
    outputs = []
    for partitions in batches:
        groups = group_parts(map_side(fold, _key_fn(spec), partitions))
        ttl_ms = None if isinstance(spec, AggregateSpec) else state_ttl_ms(spec)
        outputs.append(fold_into(fold, groups, values, touched, 0, ttl_ms))
    return outputs, values


def key_mod(x: int) -> int:
    return x % 3


class Collect(StatefulTransform):
    kind = "collect"

    def create_state(self) -> Any:
        return []

    def process(self, state: Any, key: Any, items: list[Any]) -> tuple[Any, list[Any]]:
        state.extend(items)
        return state, [(key, len(state))]


def test_item_records_have_the_documented_layout() -> None:
    fold = keyed_fold(GroupApplySpec(key_mod, Collect()))
    records = map_side(fold, key_mod, [[4, 5], [7]])
    assert records == [(1, (0, 0, 1, 4)), (2, (0, 1, 2, 5)), (1, (1, 0, 1, 7))]


@pytest.mark.parametrize("operation", [summing(), counting(), to_list()], ids=lambda o: o.name)
@pytest.mark.parametrize("combinable", [True, False])
def test_group_aggregate_matches_python(operation: AggregateOperation, combinable: bool) -> None:
    if not combinable:
        operation = AggregateOperation(operation.create, operation.accumulate, None,
                                       operation.finish)
    data = [[3, 1, 4, 1, 5], [9, 2, 6], [], [5, 3, 5]]
    expected: dict[int, Any] = {}
    for x in [x for part in data for x in part]:
        expected[x % 3] = operation.accumulate(expected.get(x % 3, operation.create()), x)
    spec = GroupAggregateSpec(key_mod, operation)
    assert batch(spec, data) == [
        (k, operation.finish(v)) for k, v in expected.items()
    ]
    # The same items over three micro-batches end in the same state.
    batches = [data[:1], data[1:3], data[3:]]
    outputs, values = stream(spec, batches)
    assert {k: operation.finish(acc) for k, (_, acc) in values.items()} == {
        k: operation.finish(v) for k, v in expected.items()
    }
    assert outputs[-1] == [(k, operation.finish(expected[k])) for k in (2, 0)]


def test_one_key_for_1_1_0_and_true_reported_as_first_seen() -> None:
    spec = GroupAggregateSpec(lambda x: x, counting())
    assert batch(spec, [[1.0, True], [1]]) == [(1.0, 3)]
    outputs, values = stream(spec, [[[True]], [[1, 1.0]]])
    assert outputs == [[(True, 1)], [(True, 3)]]
    assert values == {1: (True, 3)}


def test_each_key_gets_its_own_copy_of_initial() -> None:
    def append(acc: list[Any], x: Any) -> list[Any]:
        acc.append(x)  # in place: a shared initial list would collect every key's items
        return acc

    op = AggregateOperation.of(append, initial=[])
    assert batch(GroupAggregateSpec(key_mod, op), [[0, 1, 3], [4]]) == [
        (0, [0, 3]), (1, [1, 4])
    ]


def test_map_stateful_outputs_sit_at_their_items() -> None:
    def count(state: list[int], key: Any, item: int) -> Any:
        state[0] += 1
        return (item, state[0]) if item % 2 else None

    spec = MapStatefulSpec(key_mod, lambda: [0], count)
    data = [[1, 2, 3], [4, 5, 7]]
    assert batch(spec, data) == [(1, 1), (3, 1), (5, 2), (7, 3)]
    outputs, values = stream(spec, [[data[0]], [data[1]]])
    assert outputs == [[(1, 1), (3, 1)], [(7, 3), (5, 2)]]  # stream: key by key
    assert values == {1: (1, [3]), 2: (2, [2]), 0: (0, [1])}


def test_group_apply_once_per_key_and_batch() -> None:
    spec = GroupApplySpec(key_mod, Collect())
    assert batch(spec, [[1, 2], [4]]) == [(1, 2), (2, 1)]
    outputs, values = stream(spec, [[[1, 2]], [[4]]])
    assert outputs == [[(1, 1), (2, 1)], [(1, 2)]]
    assert values[1] == (1, [1, 4])


def test_distinct_keeps_the_first_occurrence_ever() -> None:
    spec = DistinctSpec()
    data: list[list[Any]] = [[{"a": 1}, [1], {"a": 1.0}], [[1.0], "x"]]
    assert batch(spec, data) == [{"a": 1}, [1], "x"]
    outputs, values = stream(spec, [[data[0]], [data[1]]])
    assert outputs == [[{"a": 1}, [1]], ["x"]]
    assert values == {freeze({"a": 1}): True, freeze([1]): True, "x": True}


def test_ttl_forgets_keys_and_touches_the_ones_seen() -> None:
    fold = keyed_fold(DistinctSpec(None, 10))
    values: dict[Any, Any] = {}
    touched: dict[Any, int] = {}

    def run(items: list[Any], now: int) -> list[Any]:
        groups = group_parts(map_side(fold, None, [items]))
        return fold_into(fold, groups, values, touched, now, 10)

    assert run(["a", "b"], 100) == ["a", "b"]
    assert run(["a"], 105) == []
    assert touched == {"a": 105, "b": 100}
    assert run(["a", "b"], 112) == ["b"]  # b expired (100 < 102), a was touched at 105
    assert touched == {"a": 112, "b": 112}


@pytest.mark.parametrize("combiner", [True, False])
def test_global_aggregate(combiner: bool) -> None:
    op = summing()
    if not combiner:
        op = AggregateOperation(op.create, op.accumulate, None, op.finish)
    spec = AggregateSpec(op)
    assert batch(spec, [[1, 2], [], [3]]) == [6]
    assert batch(spec, [[], []]) == [0]
    fold = keyed_fold(spec)
    assert list(reduce_batch(fold, [])) == [((0, 0, 0), 0)]


def test_a_new_key_folds_from_missing() -> None:
    fold = keyed_fold(GroupAggregateSpec(key_mod, counting()))
    out: list[Any] = []
    assert fold.fold("k", [(0, 0, "k", 2)], MISSING, out) == ("k", ("k", 2))
    assert fold.fold("k", [(0, 0, "k", 2)], ("k", 3), out) == ("k", ("k", 5))
    assert out == [((0, 0, 0), ("k", 2)), ((0, 0, 0), ("k", 5))]
