"""The example third-party plugin's ``JsonLinesSink`` passes the sink conformance kit.

Both copies of it run the whole kit: the distribution in
``tests/plugin_dist/sparkjet-example-plugin`` (imported from its source folder,
as ``tests/test_plugins.py`` does; the slow test there pip-installs it) and the
"A complete example" module of ``docs/plugins.md``, which plugin authors copy.
A last test checks that the two copies leave the same files for the same
commits, so the page cannot drift from the tested distribution.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import cloudpickle
import pytest
from pyspark import cloudpickle as pyspark_cloudpickle

import sparkjet
from sparkjet.plugin import JobContext, ProcessingGuarantee, TaskContext
from sparkjet.testing import SinkConformance, SinkHarness, StoreLocation
from tests.test_snippets import ROOT, file_blocks

DIST = Path(__file__).parent / "plugin_dist" / "sparkjet-example-plugin"
PAGE = ROOT / "docs" / "plugins.md"
DOCS_MODULE = "sparkjet_example_from_docs"


def _shipped_by_value(module: ModuleType) -> Iterator[ModuleType]:
    """``module`` pickled by value, so Spark's Python workers need not import it.

    By both picklers: pyspark's own copy of cloudpickle ships the job to the
    workers, the kit's ``cloudpickle`` ships the sink to its simulated tasks.
    """
    for pickler in (cloudpickle, pyspark_cloudpickle):
        pickler.register_pickle_by_value(module)
    try:
        yield module
    finally:
        for pickler in (cloudpickle, pyspark_cloudpickle):
            pickler.unregister_pickle_by_value(module)
        sys.modules.pop(module.__name__, None)


@pytest.fixture
def dist_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The distribution's module, imported from its source folder."""
    monkeypatch.syspath_prepend(str(DIST / "src"))
    sys.modules.pop("sparkjet_example", None)
    yield from _shipped_by_value(importlib.import_module("sparkjet_example"))


@pytest.fixture
def docs_module(tmp_path: Path) -> Iterator[ModuleType]:
    """The complete example's module, as docs/plugins.md shows it."""
    source = tmp_path / "docs_example.py"
    source.write_text(file_blocks(PAGE)["src/sparkjet_example/__init__.py"], encoding="utf-8")
    spec = importlib.util.spec_from_file_location(DOCS_MODULE, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[DOCS_MODULE] = module
    spec.loader.exec_module(module)
    yield from _shipped_by_value(module)


def _harness(module: ModuleType, client: sparkjet.Client, out: Path) -> SinkHarness:
    client.register_plugin(module, "example")
    return SinkHarness(client, new_sink=lambda: module.JsonLinesSink("out", out),
                       read=lambda: module.read_json_lines(out, "out"))


class TestDistributionJsonLinesSink(SinkConformance):
    @pytest.fixture
    def harness(
        self, dist_module: ModuleType, client: sparkjet.Client, tmp_path: Path
    ) -> SinkHarness:
        return _harness(dist_module, client, tmp_path / "out")


class TestDocsJsonLinesSink(SinkConformance):
    @pytest.fixture
    def harness(
        self, docs_module: ModuleType, client: sparkjet.Client, tmp_path: Path
    ) -> SinkHarness:
        return _harness(docs_module, client, tmp_path / "out")


def test_the_sink_declares_every_guarantee(
    dist_module: ModuleType, docs_module: ModuleType
) -> None:
    """What the kit proves above is what both copies declare, no less and no more."""
    everything = frozenset(ProcessingGuarantee)
    assert dist_module.JsonLinesSink.guarantees == everything
    assert docs_module.JsonLinesSink.guarantees == everything


def _files(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): path.read_text(encoding="utf-8")
        for path in sorted(folder.rglob("*")) if path.is_file()
    }


def test_docs_and_distribution_write_the_same_files(
    dist_module: ModuleType, docs_module: ModuleType, tmp_path: Path
) -> None:
    """The same batch job and micro-batches through each copy: the same names and bytes."""
    store = StoreLocation(str(tmp_path / "store")).store()
    batch_job = JobContext("job-1", "squares", store, parallelism=2, stage="to-jsonl(out)")
    streaming = [
        JobContext("job-2", None, store, parallelism=2, stage="to-jsonl(out)", batch_id=batch,
                   checkpoint_id="c1", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE)
        for batch in (0, 1, 0)  # batch 0 committed again: a replay
    ]
    trees = []
    for module in (dist_module, docs_module):
        out = tmp_path / module.__name__
        for n, context in enumerate([batch_job, *streaming]):
            sink = module.JsonLinesSink("out", out)
            state = sink.prepare(context)
            messages = [
                sink.write(state, iter([{"n": n, "p": p}, [p]]),
                           TaskContext(context.job_id, p, store, stage=context.stage))
                for p in range(2)
            ]
            sink.commit(state, messages, context)
        trees.append(_files(out))
        assert module.read_json_lines(out, "out") == [
            item for n in (0, 1, 2) for p in range(2) for item in ({"n": n, "p": p}, [p])
        ]
    dist_tree, docs_tree = trees
    assert dist_tree == docs_tree
    assert sorted(dist_tree) == [
        os.path.join("out", "job-1.jsonl"),
        os.path.join("out", "job-2.to-jsonl(out).c1.b0.jsonl"),
        os.path.join("out", "job-2.to-jsonl(out).c1.b1.jsonl"),
    ]
    assert [json.loads(line) for line in dist_tree[os.path.join("out", "job-1.jsonl")]
            .splitlines()] == [{"n": 0, "p": 0}, [0], {"n": 0, "p": 1}, [1]]
