"""Plugin mistakes that teach: broken plugins skipped and named, did-you-means, contracts checked.

An entry point that fails to import or to register is listed broken and
skipped, and a job using its classes is refused at submit naming it; an
unknown hook or a misspelled contract method gets a "did you mean"; a class's
methods are held to its contract when it registers (a streaming source
without ``streaming = True`` included). Entry points here are real: a
``*.dist-info`` folder on ``sys.path`` (the ``installed`` fixture).
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.cli import main
from sparkjet.core.host import manager
from sparkjet.errors import PipelineDefinitionError, PluginError
from sparkjet.pipeline import Pipeline
from sparkjet.plugin import (
    ALL_GUARANTEES,
    Category,
    JobContext,
    Sink,
    SnapshotBackend,
    Source,
    StatefulTransform,
    TaskContext,
    hookimpl,
)
from tests.conftest import TEST_SPARK, run_pipeline

BUILTINS = {
    ep.name for ep in importlib.metadata.distribution("sparkjet").entry_points
    if ep.group == "sparkjet"
}

#: A third-party package whose plugin module fails to import, while the
#: module that defines its source imports fine (what a user's pipeline uses).
BROKEN_PACKAGE = {
    "sj_broken_pkg.sources": """
        from sparkjet.plugin import ALL_GUARANTEES, Source

        class NumbersSource(Source):
            kind = "broken-numbers"
            guarantees = ALL_GUARANTEES

            def partitions(self, context):
                return [[1, 2, 3]]

            def read(self, partition, context):
                return partition
    """,
    "sj_broken_pkg.hooks": """
        import sj_broken_pkg.sources
        import sj_no_such_dependency  # not installed

        from sparkjet.plugin import hookimpl

        @hookimpl
        def register_sources(register):
            register(sj_broken_pkg.sources.NumbersSource)
    """,
}
IMPORT_ERROR = "ModuleNotFoundError(\"No module named 'sj_no_such_dependency'\")"


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the once-per-process warning about a broken plugin."""
    monkeypatch.setattr(manager, "_WARNED", set())


@pytest.fixture
def broken(installed: Callable[..., Path]) -> None:
    """The broken package, installed as distribution sparkjet-broken-plugin 2.0."""
    installed("sparkjet-broken-plugin", {"broken": "sj_broken_pkg.hooks"}, BROKEN_PACKAGE,
              version="2.0")


def connect(store_url: str, **overrides: Any) -> sparkjet.Client:
    """A client whose jobs run in this process (no JVM), made after the test set its plugins."""
    return sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK,
                            engine={"driver_only": True}, **overrides)


def _numbers_pipeline() -> Pipeline:
    from sj_broken_pkg.sources import NumbersSource  # type: ignore[import-not-found]

    p = Pipeline.create()
    p.read_from(NumbersSource("n")).write_to(Pipeline.to_list("out"))
    return p


def _list_pipeline() -> Pipeline:
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("in", [1, 2, 3])).map(lambda x: x * 10).write_to(
        Pipeline.to_list("out"))
    return p


# --- a broken entry point is listed, warned about once and skipped ---------------------------


def test_broken_plugin_is_listed_and_every_other_plugin_loads(
    broken: None, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="sparkjet.plugins"):
        client = connect(store_url)
        connect(store_url)  # a second client in the process: no second warning

    info = client.plugins.plugins["broken"]
    assert info.origin == "sparkjet-broken-plugin 2.0 (entry point)"
    assert info.broken == (
        'Error importing plugin "broken" from sparkjet-broken-plugin 2.0 (entry point): '
        + IMPORT_ERROR
    )
    assert info.status() == f"broken: {info.broken}"
    assert isinstance(info.error, PluginError)
    assert isinstance(info.error.__cause__, ModuleNotFoundError)
    assert info.registered == []
    assert {n for n, i in client.plugins.plugins.items() if i.in_use} == BUILTINS
    warnings = [r.getMessage() for r in caplog.records if "broken" in r.getMessage()]
    assert len(warnings) == 1
    assert info.broken in warnings[0]
    assert "jobs that use it fail at submit" in warnings[0]
    assert 'SPARKJET_BLOCK_PLUGINS=broken or [plugins] disable = ["broken"]' in warnings[0]


def test_jobs_that_do_not_use_a_broken_plugin_run(broken: None, store_url: str) -> None:
    client = connect(store_url)

    run_pipeline(client, _list_pipeline())

    assert client.get_list("out").get_all() == [10, 20, 30]


