"""Submit-time checks: turn a Pipeline into a validated Plan, or refuse it.

Every refusal is a :class:`~sparkjet.errors.PipelineDefinitionError` naming
the stage (and, for guarantees, the plugin and what it supports), raised
before any Spark work starts. No JVM is needed here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from sparkjet.core.dead_letters import DeadLetterPlan, default_stream, plan_dead_letters
from sparkjet.core.errors import PipelineDefinitionError, ProcessingGuaranteeError
from sparkjet.core.graph import STATELESS, OpKind, PipelineGraph, Transform
from sparkjet.core.model import ProcessingGuarantee
from sparkjet.core.plugin_manager import PluginHost, Registered
from sparkjet.core.windows import Timestamps

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
    #: Per windowed stage, the source stages its items come from and their timestamps.
    event_sources: dict[str, dict[str, Timestamps]] = field(default_factory=dict)
    #: Where dead letters go and which stages make them (None: errors fail the job);
    #: set for a job by :meth:`for_job`.
    dead_letters: DeadLetterPlan | None = None

    def for_job(
        self, job_id: str, job_name: str | None, error_policy: str, dead_letter_stream: str | None
    ) -> Plan:
        """The plan with the job's error policies applied (see :mod:`..dead_letters`)."""
        stream = dead_letter_stream or default_stream(job_name, job_id)
        found = plan_dead_letters(self.nodes, self.names, error_policy, stream)
        return dataclasses.replace(self, dead_letters=found)

    def name(self, node: Transform) -> str:
        return self.names[node]


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
    participants = {node: _registration(node, names[node], host) for node in nodes
                    if node.op in (OpKind.SOURCE, OpKind.SINK, OpKind.GROUP_APPLY)}
    streaming = any(node.params["source"].streaming for node in nodes if node.op == OpKind.SOURCE)
    for node in nodes:
        _check_picklable(node, names[node])
    event_sources = {names[n]: _event_sources(n, names) for n in nodes if n.op == OpKind.WINDOW}
    if streaming:
        _check_streaming_sources(nodes, names)
        for node in nodes:
            reason = _NOT_IN_STREAMS.get(node.op)
            if reason:
                raise PipelineDefinitionError(
                    f"stage '{names[node]}' ({node.op}) cannot run in a streaming job: {reason}",
                    names[node],
                )
        _check_guarantee(participants, names, guarantee)
    return Plan(pipeline, names, nodes, streaming, participants, event_sources)


def _event_sources(window: Transform, names: dict[Transform, str]) -> dict[str, Timestamps]:
    """The timestamped sources a windowed stage's items come from; refuses a stage without."""
    found: dict[str, Timestamps] = {}
    missing: list[str] = []
    todo = list(window.inputs)
    while todo:
        node = todo.pop()
        if node.op == OpKind.SOURCE:
            timestamps = node.params.get("timestamps")
            if timestamps is None:
                missing.append(names[node])
            else:
                found[names[node]] = timestamps
        elif node.op in STATELESS or node.op == OpKind.MERGE:
            todo.extend(node.inputs)
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
    from sparkjet.core.contracts import Source

    for node in nodes:
        if node.op != OpKind.SOURCE or not node.params["source"].streaming:
            continue
        cls = type(node.params["source"])
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


def _participant(node: Transform) -> Any:
    if node.op == OpKind.SOURCE:
        return node.params["source"]
    if node.op == OpKind.SINK:
        return node.params["sink"]
    return node.params["transform"]


def _registration(node: Transform, name: str, host: PluginHost) -> Registered:
    obj = _participant(node)
    entry = host.lookup_class(type(obj))
    if entry is None:
        cls = type(obj)
        raise PipelineDefinitionError(
            f"stage '{name}' uses {cls.__module__}.{cls.__qualname__}, which no loaded plugin "
            "registers: install its plugin (entry point group 'sparkjet'), check it is not "
            "blocked, or call client.register_plugin(...)",
            name,
        )
    return entry


def _check_picklable(node: Transform, name: str) -> None:
    things: list[tuple[str, Any]] = []
    if node.fn is not None:
        things.append(("function", node.fn))
    for key, value in node.params.items():
        if key == "operation":
            things.extend(
                (f"aggregate operation's {part}", getattr(value, part))
                for part in ("create", "accumulate", "combine", "finish", "deduct")
            )
        elif key in ("source", "sink", "transform", "create_fn", "map_fn"):
            things.append((key, value))
        elif key == "timestamps" and value.fn is not None:
            things.append(("timestamp function", value.fn))
    for label, thing in things:
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

