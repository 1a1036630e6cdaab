"""Hash joins: batch and streaming jobs against a plain-Python oracle, replays, refusals."""

from __future__ import annotations

import itertools
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle as pyspark_cloudpickle

import sparkjet
from sparkjet.errors import JobFailedError, PipelineDefinitionError
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import ItemsByTag, JoinClause, Pipeline, StreamSource
from tests.conftest import in_process_client, run_pipeline, wait_until

# Spark's workers cannot import tests/: this module's functions travel by value.
pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE
#: Keys that a dict takes as one (1, 1.0, True), None as a key, and a few others.
KEYS = [1, 1.0, True, 0, None, "a", (1, "b")]


def by_key(item: Any) -> Any:
    return item[0]


def value(item: Any) -> Any:
    return item[1]


def oracle_join(primary: list[Any], sides: list[list[Any]], inner: bool) -> list[Any]:
    """Jet's hash join in plain Python: per item, every combination of matches, in order."""
    out = []
    for item in primary:
        matches = []
        for side in sides:
            found = [value(b) for b in side if by_key(b) == by_key(item) and
                     hash(by_key(b)) == hash(by_key(item))]
            if not found:
                if inner:
                    break
                found = [None]
            matches.append(found)
        else:
            out.extend((item, *combo) for combo in itertools.product(*matches))
    return out


def batch_join(client: sparkjet.Client, primary: list[Any], sides: list[list[Any]],
               inner: bool, form: str) -> list[Any]:
    p = Pipeline.create()
    stage = p.read_from(Pipeline.from_list("primary", primary))
    builds = [p.read_from(Pipeline.from_list(f"side{i}", side)) for i, side in enumerate(sides)]
    clause = JoinClause.on_keys(by_key, by_key).projecting(value)
    if form == "builder":
        builder = stage.hash_join_builder()
        tags = [builder.add(b, clause) for b in builds]
        joined = builder.build(lambda x, found: (x, *(found.get(t) for t in tags)), inner=inner)
    elif len(sides) == 1:
        method = stage.inner_hash_join if inner else stage.hash_join
        joined = method(builds[0], clause, lambda x, r: (x, r))
    else:
        method2 = stage.inner_hash_join2 if inner else stage.hash_join2
        joined = method2(builds[0], clause, builds[1], clause, lambda x, a, b: (x, a, b))
    client.get_list("out").clear()
    joined.write_to(Pipeline.to_list("out"))
    run_pipeline(client, p)
    return client.get_list("out").get_all()


pairs = st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 9)), max_size=8)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(primary=pairs, sides=st.lists(pairs, min_size=1, max_size=2), inner=st.booleans(),
       builder=st.booleans())
def test_batch_hash_joins_equal_the_oracle(store_url: str, primary: list[Any],
                                           sides: list[list[Any]], inner: bool,
                                           builder: bool) -> None:
    client = in_process_client(store_url)
    got = batch_join(client, primary, sides, inner, "builder" if builder else "method")
    assert got == oracle_join(primary, sides, inner)


@pytest.mark.parametrize("engine_kind", ["spark", "in-process"], indirect=True)
def test_batch_hash_join_on_each_engine(client: sparkjet.Client, engine_kind: str) -> None:
    primary = [(k, i) for i, k in enumerate(KEYS * 3)]
    sides = [[(1, "one"), (True, "true"), (None, "none"), ("a", "a"), ("zz", "never")],
             [((1, "b"), "tuple"), (0, "zero")]]
    for inner in (False, True):
        assert batch_join(client, primary, sides[:1], inner, "method") == \
            oracle_join(primary, sides[:1], inner)
        assert batch_join(client, primary, sides, inner, "method") == \
            oracle_join(primary, sides, inner)


def test_self_join_against_a_branch_and_map_entries(client: sparkjet.Client) -> None:
    client.get_map("names").put_all({1: "ada", 2: "bob"})
    p = Pipeline.create()
    numbers = p.read_from(Pipeline.from_list("n", [1, 2, 3, 2]))
    doubled = numbers.map(lambda x: (x * 2, x))
    names = p.read_from(Pipeline.from_map("names"))
    (numbers.hash_join(doubled, JoinClause.on_keys(lambda x: x, by_key).projecting(value),
                       lambda x, half: (x, half))
     .hash_join(names, JoinClause.join_map_entries(by_key), lambda pair, name: (*pair, name))
     .write_to(Pipeline.to_list("out")))
    run_pipeline(client, p)
    # 2 is 2 * 1 and 4 is never a number: every item once, 2 twice as the source has it.
    assert client.get_list("out").get_all() == [
        (1, None, "ada"), (2, 1, "bob"), (3, None, None), (2, 1, "bob")]


