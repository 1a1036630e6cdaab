"""Co-groups (aggregate2, aggregate3, the aggregate builder) against a plain-Python oracle."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle as pyspark_cloudpickle

import sparkjet
from sparkjet.aggregate import AggregateOperation, counting, summing, to_list
from sparkjet.errors import PipelineDefinitionError
from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import (
    ItemsByTag,
    KeyedWindowResult,
    Pipeline,
    StreamSource,
    WindowDefinition,
)
from tests.conftest import in_process_client, run_pipeline, wait_until

# Spark's workers cannot import tests/: this module's functions travel by value.
pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE
KEYS = [1, 1.0, True, 0, None, "a", (1, "b")]
OPS = [counting, lambda: summing(value), to_list]


def key(item: Any) -> Any:
    return item[0]


def value(item: Any) -> Any:
    return item[1]


def oracle(inputs: list[list[Any]], ops: list[AggregateOperation]) -> list[Any]:
    """Per key, in order of first appearance over the inputs in turn, each input's result."""
    order: dict[Any, None] = {}
    for items in inputs:
        for item in items:
            order.setdefault(key(item), None)
    out = []
    for k in order:
        results = []
        for items, op in zip(inputs, ops, strict=True):
            acc = op.create()
            for item in items:
                if key(item) == k and hash(key(item)) == hash(k):
                    acc = op.accumulate(acc, item)
            results.append(op.finish(acc))
        out.append((k, tuple(results)))
    return out


def batch_cogroup(client: sparkjet.Client, inputs: list[list[Any]],
                  ops: list[AggregateOperation], form: str) -> list[Any]:
    p = Pipeline.create()
    stages = [p.read_from(Pipeline.from_list(f"in{i}", items)).group_by(key)
              for i, items in enumerate(inputs)]
    if form == "builder":
        builder = stages[0].aggregate_builder(ops[0])
        tags = [builder.tag0(), *(builder.add(s, op) for s, op in zip(stages[1:], ops[1:],
                                                                      strict=True))]
        out = builder.build().map(lambda kv: (kv[0], tuple(kv[1].get(t) for t in tags)))
    elif len(inputs) == 2:
        out = stages[0].aggregate2(stages[1], *ops)
    else:
        out = stages[0].aggregate3(stages[1], stages[2], *ops)
    client.get_list("out").clear()
    out.write_to(Pipeline.to_list("out"))
    run_pipeline(client, p)
    return client.get_list("out").get_all()


items = st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 9)), max_size=8)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(inputs=st.lists(items, min_size=2, max_size=3),
       picks=st.lists(st.integers(0, len(OPS) - 1), min_size=3, max_size=3),
       builder=st.booleans())
def test_batch_cogroups_equal_the_oracle(store_url: str, inputs: list[list[Any]],
                                         picks: list[int], builder: bool) -> None:
    ops = [OPS[i]() for i in picks[:len(inputs)]]
    got = batch_cogroup(in_process_client(store_url), inputs, ops,
                        "builder" if builder else "method")
    assert got == oracle(inputs, ops)


@pytest.mark.parametrize("engine_kind", ["spark", "in-process"], indirect=True)
def test_batch_cogroup_on_each_engine(client: sparkjet.Client, engine_kind: str) -> None:
    inputs = [[(k, i) for i, k in enumerate(KEYS * 2)], [(k, 10 * i) for i, k in
                                                          enumerate(reversed(KEYS))],
              [("a", 1), ("zz", 2)]]
    ops = [counting(), summing(value), to_list()]
    assert batch_cogroup(client, inputs, ops, "method") == oracle(inputs, ops)
    assert batch_cogroup(client, inputs[:2], ops[:2], "builder") == oracle(inputs[:2], ops[:2])


@pytest.mark.usefixtures("engine_kind")
def test_rolling_cogroup_in_a_stream_emits_per_touched_key(client: sparkjet.Client) -> None:
    clicks = client.get_stream("clicks", partitions=2)
    buys = client.get_stream("buys", partitions=1)
    p = Pipeline.create()
    (p.read_from(StreamSource("clicks")).group_by(key)
     .aggregate2(p.read_from(StreamSource("buys")).group_by(key), counting(), summing(value))
     .set_name("per-user").write_to(Pipeline.to_map("totals")))
    job = client.get_jet().submit(p, JobConfig(name="co", processing_guarantee=EXACTLY_ONCE,
                                               snapshot_interval_millis=100))
    try:
        sent_clicks: list[Any] = []
        sent_buys: list[Any] = []
        for round_ in range(3):
            new_clicks = [(KEYS[(i + round_) % 5], 0) for i in range(40)]
            new_buys = [(KEYS[i % 3], i) for i in range(round_ * 7)]
            clicks.publish_all(new_clicks)
            buys.publish_all(new_buys)
            sent_clicks += new_clicks
            sent_buys += new_buys
            want = dict(oracle([sent_clicks, sent_buys], [counting(), summing(value)]))
            wait_until(lambda want=want: dict(client.get_map("totals").entry_set()) == want,
                       what=f"round {round_}'s totals")
    finally:
        job.cancel()


def windowed_oracle(inputs: list[list[Any]], size: int) -> Counter[Any]:
    """Tumbling windows of ``size`` over event time ``item[1]``: counts per key and input."""
    found: dict[tuple[int, Any], list[int]] = {}
    for tag, events in enumerate(inputs):
        for event in events:
            start = event[1] - event[1] % size
            found.setdefault((start, key(event)), [0] * len(inputs))[tag] += 1
    return Counter((start, start + size, k, tuple(c)) for (start, k), c in found.items())


