"""The plugin API as a third party sees it.

- A source declares that ``latest_offsets`` takes ``start`` (``accepts_start``),
  instead of sparkjet reading the method's signature; old sources keep working.
- ``sparkjet.pipeline`` reaches the file plugin through the plugin registry, never
  by importing ``sparkjet.contrib``; a plugin whose extra is missing is listed as
  unavailable and breaks nothing else.
- One file-I/O protocol, ``FileStore``; the old names warn for one release.
- What the test kit needs of the core, exposed on purpose: the store opened
  on a URL, a listing's sizes and times and the storage's clock, a log's
  fold, the loop's call of ``latest_offsets`` and its lag, the built-in
  snapshot backends, a job's planned batches.
"""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

import sparkjet
from sparkjet.errors import ConfigError, JobFailedError, PipelineDefinitionError, PluginError
from sparkjet.job import JobConfig, JobStatus
from sparkjet.pipeline import Pipeline
from sparkjet.plugin import (
    ALL_GUARANTEES,
    JobContext,
    Source,
    TaskContext,
    hookimpl,
    latest_offsets,
)
from tests.conftest import TEST_SPARK, cancel_job, wait_until

ROOT = Path(__file__).resolve().parent.parent


def capped_source() -> type[Source]:
    """A fresh source class, defined in a function so cloudpickle ships it to Spark's workers
    by value (a class of this module would be imported there, and ``tests`` is not on their path).
    """

    class CappedSource(Source):
        """The ints ``0 .. total-1``, at most ``cap`` of them per micro-batch."""

        kind = "capped"
        streaming = True
        accepts_start = True
        guarantees = ALL_GUARANTEES
        #: Every ``start`` the micro-batch loop passed, in order (driver side: this process).
        starts: ClassVar[list[Any]] = []

        def __init__(self, name: str, total: int, cap: int) -> None:
            super().__init__(name)
            self.total, self.cap = total, cap

        def partitions(self, context: JobContext) -> Sequence[Any]:
            raise NotImplementedError("streaming only")

        def initial_offsets(self, context: JobContext) -> Any:
            return 0

        def latest_offsets(self, context: JobContext, start: Any = None) -> Any:
            type(self).starts.append(start)
            return min((start or 0) + self.cap, self.total)

        def plan_range(self, start: Any, end: Any, context: JobContext) -> Sequence[Any]:
            return [(start, end)]

        def read(self, partition: Any, context: TaskContext) -> list[Any]:
            start, end = partition
            return list(range(start, end))

    return CappedSource


class OldSource(Source):
    """A source written before ``accepts_start``: ``latest_offsets(self, context)``."""

    kind = "old-style"
    streaming = True
    guarantees = ALL_GUARANTEES

    def partitions(self, context: JobContext) -> Sequence[Any]:
        raise NotImplementedError("streaming only")

    def initial_offsets(self, context: JobContext) -> Any:
        return 0

    def latest_offsets(self, context: JobContext) -> Any:
        return 5

    def plan_range(self, start: Any, end: Any, context: JobContext) -> Sequence[Any]:
        return [(start, end)]

    def read(self, partition: Any, context: TaskContext) -> list[Any]:
        return list(range(*partition))


class Registers:
    """A runtime plugin registering the given source classes."""

    def __init__(self, *classes: type[Source], **attributes: Any) -> None:
        self.classes = classes
        self.__dict__.update(attributes)

    @hookimpl
    def register_sources(self, register: Any) -> None:
        for cls in self.classes:
            register(cls)


# --- 1. accepts_start: a declared capability ---------------------------------------------


def test_a_declared_source_is_given_start_and_an_old_one_is_not() -> None:
    CappedSource: Any = capped_source()
    capped = CappedSource("n", total=10, cap=3)
    assert latest_offsets(capped, None, start=4) == 7
    assert CappedSource.starts == [4]
    assert latest_offsets(OldSource("n"), None, start=4) == 5  # called as latest_offsets(ctx)
    assert Source.accepts_start is False