def test_none_outputs_are_dropped_and_items_by_tag_reads_by_tag(client: sparkjet.Client) -> None:
    p = Pipeline.create()
    orders = p.read_from(Pipeline.from_list("o", [(1, "x"), (2, "y")]))
    table = p.read_from(Pipeline.from_list("t", [(1, "one")]))
    builder = orders.hash_join_builder()
    tag = builder.add(table, JoinClause.on_keys(by_key, by_key).projecting(value))
    builder.build(lambda o, found: None if found.get(tag) is None else (o, found[tag])) \
        .write_to(Pipeline.to_list("out"))
    run_pipeline(client, p)
    assert client.get_list("out").get_all() == [((1, "x"), "one")]
    found = ItemsByTag(["a"])
    with pytest.raises(KeyError, match="not a side of this join"):
        found.get(type(tag)(3))


# --- streaming ---------------------------------------------------------------------------


def enrich_pipeline(fail: dict[str, bool] | None = None) -> Pipeline:
    p = Pipeline.create()
    customers = p.read_from(Pipeline.from_map("customers")).set_name("customers")
    orders = p.read_from(StreamSource("orders", partitions=2)).set_name("orders")

    def checked(pair: Any) -> Any:
        if fail is not None and fail["on"]:
            raise RuntimeError("the sink's host is down")
        return pair

    (orders.hash_join(customers, JoinClause.join_map_entries(lambda o: o["c"]),
                      lambda o, name: (o["id"], name)).set_name("enrich")
     .map(checked).set_name("check")
     .write_to(Pipeline.to_list("out")))
    return p


@pytest.mark.usefixtures("engine_kind")
def test_stream_hash_join_enriches_every_item_once(client: sparkjet.Client) -> None:
    client.get_map("customers").put_all({1: "ada", 2: "bob", 1.5: "half"})
    stream = client.get_stream("orders", partitions=2)
    job = client.get_jet().submit(enrich_pipeline(), JobConfig(
        name="enrich", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=100))
    try:
        events = [{"id": i, "c": [1, 2, True, None, 1.5][i % 5]} for i in range(200)]
        names = {1: "ada", 2: "bob", None: None, 1.5: "half"}  # True is the key 1
        for chunk in (events[:120], events[120:]):
            stream.publish_all(chunk)
            want = sorted((e["id"], names[e["c"]]) for e in events[:events.index(chunk[-1]) + 1])
            wait_until(lambda want=want: sorted(client.get_list("out").get_all()) == want,
                       what="every order enriched once")
        # The sink commits before the batch's commit record and metrics: await them.
        metrics = wait_until(
            lambda: (m := job.get_metrics()["stages"])["enrich"]["receivedCount"] == 200 and m,
            what="the join's counts")
        assert metrics["enrich"]["emittedCount"] == 200
    finally:
        job.cancel()


def test_replay_joins_against_the_table_of_its_first_try(client: sparkjet.Client) -> None:
    """A batch that failed before its commit replays against its plan's table, not the new one.

    The job suspends on the failure; the table changes; the resumed job
    replays the failed batch (its plan names the old table's digest), then
    joins new orders against the new table, read anew at the resume.
    """
    client.get_map("customers").put_all({1: "ada"})
    stream = client.get_stream("orders", partitions=2)
    fail = {"on": False}
    job = client.get_jet().submit(enrich_pipeline(fail), JobConfig(
        name="replay", processing_guarantee=EXACTLY_ONCE, suspend_on_failure=True))
    try:
        stream.publish_all([{"id": 0, "c": 1}])
        wait_until(lambda: client.get_list("out").get_all() == [(0, "ada")], what="order 0")
        fail["on"] = True
        stream.publish_all([{"id": 1, "c": 1}])
        wait_until(lambda: job.status is JobStatus.SUSPENDED, what="the failed batch to suspend")
        client.get_map("customers").put(1, "ada lovelace")
        fail["on"] = False
        job.resume()
        wait_until(lambda: len(client.get_list("out").get_all()) == 2, what="the replay")
        stream.publish_all([{"id": 2, "c": 1}])
        wait_until(lambda: len(client.get_list("out").get_all()) == 3, what="order 2")
        assert client.get_list("out").get_all() == [
            (0, "ada"), (1, "ada"), (2, "ada lovelace")]
    finally:
        job.cancel()


