"""Submit-time checks: turn a Pipeline into a validated Plan, or refuse it.

Every refusal is a :class:`~sparkjet.errors.PipelineDefinitionError` naming
the stage (and, for guarantees, the plugin and what it supports), raised
before any Spark work starts. No JVM is needed here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, assert_never

import cloudpickle

from sparkjet.core.errors import PipelineDefinitionError, ProcessingGuaranteeError
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.host.plugin_info import Registered
from sparkjet.core.model import ProcessingGuarantee
from sparkjet.core.pipeline.dead_letters import DeadLetterPlan, default_stream, plan_dead_letters
from sparkjet.core.pipeline.graph import (
    AggregateSpec,
    DistinctSpec,
    GroupAggregateSpec,
    GroupApplySpec,
    HashJoinSpec,
    IntervalJoinSpec,
    KeyedSpec,
    MapStatefulSpec,
    MergeSpec,
    NodeSpec,
    OpKind,
    PipelineGraph,
    ServiceSpec,
    SinkSpec,
    SortSpec,
    SourceSpec,
    StatelessSpec,
    TimedSpec,
    Transform,
    WindowSpec,
)
from sparkjet.core.pipeline.windows import Timestamps

if TYPE_CHECKING:
    from sparkjet.core.host.contracts import JobContext

log = logging.getLogger(__name__)

#: Operations a streaming job cannot run, with the reason shown to the user.
_NOT_IN_STREAMS = {
    OpKind.SORT: "sorting needs the whole input, which a stream never has",
    OpKind.AGGREGATE: "a global aggregate needs the whole input; use group_by(...).aggregate(...)",
}


@dataclass
class Plan:
    """A validated pipeline: nodes in topological order, with names and plugins."""

    pipeline: PipelineGraph
    names: dict[Transform, str]
    nodes: list[Transform]
    streaming: bool
    #: The registration of each source, sink and stateful-transform node.
    participants: dict[Transform, Registered]
    #: Per timed stage (a window, an interval join), the source stages its items come
    #: from and their timestamps.
    event_sources: dict[str, dict[str, Timestamps]] = field(default_factory=dict)
    #: Where dead letters go and which stages make them (None: errors fail the job);
    #: set for a job by :meth:`for_job`.
    dead_letters: DeadLetterPlan | None = None
    #: The nodes that feed only hash joins' build sides (the build inputs and
    #: their upstream): bounded, read in full before the primary side. A
    #: streaming job reads them once per run of its loop, not per micro-batch.
    build_nodes: frozenset[Transform] = frozenset()

    def for_job(
        self, job_id: str, job_name: str | None, error_policy: str, dead_letter_stream: str | None
    ) -> Plan:
        """The plan with the job's error policies applied (see :mod:`..dead_letters`)."""
        stream = dead_letter_stream or default_stream(job_name, job_id)
        found = plan_dead_letters(self.nodes, self.names, error_policy, stream)
        return dataclasses.replace(self, dead_letters=found)

    def name(self, node: Transform) -> str:
        """The stage name of ``node``."""
        return self.names[node]

    def sources(self) -> dict[Transform, SourceSpec]:
        """The source nodes, in topological order, with their specs.

        In a streaming plan: the sources its micro-batches read (offsets,
        lag, snapshots), not the bounded ones of hash joins' build sides
        (:meth:`build_sources`).
        """
        return {node: node.spec for node in self.nodes if isinstance(node.spec, SourceSpec)
                and not (self.streaming and node in self.build_nodes)}

    def build_sources(self) -> dict[Transform, SourceSpec]:
        """The sources of hash joins' build sides, in topological order, with their specs."""
        return {node: node.spec for node in self.nodes
                if isinstance(node.spec, SourceSpec) and node in self.build_nodes}

    def joins(self) -> dict[Transform, HashJoinSpec]:
        """The hash join nodes, in topological order, with their specs."""
        return {node: node.spec for node in self.nodes if isinstance(node.spec, HashJoinSpec)}

    def close_sources(self, job_context: Callable[[Transform], JobContext]) -> None:
        """Call every source's driver-side ``close``; a failure is logged, naming the stage."""
        every = {node: node.spec for node in self.nodes if isinstance(node.spec, SourceSpec)}
        for node, spec in every.items():
            context = job_context(node)
            try:
                spec.source.close(context)
            except Exception as exc:  # a plugin's: the job's outcome stands
                log.warning("job %s: closing source stage %r (%s) failed: %s: %s",
                            context.job_id, self.name(node), spec.source.describe(),
                            type(exc).__name__, exc)


