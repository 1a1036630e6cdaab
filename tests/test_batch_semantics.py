"""Each batch operation against a plain-Python oracle on the same data."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sparkjet.aggregate import (
    AggregateOperation,
    averaging,
    counting,
    max_by,
    min_by,
    summing,
    to_list,
    to_set,
)
from sparkjet.pipeline import Pipeline
from tests.conftest import run_pipeline

pytestmark = pytest.mark.usefixtures("reduce_path")

MIXED_KEYS = [1, 1.0, True, 2, 2.0, "a", 0, False, 0.0, "b", 1, "a"]
RECORDS = [{"k": i % 7, "v": (i * 13) % 5, "i": i} for i in range(200)]


def collect(client, build, items, name="out") -> list[Any]:  # type: ignore[no-untyped-def]
    """Run source(items) -> build(stage) -> list sink; return the sink's content."""
    p = Pipeline.create()
    build(p.read_from(Pipeline.from_list("in", items))).write_to(Pipeline.to_list(name))
    run_pipeline(client, p)
    return client.get_list(name).get_all()


def group_oracle(items, key_fn, acc_fn, initial):  # type: ignore[no-untyped-def]
    out: dict[Any, Any] = {}
    for item in items:
        k = key_fn(item)
        if k not in out:
            out[k] = copy.deepcopy(initial)
        out[k] = acc_fn(out[k], item)
    return list(out.items())


def test_example_from_the_issue(client) -> None:  # type: ignore[no-untyped-def]
    out = collect(client, lambda s: s.map(lambda x: x * 2).filter(lambda x: x > 4), [1, 2, 3, 4, 5])
    assert out == [6, 8, 10]


def test_stateless_chain_keeps_source_order(client) -> None:  # type: ignore[no-untyped-def]
    items = list(range(1000))
    out = collect(
        client,
        lambda s: s.map(lambda x: x + 1).flat_map(lambda x: [x] * (x % 3)).filter(lambda x: x % 2),
        items,
    )
    expected = [y for x in items for y in [x + 1] * ((x + 1) % 3) if y % 2]
    assert out == expected


def test_group_by_emits_key_and_items_in_first_appearance_order(client) -> None:  # type: ignore[no-untyped-def]
    out = collect(client, lambda s: s.group_by(lambda x: x), MIXED_KEYS)
    expected = group_oracle(MIXED_KEYS, lambda x: x, lambda acc, x: [*acc, x], [])
    assert out == expected
    # 1, 1.0 and True are one key; the first one seen represents it.
    assert out[0] == (1, [1, 1.0, True, 1])
    assert type(out[0][0]) is int


def test_group_aggregate_with_mutable_initial_gets_a_copy_per_key(client) -> None:  # type: ignore[no-untyped-def]
    def append(acc: list[Any], x: Any) -> list[Any]:
        acc.append(x["i"])  # mutates: a shared initial would leak across keys
        return acc

    out = collect(
        client, lambda s: s.group_by(lambda r: r["k"]).aggregate(accumulator=append, initial=[]),
        RECORDS,
    )
    assert out == group_oracle(RECORDS, lambda r: r["k"], append, [])


def test_group_aggregate_with_combiner_matches_sequential_fold(client) -> None:  # type: ignore[no-untyped-def]
    out = collect(
        client,
        lambda s: s.group_by(lambda r: r["k"]).aggregate(
            accumulator=lambda acc, r: acc + r["v"], initial=0, combiner=lambda a, b: a + b,
            finisher=lambda acc: acc * 10,
        ),
        RECORDS,
    )
    sums = group_oracle(RECORDS, lambda r: r["k"], lambda a, r: a + r["v"], 0)
    expected = [(k, v * 10) for k, v in sums]
    assert out == expected


def test_group_aggregate_mixed_numeric_keys(client) -> None:  # type: ignore[no-untyped-def]
    out = collect(client, lambda s: s.group_by(lambda x: x).aggregate(counting()), MIXED_KEYS)
    assert out == group_oracle(MIXED_KEYS, lambda x: x, lambda a, _x: a + 1, 0)
    assert dict(out)[True] == 4 and dict(out)[False] == 3


@pytest.mark.parametrize(
    ("operation", "oracle"),
    [
        (counting(), len),
        (summing(lambda r: r["v"]), lambda rs: sum(r["v"] for r in rs)),
        (averaging(lambda r: r["v"]), lambda rs: sum(r["v"] for r in rs) / len(rs)),
        (min_by(lambda r: r["v"]), lambda rs: min(rs, key=lambda r: r["v"])),
        (max_by(lambda r: r["v"]), lambda rs: max(rs, key=lambda r: r["v"])),
        (to_list(), list),
        (to_set(), lambda rs: {r["i"] for r in rs}),
    ],
    ids=["counting", "summing", "averaging", "min_by", "max_by", "to_list", "to_set"],
)
def test_builtin_operations_grouped(client, operation, oracle) -> None:  # type: ignore[no-untyped-def]
    items = RECORDS
    if operation.name == "to_set":
        def build(s):  # type: ignore[no-untyped-def]
            return s.group_by(lambda r: r["k"]).aggregate(
                AggregateOperation(set, lambda a, r: a | {r["i"]}, lambda a, b: a | b)
            )
        out = collect(client, build, items)
        expected_groups: dict[Any, list[Any]] = {}
        for r in items:
            expected_groups.setdefault(r["k"], []).append(r)
        assert out == [(k, oracle(rs)) for k, rs in expected_groups.items()]
        out2 = collect(client, lambda s: s.map(lambda r: r["k"]).aggregate(to_set()), items, "o2")
        assert out2 == [{r["k"] for r in items}]
        return
    out = collect(client, lambda s: s.group_by(lambda r: r["k"]).aggregate(operation), items)
    groups: dict[Any, list[Any]] = {}
    for r in items:
        groups.setdefault(r["k"], []).append(r)
    assert out == [(k, oracle(rs)) for k, rs in groups.items()]