def test_window_after_a_stream_join_keeps_event_time(client: sparkjet.Client) -> None:
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import WindowDefinition

    client.get_map("customers").put_all({1: "ada", 2: "bob"})
    stream = client.get_stream("orders", partitions=1)
    p = Pipeline.create()
    customers = p.read_from(Pipeline.from_map("customers"))
    (p.read_from(StreamSource("orders")).with_timestamps(lambda o: o["t"], 0)
     .inner_hash_join(customers, JoinClause.join_map_entries(lambda o: o["c"]),
                      lambda o, name: name)
     .window(WindowDefinition.tumbling(10)).group_by(lambda name: name).aggregate(counting())
     .map(lambda r: (r.start, r.key, r.result)).write_to(Pipeline.to_list("out")))
    job = client.get_jet().submit(p, JobConfig(name="win", processing_guarantee=EXACTLY_ONCE))
    try:
        stream.publish_all([{"t": t, "c": c} for t, c in [(1, 1), (2, 2), (3, 1), (4, 9),
                                                           (12, 1), (25, 2)]])
        wait_until(lambda: len(client.get_list("out").get_all()) >= 3, what="two windows")
        assert sorted(client.get_list("out").get_all()) == [
            (0, "ada", 2), (0, "bob", 1), (10, "ada", 1)]
    finally:
        job.cancel()


# --- refused at submit, failing at run ------------------------------------------------------


def submit(client: sparkjet.Client, pipeline: Pipeline) -> Any:
    return client.get_jet().submit(pipeline, JobConfig(processing_guarantee=EXACTLY_ONCE))


def test_a_streaming_build_side_is_refused_naming_the_join(client: sparkjet.Client) -> None:
    p = Pipeline.create()
    orders = p.read_from(Pipeline.from_list("o", [1]))
    clicks = p.read_from(StreamSource("clicks"))
    orders.hash_join(clicks, JoinClause.on_keys(by_key, by_key), lambda a, b: a) \
        .set_name("join-clicks").write_to(Pipeline.to_list("out"))
    with pytest.raises(PipelineDefinitionError,
                       match=r"stage 'join-clicks'.*streaming source 'from-stream"):
        submit(client, p)


def test_a_bounded_source_outside_a_build_side_in_a_stream_is_refused(
        client: sparkjet.Client) -> None:
    p = Pipeline.create()
    stream = p.read_from(StreamSource("clicks"))
    stream.merge(p.read_from(Pipeline.from_list("l", [1])).set_name("table")) \
        .write_to(Pipeline.to_list("out"))
    with pytest.raises(PipelineDefinitionError, match="stage 'table' reads the bounded source"):
        submit(client, p)
    assert client.get_jet().get_jobs() == []


def test_a_build_side_feeding_a_sink_in_a_stream_is_refused(client: sparkjet.Client) -> None:
    p = Pipeline.create()
    table = p.read_from(Pipeline.from_list("l", [(1, 2)])).set_name("table")
    table.write_to(Pipeline.to_list("copy"))
    p.read_from(StreamSource("clicks")).hash_join(
        table, JoinClause.on_keys(by_key, by_key), lambda a, b: a).write_to(
        Pipeline.to_list("out"))
    with pytest.raises(PipelineDefinitionError, match="stage 'table' is part of a hash join's"):
        submit(client, p)


def test_a_keyed_stage_on_a_streaming_build_side_is_refused(client: sparkjet.Client) -> None:
    from sparkjet.aggregate import counting

    p = Pipeline.create()
    table = p.read_from(Pipeline.from_list("l", [1, 1])).group_by(lambda x: x) \
        .aggregate(counting()).set_name("counted")
    p.read_from(StreamSource("clicks")).hash_join(
        table, JoinClause.on_keys(by_key, by_key), lambda a, b: a).write_to(
        Pipeline.to_list("out"))
    with pytest.raises(PipelineDefinitionError, match=r"stage 'counted' .* build side"):
        submit(client, p)