def test_a_streaming_job_caps_each_micro_batch_from_start(client: sparkjet.Client) -> None:
    CappedSource: Any = capped_source()
    client.register_plugin(Registers(CappedSource), "capped")
    p = Pipeline.create()
    p.read_from(CappedSource("n", total=7, cap=3)).write_to(Pipeline.to_list("out"))
    job = client.get_jet().submit(p, JobConfig(name="capped"))

    def all_seven() -> bool:
        if job.status is JobStatus.FAILED:
            job.join()  # raises, with the cause
        return len(client.get_list("out").get_all()) == 7

    try:
        wait_until(all_seven, timeout=300, what="seven items")
    finally:
        if job.status is not JobStatus.FAILED:
            job.cancel()
    assert sorted(client.get_list("out").get_all()) == list(range(7))
    # each batch started where the last ended, and read at most 3 items
    assert [s for s in dict.fromkeys(CappedSource.starts)][:3] == [0, 3, 6]


def test_old_style_source_registers_and_runs_unchanged(client: sparkjet.Client) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation for a source that never took start
        client.register_plugin(Registers(OldSource), "old")
    assert OldSource.accepts_start is False


def test_start_parameter_without_declaration_warns_naming_the_plugin(
    client: sparkjet.Client,
) -> None:
    class Sniffed(OldSource):  # the pre-0.2 convention: a `start` parameter, nothing declared
        kind = "sniffed"

        def latest_offsets(self, context: JobContext, start: Any = None) -> Any:
            return ("given", start)

    with pytest.warns(DeprecationWarning, match=r'plugin "legacy": source .*Sniffed\.'
                      r"latest_offsets takes 'start'.*add 'accepts_start = True'"):
        client.register_plugin(Registers(Sniffed), "legacy")
    assert latest_offsets(Sniffed("n"), None, start=3) == ("given", 3)  # still given start


def test_declaration_the_method_cannot_honour_is_refused(client: sparkjet.Client) -> None:
    class Liar(OldSource):
        kind = "liar"
        accepts_start = True

    with pytest.raises(PluginError, match=r'plugin "liar": source .*Liar declares accepts_start = '
                       r"True, but its latest_offsets\(self, context.*\) has no 'start' parameter"):
        client.register_plugin(Registers(Liar), "liar")
    assert "liar" not in {i.name for i in client.list_plugins()}


def test_a_declaration_that_is_not_a_bool_is_refused(client: sparkjet.Client) -> None:
    class Vague(OldSource):
        kind = "vague"
        accepts_start = "yes"  # type: ignore[assignment]

    with pytest.raises(PluginError, match=r'plugin "vague": source .*Vague declares '
                       r"accepts_start = 'yes'; it must be True or False"):
        client.register_plugin(Registers(Vague), "vague")


def closing_source() -> type[Source]:
    """A fresh streaming source class that notes each ``close`` (see :func:`capped_source`)."""

    class ClosingSource(Source):
        """The ints ``0 .. total-1`` in one micro-batch; ``read`` fails once ``fail`` is set."""

        kind = "closing"
        streaming = True
        guarantees = ALL_GUARANTEES
        #: The job id of every ``close`` call, in order (driver side: this process).
        closed: ClassVar[list[str]] = []
        #: Whether ``close`` raises (after noting the call).
        close_fails: ClassVar[bool] = False

        def __init__(self, name: str, total: int, fail: bool = False) -> None:
            super().__init__(name)
            self.total, self.fail = total, fail

        def partitions(self, context: JobContext) -> Sequence[Any]:
            return [(0, self.total)]

        def initial_offsets(self, context: JobContext) -> Any:
            return 0

        def latest_offsets(self, context: JobContext) -> Any:
            return self.total

        def plan_range(self, start: Any, end: Any, context: JobContext) -> Sequence[Any]:
            return [(start, end)]

        def read(self, partition: Any, context: TaskContext) -> list[Any]:
            if self.fail:
                raise ValueError("this source cannot read")
            return list(range(*partition))

        def close(self, context: JobContext) -> None:
            type(self).closed.append(context.job_id)
            if type(self).close_fails:
                raise OSError("the connection would not close")

    return ClosingSource


