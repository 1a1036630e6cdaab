"""The plugin system: discovery, registration errors, blocking, guarantees and hooks.

Third-party plugins are exercised through ``tests/plugin_dist/sparkjet-example-plugin``,
a real distribution. The slow test pip-installs it and runs a job in a fresh
process; the other tests import it from its source folder and either register
it at runtime or expose it through a ``*.dist-info`` folder on ``sys.path``,
which is exactly what an installed distribution looks like to
``importlib.metadata`` (so those are real entry points).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import sparkjet
from sparkjet.aggregate import counting
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.pipeline.planner import plan
from sparkjet.errors import (
    JobCancelledError,
    JobFailedError,
    PipelineDefinitionError,
    PluginError,
    ProcessingGuaranteeError,
    SnapshotBackendError,
)
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.plugin import (
    ALL_GUARANTEES,
    AT_LEAST_ONCE_AT_MOST,
    JobContext,
    Sink,
    Source,
    TaskContext,
    hookimpl,
)
from sparkjet.plugins.snapshots import LocalSnapshotBackend
from sparkjet.testing import StoreLocation
from tests.conftest import TEST_SPARK, run_pipeline, wait_until

DIST = Path(__file__).parent / "plugin_dist" / "sparkjet-example-plugin"
DIST_NAME = "sparkjet-example-plugin"
# pyproject's own entry points, as installed: "files" (sparkjet.contrib.files) is one
# once the distribution is (re)installed from a pyproject that declares it.
BUILTINS = {
    ep.name for ep in importlib.metadata.distribution("sparkjet").entry_points
    if ep.group == "sparkjet"
}
assert {"list", "map", "logger", "stream", "snapshots"} <= BUILTINS

NONE = ProcessingGuarantee.NONE
AT_LEAST_ONCE = ProcessingGuarantee.AT_LEAST_ONCE
EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE


# --- helpers and fixtures ----------------------------------------------------------------


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example plugin module, imported from its source folder."""
    monkeypatch.syspath_prepend(str(DIST / "src"))
    sys.modules.pop("sparkjet_example", None)
    yield importlib.import_module("sparkjet_example")
    sys.modules.pop("sparkjet_example", None)


def connect(store_url: str, **overrides: Any) -> sparkjet.Client:
    """A client made after a test set its environment (the ``client`` fixture is made before)."""
    return sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK, **overrides)


class ListLikeSource(Source):
    """A driver-only source for registration tests (never run)."""

    kind = "dup-kind"
    guarantees = ALL_GUARANTEES

    def partitions(self, context: JobContext) -> list[Any]:
        return []

    def read(self, partition: Any, context: TaskContext) -> list[Any]:
        return []


class OtherListLikeSource(ListLikeSource):
    kind = "dup-kind"


class Registers:
    """A plugin registering the given classes as sources and sinks."""

    def __init__(self, sources: tuple[Any, ...] = (), sinks: tuple[Any, ...] = ()) -> None:
        self.sources, self.sinks = sources, sinks

    @hookimpl
    def register_sources(self, register: Callable[[Any], None]) -> None:
        for cls in self.sources:
            register(cls)

    @hookimpl
    def register_sinks(self, register: Callable[[Any], None]) -> None:
        for cls in self.sinks:
            register(cls)


class FakeJob:
    """Stands in for a job where a test calls a lifecycle hook without one (a JobView)."""

    id = "fake-job"
    name = None


class StatusRecorder:
    """Records lifecycle hook calls into a shared list."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    @hookimpl
    def on_job_status_changed(self, job: Any, old_status: JobStatus, new_status: JobStatus) -> None:
        self.events.append(("status", job.id, old_status, new_status))

    @hookimpl
    def on_job_error(self, job: Any, error: BaseException) -> None:
        self.events.append(("error", job.id, error))

    @hookimpl
    def before_spark_session_created(self, builder: Any, spark_conf: dict[str, str]) -> None:
        self.events.append(("session", spark_conf))


# --- the installed distribution, end to end (slow) ---------------------------------------

_SUBPROCESS_SCRIPT = r"""
import json, os, sys

import sparkjet
from sparkjet.errors import JobFailedError
from sparkjet.job import JobConfig
from sparkjet.pipeline import Pipeline
from sparkjet.plugin import hookimpl
from sparkjet_example import JsonLinesSink, RangeSource, read_json_lines

store, out = sys.argv[1], sys.argv[2]
seen = {}


class SessionMarker:
    @hookimpl
    def before_spark_session_created(self, builder, spark_conf):
        seen["ui"] = spark_conf.get("spark.ui.enabled")
        builder.config("spark.sparkjet.test.marker", "set-by-plugin")