def test_a_job_using_a_broken_plugins_class_fails_at_submit_naming_it(
    broken: None, store_url: str
) -> None:
    jet = connect(store_url).get_jet()

    with pytest.raises(PipelineDefinitionError) as info:
        jet.submit(_numbers_pipeline())

    message = str(info.value)
    assert info.value.stage == "from-broken-numbers(n)"
    assert message.startswith(
        "stage 'from-broken-numbers(n)' uses sj_broken_pkg.sources.NumbersSource, whose plugin "
        '"broken" (sparkjet-broken-plugin 2.0 (entry point)) is broken: Error importing plugin '
        '"broken"'
    )
    assert IMPORT_ERROR in message
    assert isinstance(info.value.__cause__, PluginError)
    assert jet.get_jobs() == []


def test_a_kind_lookup_names_the_broken_plugins(broken: None, store_url: str) -> None:
    client = connect(store_url)

    with pytest.raises(PluginError) as info:
        client.plugins.lookup_kind(Category.SOURCE, "broken-numbers")

    message = str(info.value)
    assert 'no source of kind "broken-numbers" is registered' in message
    assert 'plugin "broken" (sparkjet-broken-plugin 2.0 (entry point)) is broken' in message
    assert IMPORT_ERROR in message


def test_a_blocked_broken_plugin_is_neither_warned_about_nor_listed(
    broken: None, store_url: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("SPARKJET_BLOCK_PLUGINS", "broken")
    with caplog.at_level(logging.WARNING, logger="sparkjet.plugins"):
        client = connect(store_url)

    assert set(client.plugins.plugins) == BUILTINS
    assert not [r for r in caplog.records if "broken" in r.getMessage()]
    with pytest.raises(PipelineDefinitionError) as info:
        client.get_jet().submit(_numbers_pipeline())
    assert ('whose plugin "broken" (sparkjet-broken-plugin 2.0 (entry point)) is blocked'
            in str(info.value))


def test_sparkjet_plugins_lists_a_broken_plugin_with_the_hint_to_block_it(
    broken: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plugins"]) == 0

    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    at = lines.index("broken (sparkjet-broken-plugin 2.0 (entry point))")
    assert lines[at + 1] == (
        '  broken: Error importing plugin "broken" from sparkjet-broken-plugin 2.0 '
        f"(entry point): {IMPORT_ERROR}"
    )
    assert lines[at + 2] == (
        '  skipped; block it with SPARKJET_BLOCK_PLUGINS=broken or [plugins] disable = ["broken"]'
    )
    assert any(line.startswith("list (built-in)") for line in lines)  # the others as usual
    assert "is skipped" in captured.err  # the warning, once


def test_entry_point_whose_registration_hook_raises_is_broken(
    installed: Callable[..., Path], store_url: str
) -> None:
    installed("sparkjet-raising-plugin", {"raising": "sj_raising_pkg"}, {
        "sj_raising_pkg": empty_source_plugin("Fine", "raising-fine",
                                              then='raise KeyError("lost my config")'),
    })

    client = connect(store_url)

    info = client.plugins.plugins["raising"]
    assert info.broken == (
        'plugin "raising" from sparkjet-raising-plugin 1.0 (entry point) failed in '
        "register_sources: KeyError('lost my config')"
    )
    assert info.registered == []  # what it registered before raising is rolled back
    import sj_raising_pkg  # type: ignore[import-not-found]

    assert client.plugins.lookup_class(sj_raising_pkg.Fine) is None
    p = Pipeline.create()
    p.read_from(sj_raising_pkg.Fine("f")).write_to(Pipeline.to_list("out"))
    with pytest.raises(PipelineDefinitionError, match="failed in register_sources") as raised:
        client.get_jet().submit(p)
    assert isinstance(raised.value.__cause__, PluginError)
    assert isinstance(raised.value.__cause__.__cause__, KeyError)


def empty_source_plugin(cls: str, kind: str, then: str = "") -> str:
    """A plugin module registering one batch source ``cls`` of ``kind`` that reads nothing.

    ``then``: one more statement of the registration hook, after it registers.
    """
    return f"""
        from sparkjet.plugin import ALL_GUARANTEES, Source, hookimpl

        class {cls}(Source):
            kind = "{kind}"
            guarantees = ALL_GUARANTEES

            def partitions(self, context):
                return []

            def read(self, partition, context):
                return []

        @hookimpl
        def register_sources(register):
            register({cls})
            {then}
    """


def test_entry_point_with_a_misspelled_contract_method_is_broken(
    installed: Callable[..., Path], store_url: str
) -> None:
    installed("sparkjet-typo-plugin", {"typo": "sj_typo_source"}, {"sj_typo_source": """
        from sparkjet.plugin import ALL_GUARANTEES, Source, hookimpl

        class Lines(Source):
            kind = "typo-lines"
            streaming = True
            guarantees = ALL_GUARANTEES

            def partitions(self, context):
                raise NotImplementedError("streaming only")

            def read(self, partition, context):
                return []

            def initial_offsets(self, context):
                return 0

            def lastest_offsets(self, context):
                return 0

            def plan_range(self, start, end, context):
                return []

        @hookimpl
        def register_sources(register):
            register(Lines)
    """})

    info = connect(store_url).plugins.plugins["typo"]

    assert info.broken == (
        "plugin \"typo\": source Lines defines 'lastest_offsets'; did you mean 'latest_offsets'?"
    )


def test_two_entry_points_registering_one_kind_fail_connect_with_the_hint_to_block_one(
    installed: Callable[..., Path], store_url: str
) -> None:
    source = empty_source_plugin("Dup", "dup-kind")
    installed("sparkjet-dup-a", {"dup-a": "sj_dup_a"}, {"sj_dup_a": source})
    installed("sparkjet-dup-b", {"dup-b": "sj_dup_b"}, {"sj_dup_b": source})

    with pytest.raises(PluginError) as info:
        connect(store_url)

    message = str(info.value)
    assert 'source kind "dup-kind"' in message
    assert "sj_dup_a.Dup" in message
    assert "sj_dup_b.Dup" in message
    assert "uninstall one of them, or block it with SPARKJET_BLOCK_PLUGINS=dup-" in message


# --- unknown hooks: did you mean ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("hook", "expected"),
    [
        ("register_source", "register_source (did you mean 'register_sources'?)"),
        ("on_job_status_change", "on_job_status_change (did you mean 'on_job_status_changed'?)"),
        ("before_session", "before_session; sparkjet's hooks are before_spark_session_created,"),
    ],
)
def test_unknown_hook_registered_at_runtime_raises_with_a_did_you_mean(
    store_url: str, hook: str, expected: str
) -> None:
    client = connect(store_url)
    plugin = type("Typo", (), {hook: hookimpl(lambda self: None)})()

    with pytest.raises(PluginError) as info:
        client.register_plugin(plugin, "typo")

    assert str(info.value).startswith(
        'plugin "typo" implements a hook sparkjet does not define: ')
    assert expected in str(info.value)
    assert "typo" not in client.plugins.plugins
    assert client.plugins.pm.get_plugin("typo") is None
    client.register_plugin(type("Fixed", (), {})(), "typo")  # the name is free again


# --- contract methods, checked when a class registers -------------------------------------------


class _Base(Source):
    kind = "contract-batch"
    guarantees = ALL_GUARANTEES

    def partitions(self, context: JobContext) -> list[Any]:
        return [[1, 2]]

    def read(self, partition: Any, context: TaskContext) -> list[Any]:
        return list(partition)


class _StreamBase(_Base):
    kind = "contract-stream"
    streaming = True

    def partitions(self, context: JobContext) -> list[Any]:
        raise NotImplementedError("read by streaming jobs only")

    def initial_offsets(self, context: JobContext) -> Any:
        return 0

    def latest_offsets(self, context: JobContext) -> Any:
        return 2

    def plan_range(self, start: Any, end: Any, context: JobContext) -> Sequence[Any]:
        return [list(range(start, end))]


def _stream_class(**methods: Any) -> type[Source]:
    """A streaming source with the three offset methods, then ``methods`` (None: left out)."""
    body: dict[str, Any] = {"kind": "contract-typo", "streaming": True,
                            "guarantees": ALL_GUARANTEES, "__module__": __name__}
    namespace = {**body, **{k: v for k, v in methods.items() if v is not None}}
    cls = type("Foo", (Source,), {
        "partitions": _StreamBase.partitions, "read": _Base.read,
        "initial_offsets": _StreamBase.initial_offsets,
        "latest_offsets": _StreamBase.latest_offsets, "plan_range": _StreamBase.plan_range,
        **namespace,
    })
    for name, value in methods.items():
        if value is None:
            delattr(cls, name)
    return cls


def _offsets(self: Any, context: Any) -> Any:
    return 0


class _Registers:
    def __init__(self, category: str, *classes: type) -> None:
        self.category = category
        self.classes = classes

    @hookimpl
    def register_sources(self, register: Callable[[Any], None]) -> None:
        for cls in self.classes if self.category == "source" else ():
            register(cls)

    @hookimpl
    def register_sinks(self, register: Callable[[Any], None]) -> None:
        for cls in self.classes if self.category == "sink" else ():
            register(cls)

    @hookimpl
    def register_stateful_transforms(self, register: Callable[[Any], None]) -> None:
        for cls in self.classes if self.category == "transform" else ():
            register(cls)

    @hookimpl
    def register_snapshot_backends(self, register: Callable[[Any], None]) -> None:
        for cls in self.classes if self.category == "backend" else ():
            register(cls)


class _SinkWithTypo(Sink):
    kind = "contract-sink"
    guarantees = ALL_GUARANTEES

    def write(self, state: Any, items: Any, context: TaskContext) -> Any:
        return None

    def comit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        pass


class _SinkWithoutCommit(Sink):
    kind = "contract-sink"
    guarantees = ALL_GUARANTEES

    def write(self, state: Any, items: Any, context: TaskContext) -> Any:
        return None


class _TransformWithTypo(StatefulTransform):
    kind = "contract-transform"
    guarantees = ALL_GUARANTEES

    def create_state(self) -> Any:
        return 0

    def proces(self, state: Any, key: Any, items: list[Any]) -> tuple[Any, list[Any]]:
        return state, items


class _BackendWithTypo(SnapshotBackend):
    kind = "contract-backend"

    def write_bytes(self, path: str, data: bytes) -> None:
        pass

    def read_bytes(self, path: str) -> bytes:
        return b""

    def lists(self, prefix: str) -> list[str]:
        return []

    def delete(self, prefix: str) -> None:
        pass


class _ForgotStreamingFlag(Source):
    kind = "contract-forgot"
    guarantees = ALL_GUARANTEES

    def read(self, partition: Any, context: TaskContext) -> list[Any]:
        return []

    initial_offsets = _StreamBase.initial_offsets
    latest_offsets = _StreamBase.latest_offsets
    plan_range = _StreamBase.plan_range


class _ForgotStreamingFlagWithStub(_ForgotStreamingFlag):
    def partitions(self, context: JobContext) -> list[Any]:
        raise NotImplementedError("streaming only")


@pytest.mark.parametrize(
    ("category", "cls", "expected"),
    [
        ("source", _stream_class(latest_offsets=None, lastest_offsets=_offsets),
         "source Foo defines 'lastest_offsets'; did you mean 'latest_offsets'?"),
        ("source", _stream_class(latest_offsets=None, latest_offset=_offsets),
         "source Foo defines 'latest_offset'; did you mean 'latest_offsets'?"),
        ("source", _stream_class(plan_range=None, initial_offsets=None),
         "source Foo declares streaming = True but does not implement initial_offsets, "
         "plan_range, which a streaming job reads offsets with"),
        ("source", _stream_class(latest_offsets=None, latest_offset=_offsets, plan_range=None),
         "source Foo defines 'latest_offset'; did you mean 'latest_offsets'? It also declares "
         "streaming = True but does not implement plan_range"),
        ("sink", _SinkWithTypo,
         "sink _SinkWithTypo defines 'comit'; did you mean 'commit'?"),
        ("sink", _SinkWithoutCommit,
         "sink _SinkWithoutCommit does not implement commit, abstract in sparkjet.plugin.Sink"),
        ("transform", _TransformWithTypo,
         "stateful transform _TransformWithTypo defines 'proces'; did you mean 'process'?"),
        ("backend", _BackendWithTypo,
         "snapshot backend _BackendWithTypo defines 'lists'; did you mean 'list'?"),
        ("source", _ForgotStreamingFlag,
         "source _ForgotStreamingFlag implements streaming methods (initial_offsets, "
         "latest_offsets, plan_range) but does not declare `streaming = True`"),
        ("source", _ForgotStreamingFlagWithStub,
         "source _ForgotStreamingFlagWithStub implements streaming methods (initial_offsets, "
         "latest_offsets, plan_range) but does not declare `streaming = True`"),
    ],
    ids=["lastest_offsets", "latest_offset", "missing-offset-methods", "typo-and-missing",
         "sink-typo", "sink-abstract", "transform-typo", "backend-typo", "forgot-streaming",
         "forgot-streaming-stub"],
)
def test_contract_is_checked_when_a_class_registers(
    client: sparkjet.Client, category: str, cls: type, expected: str
) -> None:
    with pytest.raises(PluginError) as info:
        client.register_plugin(_Registers(category, cls), "contract")

    assert str(info.value).startswith(f'plugin "contract": {expected}')
    assert "contract" not in client.plugins.plugins


class _WithHelpers(_StreamBase):
    """Helpers that look like contract names but are not typos of a method it lacks."""

    kind = "contract-helpers"

    def partition(self, n: int) -> list[Any]:  # beside partitions, which it defines
        return [n]

    def latest_offsets_cached(self) -> Any:
        return None

    @property
    def closed(self) -> bool:  # an attribute: no typo of the method close
        return False

    def reader(self) -> None:
        pass


class _BothWays(_Base):
    """A source that reads a batch by partitions and a stream by offsets, per instance."""

    kind = "contract-both"

    def __init__(self, name: str, streaming: bool) -> None:
        super().__init__(name)
        self.streaming = streaming  # type: ignore[misc]

    initial_offsets = _StreamBase.initial_offsets
    latest_offsets = _StreamBase.latest_offsets
    plan_range = _StreamBase.plan_range


def test_helpers_and_real_contract_classes_register(client: sparkjet.Client) -> None:
    client.register_plugin(_Registers("source", _StreamBase, _WithHelpers, _BothWays), "fine")

    registered = {r.kind for r in client.plugins.plugins["fine"].registered}
    assert registered == {"contract-stream", "contract-helpers", "contract-both"}


def test_every_builtin_and_the_example_plugin_registers(
    client: sparkjet.Client, example_plugin: Any
) -> None:
    for name in BUILTINS:
        info = client.plugins.plugins[name]
        assert info.broken is None, info.broken
        assert info.unavailable is None, info.unavailable  # confluent-kafka is a test dependency
        assert info.registered
    client.register_plugin(example_plugin, "example")
    assert {(r.category, r.kind) for r in client.plugins.plugins["example"].registered} == {
        ("source", "range"), ("source", "ticker"), ("sink", "jsonl"),
        ("snapshot backend", "example-dir"),
    }


@pytest.fixture
def example_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """tests/plugin_dist's example plugin module, imported from its source folder."""
    import sys

    monkeypatch.syspath_prepend(
        str(Path(__file__).parent / "plugin_dist" / "sparkjet-example-plugin" / "src"))
    sys.modules.pop("sparkjet_example", None)
    yield importlib.import_module("sparkjet_example")
    sys.modules.pop("sparkjet_example", None)


# --- at submit: what registration cannot see ----------------------------------------------------


def test_unregistered_subclass_that_forgot_streaming_is_refused_at_submit(
    client: sparkjet.Client,
) -> None:
    class Ticks(_Base):  # a subclass of a registered batch source, registered by nobody
        def partitions(self, context: JobContext) -> list[Any]:
            raise NotImplementedError("streaming only")

        initial_offsets = _StreamBase.initial_offsets
        latest_offsets = _StreamBase.latest_offsets
        plan_range = _StreamBase.plan_range

    client.register_plugin(_Registers("source", _Base), "batch")
    p = Pipeline.create()
    p.read_from(Ticks("t")).write_to(Pipeline.to_list("out"))

    with pytest.raises(PipelineDefinitionError) as info:
        client.get_jet().submit(p)

    assert info.value.stage == "from-contract-batch(t)"
    assert str(info.value).startswith("stage 'from-contract-batch(t)': source ")
    assert (".<locals>.Ticks implements streaming methods (initial_offsets, latest_offsets, "
            "plan_range) but does not declare `streaming = True`") in str(info.value)
    assert client.get_jet().get_jobs() == []


def test_instance_declaring_either_way_runs(client: sparkjet.Client) -> None:
    client.register_plugin(_Registers("source", _BothWays), "both")
    p = Pipeline.create()
    p.read_from(_BothWays("b", streaming=False)).write_to(Pipeline.to_list("out"))

    run_pipeline(client, p)

    assert client.get_list("out").get_all() == [1, 2]