def test_global_aggregate_and_without_combiner(client) -> None:  # type: ignore[no-untyped-def]
    items = list(range(1, 101))
    out = collect(client, lambda s: s.aggregate(accumulator=lambda a, x: a + x, initial=0), items)
    assert out == [sum(items)]
    # Not commutative and no combiner: the fold must see items in source order.
    out = collect(
        client, lambda s: s.aggregate(accumulator=lambda a, x: a * 31 + x, initial=7), items, "o2"
    )
    expected = 7
    for x in items:
        expected = expected * 31 + x
    assert out == [expected]


def test_global_aggregate_of_nothing_is_the_initial_value(client) -> None:  # type: ignore[no-untyped-def]
    out = collect(
        client,
        lambda s: s.filter(lambda x: False).aggregate(accumulator=lambda a, x: [*a, x], initial=[]),
        [1, 2, 3],
    )
    assert out == [[]]
    counted = collect(client, lambda s: s.filter(lambda x: False).aggregate(counting()), [1], "o2")
    assert counted == [0]


def test_distinct_uses_python_equality(client) -> None:  # type: ignore[no-untyped-def]
    items: list[Any] = [
        {"a": 1}, {"a": 1.0}, [1, 2], (1, 2), [1, 2], {1, 2}, frozenset({1, 2}),
        1, True, 1.0, "x", {"a": [1]}, {"a": [1]}, None, None,
    ]
    out = collect(client, lambda s: s.distinct(), items)
    expected: list[Any] = []
    for item in items:
        if not any(item == seen for seen in expected):
            expected.append(item)
    assert out == expected


def test_distinct_with_key_fn_keeps_first(client) -> None:  # type: ignore[no-untyped-def]
    out = collect(client, lambda s: s.distinct(lambda r: r["v"]), RECORDS)
    seen: dict[Any, Any] = {}
    for r in RECORDS:
        seen.setdefault(r["v"], r)
    assert out == list(seen.values())


@pytest.mark.parametrize("reverse", [False, True])
def test_sort_is_stable_like_sorted(client, reverse) -> None:  # type: ignore[no-untyped-def]
    items = [(i % 5, i) for i in range(300)]
    out = collect(client, lambda s: s.sort(key_fn=lambda t: t[0], reverse=reverse), items)
    assert out == sorted(items, key=lambda t: t[0], reverse=reverse)


def test_sort_without_key(client) -> None:  # type: ignore[no-untyped-def]
    items = [5, 3.5, 1, True, 2, 0, -4, 3.5]
    assert collect(client, lambda s: s.sort(), items) == sorted(items)


def test_merge_keeps_both_in_order_and_branches_share_a_stage(client) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline.create()
    base = p.read_from(Pipeline.from_list("in", list(range(10)))).map(lambda x: x * 10)
    evens = base.filter(lambda x: x % 20 == 0)
    odds = base.filter(lambda x: x % 20 != 0)
    evens.merge(odds).write_to(Pipeline.to_list("merged"))
    base.write_to(Pipeline.to_list("all"))
    job = run_pipeline(client, p)
    assert client.get_list("merged").get_all() == [0, 20, 40, 60, 80, 10, 30, 50, 70, 90]
    assert client.get_list("all").get_all() == [x * 10 for x in range(10)]
    stages = job.get_metrics()["stages"]
    assert stages["map"] == {"receivedCount": 10, "emittedCount": 10}
    assert stages["merge"]["receivedCount"] == 10


def test_peek_passes_items_through(client) -> None:  # type: ignore[no-untyped-def]
    assert collect(client, lambda s: s.peek().map(str), [1, 2]) == ["1", "2"]


def test_map_sink_upserts_and_map_source_reads(client) -> None:  # type: ignore[no-untyped-def]
    client.get_map("m").put("z", 0)
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("in", ["a", "b", "a", "c"]))
     .group_by(lambda w: w).aggregate(counting())
     .write_to(Pipeline.to_map("m")))
    run_pipeline(client, p)
    m = client.get_map("m")
    assert dict(m.entry_set()) == {"z": 0, "a": 2, "b": 1, "c": 1}
    p2 = Pipeline.create()
    (p2.read_from(Pipeline.from_map("m")).map(lambda kv: (kv[0], kv[1] + 100))
     .write_to(Pipeline.to_map("m2")))
    run_pipeline(client, p2)
    assert dict(client.get_map("m2").entry_set()) == {"z": 100, "a": 102, "b": 101, "c": 101}


def test_list_source_reads_store_list_and_large_outputs_use_segments(client) -> None:  # type: ignore[no-untyped-def]
    client.get_list("big").add_all(range(30_000))
    client.get_list("big").add_all(range(5))
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("big")).map(lambda x: x + 1).write_to(Pipeline.to_list("big2"))
    run_pipeline(client, p)
    assert client.get_list("big2").get_all() == [x + 1 for x in [*range(30_000), *range(5)]]


def test_logger_sink_logs_in_order(client, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level("INFO", logger="sparkjet.sink.logger")
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("in", [3, 1, 2])).write_to(Pipeline.to_logger())
    run_pipeline(client, p)
    lines = [r.getMessage() for r in caplog.records if r.name == "sparkjet.sink.logger"]
    assert lines == ["3", "1", "2"]
