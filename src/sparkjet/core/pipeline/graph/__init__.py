"""The pipeline graph: transforms (nodes) and the stage handles users chain.

Nothing here touches Spark. A :class:`PipelineGraph` (the base of the user's
:class:`sparkjet.pipeline.Pipeline`) is a DAG of :class:`Transform` nodes;
the stage objects returned by ``read_from``, ``map`` and friends are thin
handles that add nodes to it.

A node is its place in the graph (:class:`Transform`: inputs, consumers,
name) plus what it does: its *spec*, one frozen dataclass per kind of node
(:class:`SourceSpec`, :class:`MapSpec`, ..., :class:`WindowSpec`), whose
fields are typed. Code that runs a node narrows its spec by kind
(``isinstance(node.spec, SourceSpec)`` or ``match``) and reads the fields;
the :data:`NodeSpec` union lists every kind. One concern per module, from
the bottom up:

- :mod:`.specs`: :class:`OpKind` and the specs, what each kind of node does;
- :mod:`.checks`: the checks of what users pass (stage names, lags and
  timeouts, TTLs, aggregate operations);
- :mod:`.builder`: :class:`Transform`, :class:`PipelineGraph` and the stage
  handles (:class:`Stage`, :class:`GroupedStage`, :class:`WindowedStage`,
  :class:`WindowedGroupedStage`, :class:`SinkStage`).

The names below are re-exported so that ``sparkjet.core.pipeline.graph.<name>`` keeps
working (for code and pickles that name it: a streaming job's stored
pipeline names its nodes' and specs' classes).
"""

from __future__ import annotations

from sparkjet.core.pipeline.graph.builder import (
    GroupedStage,
    PipelineGraph,
    SinkStage,
    Stage,
    Transform,
    WindowedGroupedStage,
    WindowedStage,
    keyed_spec,
)
from sparkjet.core.pipeline.graph.checks import validate_stage_name
from sparkjet.core.pipeline.graph.cogroup_stages import AggregateBuilder
from sparkjet.core.pipeline.graph.join_stages import HashJoinBuilder
from sparkjet.core.pipeline.graph.specs import (
    AggregateSpec,
    AsyncServiceSpec,
    DistinctSpec,
    ErrorPolicySpec,
    FilterSpec,
    FlatMapSpec,
    GroupAggregateSpec,
    GroupApplySpec,
    HashJoinSpec,
    IntervalJoinSpec,
    KeyedSpec,
    MapSpec,
    MapStatefulSpec,
    MergeSpec,
    NodeSpec,
    OpKind,
    PeekSpec,
    ServiceSpec,
    SinkSpec,
    SortSpec,
    SourceSpec,
    StatelessSpec,
    TimedSpec,
    WindowSpec,
    state_ttl_ms,
)

__all__ = [
    "AggregateBuilder",
    "AggregateSpec",
    "AsyncServiceSpec",
    "DistinctSpec",
    "ErrorPolicySpec",
    "FilterSpec",
    "FlatMapSpec",
    "GroupAggregateSpec",
    "GroupApplySpec",
    "GroupedStage",
    "HashJoinBuilder",
    "HashJoinSpec",
    "IntervalJoinSpec",
    "KeyedSpec",
    "MapSpec",
    "MapStatefulSpec",
    "MergeSpec",
    "NodeSpec",
    "OpKind",
    "PeekSpec",
    "PipelineGraph",
    "ServiceSpec",
    "SinkSpec",
    "SinkStage",
    "SortSpec",
    "SourceSpec",
    "Stage",
    "StatelessSpec",
    "TimedSpec",
    "Transform",
    "WindowSpec",
    "WindowedGroupedStage",
    "WindowedStage",
    "keyed_spec",
    "state_ttl_ms",
    "validate_stage_name",
]