def plan(pipeline: Any, host: PluginHost, guarantee: ProcessingGuarantee) -> Plan:
    """Validate ``pipeline`` for a job with ``guarantee``; see the module docstring."""
    if not isinstance(pipeline, PipelineGraph):
        raise PipelineDefinitionError(f"submit() takes a Pipeline, got {pipeline!r}")
    nodes = list(pipeline.transforms)
    if not nodes:
        raise PipelineDefinitionError("the pipeline is empty: add a source with read_from()")
    names = pipeline.stage_names()
    _check_unique_names(nodes, names)
    for node in nodes:
        if node.op != OpKind.SINK and not node.consumers:
            raise PipelineDefinitionError(
                f"stage '{names[node]}' has no sink downstream: end the branch with write_to()",
                names[node],
            )
    participants = {node: _registration(node, participant, names[node], host)
                    for node in nodes if (participant := _participant(node.spec)) is not None}
    build_nodes = _build_nodes(nodes, names)
    streaming = any(node.spec.source.streaming for node in nodes
                    if isinstance(node.spec, SourceSpec) and node not in build_nodes)
    for node in nodes:
        _check_picklable(node.spec, names[node])
    event_sources = {names[n]: _event_sources(n, names) for n in nodes
                     if isinstance(n.spec, TimedSpec)}
    if streaming:
        _check_bounded_sources(nodes, names, build_nodes)
        _check_streaming_sources(nodes, names)
        for node in nodes:
            reason = _NOT_IN_STREAMS.get(node.op)
            if reason:
                raise PipelineDefinitionError(
                    f"stage '{names[node]}' ({node.op}) cannot run in a streaming job: {reason}",
                    names[node],
                )
        _check_guarantee(
            {n: e for n, e in participants.items() if n not in build_nodes}, names, guarantee)
    return Plan(pipeline, names, nodes, streaming, participants, event_sources,
                build_nodes=build_nodes)


def _build_nodes(nodes: list[Transform], names: dict[Transform, str]) -> frozenset[Transform]:
    """The nodes upstream of hash joins' build inputs; refuses a streaming build side.

    A build side is read in full before its join's first primary item, so
    every source upstream of it must be bounded.
    """
    found: set[Transform] = set()
    for join in nodes:
        if not isinstance(join.spec, HashJoinSpec):
            continue
        for side in join.inputs[1:]:
            todo = [side]
            while todo:
                node = todo.pop()
                if node in found:
                    continue
                found.add(node)
                spec = node.spec
                if isinstance(spec, SourceSpec) and spec.source.streaming:
                    raise PipelineDefinitionError(
                        f"stage '{names[join]}': its build side '{names[side]}' reads the "
                        f"streaming source '{names[node]}' ({spec.source.describe()}); a hash "
                        "join reads its build sides in full before the first item, so they "
                        "must be bounded (a list, a map, files); to match two streams, use an "
                        "interval join or a co-group on windows",
                        names[join])
                todo.extend(node.inputs)
    return frozenset(found)