def test_a_source_is_closed_on_the_driver_each_time_its_job_stops_running(
    client: sparkjet.Client,
) -> None:
    """Suspended, resumed and cancelled: closed at each stop, before the status says so."""
    ClosingSource: Any = closing_source()
    client.register_plugin(Registers(ClosingSource), "closing")
    p = Pipeline.create()
    p.read_from(ClosingSource("n", total=3)).write_to(Pipeline.to_list("closed-out"))
    job = client.get_jet().submit(p, JobConfig(name="closing"))
    try:
        wait_until(lambda: client.get_list("closed-out").size() == 3, what="three items")
        assert ClosingSource.closed == []  # running: nothing closed yet
        job.suspend()
        wait_until(lambda: job.status is JobStatus.SUSPENDED, what="SUSPENDED")
        assert ClosingSource.closed == [job.id]
        job.resume()
        wait_until(lambda: job.status is JobStatus.RUNNING, what="RUNNING again")
        assert ClosingSource.closed == [job.id]
    finally:
        cancel_job(job)
    assert ClosingSource.closed == [job.id, job.id]
    assert sorted(client.get_list("closed-out").get_all()) == [0, 1, 2]


def test_a_failed_job_and_a_batch_job_close_their_sources(client: sparkjet.Client) -> None:
    ClosingSource: Any = closing_source()
    client.register_plugin(Registers(ClosingSource), "closing")
    failing = Pipeline.create()
    failing.read_from(ClosingSource("n", total=3, fail=True)).write_to(Pipeline.to_list("x"))
    job = client.get_jet().submit(failing, JobConfig(name="closing-fails"))
    with pytest.raises(JobFailedError, match="this source cannot read"):
        job.join(timeout=120)
    assert ClosingSource.closed == [job.id]
    ClosingSource.streaming = False  # the same source read by a batch job
    batch = Pipeline.create()
    batch.read_from(ClosingSource("n", total=3)).write_to(Pipeline.to_list("closed-batch"))
    done = client.get_jet().submit(batch, JobConfig(name="closing-batch"))
    done.join(timeout=120)
    assert ClosingSource.closed == [job.id, done.id]
    assert sorted(client.get_list("closed-batch").get_all()) == [0, 1, 2]


def test_a_close_that_fails_is_logged_naming_the_stage_and_changes_no_outcome(
    client: sparkjet.Client, caplog: pytest.LogCaptureFixture,
) -> None:
    ClosingSource: Any = closing_source()
    ClosingSource.close_fails = True
    client.register_plugin(Registers(ClosingSource), "closing")
    p = Pipeline.create()
    p.read_from(ClosingSource("n", total=2)).write_to(Pipeline.to_list("close-fails"))
    job = client.get_jet().submit(p, JobConfig(name="close-fails"))
    wait_until(lambda: client.get_list("close-fails").size() == 2, what="two items")
    with caplog.at_level("WARNING", logger="sparkjet"):
        cancel_job(job)  # still CANCELLED (join raises JobCancelledError), not FAILED
    assert ClosingSource.closed == [job.id]
    assert any("closing:n" in r.getMessage() and "the connection would not close"
               in r.getMessage() for r in caplog.records), caplog.text


# --- 2. the facade and contrib --------------------------------------------------------------


