"""Every plugin class docs/plugins.md shows passes its conformance kit, as the page is.

The page's python blocks that define a source, a sink or a snapshot backend
are loaded as modules, each block as it is printed (shipped by value, so
Spark's workers need not import them), and each class runs the kit its
kind has: ``SourceConformance`` for the streaming ``LinesSource`` and the
bounded ``RangeSource`` of the complete example, ``SinkConformance`` for
``FilePerBatchSink``, ``SnapshotBackendConformance`` for
``TeamBucketBackend``. The complete example's ``JsonLinesSink`` runs the
sink kit in ``tests/test_example_plugin_conformance.py``.

:func:`test_every_example_class_has_its_kit_here` keeps it so: a class the
page adds fails it until it is given a kit here (or a reason it has none).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import sparkjet
from sparkjet.plugin import SnapshotBackend, Source
from sparkjet.testing import (
    SinkConformance,
    SinkHarness,
    SnapshotBackendConformance,
    SourceConformance,
    SourceHarness,
)
from tests.test_example_plugin_conformance import _shipped_by_value
from tests.test_snippets import ROOT, blocks, file_block_path

PAGE = ROOT / "docs" / "plugins.md"

#: Every plugin class the page defines, and where its kit runs (or why it has none).
KITS = {
    "LinesSource": "TestLinesSource",
    "RangeSource": "TestRangeSource",
    "FilePerBatchSink": "TestFilePerBatchSink",
    "TeamBucketBackend": "TestTeamBucketBackend",
    "JsonLinesSink": "tests/test_example_plugin_conformance.py::TestDocsJsonLinesSink",
    "FirstN": "no kit: stateful transforms have none; its block runs in test_snippets",
}
#: The base classes whose subclasses on the page are plugin classes.
PLUGIN_BASES = {"Source", "Sink", "CommitLogSink", "StatefulTransform", "SnapshotBackend"}


def _plugin_classes(code: str) -> list[str]:
    """The classes ``code`` defines on one of :data:`PLUGIN_BASES`."""
    return [
        node.name for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.ClassDef)
        and any(isinstance(base, ast.Name) and base.id in PLUGIN_BASES for base in node.bases)
    ]


def _example_blocks() -> dict[str, tuple[int, str]]:
    """Each plugin class of the page: the line and code of the block defining it."""
    found: dict[str, tuple[int, str]] = {}
    for line, code in blocks(PAGE, "python"):
        for name in _plugin_classes(code):
            assert name not in found, f"docs/plugins.md defines {name} twice"
            found[name] = (line, code)
    return found


def test_every_example_class_has_its_kit_here() -> None:
    """A plugin class added to the page is a kit to add here."""
    defined = set(_example_blocks())
    assert defined == set(KITS), (
        f"docs/plugins.md defines {sorted(defined - set(KITS))} with no kit here, and "
        f"{sorted(set(KITS) - defined)} are gone from it"
    )


def _load(name: str) -> Iterator[ModuleType]:
    """The block defining class ``name``, imported as a module of its own (by value)."""
    line, code = _example_blocks()[name]
    where = file_block_path(code) or f"docs/plugins.md:{line}"
    module_name = f"plugins_md_{name.lower()}_{uuid.uuid4().hex[:6]}"
    spec = importlib.util.spec_from_loader(module_name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    # Blank lines first, so a traceback's line is the page's.
    exec(compile("\n" * (line - 1) + code, where, "exec"), module.__dict__)
    sys.modules[module_name] = module
    yield from _shipped_by_value(module)


@pytest.fixture
def lines_module() -> Iterator[ModuleType]:
    yield from _load("LinesSource")


@pytest.fixture
def range_module() -> Iterator[ModuleType]:
    yield from _load("RangeSource")


@pytest.fixture
def file_per_batch_module() -> Iterator[ModuleType]:
    yield from _load("FilePerBatchSink")


@pytest.fixture
def team_bucket_module() -> Iterator[ModuleType]:
    yield from _load("TeamBucketBackend")


def _registered(client: sparkjet.Client, module: ModuleType, *classes: type[Any]) -> None:
    """Register the page's classes on the client, as the plugin's hook would."""
    from sparkjet.plugin import hookimpl

    sources = [c for c in classes if issubclass(c, Source)]
    sinks = [c for c in classes if not issubclass(c, Source)]

    class PagePlugin:
        @hookimpl
        def register_sources(self, register: Callable[[type[Any]], None]) -> None:
            for cls in sources:
                register(cls)

        @hookimpl
        def register_sinks(self, register: Callable[[type[Any]], None]) -> None:
            for cls in sinks:
                register(cls)

    name = f"docs-{module.__name__}"
    if name not in {info.name for info in client.list_plugins()}:
        client.register_plugin(PagePlugin(), name)


# --- LinesSource: a streaming source of byte offsets ------------------------------------------


class LinesHarness(SourceHarness):
    """JSON lines appended to one text file, which the page's ``LinesSource`` reads."""

    why_not = {
        "cap": "LinesSource reads up to the last complete line",
        "partitions": "one file is one partition",
        "trim": "an appended file is never trimmed",
    }

    def __init__(self, module: ModuleType, folder: Path) -> None:
        self.module = module
        self.path = str(folder / f"lines-{uuid.uuid4().hex[:8]}.txt")
        Path(self.path).touch()

    def prepare(self, client: sparkjet.Client) -> None:
        _registered(client, self.module, self.module.LinesSource)

    def new_source(self, *, capped: bool = True) -> Source:
        source: Source = self.module.LinesSource(self.path)
        return source

    def add(self, client: sparkjet.Client, items: list[dict[str, Any]]) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(item) + "\n" for item in items)

    def decode(self, item: Any) -> dict[str, Any]:
        decoded: dict[str, Any] = json.loads(item)
        return decoded