client = sparkjet.connect(
    store={"url": store},
    spark={"master": "local[2]", "conf": {"spark.ui.enabled": False}},
)
client.register_plugin(SessionMarker(), "marker")
report = {
    "plugins": {
        name: {
            "origin": info.origin,
            "registered": sorted([r.category, r.kind] for r in info.registered),
        }
        for name, info in client.plugins.plugins.items()
    },
    "range_from": client.plugins.lookup_kind("source", "range").plugin,
}

p = Pipeline.create()
p.read_from(RangeSource("numbers", 10)) \
    .map(lambda x: {"n": x, "square": x * x}) \
    .write_to(JsonLinesSink("squares", out))
job = client.get_jet().submit(p, JobConfig(name="squares"))
job.join(timeout=240)
report["status"] = job.status.value
report["files_after_success"] = sorted(os.listdir(os.path.join(out, "squares")))
report["job_id"] = job.id
report["items"] = read_json_lines(out, "squares")
report["marker"] = client.spark.conf.get("spark.sparkjet.test.marker")
report["seen"] = seen


def boom(x):
    if x == 7:
        raise ValueError("no sevens")
    return x


p2 = Pipeline.create()
p2.read_from(RangeSource("numbers", 10)).map(boom).set_name("boom") \
    .write_to(JsonLinesSink("failed", out))
job2 = client.get_jet().submit(p2)
try:
    job2.join(timeout=240)
    report["failure"] = None
except JobFailedError as exc:
    report["failure"] = {"stage": exc.stage, "message": str(exc)}