def test_pipeline_facade_does_not_import_contrib() -> None:
    code = (
        "import sys, sparkjet.pipeline, sparkjet.job, sparkjet.aggregate\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('sparkjet.contrib'))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_from_files_and_to_files_resolve_through_the_registry(tmp_path: Path) -> None:
    from sparkjet.contrib.files import FileSink, FileSource

    source = Pipeline.from_files(str(tmp_path), format="csv", streaming=False)
    assert type(source) is FileSource and source.format == "csv"  # type: ignore[attr-defined]
    assert type(Pipeline.to_files(str(tmp_path), "parquet")) is FileSink


def test_blocked_file_plugin_is_named_by_from_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPARKJET_BLOCK_PLUGINS", "files")
    with pytest.raises(PluginError, match=r'no source of kind "files" is registered.*blocked'):
        Pipeline.from_files(str(tmp_path))


def test_old_import_of_file_source_warns_with_the_new_one() -> None:
    from sparkjet.contrib.files import FileSink, FileSource

    with pytest.warns(DeprecationWarning, match=r"use 'from sparkjet\.contrib\.files import "
                      r"FileSource'"):
        from sparkjet.pipeline import FileSource as old_source
    with pytest.warns(DeprecationWarning, match="import FileSink"):
        from sparkjet.pipeline import FileSink as old_sink
    assert old_source is FileSource and old_sink is FileSink
    with pytest.raises(ImportError, match="NoSuchThing"):
        from sparkjet.pipeline import NoSuchThing  # type: ignore[attr-defined]  # noqa: F401


def test_plugin_whose_dependency_is_missing_is_listed_unavailable(
    client: sparkjet.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    class NeedsMissing(OldSource):
        kind = "needs-missing"

    plugin = Registers(
        NeedsMissing, sparkjet_requires={"sparkjet_no_such_module": "pip install no-such-extra"}
    )
    client.register_plugin(plugin, "needy")
    info = {i.name: i for i in client.list_plugins()}["needy"]
    assert info.unavailable == (
        "needs sparkjet_no_such_module (pip install no-such-extra), which is not installed"
    )
    assert info.registered == []
    assert client.plugins.lookup_class(NeedsMissing) is None  # nothing of it is in use
    assert all(i.unavailable is None for n, i in {i.name: i for i in client.list_plugins()}.items()
               if n != "needy")

    p = Pipeline.create()
    p.read_from(NeedsMissing("n")).write_to(Pipeline.to_list("out"))
    with pytest.raises(PipelineDefinitionError, match=r'whose plugin "needy" \(registered at '
                       r"runtime\) is unavailable: needs sparkjet_no_such_module"):
        client.get_jet().submit(p)


def test_a_malformed_requirement_declaration_is_refused(client: sparkjet.Client) -> None:
    with pytest.raises(PluginError, match=r'plugin "odd".*sparkjet_requires must map module '
                       r"names to install hints"):
        client.register_plugin(Registers(sparkjet_requires=["confluent_kafka"]), "odd")


@pytest.mark.slow
def test_kafka_without_confluent_kafka_breaks_nothing_else(tmp_path: Path) -> None:
    """A fresh process where confluent-kafka cannot be imported, as without the extra."""
    script = tmp_path / "no_kafka.py"
    script.write_text(textwrap.dedent(f"""
        import importlib.abc, sys

        class NoKafka(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "confluent_kafka" or name.startswith("confluent_kafka."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, NoKafka())
        import sparkjet
        from sparkjet.cli.app import main
        from sparkjet.pipeline import Pipeline

        assert main(["plugins"]) == 0  # the default store, in the working directory
        client = sparkjet.connect(store={{"url": {str(tmp_path / 'store')!r}}},
                                  spark={TEST_SPARK!r})
        p = Pipeline.create()
        p.read_from(Pipeline.from_list("in", [1, 2, 3])).map(lambda x: x * 2) \\
            .write_to(Pipeline.to_list("out"))
        client.get_jet().submit(p).join(timeout=480)
        print("OUT", sorted(client.get_list("out").get_all()))
    """), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=720)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("kafka (")))
    assert lines[at + 1] == (
        "  unavailable: needs confluent_kafka (pip install 'sparkjet[kafka]'), "
        "which is not installed"
    )
    assert any(line.startswith("files (") for line in lines)
    assert "OUT [2, 4, 6]" in lines


# --- 3. one file-I/O protocol ----------------------------------------------------------------