def _check_bounded_sources(
    nodes: list[Transform], names: dict[Transform, str], build_nodes: frozenset[Transform]
) -> None:
    """A streaming job's bounded sources and their stages feed only build sides.

    A bounded source elsewhere in a streaming job has no offsets to read by
    micro-batch: refused here, naming the stage, rather than failing later.
    A build side of a streaming job is read by a batch run once per run of
    the loop, so its stages must keep no state between micro-batches.
    """
    for node in nodes:
        spec = node.spec
        if isinstance(spec, SourceSpec) and not spec.source.streaming \
                and node not in build_nodes:
            raise PipelineDefinitionError(
                f"stage '{names[node]}' reads the bounded source {spec.source.describe()} in a "
                "streaming job: a bounded source may only be the build side of a hash join "
                "there (stream.hash_join(table, clause, fn)); read it in a batch job, or "
                "publish it to a stream",
                names[node])
        if node not in build_nodes:
            continue
        for consumer in node.consumers:
            feeds_build = consumer in build_nodes or (
                isinstance(consumer.spec, HashJoinSpec) and node in consumer.inputs[1:]
                and node is not consumer.inputs[0])
            if not feeds_build:
                raise PipelineDefinitionError(
                    f"stage '{names[node]}' is part of a hash join's build side in a streaming "
                    f"job and also feeds '{names[consumer]}': a build side is read once per "
                    "run, so its stages may only feed build sides",
                    names[node])
        if isinstance(spec, KeyedSpec | AggregateSpec | SortSpec):
            raise PipelineDefinitionError(
                f"stage '{names[node]}' ({node.op}) is on a hash join's build side in a "
                "streaming job: a streaming job's build sides may hold only sources and "
                "stateless stages (map, filter, flat_map, peek, merge) for now; aggregate the "
                "table in a batch job writing a map, and join against that map",
                names[node])


def _event_sources(window: Transform, names: dict[Transform, str]) -> dict[str, Timestamps]:
    """The timestamped sources a windowed stage's items come from; refuses a stage without."""
    found: dict[str, Timestamps] = {}
    missing: list[str] = []
    todo = list(window.inputs)
    while todo:
        node = todo.pop()
        if isinstance(node.spec, SourceSpec):
            timestamps = node.spec.timestamps
            if timestamps is None:
                missing.append(names[node])
            else:
                found[names[node]] = timestamps
        elif isinstance(node.spec, StatelessSpec | MergeSpec | ServiceSpec):
            todo.extend(node.inputs)
        elif isinstance(node.spec, HashJoinSpec):
            todo.append(node.inputs[0])  # the primary's items, with their timestamps
        else:
            missing.append(names[node])
    if missing:
        culprit = ", ".join(f"'{m}'" for m in sorted(set(missing)))
        raise PipelineDefinitionError(
            f"stage '{names[window]}' windows items that have no timestamps: they come from "
            f"{culprit}, which gives none; call with_timestamps(fn, allowed_lag_ms) (or "
            "with_ingestion_timestamps()) on the source stage (a stateful stage's output has "
            "no timestamps)",
            names[window],
        )
    return found


def _check_streaming_sources(nodes: list[Transform], names: dict[Transform, str]) -> None:
    from sparkjet.core.host.contracts import Source

    for node in nodes:
        if not isinstance(node.spec, SourceSpec) or not node.spec.source.streaming:
            continue
        cls = type(node.spec.source)
        missing = [
            m for m in ("initial_offsets", "latest_offsets", "plan_range")
            if getattr(cls, m) is getattr(Source, m)
        ]
        if missing:
            raise PipelineDefinitionError(
                f"stage '{names[node]}': {cls.__qualname__} is declared streaming but does not "
                f"implement {', '.join(missing)}, which a streaming job reads offsets with",
                names[node],
            )


def _check_unique_names(nodes: list[Transform], names: dict[Transform, str]) -> None:
    seen: dict[str, Transform] = {}
    for node in nodes:
        name = names[node]
        if name in seen:
            raise PipelineDefinitionError(
                f"stage name '{name}' is used by two stages ({seen[name].op} and {node.op}); "
                "stage names must be unique within a pipeline",
                name,
            )
        seen[name] = node