report["files_after_failure"] = {
    name: sorted(os.listdir(os.path.join(out, name))) for name in sorted(os.listdir(out))
}
print("REPORT " + json.dumps(report))
"""


@pytest.mark.slow
def test_installed_distribution_is_discovered_and_runs_a_job(tmp_path: Path) -> None:
    # Build from a copy: setuptools leaves build/ and *.egg-info next to the sources.
    source = tmp_path / "src"
    shutil.copytree(
        DIST, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    site = tmp_path / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
         "--disable-pip-version-check", "--no-input", "--target", str(site), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    entry_points = next(site.glob("sparkjet_example_plugin-0.1.0.dist-info")) / "entry_points.txt"
    assert "example = sparkjet_example" in entry_points.read_text()

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKJET_")}
    env.update(PYTHONPATH=str(site), PYSPARK_PYTHON=sys.executable)
    run = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS_SCRIPT, str(tmp_path / "store"), str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("REPORT "))
    report = json.loads(line[len("REPORT "):])

    # Discovered through its entry point, with its distribution named.
    example = report["plugins"]["example"]
    assert example["origin"] == f"{DIST_NAME} 0.1.0 (entry point)"
    assert example["registered"] == [
        ["sink", "jsonl"], ["snapshot backend", "example-dir"], ["source", "range"],
        ["source", "ticker"],
    ]
    assert {name: p["origin"] for name, p in report["plugins"].items() if name in BUILTINS} == {
        name: "built-in" for name in BUILTINS
    }
    assert report["plugins"]["marker"]["origin"] == "registered at runtime"
    assert report["range_from"] == "example"

    # The job ran on Spark executors and committed one file, in order, no leftovers.
    assert report["status"] == "COMPLETED"
    assert report["items"] == [{"n": n, "square": n * n} for n in range(10)]
    assert report["files_after_success"] == [f"{report['job_id']}.jsonl"]

    # before_spark_session_created ran before the (fresh) session was built.
    assert report["seen"] == {"ui": "false"}
    assert report["marker"] == "set-by-plugin"

    # A failing job makes nothing visible.
    assert report["failure"] is not None
    assert report["failure"]["stage"] == "boom"
    assert "no sevens" in report["failure"]["message"]
    assert report["files_after_failure"] == {
        "failed": [], "squares": [f"{report['job_id']}.jsonl"]
    }


# --- the example plugin's classes, without Spark -------------------------------------------


def test_range_source_partitions_cover_the_range_in_order(
    example: ModuleType, tmp_path: Path
) -> None:
    store = StoreLocation(str(tmp_path / "store")).store()
    job = JobContext("job-1", None, store, parallelism=2)
    task = TaskContext("job-1", 0, store)

    source = example.RangeSource("numbers", 10)
    parts = source.partitions(job)

    assert parts == [(0, 4), (4, 7), (7, 10)]
    assert [x for part in parts for x in source.read(part, task)] == list(range(10))
    assert example.RangeSource("few", 2).partitions(job) == [(0, 1), (1, 2)]
    assert [list(source.read(p, task)) for p in example.RangeSource("e", 0).partitions(job)] == [[]]
    with pytest.raises(ValueError, match="non-negative"):
        example.RangeSource("bad", -1)


def test_jsonl_sink_commits_parts_in_order_atomically(example: ModuleType, tmp_path: Path) -> None:
    store = StoreLocation(str(tmp_path / "store")).store()
    out = tmp_path / "out"
    sink = example.JsonLinesSink("result", out)
    job = JobContext("job-1", None, store, parallelism=2)

    state = sink.prepare(job)
    # Partitions finish in any order; commit gets the messages in partition order.
    second = sink.write(state, iter([{"b": 3}]), TaskContext("job-1", 1, store))
    first = sink.write(state, iter([{"a": 1}, [2]]), TaskContext("job-1", 0, store))
    assert example.read_json_lines(out, "result") == []  # nothing visible before commit

    sink.commit(state, [first, second], job)

    folder = out / "result"
    assert (folder / "job-1.jsonl").read_text().splitlines() == ['{"a": 1}', "[2]", '{"b": 3}']
    assert sorted(os.listdir(folder)) == ["job-1.jsonl"]  # no temp file left

    # Another job adds its own file; the first job's output stays.
    job2 = JobContext("job-2", None, store, parallelism=2)
    state = sink.prepare(job2)
    part = sink.write(state, iter(["x"]), TaskContext("job-2", 0, store))
    sink.commit(state, [part], job2)
    assert sorted(os.listdir(folder)) == ["job-1.jsonl", "job-2.jsonl"]
    assert example.read_json_lines(out, "result") == [{"a": 1}, [2], {"b": 3}, "x"]


def test_jsonl_sink_abort_removes_every_temp_file(example: ModuleType, tmp_path: Path) -> None:
    store = StoreLocation(str(tmp_path / "store")).store()
    out = tmp_path / "out"
    sink = example.JsonLinesSink("result", out)
    job = JobContext("job-1", None, store, parallelism=2)
    (out / "result").mkdir(parents=True)
    (out / "result" / "unrelated.txt").write_text("keep me")

    state = sink.prepare(job)
    written = sink.write(state, iter([1, 2]), TaskContext("job-1", 0, store))
    sink.write(state, iter([3]), TaskContext("job-1", 1, store))  # its message was lost

    sink.abort(state, [written], job)

    assert sorted(os.listdir(out / "result")) == ["unrelated.txt"]


# --- entry points -----------------------------------------------------------------------------


def test_entry_point_plugin_is_discovered_with_its_distribution(
    example: ModuleType, installed: Callable[..., Path], store_url: str
) -> None:
    installed(DIST_NAME, {"example": "sparkjet_example"}, version="0.1.0")

    client = connect(store_url)

    info = client.plugins.plugins["example"]
    assert info.origin == f"{DIST_NAME} 0.1.0 (entry point)"
    assert {(r.category, r.kind) for r in info.registered} == {
        ("source", "range"), ("source", "ticker"), ("sink", "jsonl"),
        ("snapshot backend", "example-dir"),
    }
    assert client.plugins.lookup_kind("sink", "jsonl").cls is example.JsonLinesSink
    assert all(client.plugins.plugins[name].origin == "built-in" for name in BUILTINS)


@pytest.mark.parametrize(
    ("modules", "target", "cause"),
    [
        ({"sj_test_broken": "raise RuntimeError('boom at import')\n"}, "sj_test_broken",
         "boom at import"),
        ({}, "sj_test_no_such_module", "No module named 'sj_test_no_such_module'"),
    ],
    ids=["raises-at-import", "missing-module"],
)
def test_entry_point_that_fails_to_import_is_listed_broken_naming_plugin_and_distribution(
    installed: Callable[..., Path],
    store_url: str,
    modules: dict[str, str],
    target: str,
    cause: str,
) -> None:
    installed("sparkjet-broken-plugin", {"broken": target}, modules, version="2.0")

    client = connect(store_url)  # every other plugin loads

    info = client.plugins.plugins["broken"]
    assert info.broken is not None
    assert 'Error importing plugin "broken"' in info.broken
    assert "sparkjet-broken-plugin 2.0" in info.broken
    assert cause in info.broken
    assert isinstance(info.error, PluginError)
    assert info.error.__cause__ is not None
    assert info.registered == []
    assert not info.in_use
    assert client.plugins.pm.get_plugin("broken") is None
    assert {n for n, i in client.plugins.plugins.items() if i.in_use} == BUILTINS


def test_disable_autoload_skips_entry_points_but_loads_builtins(
    installed: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, store_url: str
) -> None:
    installed("sparkjet-broken-plugin", {"broken": "sj_test_no_such_module"})
    assert connect(store_url).plugins.plugins["broken"].broken  # the entry point is visible ...

    monkeypatch.setenv("SPARKJET_DISABLE_PLUGIN_AUTOLOAD", "1")
    client = connect(store_url)  # ... and skipped

    assert set(client.plugins.plugins) == BUILTINS
    assert client.plugins.lookup_kind("source", "list").plugin == "list"
    assert client.plugins.lookup_kind("sink", "map").plugin == "map"
    assert client.plugins.lookup_kind("sink", "logger").plugin == "logger"


def test_block_plugins_skips_an_entry_point(
    installed: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, store_url: str
) -> None:
    installed("sparkjet-broken-plugin", {"broken": "sj_test_no_such_module"})
    monkeypatch.setenv("SPARKJET_BLOCK_PLUGINS", "something-else, broken")

    client = connect(store_url)

    assert set(client.plugins.plugins) == BUILTINS


def test_entry_point_with_a_misspelled_hook_is_listed_broken_with_a_did_you_mean(
    installed: Callable[..., Path], store_url: str
) -> None:
    installed(
        "sparkjet-typo-plugin",
        {"typo": "sj_test_typo"},
        {"sj_test_typo": """
            from sparkjet.plugin import hookimpl

            @hookimpl
            def register_source(register):
                pass
        """},
    )

    client = connect(store_url)

    message = client.plugins.plugins["typo"].broken
    assert message is not None
    assert 'plugin "typo" from sparkjet-typo-plugin 1.0 (entry point)' in message
    assert "register_source (did you mean 'register_sources'?)" in message
    assert client.plugins.pm.get_plugin("typo") is None


def test_entry_point_name_taken_by_a_builtin(
    installed: Callable[..., Path], store_url: str
) -> None:
    installed("sparkjet-fancy-logger", {"logger": "sj_test_fancy"}, {"sj_test_fancy": ""})

    with pytest.raises(PluginError) as info:
        connect(store_url)

    assert 'plugin name "logger"' in str(info.value)
    assert "sparkjet-fancy-logger 1.0" in str(info.value)
    assert "built-in" in str(info.value)


# --- registration errors ------------------------------------------------------------------------


def test_duplicate_kind_names_both_plugins(client: sparkjet.Client) -> None:
    client.register_plugin(Registers(sources=(ListLikeSource,)), "alpha")

    with pytest.raises(PluginError) as info:
        client.register_plugin(Registers(sources=(OtherListLikeSource,)), "beta")

    message = str(info.value)
    assert 'plugin "beta"' in message
    assert 'plugin "alpha"' in message
    assert 'source kind "dup-kind"' in message
    assert f"({__name__}.OtherListLikeSource)" in message
    assert f"({__name__}.ListLikeSource)" in message
    # The failed plugin left nothing behind: the first one keeps the kind ...
    assert "beta" not in client.plugins.plugins
    assert client.plugins.lookup_kind("source", "dup-kind").cls is ListLikeSource
    assert client.plugins.lookup_class(OtherListLikeSource).cls is ListLikeSource  # via its base
    # ... and the name can be used again once the plugin is fixed.
    client.register_plugin(Registers(), "beta")
    assert "beta" in client.plugins.plugins


def test_duplicate_kind_with_a_builtin_names_it(client: sparkjet.Client) -> None:
    class MyListSink(Sink):
        kind = "list"
        guarantees = ALL_GUARANTEES

        def write(self, state: Any, items: Any, context: TaskContext) -> Any:
            return None

        def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
            pass

    with pytest.raises(PluginError) as info:
        client.register_plugin(Registers(sinks=(MyListSink,)), "mine")

    assert 'plugin "mine" registers sink kind "list"' in str(info.value)
    assert 'already registered by plugin "list"' in str(info.value)
    assert client.plugins.lookup_kind("sink", "list").plugin == "list"


class _MissingKind(Source):
    def partitions(self, context: JobContext) -> list[Any]:
        return []

    def read(self, partition: Any, context: TaskContext) -> list[Any]:
        return []


class _NoneKind(ListLikeSource):
    kind = None  # type: ignore[assignment]


class _EmptyKind(ListLikeSource):
    kind = ""


class _NoGuarantees(ListLikeSource):
    kind = "no-guarantees"
    guarantees = frozenset()


class _StringGuarantees(ListLikeSource):
    kind = "string-guarantees"
    guarantees = frozenset({"EXACTLY_ONCE"})  # type: ignore[assignment]


class _ListGuarantees(ListLikeSource):
    kind = "list-guarantees"
    guarantees = [ProcessingGuarantee.NONE]  # type: ignore[assignment]


class _NotASource:
    kind = "not-a-source"
    guarantees = ALL_GUARANTEES


@pytest.mark.parametrize(
    ("plugin", "expected"),
    [
        (Registers(sources=(_NotASource,)), "is not a subclass of sparkjet.plugin.Source"),
        (Registers(sources=(ListLikeSource("x"),)), "is not a subclass of sparkjet.plugin.Source"),
        (Registers(sinks=(ListLikeSource,)), "as a sink, but it is not a subclass of "
                                              "sparkjet.plugin.Sink"),
        (Registers(sources=(_MissingKind,)), "source _MissingKind has no 'kind' string"),
        (Registers(sources=(_NoneKind,)), "source _NoneKind has no 'kind' string"),
        (Registers(sources=(_EmptyKind,)), "source _EmptyKind has no 'kind' string"),
        (Registers(sources=(_NoGuarantees,)), "_NoGuarantees must declare 'guarantees'"),
        (Registers(sources=(_StringGuarantees,)), "_StringGuarantees must declare 'guarantees'"),
        (Registers(sources=(_ListGuarantees,)), "_ListGuarantees must declare 'guarantees'"),
    ],
    ids=["plain-class", "instance", "wrong-base", "kind-missing", "kind-none", "kind-empty",
         "no-guarantees", "string-guarantees", "list-guarantees"],
)
def test_invalid_registration_names_the_plugin(
    client: sparkjet.Client, plugin: Registers, expected: str
) -> None:
    with pytest.raises(PluginError) as info:
        client.register_plugin(plugin, "faulty")

    assert 'plugin "faulty"' in str(info.value)
    assert expected in str(info.value)
    assert "faulty" not in client.plugins.plugins
    assert client.plugins.pm.get_plugin("faulty") is None


def test_half_registered_plugin_is_rolled_back(client: sparkjet.Client) -> None:
    class Fine(ListLikeSource):
        kind = "fine-kind"

    with pytest.raises(PluginError, match="_NoGuarantees"):
        client.register_plugin(Registers(sources=(Fine, _NoGuarantees)), "partial")

    with pytest.raises(PluginError, match='no source of kind "fine-kind"'):
        client.plugins.lookup_kind("source", "fine-kind")
    assert client.plugins.lookup_class(Fine) is None


def test_registration_hook_that_raises_names_the_plugin(client: sparkjet.Client) -> None:
    class Exploding:
        @hookimpl
        def register_sinks(self, register: Any) -> None:
            raise KeyError("lost my config")

    with pytest.raises(PluginError) as info:
        client.register_plugin(Exploding(), "exploding")

    assert 'plugin "exploding" failed in register_sinks' in str(info.value)
    assert "lost my config" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)


def test_misspelled_hook_name_is_refused_at_registration(client: sparkjet.Client) -> None:
    class Typo:
        @hookimpl
        def on_job_status_change(self, job: Any, old_status: Any, new_status: Any) -> None:
            pass

    with pytest.raises(PluginError) as info:
        client.register_plugin(Typo(), "typo")

    assert 'plugin "typo"' in str(info.value)
    assert "on_job_status_change" in str(info.value)
    assert "typo" not in client.plugins.plugins
    client.register_plugin(Registers(), "after-typo")  # the host is still usable


def test_hook_with_unknown_argument_is_refused(client: sparkjet.Client) -> None:
    class WrongArgs:
        @hookimpl
        def register_sources(self, registrar: Any) -> None:
            pass

    with pytest.raises(PluginError) as info:
        client.register_plugin(WrongArgs(), "wrong-args")

    assert 'plugin "wrong-args"' in str(info.value)
    assert "registrar" in str(info.value)


def test_plugin_name_can_be_registered_once(client: sparkjet.Client) -> None:
    client.register_plugin(Registers(), "once")

    with pytest.raises(PluginError, match='a plugin named "once" is already registered'):
        client.register_plugin(Registers(), "once")
    with pytest.raises(PluginError, match='"logger" is already registered'):
        client.register_plugin(Registers(), "logger")


# --- blocking --------------------------------------------------------------------------------


def _logger_pipeline() -> Pipeline:
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("in", [1, 2, 3])).write_to(Pipeline.to_logger())
    return p


@pytest.mark.parametrize("how", ["env", "config-file", "connect"])
def test_blocked_plugin_is_refused_at_submit(
    how: str, monkeypatch: pytest.MonkeyPatch, store_url: str
) -> None:
    if how == "env":
        monkeypatch.setenv("SPARKJET_BLOCK_PLUGINS", "logger")
        client = connect(store_url)
    elif how == "config-file":
        Path("sparkjet.toml").write_text('[plugins]\ndisable = ["logger"]\n')
        client = connect(store_url)
    else:
        client = connect(store_url, plugins={"disable": ["logger"]})
    assert set(client.plugins.plugins) == BUILTINS - {"logger"}
    jet = client.get_jet()

    with pytest.raises(PipelineDefinitionError) as info:
        jet.submit(_logger_pipeline())

    assert info.value.stage == "to-logger"
    assert "stage 'to-logger'" in str(info.value)
    assert "LoggerSink" in str(info.value)
    assert "blocked" in str(info.value)
    assert jet.get_jobs() == []  # refused before anything started


def test_unblocked_logger_pipeline_plans(client: sparkjet.Client) -> None:
    validated = plan(_logger_pipeline(), client.plugins, NONE)

    assert [validated.participants[n].plugin for n in validated.nodes] == ["list", "logger"]


# --- processing guarantees at submit ----------------------------------------------------------


def _stream_pipeline(example: ModuleType, client: sparkjet.Client, out: Path) -> Pipeline:
    """Ticker (NONE) to a sink declaring NONE and AT_LEAST_ONCE: two offenders for EXACTLY_ONCE.

    The example's own sink keeps every guarantee, so the second offender is
    a subclass of it that declares less, registered by a plugin of its own.
    """

    class AtLeastOnceJsonLinesSink(example.JsonLinesSink):  # type: ignore[name-defined,misc]
        kind = "jsonl-alo"
        guarantees = AT_LEAST_ONCE_AT_MOST

    class AtLeastOncePlugin:
        @hookimpl
        def register_sinks(self, register: Any) -> None:
            register(AtLeastOnceJsonLinesSink)

    client.register_plugin(example, "example")
    client.register_plugin(AtLeastOncePlugin(), "alo")
    p = Pipeline.create()
    p.read_from(example.TickerSource("ticks")).write_to(AtLeastOnceJsonLinesSink("out", out))
    return p


def test_guarantee_check_lists_every_offender(
    client: sparkjet.Client, example: ModuleType, tmp_path: Path
) -> None:
    with pytest.raises(ProcessingGuaranteeError) as info:
        plan(_stream_pipeline(example, client, tmp_path), client.plugins, EXACTLY_ONCE)

    error = info.value
    assert error.offenders == [
        "stage 'from-ticker(ticks)' (source 'ticker' from plugin 'example') supports NONE",
        "stage 'to-jsonl-alo(out)' (sink 'jsonl-alo' from plugin 'alo') supports NONE, "
        "AT_LEAST_ONCE",
    ]
    assert "asks for EXACTLY_ONCE" in str(error)
    assert all(offender in str(error) for offender in error.offenders)
    assert error.stage == "from-ticker(ticks)"
    assert error.stages == ["from-ticker(ticks)", "to-jsonl-alo(out)"]


def test_guarantee_check_lists_only_offenders(
    client: sparkjet.Client, example: ModuleType, tmp_path: Path
) -> None:
    pipeline = _stream_pipeline(example, client, tmp_path)

    with pytest.raises(ProcessingGuaranteeError) as info:
        plan(pipeline, client.plugins, AT_LEAST_ONCE)
    assert len(info.value.offenders) == 1
    assert "from-ticker(ticks)" in info.value.offenders[0]

    validated = plan(pipeline, client.plugins, NONE)
    assert validated.streaming
    assert {e.plugin for e in validated.participants.values()} == {"example", "alo"}


def test_batch_jobs_accept_any_guarantee(
    client: sparkjet.Client, example: ModuleType, tmp_path: Path
) -> None:
    client.register_plugin(example, "example")
    p = Pipeline.create()
    p.read_from(example.RangeSource("numbers", 3)).write_to(example.JsonLinesSink("out", tmp_path))

    validated = plan(p, client.plugins, EXACTLY_ONCE)

    assert not validated.streaming
    assert [validated.name(n) for n in validated.nodes] == ["from-range(numbers)", "to-jsonl(out)"]


def test_submit_checks_guarantees_before_refusing_streams(
    client: sparkjet.Client, example: ModuleType, tmp_path: Path
) -> None:
    jet = client.get_jet()
    pipeline = _stream_pipeline(example, client, tmp_path)

    with pytest.raises(ProcessingGuaranteeError) as info:
        jet.submit(pipeline, JobConfig(processing_guarantee=EXACTLY_ONCE))
    assert len(info.value.offenders) == 2

    assert jet.get_jobs() == []
    job = jet.submit(pipeline)  # NONE: every participant keeps it, so the stream runs
    try:
        assert job.status is not JobStatus.FAILED
    finally:
        job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=60)


def test_streaming_source_without_offsets_is_refused(
    client: sparkjet.Client, example: ModuleType, tmp_path: Path
) -> None:
    class NoOffsets(example.TickerSource):  # type: ignore[name-defined,misc]
        initial_offsets = Source.initial_offsets
        latest_offsets = Source.latest_offsets
        plan_range = Source.plan_range

    client.register_plugin(example, "example")
    p = Pipeline.create()
    p.read_from(NoOffsets("ticks")).write_to(Pipeline.to_list("out"))
    with pytest.raises(PipelineDefinitionError, match="does not implement initial_offsets") as info:
        client.get_jet().submit(p)
    assert info.value.stage == "from-ticker(ticks)"


def test_source_of_an_unregistered_plugin_is_refused(
    client: sparkjet.Client, example: ModuleType, tmp_path: Path
) -> None:
    p = Pipeline.create()
    p.read_from(example.RangeSource("numbers", 3)).write_to(Pipeline.to_list("out"))

    with pytest.raises(PipelineDefinitionError) as info:
        plan(p, client.plugins, NONE)

    assert info.value.stage == "from-range(numbers)"
    assert "sparkjet_example.RangeSource" in str(info.value)


# --- tracing -----------------------------------------------------------------------------------


def test_trace_hooks_logs_hook_calls(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SPARKJET_TRACE_HOOKS", "1")
    caplog.set_level(logging.DEBUG, logger="sparkjet.hooks")

    host = PluginHost()
    host.register(StatusRecorder([]), "recorder")
    host.job_error(job=FakeJob(), error=RuntimeError("x"))

    traced = "\n".join(r.getMessage() for r in caplog.records if r.name == "sparkjet.hooks")
    assert "register_sources" in traced
    assert "register_sinks" in traced
    assert "on_job_error" in traced


def test_no_hook_trace_by_default(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("SPARKJET_TRACE_HOOKS", raising=False)
    caplog.set_level(logging.DEBUG, logger="sparkjet.hooks")

    PluginHost().job_error(job=FakeJob(), error=RuntimeError("x"))

    assert [r for r in caplog.records if r.name == "sparkjet.hooks"] == []


# --- lifecycle hooks -----------------------------------------------------------------------------


def _times_ten_pipeline(fn: Callable[[Any], Any] | None = None) -> Pipeline:
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("in", [1, 2, 3])) \
        .map(fn or (lambda x: x * 10)).set_name("times-ten") \
        .write_to(Pipeline.to_list("out"))
    return p


def test_lifecycle_hooks_see_a_real_job(client: sparkjet.Client) -> None:
    events: list[Any] = []
    client.register_plugin(StatusRecorder(events), "recorder")
    impls = client.plugins.pm.hook.before_spark_session_created.get_hookimpls()
    assert "recorder" in [impl.plugin_name for impl in impls]  # accepted as a valid hook

    job = run_pipeline(client, _times_ten_pipeline(), name="lifecycle")

    assert job.status is JobStatus.COMPLETED
    assert client.get_list("out").get_all() == [10, 20, 30]
    changes = [(old, new) for kind, job_id, old, new in
               (e for e in events if e[0] == "status") if job_id == job.id]
    # Each change starts where the previous one ended ...
    assert changes[0][0] is JobStatus.NOT_RUNNING
    assert all(prev[1] is nxt[0] for prev, nxt in itertools.pairwise(changes))
    # ... through STARTING and RUNNING to COMPLETED (COMPLETING, while sinks commit, may show).
    seen = [new for _, new in changes if new is not JobStatus.COMPLETING]
    assert seen == [JobStatus.STARTING, JobStatus.RUNNING, JobStatus.COMPLETED]
    assert not [e for e in events if e[0] == "error"]


def test_on_job_error_is_called_once_before_failed(client: sparkjet.Client) -> None:
    events: list[Any] = []
    client.register_plugin(StatusRecorder(events), "recorder")

    def fail_on_two(x: int) -> int:
        if x == 2:
            raise ValueError("two is right out")
        return x

    job = client.get_jet().submit(_times_ten_pipeline(fail_on_two))
    with pytest.raises(JobFailedError):
        job.join(timeout=120)

    relevant = [e for e in events if e[0] in ("status", "error")]
    assert [e[0] for e in relevant] == ["status", "status", "error", "status"]
    error_event, last = relevant[2], relevant[3]
    assert isinstance(error_event[2], JobFailedError)
    assert error_event[2].stage == "times-ten"
    assert last[2:] == (JobStatus.RUNNING, JobStatus.FAILED)
    assert client.get_list("out").get_all() == []


def test_a_failing_hook_does_not_break_the_job(
    client: sparkjet.Client, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[Any] = []

    class Grumpy:
        @hookimpl
        def on_job_status_changed(self, job: Any, old_status: Any, new_status: Any) -> None:
            raise RuntimeError(f"grumpy about {new_status.value}")

    client.register_plugin(StatusRecorder(events), "recorder")
    client.register_plugin(Grumpy(), "grumpy")  # called before the recorder (last in, first)
    caplog.set_level(logging.ERROR, logger="sparkjet.plugins")

    job = run_pipeline(client, _times_ten_pipeline(), name="grumpy-job")

    assert job.status is JobStatus.COMPLETED
    assert client.get_list("out").get_all() == [10, 20, 30]
    # The other plugin was still told about every change.
    told = [e[3] for e in events if e[0] == "status"]
    assert [s for s in told if s is not JobStatus.COMPLETING] == [
        JobStatus.STARTING, JobStatus.RUNNING, JobStatus.COMPLETED,
    ]
    failures = [r for r in caplog.records if r.name == "sparkjet.plugins"]
    assert len(failures) == len(told)  # one logged error per change
    assert all('"grumpy"' in r.getMessage() and "on_job_status_changed" in r.getMessage()
               for r in failures)
    assert failures[-1].exc_info is not None
    assert "grumpy about COMPLETED" in str(failures[-1].exc_info[1])


# --- on_snapshot_exported --------------------------------------------------------------------


class ExportRecorder:
    """Records every ``on_snapshot_exported`` call with what the hook saw."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    @hookimpl
    def on_snapshot_exported(self, job: Any, name: str, manifest: Any, cancel_job: bool) -> None:
        self.events.append({
            "job": job.id,
            "name": name,
            "manifest": manifest.name,
            "batch": manifest.batch_id,
            "keys": {stage.name: stage.key_count for stage in manifest.stages},
            "cancel_job": cancel_job,
        })