def test_windowed_cogroup_matches_the_oracle(client: sparkjet.Client) -> None:
    left = client.get_stream("left", partitions=1)  # no idle partition holds the watermark
    right = client.get_stream("right", partitions=1)
    p = Pipeline.create()
    lefts = p.read_from(StreamSource("left")).with_timestamps(value, 0)
    rights = p.read_from(StreamSource("right")).with_timestamps(value, 0)
    (lefts.window(WindowDefinition.tumbling(10)).group_by(key)
     .aggregate2(rights.group_by(key), counting(), counting())
     .set_name("co-window").write_to(Pipeline.to_list("windows")))
    job = client.get_jet().submit(p, JobConfig(name="cw", processing_guarantee=EXACTLY_ONCE,
                                               snapshot_interval_millis=100))
    try:
        ls = [("a", t) for t in (1, 3, 12, 15)] + [("b", 4)]
        rs = [("a", 2), ("b", 14), ("c", 5)]
        left.publish_all(ls)
        right.publish_all(rs)
        # A late-enough item on both inputs closes the windows before 30.
        left.publish_all([("z", 30)])
        right.publish_all([("z", 31)])
        want = windowed_oracle([ls, rs], 10)

        def closed() -> Counter[Any]:
            return Counter((w.start, w.end, w.key, w.result)
                           for w in client.get_list("windows").get_all()
                           if isinstance(w, KeyedWindowResult) and w.end <= 30)

        wait_until(lambda: closed() == want, what="the closed windows")
    finally:
        job.cancel()


def test_a_rolling_cogroup_carries_its_state_through_a_snapshot(
        client: sparkjet.Client) -> None:
    clicks = client.get_stream("clicks", partitions=1)
    buys = client.get_stream("buys", partitions=1)

    def pipeline() -> Pipeline:
        p = Pipeline.create()
        (p.read_from(StreamSource("clicks")).set_name("clicks").group_by(key)
         .aggregate2(p.read_from(StreamSource("buys")).set_name("buys").group_by(key),
                     counting(), summing(value))
         .set_name("per-user").write_to(Pipeline.to_map("totals")))
        return p

    job = client.get_jet().submit(pipeline(), JobConfig(
        name="v1", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=100))
    clicks.publish_all([("ada", 0), ("bob", 0)])
    buys.publish_all([("ada", 5)])
    wait_until(lambda: dict(client.get_map("totals").entry_set()) ==
               {"ada": (1, 5), "bob": (1, 0)}, what="v1's totals")
    job.export_snapshot("co-v1", cancel_job=True)
    buys.publish_all([("bob", 7)])
    clicks.publish_all([("ada", 0)])
    job2 = client.get_jet().submit(pipeline(), JobConfig(
        name="v2", processing_guarantee=EXACTLY_ONCE, initial_snapshot_name="co-v1"))
    try:
        wait_until(lambda: dict(client.get_map("totals").entry_set()) ==
                   {"ada": (2, 5), "bob": (1, 7)}, what="v2 going on from v1's state")
    finally:
        job2.cancel()


def test_bad_cogroup_inputs_are_refused_naming_the_stage() -> None:
    p = Pipeline.create()
    grouped = p.read_from(Pipeline.from_list("a", [1])).set_name("orders").group_by(key)
    plain = p.read_from(Pipeline.from_list("b", [1]))
    other = Pipeline.create().read_from(Pipeline.from_list("c", [1])).group_by(key)
    with pytest.raises(PipelineDefinitionError, match=r"'orders' co-groups with grouped"):
        grouped.aggregate2(plain, counting(), counting())  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match=r"'orders'.*another pipeline"):
        grouped.aggregate2(other, counting(), counting())
    with pytest.raises(PipelineDefinitionError, match=r"'orders' takes an AggregateOperation"):
        grouped.aggregate2(plain.group_by(key), counting(), "sum")  # type: ignore[arg-type]
    assert ItemsByTag([1, 2]).get(grouped.aggregate_builder(counting()).tag0()) == 1


@pytest.mark.parametrize("edit", ["swapped", "operation", "key"])
def test_check_upgrade_decides_cogroup_edits_aloud(client: sparkjet.Client, edit: str) -> None:
    """Inputs swapped, an input's operation or key function changed: 'changed', refused."""
    client.get_stream("clicks", partitions=1)
    client.get_stream("buys", partitions=1)

    def pipeline(swapped: bool = False, op1: AggregateOperation | None = None,
                 key1: Any = key) -> Pipeline:
        p = Pipeline.create()
        clicks = p.read_from(StreamSource("clicks")).set_name("clicks").group_by(key)
        buys = p.read_from(StreamSource("buys")).set_name("buys").group_by(key1)
        first, second = (buys, clicks) if swapped else (clicks, buys)
        (first.aggregate2(second, counting(), op1 or counting()).set_name("per-user")
         .write_to(Pipeline.to_map("totals")))
        return p

    job = client.get_jet().submit(pipeline(), JobConfig(
        name="v1", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=100))
    client.get_stream("clicks").publish_all([("ada", 1)])
    wait_until(lambda: client.get_map("totals").size() == 1, what="v1's totals")
    job.export_snapshot("v1", cancel_job=True)
    same = {(r.kind, r.stage): r for r in client.get_jet().check_upgrade(pipeline(), "v1")}
    assert same["state", "per-user"].status == "restored"
    v2 = {"swapped": pipeline(swapped=True), "operation": pipeline(op1=summing(value)),
          "key": pipeline(key1=lambda item: str(item[0]))}[edit]
    found = {(r.kind, r.stage): r for r in client.get_jet().check_upgrade(v2, "v1")}
    row = found["state", "per-user"]
    assert row.status == "changed" and row.refusal, (row.status, row.note, row.refusal)