def _participant(spec: NodeSpec) -> object | None:
    """The plugin object a node runs (a source, a sink, a stateful transform), if any."""
    if isinstance(spec, SourceSpec):
        return spec.source
    if isinstance(spec, SinkSpec):
        return spec.sink
    if isinstance(spec, GroupApplySpec):
        return spec.transform
    return None


def _registration(node: Transform, obj: object, name: str, host: PluginHost) -> Registered:
    # The host says why a class has no registration (naming a broken, unavailable
    # or blocked plugin it belongs to) and checks an unregistered subclass's contract.
    return host.participant(obj, name)


def _shipped(spec: NodeSpec) -> list[tuple[str, Any]]:
    """What of a node is pickled to reach Spark executors, each with how messages call it."""
    def operation(op: Any) -> list[tuple[str, Any]]:
        return [(f"aggregate operation's {part}", getattr(op, part))
                for part in ("create", "accumulate", "combine", "finish", "deduct")]

    def function(fn: Any) -> list[tuple[str, Any]]:
        return [] if fn is None else [("function", fn)]

    match spec:
        case SourceSpec(source=source, timestamps=timestamps):
            stamp = [] if timestamps is None or timestamps.fn is None else [
                ("timestamp function", timestamps.fn)]
            return [("source", source), *stamp]
        case StatelessSpec(fn=fn):
            return function(fn)
        case MergeSpec():
            return []
        case SinkSpec(sink=sink):
            return [("sink", sink)]
        case GroupAggregateSpec(key_fn=key_fn, operation=op):
            return [*function(key_fn), *operation(op)]
        case GroupApplySpec(key_fn=key_fn, transform=transform):
            return [*function(key_fn), ("transform", transform)]
        case MapStatefulSpec(key_fn=key_fn, create_fn=create_fn, map_fn=map_fn):
            return [*function(key_fn), ("create_fn", create_fn), ("map_fn", map_fn)]
        case DistinctSpec(key_fn=key_fn) | SortSpec(key_fn=key_fn):
            return function(key_fn)
        case WindowSpec(key_fn=key_fn, operation=op):
            return [*function(key_fn), *operation(op)]
        case IntervalJoinSpec(key_fn=key_fn, map_fn=map_fn):
            return [*function(key_fn), ("function", map_fn)]
        case AggregateSpec(operation=op):
            return operation(op)
        case ServiceSpec(factory=factory, fn=fn):
            destroy = [] if factory.destroy_fn is None else [
                ("service factory's destroy_fn", factory.destroy_fn)]
            return [("service factory's create_fn", factory.create_fn), *destroy,
                    ("function", fn)]
        case HashJoinSpec(clauses=clauses, map_fn=map_fn):
            return [*((f"join clause's {part}", getattr(c, part)) for c in clauses
                      for part in ("left_key", "right_key", "project")),
                    ("function", map_fn)]
        case _:  # pragma: no cover
            assert_never(spec)


def _check_picklable(spec: NodeSpec, name: str) -> None:
    for label, thing in _shipped(spec):
        try:
            cloudpickle.dumps(thing)
        except Exception as exc:
            raise PipelineDefinitionError(
                f"stage '{name}': its {label} {thing!r} cannot be pickled to ship to Spark "
                f"executors ({type(exc).__name__}: {exc})",
                name,
            ) from exc


def _check_guarantee(
    participants: dict[Transform, Registered],
    names: dict[Transform, str],
    guarantee: ProcessingGuarantee,
) -> None:
    offenders = []
    stages = []
    for node, entry in participants.items():
        supported = entry.cls.guarantees
        if guarantee not in supported:
            listed = ", ".join(g.value for g in sorted(supported, key=lambda g: g.rank))
            offenders.append(
                f"stage '{names[node]}' ({entry.category} '{entry.kind}' from plugin "
                f"'{entry.plugin}') supports {listed}"
            )
            stages.append(names[node])
    if offenders:
        raise ProcessingGuaranteeError(
            f"the job asks for {guarantee.value}, which these participants cannot keep:\n  "
            + "\n  ".join(offenders),
            offenders,
            stages,
        )

