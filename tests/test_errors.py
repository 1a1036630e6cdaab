"""Bad pipelines are refused at submit; failures at run time name the stage."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sparkjet.errors import JobFailedError, PipelineDefinitionError
from sparkjet.job import JobStatus
from sparkjet.pipeline import Pipeline
from tests.conftest import run_pipeline

pytestmark = pytest.mark.usefixtures("reduce_path")


def source(items=(1, 2, 3)):  # type: ignore[no-untyped-def]
    return Pipeline.from_list("in", list(items))


def test_stage_without_a_sink_is_refused(jet) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline.create()
    p.read_from(source()).map(lambda x: x).set_name("dangling")
    with pytest.raises(PipelineDefinitionError, match="stage 'dangling' has no sink") as info:
        jet.submit(p)
    assert info.value.stage == "dangling"


def test_sink_must_be_last(jet) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline.create()
    sink_stage = p.read_from(source()).write_to(Pipeline.to_list("x"))
    with pytest.raises(PipelineDefinitionError, match=r"'to-list\(x\)' is a sink"):
        sink_stage.map(lambda x: x)  # type: ignore[attr-defined]
    other = p.read_from(source())
    with pytest.raises(PipelineDefinitionError, match="cannot merge sink stage"):
        other.merge(sink_stage)  # type: ignore[arg-type]


def test_duplicate_stage_names_are_refused(jet) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline.create()
    s = p.read_from(source()).map(lambda x: x).set_name("twice")
    s.map(lambda x: x).set_name("twice").write_to(Pipeline.to_list("x"))
    with pytest.raises(PipelineDefinitionError, match="stage name 'twice' is used by two stages"):
        jet.submit(p)


def test_invalid_stage_names_are_refused() -> None:
    p = Pipeline.create()
    stage = p.read_from(source())
    for bad in ("", "  ", " lead", "a\nb", 42):
        with pytest.raises(PipelineDefinitionError):
            stage.set_name(bad)  # type: ignore[arg-type]


def test_generated_names_are_stable_and_unique() -> None:
    def build() -> Pipeline:
        p = Pipeline.create()
        s = p.read_from(source()).map(str).map(str).filter(bool)
        s.group_by(len).aggregate(accumulator=lambda a, x: a, initial=0).write_to(
            Pipeline.to_list("r")
        )
        return p

    names = [[t.name for t in build().transforms] for _ in range(2)]
    assert names[0] == names[1] == [
        "from-list(in)", "map", "map-2", "filter", "group-aggregate", "to-list(r)",
    ]


def test_unpicklable_function_is_refused_naming_the_stage(jet) -> None:  # type: ignore[no-untyped-def]
    lock = threading.Lock()
    p = Pipeline.create()
    (p.read_from(source()).map(lambda x: (lock, x)).set_name("holds-a-lock")
     .write_to(Pipeline.to_list("x")))
    with pytest.raises(PipelineDefinitionError, match=r"stage 'holds-a-lock'.*cannot be pickled"):
        jet.submit(p)


def test_non_callable_and_wrong_types_are_refused() -> None:
    p = Pipeline.create()
    stage = p.read_from(source())
    with pytest.raises(PipelineDefinitionError, match=r"map.*takes a function"):
        stage.map(42)  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="takes a sink"):
        stage.write_to("results")  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="takes a source"):
        p.read_from([1, 2])  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="accumulator"):
        stage.aggregate()


def test_empty_pipeline_is_refused(jet) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PipelineDefinitionError, match="empty"):
        jet.submit(Pipeline.create())


def test_user_function_error_names_stage_and_chains_cause(client) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline.create()
    (p.read_from(source(range(100))).map(lambda x: x + 1)
     .map(lambda x: 1 // (x - 50)).set_name("divide")
     .write_to(Pipeline.to_list("x")))
    with pytest.raises(JobFailedError, match="stage 'divide' failed: ZeroDivisionError") as info:
        run_pipeline(client, p)
    assert info.value.stage == "divide"
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert "Py4J" not in str(info.value)
    job = client.get_jet().get_jobs()[0]
    assert job.status is JobStatus.FAILED
    assert "divide" in (job.get_failure() or "")


def test_stop_iteration_in_user_function_fails_instead_of_truncating(client) -> None:  # type: ignore[no-untyped-def]
    def stop_at_5(x: int) -> int:
        if x == 5:
            raise StopIteration
        return x

    p = Pipeline.create()
    p.read_from(source(range(10))).map(stop_at_5).write_to(Pipeline.to_list("x"))
    with pytest.raises(JobFailedError, match="stage 'map'"):
        run_pipeline(client, p)
    assert client.get_list("x").get_all() == []


def test_unhashable_group_key_names_the_stage(client) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline.create()
    (p.read_from(source([1, 2])).group_by(lambda x: [x]).aggregate(accumulator=lambda a, x: a,
                                                                   initial=0)
     .set_name("by-list").write_to(Pipeline.to_list("x")))
    with pytest.raises(JobFailedError, match=r"stage 'by-list'.*unhashable") as info:
        run_pipeline(client, p)
    assert isinstance(info.value.__cause__, TypeError)


def test_unorderable_items_name_the_sort_stage(client) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline.create()
    p.read_from(source([3, "a", 1, None] * 20)).sort().write_to(Pipeline.to_list("x"))
    with pytest.raises(JobFailedError, match="stage 'sort' failed: TypeError"):
        run_pipeline(client, p)


def test_map_sink_refuses_non_pairs_naming_sink(client) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline.create()
    p.read_from(source([1, 2])).write_to(Pipeline.to_map("m"))
    with pytest.raises(JobFailedError, match=r"stage 'to-map\(m\)'.*\(key, value\) pairs"):
        run_pipeline(client, p)
    assert client.get_map("m").size() == 0


def test_failed_job_leaves_sinks_as_they_were(client, store_url) -> None:  # type: ignore[no-untyped-def]
    target = client.get_list("kept")
    target.add_all(["before"])
    n = 40_000  # large enough that partitions are staged as segment files

    def fail_last(x: int) -> int:
        if x == n - 1:
            raise ValueError("the last item is bad")
        return x

    p = Pipeline.create()
    stage = p.read_from(source(range(n)))
    stage.write_to(Pipeline.to_list("kept"))  # would succeed on its own
    stage.map(fail_last).write_to(Pipeline.to_list("kept"))
    with pytest.raises(JobFailedError, match="the last item is bad"):
        run_pipeline(client, p)
    assert target.get_all() == ["before"]
    data = Path(store_url) / "lists" / "kept" / "data"

    def segments() -> list[Path]:
        return sorted(data.glob("*.pkl")) if data.exists() else []

    # A task of the failed job may still be finishing its write; it must then
    # delete its own segment, so wait (bounded) for the folder to settle.
    deadline = time.monotonic() + 20
    while segments() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert segments() == [], "aborted sinks must delete their staged segments"


def test_naming_a_grouped_stage_names_its_aggregate(client) -> None:  # type: ignore[no-untyped-def]
    from sparkjet.aggregate import counting

    p = Pipeline.create()
    grouped = p.read_from(source(["a", "bb", "cc"])).group_by(len).set_name("by-length")
    assert grouped.name == "by-length"
    grouped.aggregate(counting()).write_to(Pipeline.to_list("x"))
    job = run_pipeline(client, p)
    assert client.get_list("x").get_all() == [(1, 1), (2, 2)]
    assert "by-length" in job.get_metrics()["stages"]


def test_settings_this_version_cannot_honour_are_refused(jet) -> None:  # type: ignore[no-untyped-def]
    from sparkjet.job import JobConfig

    p = Pipeline.create()
    p.read_from(source()).write_to(Pipeline.to_list("x"))
    # A batch pipeline keeps no state to start from (streams: tests/test_snapshots.py).
    with pytest.raises(PipelineDefinitionError, match="initial_snapshot_name='snap': only a str"):
        jet.submit(p, JobConfig(initial_snapshot_name="snap"))
    with pytest.raises(PipelineDefinitionError, match="suspend_on_failure"):
        jet.submit(p, JobConfig(suspend_on_failure=True))
    assert jet.get_jobs() == []


def test_worker_import_failure_is_summarised(client, tmp_path, monkeypatch, reduce_path) -> None:  # type: ignore[no-untyped-def]
    """A module only the driver can import fails on Spark's workers, named.

    In process the driver imports it and the job runs: the one difference
    between the engines that pickling the tasks cannot show (docs/streaming.md).
    """
    import sys

    (tmp_path / "only_on_driver.py").write_text("def double(x):\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_on_driver  # type: ignore[import-not-found]

    p = Pipeline.create()
    p.read_from(source()).map(only_on_driver.double).write_to(Pipeline.to_list("x"))
    try:
        if reduce_path == "in-process":
            run_pipeline(client, p)
            assert list(client.get_list("x")) == [2, 4, 6]
            return
        with pytest.raises(JobFailedError, match=r"ModuleNotFoundError: No module named "
                           r"'only_on_driver'.*cannot import it"):
            run_pipeline(client, p)
    finally:
        sys.modules.pop("only_on_driver", None)