class TestLinesSource(SourceConformance):
    @pytest.fixture
    def source_harness(self, lines_module: ModuleType, tmp_path: Path) -> SourceHarness:
        return LinesHarness(lines_module, tmp_path)


# --- RangeSource: the complete example's bounded source ----------------------------------------


class RangeHarness(SourceHarness):
    """The ints ``0 .. n-1`` of the page's ``RangeSource``: giving items grows ``n``."""

    streaming = False
    why_not = {"streaming": "RangeSource is a bounded source: a batch job reads 0 .. n-1"}

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.n = 0
        self.token = ""

    def prepare(self, client: sparkjet.Client) -> None:
        _registered(client, self.module, self.module.RangeSource)

    def new_source(self, *, capped: bool = True) -> Source:
        source: Source = self.module.RangeSource("numbers", self.n)
        return source

    def add(self, client: sparkjet.Client, items: list[dict[str, Any]]) -> None:
        # The kit's items are numbered on from 0, as the range is.
        assert [item["seq"] for item in items] == list(range(self.n, self.n + len(items)))
        self.n += len(items)
        self.token = items[0]["kit"] if items else self.token

    def decode(self, item: Any) -> dict[str, Any]:
        return {"seq": item, "key": f"k{item % 5}", "kit": self.token}


class TestRangeSource(SourceConformance):
    @pytest.fixture
    def source_harness(self, range_module: ModuleType) -> SourceHarness:
        return RangeHarness(range_module)


# --- FilePerBatchSink ------------------------------------------------------------------------


def _committed_lines(folder: str) -> list[str]:
    """What a reader of ``FilePerBatchSink``'s folder sees: its ``.txt`` files' lines."""
    lines: list[str] = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".txt"):
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                lines.extend(fh.read().splitlines())
    return lines


class TestFilePerBatchSink(SinkConformance):
    @pytest.fixture
    def harness(
        self, file_per_batch_module: ModuleType, client: sparkjet.Client, tmp_path: Path
    ) -> SinkHarness:
        module = file_per_batch_module
        _registered(client, module, module.FilePerBatchSink)
        out = tmp_path / "out"
        out.mkdir()
        return SinkHarness(client, new_sink=lambda: module.FilePerBatchSink("out", str(out)),
                           read=lambda: _committed_lines(str(out)),
                           item=lambda n: str({"seq": n}))


# --- TeamBucketBackend -----------------------------------------------------------------------


class TestTeamBucketBackend(SnapshotBackendConformance):
    @pytest.fixture
    def new_backend(
        self, team_bucket_module: ModuleType, tmp_path: Path
    ) -> Callable[[], SnapshotBackend]:
        root = str(tmp_path / "bucket")
        return lambda: team_bucket_module.TeamBucketBackend(root)