def test_the_job_store_reaches_files_through_the_one_file_protocol(store_url: str) -> None:
    from sparkjet.plugin import open_file_store
    from sparkjet.testing import StoreLocation

    job = JobContext("job-1", None, StoreLocation(store_url).store(), parallelism=2)
    task = TaskContext("job-1", 0, job.store)
    assert task.store is job.store  # wrapped once, shared
    files = job.store.files
    target = files.path("plugin-own", "a.bin")
    files.write_bytes(target, b"one")
    assert files.create_exclusive(files.path("plugin-own", "b.bin"), b"two") is True
    assert files.create_exclusive(files.path("plugin-own", "b.bin"), b"other") is False
    assert sorted(files.listdir(files.path("plugin-own"))) == ["a.bin", "b.bin"]
    # the same protocol, opened on the same URL by a plugin on its own
    elsewhere = open_file_store(store_url)
    assert elsewhere.read_bytes(elsewhere.path("plugin-own", "a.bin")) == b"one"
    # and the store's logs, a different concern, beside the files
    assert job.store.list_log("nothing").live_records() == []
    assert job.store.shown_url == files.shown_url


def test_file_calls_on_the_store_itself_warn_and_still_work(store_url: str) -> None:
    from sparkjet.testing import StoreLocation

    job = JobContext("job-1", None, StoreLocation(store_url).store(), parallelism=2)
    path = job.store.files.path("x.bin")
    job.store.files.write_bytes(path, b"x")
    with pytest.warns(DeprecationWarning, match=r"context\.store\.read_bytes is deprecated.*use "
                      r"context\.store\.files\.read_bytes"):
        assert job.store.read_bytes(path) == b"x"  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="list_names"):  # internals are not reachable
        job.store.list_names  # type: ignore[attr-defined]  # noqa: B018


def test_an_executor_writes_its_own_files_through_context_store_files(
    client: sparkjet.Client,
) -> None:
    def make_sink() -> type[Any]:
        from sparkjet.plugin import Sink

        class OwnFilesSink(Sink):
            """Each partition's items as a file in the store; commit joins them (by value)."""

            kind = "own-files"
            guarantees = ALL_GUARANTEES

            def write(self, state: Any, items: Any, context: TaskContext) -> Any:
                files = context.store.files
                path = files.path("own", f"part-{context.partition}")
                files.write_bytes(path, repr(sorted(items)).encode())
                return path

            def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
                files = context.store.files
                joined = b"|".join(files.read_bytes(m) for m in messages)
                files.write_bytes(files.path("own", "joined"), joined)

        return OwnFilesSink

    sink_class = make_sink()

    class Plugin:
        @hookimpl
        def register_sinks(self, register: Any) -> None:
            register(sink_class)

    client.register_plugin(Plugin(), "own-files")
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("in", [1, 2, 3, 4])).write_to(sink_class("out"))
    client.get_jet().submit(p).join(timeout=300)
    from sparkjet.plugin import open_file_store

    store = open_file_store(client.store.shown_url)
    joined = store.read_bytes(store.path("own", "joined")).split(b"|")
    assert sorted(x for part in joined for x in ast.literal_eval(part.decode())) == [1, 2, 3, 4]


# --- 4. what the test kit needs, exposed on purpose ---------------------------------------


def test_open_store_is_the_store_a_job_context_holds(store_url: str) -> None:
    from sparkjet.plugin import StoreAccess, open_store

    store: StoreAccess = open_store(store_url)
    context = JobContext("job-1", None, store, parallelism=2)
    files = context.store.files
    files.write_bytes(files.path("listed", "a"), b"abc")
    listed = files.entries(files.path("listed"))
    assert list(listed) == ["a"]
    assert listed["a"].size == 3 == files.size(files.path("listed", "a"))
    modified, now = files.modified(files.path("listed", "a")), files.now()
    assert modified is not None and now is not None
    assert -2.0 <= now - modified <= 5.0
    assert files.entries(files.path("absent")) == {}
    # a list written through one opening is read through another
    store.list_log("seen").commit("append", [("items", [1, 2])], writer="w")
    assert [r.parts for r in open_store(store_url).list_log("seen").live_records()] == [
        [("items", [1, 2])]]


