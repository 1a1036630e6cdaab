"""Names moved into packages stay where they were: imports and pickles that name the old module.

``sparkjet.core.contracts`` and ``sparkjet.core.graph`` were modules and are
packages now, one concern per module. Plugins, tests and third parties import
from the old paths, and a streaming job's stored pipeline (a cloudpickle of
its nodes and specs) written before the split names the old modules: both
must keep working.
"""

from __future__ import annotations

import importlib
import pickle

import cloudpickle
import pytest

from sparkjet.core import contracts, graph

#: Every public name the modules held before they became packages.
CONTRACTS = [
    "ALL_GUARANTEES", "AT_LEAST_ONCE_AT_MOST", "BatchedItems", "CommitLogAccess",
    "CommitLogSink", "FileStore", "InputSize", "JobContext", "LogRecord", "PluginStore",
    "Sink", "SnapshotBackend", "Source", "StatefulTransform", "StoreAccess",
    "StreamLogAccess", "TaskContext", "open_file_store", "plugin_store", "source_lag",
]
GRAPH = [
    "AggregateSpec", "DistinctSpec", "ErrorPolicySpec", "FilterSpec", "FlatMapSpec",
    "GroupAggregateSpec", "GroupApplySpec", "GroupedStage", "KeyedSpec", "MapSpec",
    "MapStatefulSpec", "MergeSpec", "NodeSpec", "OpKind", "PeekSpec", "PipelineGraph",
    "SinkSpec", "SinkStage", "SortSpec", "SourceSpec", "Stage", "StatelessSpec", "Transform",
    "WindowSpec", "WindowedGroupedStage", "WindowedStage", "keyed_spec", "state_ttl_ms",
    "validate_stage_name",
]


def test_every_name_is_importable_from_the_old_module() -> None:
    assert sorted(contracts.__all__) == sorted(CONTRACTS)
    assert sorted(graph.__all__) == sorted(GRAPH)
    for module, names in (("sparkjet.core.contracts", CONTRACTS), ("sparkjet.core.graph", GRAPH)):
        imported = importlib.import_module(module)
        for name in names:
            assert getattr(imported, name) is not None, f"{module}.{name}"


@pytest.mark.parametrize(
    ("module", "name"),
    [("sparkjet.core.contracts", n) for n in CONTRACTS if n[0].isupper() and not n.isupper()]
    + [("sparkjet.core.graph", n) for n in GRAPH
       if n[0].isupper() and n not in ("KeyedSpec", "ErrorPolicySpec", "NodeSpec")],
)
def test_a_pickle_naming_the_old_module_loads(module: str, name: str) -> None:
    # The GLOBAL opcode: what a pickle holds for a class it refers to by name.
    loaded = pickle.loads(f"c{module}\n{name}\n.".encode())
    assert loaded is getattr(importlib.import_module(module), name)
    assert loaded.__module__.startswith(f"{module}.")  # defined in one of the package's modules


def test_a_pipeline_pickled_before_the_split_loads() -> None:
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import Pipeline
    from sparkjet.plugins.lists import ListSink, ListSource

    pipeline = Pipeline.create()
    pipeline.read_from(ListSource("in")).map(str).group_by(len).aggregate(counting()).write_to(
        ListSink("out")
    )
    # Protocol 2 names a class with the GLOBAL opcode, ``c<module>\n<name>\n``: rewritten
    # to the old module, the pickle is what a job stored before the split.
    new = cloudpickle.dumps(pipeline, protocol=2)
    assert b"csparkjet.core.graph.builder\nTransform\n" in new
    old = new.replace(b"csparkjet.core.graph.builder\n", b"csparkjet.core.graph\n").replace(
        b"csparkjet.core.graph.specs\n", b"csparkjet.core.graph\n"
    )
    assert b"sparkjet.core.graph.builder" not in old
    assert b"sparkjet.core.graph.specs" not in old
    copy = pickle.loads(old)
    assert [node.name for node in copy.transforms] == [node.name for node in pipeline.transforms]
    assert [node.spec.op for node in copy.transforms] == [
        node.spec.op for node in pipeline.transforms
    ]