def test_bad_join_arguments_are_refused_naming_the_stage() -> None:
    p = Pipeline.create()
    stage = p.read_from(Pipeline.from_list("a", [1])).set_name("orders")
    table = p.read_from(Pipeline.from_list("b", [1]))
    clause = JoinClause.on_keys(by_key, by_key)
    sink = table.write_to(Pipeline.to_list("x"))
    other = Pipeline.create().read_from(Pipeline.from_list("c", [1]))
    with pytest.raises(PipelineDefinitionError, match=r"'orders'.*sink stage"):
        stage.hash_join(sink, clause, lambda a, b: a)  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match=r"'orders'.*another pipeline"):
        stage.hash_join(other, clause, lambda a, b: a)
    with pytest.raises(PipelineDefinitionError, match=r"'orders'.*its own build side"):
        stage.hash_join(stage, clause, lambda a, b: a)
    with pytest.raises(PipelineDefinitionError, match="'orders' takes a JoinClause"):
        stage.hash_join(table, by_key, lambda a, b: a)  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="'orders' takes a function"):
        stage.hash_join(table, clause, "nope")  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="'orders' has no build side"):
        stage.hash_join_builder().build(lambda a, b: a)
    with pytest.raises(PipelineDefinitionError, match="left_key must be a function"):
        JoinClause.on_keys(1, by_key)  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="projecting"):
        clause.projecting(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("side", ["primary", "build"])
def test_a_key_function_that_raises_fails_the_job_naming_the_stage(
        client: sparkjet.Client, side: str) -> None:
    def broken(item: Any) -> Any:
        raise ValueError(f"no key in {item!r}")

    p = Pipeline.create()
    orders = p.read_from(Pipeline.from_list("o", [(1, 2)]))
    table = p.read_from(Pipeline.from_list("t", [(1, 3)]))
    clause = (JoinClause.on_keys(broken, by_key) if side == "primary"
              else JoinClause.on_keys(by_key, broken))
    orders.hash_join(table, clause, lambda a, b: a).set_name("joined") \
        .write_to(Pipeline.to_list("out"))
    with pytest.raises(JobFailedError, match=r"stage 'joined'.*ValueError: no key in") as caught:
        run_pipeline(client, p)
    cause = caught.value.__cause__
    assert isinstance(cause, ValueError)
    assert client.get_list("out").get_all() == []


def test_an_unhashable_key_fails_naming_the_stage(client: sparkjet.Client) -> None:
    p = Pipeline.create()
    orders = p.read_from(Pipeline.from_list("o", [[1, 2]]))
    table = p.read_from(Pipeline.from_list("t", [(1, 3)]))
    orders.hash_join(table, JoinClause.on_keys(lambda o: o, by_key), lambda a, b: a) \
        .set_name("joined").write_to(Pipeline.to_list("out"))
    with pytest.raises(JobFailedError, match=r"stage 'joined'.*unhashable"):
        run_pipeline(client, p)


def test_a_table_over_the_byte_budget_fails_at_start_naming_stage_and_size(
        store_url: str) -> None:
    client = sparkjet.connect(store={"url": store_url},
                              engine={"driver_only": True, "join_table_max_bytes": 1000})
    p = Pipeline.create()
    orders = p.read_from(Pipeline.from_list("o", [1]))
    table = p.read_from(Pipeline.from_list("t", [(i, "x" * 20) for i in range(100)])) \
        .set_name("big")
    orders.hash_join(table, JoinClause.on_keys(lambda o: o, by_key), lambda a, b: a) \
        .set_name("joined").write_to(Pipeline.to_list("out"))
    with pytest.raises(JobFailedError, match=r"stage 'joined': the table of its build side "
                                             r"'big' is [\d,]+ bytes.*over the 1,000 bytes"):
        run_pipeline(client, p)


def test_a_table_is_loaded_once_per_process(tmp_path: Any, monkeypatch: Any) -> None:
    from sparkjet.core.engine.tasks import tables
    from sparkjet.core.store.fs import Store

    files = Store(str(tmp_path))
    ref = tables.make_table([(1, "a")], JoinClause.on_keys(by_key, by_key), stage="j",
                            side="t", files=files, job_id="job", max_bytes=1 << 20)
    monkeypatch.setattr(tables, "_CACHE", type(tables._CACHE)())
    reads: list[str] = []
    real = Store.read_bytes

    def counted(self: Store, path: str) -> bytes:
        reads.append(path)
        return real(self, path)

    monkeypatch.setattr(Store, "read_bytes", counted)
    loaded = tables.load_tables(files, "job", [ref.digest])
    assert [dict(t) for t in loaded()] == [{1: [(1, "a")]}]
    assert [dict(t) for t in loaded()] == [{1: [(1, "a")]}]
    assert reads == [ref.path]
    # A damaged file is named, not unpickled.
    files.write_bytes(ref.path, b"garbage")
    monkeypatch.setattr(tables, "_CACHE", type(tables._CACHE)())
    with pytest.raises(JobFailedError, match="does not match its digest"):
        tables.load_tables(files, "job", [ref.digest])()


def test_check_upgrade_says_a_join_is_rebuilt_from_its_build_sides(
        client: sparkjet.Client) -> None:
    client.get_map("customers").put_all({1: "ada"})
    client.get_stream("orders", partitions=2)
    job = client.get_jet().submit(enrich_pipeline(), JobConfig(
        name="v1", processing_guarantee=EXACTLY_ONCE))
    wait_until(lambda: job.status is JobStatus.RUNNING, what="v1 to run")
    job.export_snapshot("v1", cancel_job=True)
    found = {(r.kind, r.stage): r for r in client.get_jet().check_upgrade(enrich_pipeline(), "v1")}
    row = found["join", "enrich"]
    assert row.status == "rebuilt" and not row.refusal and not row.carried
    assert "'customers' are read anew" in row.note
    # The table's source has no offsets to carry: it is no source row of the upgrade.
    assert ("source", "customers") not in found and found["source", "orders"].carried


def test_map_using_map_looks_items_up_in_a_map(client: sparkjet.Client) -> None:
    client.get_map("names").put_all({1: "ada", 2: "bob", None: "nobody"})
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("ids", [1, 2, 3, True, None, 1.0]))
     .map_using_map("names", lambda x: x, lambda x, name: None if name is None else (x, name))
     .set_name("named").write_to(Pipeline.to_list("out")))
    run_pipeline(client, p)
    assert client.get_list("out").get_all() == [
        (1, "ada"), (2, "bob"), (True, "ada"), (None, "nobody"), (1.0, "ada")]
    stage = Pipeline.create().read_from(Pipeline.from_list("x", [1])).set_name("x")
    with pytest.raises(PipelineDefinitionError, match=r"'x' takes a map's name"):
        stage.map_using_map("", by_key, lambda a, b: a)
    with pytest.raises(PipelineDefinitionError, match=r"'x' takes a key function"):
        stage.map_using_map("names", "k", lambda a, b: a)  # type: ignore[arg-type]


def test_map_using_map_in_a_stream_reads_the_map_anew_on_restart(
        client: sparkjet.Client) -> None:
    client.get_map("names").put_all({1: "ada"})
    stream = client.get_stream("ids", partitions=1)
    p = Pipeline.create()
    (p.read_from(StreamSource("ids")).map_using_map("names", lambda x: x, lambda x, n: (x, n))
     .write_to(Pipeline.to_list("out")))
    job = client.get_jet().submit(p, JobConfig(name="lookup", processing_guarantee=EXACTLY_ONCE,
                                               snapshot_interval_millis=50))
    try:
        stream.publish_all([1])
        wait_until(lambda: client.get_list("out").get_all() == [(1, "ada")], what="1 named")
        client.get_map("names").put(1, "ada lovelace")
        job.restart()
        wait_until(lambda: job.status is JobStatus.RUNNING, what="the restart")
        stream.publish_all([1])
        wait_until(lambda: len(client.get_list("out").get_all()) == 2, what="1 named again")
        assert client.get_list("out").get_all() == [(1, "ada"), (1, "ada lovelace")]
    finally:
        job.cancel()