def test_a_log_folds_on_demand_and_skips_a_batch_committed_twice(store_url: str) -> None:
    from sparkjet.plugin import open_store

    log = open_store(store_url).list_log("folded")
    for batch in range(3):
        for _ in range(2):  # the second: a fenced driver, not yet aware, committing again
            log.commit("append", [("items", [batch])], writer=f"b{batch}", producer="p",
                       batch=batch)
    assert [i for r in log.live_records() for _, items in r.parts for i in items] == [0, 1, 2]
    assert log.fold() == 6
    assert log.fold() is None  # nothing new
    log.commit("append", [("items", [2])], writer="late", producer="p", batch=2)
    log.commit("append", [("items", [3])], writer="b3", producer="p", batch=3)
    assert [i for r in log.live_records() for _, items in r.parts for i in items] == [0, 1, 2, 3]


def test_source_lag_counts_numeric_offsets_only() -> None:
    from sparkjet.plugin import source_lag

    assert source_lag(3, 10) == 7
    assert source_lag([1, 2], [4, 2, 5]) == 8  # a partition missing counts from 0
    assert source_lag({"a": 1}, {"a": 3, "b": 1}) == 3
    assert source_lag("file-3", "file-9") is None


def test_builtin_snapshot_backend_by_scheme_or_kind(tmp_path: Path) -> None:
    from sparkjet.plugin import SnapshotBackend, builtin_snapshot_backend

    local = builtin_snapshot_backend(str(tmp_path / "snaps"))
    memory = builtin_snapshot_backend("memory://kit-snaps", {})
    named = builtin_snapshot_backend(f"file://{tmp_path}/named", kind="local")
    assert (local.kind, memory.kind, named.kind) == ("local", "memory", "local")
    for backend in (local, memory, named):
        assert isinstance(backend, SnapshotBackend)
        backend.write_bytes("a/b", b"1")
        assert backend.list("a") == ["a/b"]
    with pytest.raises(ConfigError, match="no built-in snapshot backend for 'ftp://x/y'"):
        builtin_snapshot_backend("ftp://x/y")
    with pytest.raises(PluginError, match='no snapshot backend of kind "nowhere"'):
        builtin_snapshot_backend("memory://x", kind="nowhere")


def test_a_streaming_job_shows_its_planned_batches(client: sparkjet.Client) -> None:
    from sparkjet.job import PlannedBatch
    from sparkjet.pipeline import StreamSource

    p = Pipeline.create()
    p.read_from(StreamSource("in")).set_name("in").write_to(Pipeline.to_list("out"))
    stream = client.get_stream("in", partitions=1)
    job = client.get_jet().submit(p, JobConfig(snapshot_interval_millis=50))
    try:
        for n in range(3):
            stream.publish_all([n, n])
            wait_until(lambda n=n: len(client.get_list("out").get_all()) == 2 * (n + 1),  # type: ignore[misc]
                       timeout=120, what=f"batch {n}'s items")
        planned = job.get_planned_batches()
    finally:
        cancel_job(job)
    assert planned and all(isinstance(b, PlannedBatch) for b in planned)
    assert [b.batch for b in planned] == list(range(len(planned)))
    assert planned[0].starts == {"in": [0]}
    assert planned[-1].ends == {"in": [6]}
    for before, after in itertools.pairwise(planned):
        assert after.starts == before.ends  # each starts where the last ended
        assert after.time_ms >= before.time_ms
    batch = client.get_jet().submit(_list_pipeline())
    batch.join(timeout=120)
    assert batch.get_planned_batches() == []


def _list_pipeline() -> Pipeline:
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("nums", [1, 2])).write_to(Pipeline.to_list("copy"))
    return p