class BreakableSnapshotBackend(LocalSnapshotBackend):
    """The local backend, whose writes fail while ``broken`` is set."""

    kind = "breakable"
    broken = False

    def _check(self) -> None:
        if type(self).broken:
            raise OSError("the disk is on fire")

    def write_bytes(self, path: str, data: bytes) -> None:
        self._check()
        super().write_bytes(path, data)

    def write_chunks(self, path: str, chunks: Any) -> None:
        self._check()
        super().write_chunks(path, chunks)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        self._check()
        return super().create_exclusive(path, data)


class RegistersBreakable:
    @hookimpl
    def register_snapshot_backends(self, register: Any) -> None:
        register(BreakableSnapshotBackend)


@pytest.mark.spark
def test_on_snapshot_exported_is_called_once_per_completed_export(
    store_url: str, tmp_path: Path
) -> None:
    client = connect(store_url, snapshots={"backend": "breakable", "url": str(tmp_path / "snaps")})
    events: list[Any] = []
    client.register_plugin(RegistersBreakable(), "breakable")
    client.register_plugin(ExportRecorder(events), "recorder")
    BreakableSnapshotBackend.broken = False
    stream = client.get_stream("clicks", partitions=1)
    p = Pipeline.create()
    (p.read_from(StreamSource("clicks")).set_name("clicks")
     .group_by(lambda x: x % 10).aggregate(counting()).set_name("per-key")
     .write_to(Pipeline.to_map("counts")))
    config = JobConfig(name="exported", processing_guarantee=EXACTLY_ONCE,
                       snapshot_interval_millis=100)
    job = client.get_jet().submit(p, config)
    try:
        wait_until(lambda: job.status is JobStatus.RUNNING, what="the job to run")
        stream.publish_all(range(30))
        wait_until(lambda: len(client.get_map("counts").entry_set()) == 10, what="the counts")

        snapshot = job.export_snapshot("first")

        assert job.status is JobStatus.RUNNING
        assert events == [{
            "job": job.id, "name": "first", "manifest": "first",
            "batch": snapshot.manifest.batch_id, "keys": {"per-key": 10}, "cancel_job": False,
        }]

        BreakableSnapshotBackend.broken = True
        with pytest.raises(SnapshotBackendError, match="the disk is on fire"):
            job.export_snapshot("failed")
        BreakableSnapshotBackend.broken = False

        assert [e["name"] for e in events] == ["first"]  # a failed export is not announced
        assert job.status is JobStatus.RUNNING

        job.cancel_and_export_snapshot("last")
        with pytest.raises(JobCancelledError):
            job.join(timeout=60)

        assert [(e["name"], e["cancel_job"]) for e in events] == [
            ("first", False), ("last", True),
        ]
    finally:
        BreakableSnapshotBackend.broken = False
        if not job.is_terminal():
            job.cancel()


def test_a_failing_export_hook_is_logged_and_the_others_are_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Manifest:  # a ManifestView
        name, batch_id, stages = "s", 3, ()

    class Broken:
        @hookimpl
        def on_snapshot_exported(self, name: str) -> None:  # fewer arguments than the spec
            raise RuntimeError(f"cannot announce {name}")

    events: list[Any] = []
    host = PluginHost(autoload=False)
    host.register(ExportRecorder(events), "recorder")
    host.register(Broken(), "broken")  # called first (last in, first)
    caplog.set_level(logging.ERROR, logger="sparkjet.plugins")

    host.snapshot_exported(job=FakeJob(), name="s", manifest=Manifest(), cancel_job=False)

    assert [(e["job"], e["name"], e["batch"]) for e in events] == [("fake-job", "s", 3)]
    [failure] = [r for r in caplog.records if r.name == "sparkjet.plugins"]
    assert '"broken"' in failure.getMessage() and "on_snapshot_exported" in failure.getMessage()
