"""The pipeline graph and the stage handles users chain to build it.

A :class:`PipelineGraph` (the base of the user's
:class:`sparkjet.pipeline.Pipeline`) is a DAG of :class:`Transform` nodes;
the stage objects returned by ``read_from``, ``map`` and friends
(:class:`Stage`, :class:`GroupedStage`, :class:`WindowedStage`,
:class:`WindowedGroupedStage`, :class:`SinkStage`) are thin handles that add
nodes to it. A node is its place in the graph (inputs, consumers, name) plus
its spec (:mod:`.specs`). Nothing here touches Spark.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Self

from sparkjet.core.errors import PipelineDefinitionError
from sparkjet.core.model import ERROR_POLICIES
from sparkjet.core.pipeline.aggregation import AggregateOperation, co_aggregate, cogroup_key
from sparkjet.core.pipeline.graph.checks import (
    idle_ms,
    lag_ms,
    operation_of,
    ttl_ms,
    validate_stage_name,
)
from sparkjet.core.pipeline.graph.cogroup_stages import CoGroupMethods, cogroup_merge
from sparkjet.core.pipeline.graph.join_stages import JoinMethods
from sparkjet.core.pipeline.graph.service_stages import ServiceMethods
from sparkjet.core.pipeline.graph.specs import (
    AggregateSpec,
    DistinctSpec,
    ErrorPolicySpec,
    FilterSpec,
    FlatMapSpec,
    GroupAggregateSpec,
    GroupApplySpec,
    KeyedSpec,
    MapSpec,
    MapStatefulSpec,
    MergeSpec,
    NodeSpec,
    OpKind,
    PeekSpec,
    SinkSpec,
    SortSpec,
    SourceSpec,
    WindowSpec,
)
from sparkjet.core.pipeline.windows import DEFAULT_IDLE_TIMEOUT_MS, Timestamps, WindowDefinition

if TYPE_CHECKING:
    from sparkjet.core.host.contracts.base_classes import Sink, Source, StatefulTransform


def keyed_spec(node: Transform) -> KeyedSpec | None:
    """``node``'s spec if it is a keyed stage (:data:`KeyedSpec`), else None."""
    return node.spec if isinstance(node.spec, KeyedSpec) else None


class Transform:
    """One node of the pipeline DAG: its place in the graph, its name, and its :attr:`spec`.

    Nodes are compared and hashed by identity (plans key dicts by node).
    """

    def __init__(
        self,
        pipeline: PipelineGraph,
        spec: NodeSpec,
        inputs: list[Transform],
        *,
        default_name: str | None = None,
    ) -> None:
        self.pipeline = pipeline
        #: What the node does; replaced (specs are frozen) when a stage method changes it.
        self.spec: NodeSpec = spec
        self.inputs = inputs
        self.explicit_name: str | None = None
        self.default_name = default_name or spec.op.replace("_", "-")
        self.index = len(pipeline.transforms)
        self.consumers: list[Transform] = []
        for upstream in inputs:
            upstream.consumers.append(self)
        pipeline.transforms.append(self)

    @property
    def op(self) -> OpKind:
        """The kind of node (its spec's)."""
        return self.spec.op

    @property
    def name(self) -> str:
        """The stage's name: the one set by ``set_name``, else its generated name."""
        return self.pipeline.stage_names()[self]

    def __repr__(self) -> str:
        return f"<{self.op} stage {self.name!r}>"


class PipelineGraph:
    """A DAG of stages, built with :meth:`read_from` and the stage methods."""

    def __init__(self) -> None:
        self.transforms: list[Transform] = []

    @classmethod
    def create(cls) -> Self:
        """A new, empty pipeline."""
        return cls()

    def read_from(self, source: Source) -> Stage:
        """Start a branch of the pipeline at ``source``."""
        from sparkjet.core.host.contracts.base_classes import Source

        if not isinstance(source, Source):
            raise PipelineDefinitionError(
                f"read_from() takes a source (a sparkjet.plugin.Source), got {source!r}"
            )
        node = Transform(
            self, SourceSpec(source), [],
            default_name=f"from-{source.describe().replace(':', '(', 1)})"
            if ":" in source.describe() else f"from-{source.describe()}",
        )
        return Stage(node)

    def stage_names(self) -> dict[Transform, str]:
        """Every node's name: explicit names as set, generated ones numbered by occurrence."""
        taken = {t.explicit_name for t in self.transforms if t.explicit_name}
        names: dict[Transform, str] = {}
        counts: dict[str, int] = {}
        for node in self.transforms:
            if node.explicit_name:
                names[node] = node.explicit_name
                continue
            base = node.default_name
            while True:
                counts[base] = counts.get(base, 0) + 1
                candidate = base if counts[base] == 1 else f"{base}-{counts[base]}"
                if candidate not in taken:
                    break
            taken.add(candidate)
            names[node] = candidate
        return names

    def __repr__(self) -> str:
        return f"<Pipeline of {len(self.transforms)} stages>"


class _Handle:
    def __init__(self, node: Transform) -> None:
        self._node = node

    @property
    def name(self) -> str:
        """The stage's name (explicit or generated)."""
        return self._node.name

    def set_name(self, name: str) -> _Handle:
        """Name this stage; names must be unique within the pipeline (checked at submit)."""
        self._node.explicit_name = validate_stage_name(name)
        return self


class Stage(_Handle, JoinMethods, ServiceMethods):
    """A stage that emits items; chain further stages or a sink onto it."""

    def set_name(self, name: str) -> Stage:
        """Name this stage; names must be unique within the pipeline (checked at submit)."""
        super().set_name(name)
        return self

    def _add(
        self, spec: NodeSpec, *inputs: Transform, default_name: str | None = None
    ) -> Transform:
        return Transform(self._node.pipeline, spec, [self._node, *inputs],
                         default_name=default_name)

    def _wrap(self, node: Transform) -> Self:
        return Stage(node)  # type: ignore[return-value]  # a grouped stage's join is a Stage

    def _fn(self, op: str, fn: Any) -> Callable[..., Any]:
        if not callable(fn):
            raise PipelineDefinitionError(
                f"{op}() after stage '{self.name}' takes a function, got {fn!r}", self.name
            )
        return fn  # type: ignore[no-any-return]

    def map(self, fn: Callable[[Any], Any]) -> Stage:
        """Emit ``fn(item)`` for each item."""
        return Stage(self._add(MapSpec(self._fn("map", fn))))

    def filter(self, fn: Callable[[Any], Any]) -> Stage:
        """Keep the items for which ``fn(item)`` is true."""
        return Stage(self._add(FilterSpec(self._fn("filter", fn))))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> Stage:
        """Emit every element of ``fn(item)`` for each item."""
        return Stage(self._add(FlatMapSpec(self._fn("flat_map", fn))))

    def peek(self, fn: Callable[[Any], Any] = repr) -> Stage:
        """Log ``fn(item)`` for each item (logger ``sparkjet.peek``) and pass it on."""
        return Stage(self._add(PeekSpec(self._fn("peek", fn))))

    def on_error(self, policy: str) -> Stage:
        """What this stage does with an item its function raises on.

        ``"fail"``: the job fails, naming the stage (Jet's behaviour, and the
        default unless ``JobConfig.error_policy`` says otherwise).
        ``"dead-letter"``: the item, with the stage, the error and its
        traceback and where the item came from, goes to the job's dead-letter
        stream (``JobConfig.dead_letter_stream``), counted in the stage's
        ``deadLetters`` metric, and the job goes on without it. Applies to
        map, filter, flat_map and peek stages, to service calls
        (``map_using_service``, ``map_using_service_async``: a call that
        raises or times out), and to windowed aggregations: there it sets
        the late items aside (behind the watermark, which the window drops
        and counts in ``lateEventsDropped`` either way); their key and
        aggregate functions still fail the job.
        """
        node = self._node
        if policy not in ERROR_POLICIES:
            raise PipelineDefinitionError(
                f"on_error() on stage '{self.name}': the policy is 'fail' or 'dead-letter', "
                f"got {policy!r}",
                self.name,
            )
        if not isinstance(node.spec, ErrorPolicySpec):
            raise PipelineDefinitionError(
                f"on_error() on stage '{self.name}': error policies apply to map, filter, "
                f"flat_map and peek stages, service calls, windowed aggregations and interval "
                f"joins (their late items), and '{self.name}' is a {node.op} stage (its "
                "functions fail the job: skipping an item there would change results silently)",
                self.name,
            )
        node.spec = dataclasses.replace(node.spec, on_error=policy)
        return self

    def with_timestamps(
        self,
        fn: Callable[[Any], int],
        allowed_lag_ms: int,
        *,
        idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
    ) -> Stage:
        """Give the source's items event time: ``fn(item)``, an int of milliseconds.

        The watermark stays ``allowed_lag_ms`` behind the highest timestamp
        seen (the lowest over the source's partitions; a partition without
        events for ``idle_timeout_ms`` stops holding it back). Only a source
        stage takes timestamps; windowed stages downstream need them.
        """
        if not callable(fn):
            raise PipelineDefinitionError(
                f"with_timestamps() on stage '{self.name}' takes a function, got {fn!r}",
                self.name,
            )
        self._timestamps(Timestamps(fn, lag_ms(allowed_lag_ms), idle_ms(idle_timeout_ms)))
        return self

    def with_ingestion_timestamps(
        self, allowed_lag_ms: int = 0, *, idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS
    ) -> Stage:
        """Give the source's items the time they were read as their event time.

        In a streaming job that is the micro-batch's planned time, the same
        when a batch is replayed, so results stay exact.
        """
        self._timestamps(Timestamps(None, lag_ms(allowed_lag_ms), idle_ms(idle_timeout_ms)))
        return self

    def without_timestamps(self) -> Stage:
        """The source's items have no event time (the default): no windows downstream."""
        self._timestamps(None)
        return self

    def _timestamps(self, timestamps: Timestamps | None) -> None:
        spec = self._node.spec
        if not isinstance(spec, SourceSpec):
            raise PipelineDefinitionError(
                f"stage '{self.name}' is a {self._node.op} stage: timestamps are given to a "
                "source stage (right after read_from()), as Jet's withTimestamps()",
                self.name,
            )
        self._node.spec = dataclasses.replace(spec, timestamps=timestamps)

    def window(self, definition: WindowDefinition) -> WindowedStage:
        """Cut the items' event time into windows.

        Chain ``group_by(...).aggregate()`` or ``aggregate()``. The items need
        timestamps from their source (``with_timestamps()``).
        """
        if not isinstance(definition, WindowDefinition):
            raise PipelineDefinitionError(
                f"window() after stage '{self.name}' takes a WindowDefinition "
                f"(WindowDefinition.tumbling/sliding/session), got {definition!r}",
                self.name,
            )
        return WindowedStage(self, definition)

    def group_by(self, key_fn: Callable[[Any], Any]) -> GroupedStage:
        """Group items by ``key_fn(item)``.

        Chain ``aggregate()`` (emits ``(key, result)``) or ``apply()``; used
        directly, the grouped stage emits ``(key, [items])``. Keys group as
        in a dict: ``1``, ``1.0`` and ``True`` are one key.
        """
        return GroupedStage(self, self._fn("group_by", key_fn))

    def aggregate(
        self,
        operation: AggregateOperation | None = None,
        *,
        accumulator: Callable[[Any, Any], Any] | None = None,
        initial: Any = None,
        combiner: Callable[[Any, Any], Any] | None = None,
        finisher: Callable[[Any], Any] | None = None,
    ) -> Stage:
        """Aggregate all items into one result."""
        op = operation_of(self.name, operation, accumulator, initial, combiner, finisher)
        return Stage(self._add(AggregateSpec(op)))

    def distinct(
        self, key_fn: Callable[[Any], Any] | None = None, *, ttl_millis: int | None = None
    ) -> Stage:
        """Keep the first item of each group of equal items (or of equal ``key_fn(item)``).

        Equality is Python's ``==``: dicts, lists and sets compare by value. In
        a streaming job the stage remembers every key it has seen; with
        ``ttl_millis`` a key is forgotten that long after it was last seen (a
        later equal item passes again), which bounds the state. Batch jobs see
        all items at once and ignore ``ttl_millis``.
        """
        if key_fn is not None:
            self._fn("distinct", key_fn)
        return Stage(self._add(DistinctSpec(key_fn, ttl_ms(ttl_millis))))

    def sort(self, key_fn: Callable[[Any], Any] | None = None, reverse: bool = False) -> Stage:
        """Order items as ``sorted(items, key=key_fn, reverse=reverse)`` would (stable)."""
        if key_fn is not None:
            self._fn("sort", key_fn)
        if not isinstance(reverse, bool):
            raise PipelineDefinitionError(f"sort(reverse=) must be a bool, got {reverse!r}")
        return Stage(self._add(SortSpec(key_fn, reverse)))

    def merge(self, other: Stage) -> Stage:
        """Emit this stage's items followed by ``other``'s (order kept in batch jobs)."""
        candidate: object = other  # typed as Stage, but users pass anything
        if isinstance(candidate, SinkStage):
            raise PipelineDefinitionError(
                f"cannot merge sink stage '{other.name}': a sink must be the last stage",
                other.name,
            )
        if not isinstance(other, Stage):
            raise PipelineDefinitionError(f"merge() takes a stage, got {other!r}", self.name)
        if other._node.pipeline is not self._node.pipeline:
            raise PipelineDefinitionError(
                f"cannot merge stage '{other.name}' from another pipeline into '{self.name}'",
                self.name,
            )
        return Stage(self._add(MergeSpec(), other._node))

    def write_to(self, sink: Sink) -> SinkStage:
        """End this branch in ``sink``."""
        from sparkjet.core.host.contracts.base_classes import Sink

        if not isinstance(sink, Sink):
            raise PipelineDefinitionError(
                f"write_to() after stage '{self.name}' takes a sink (a sparkjet.plugin.Sink), "
                f"got {sink!r}",
                self.name,
            )
        described = sink.describe()
        default = (
            f"to-{described.replace(':', '(', 1)})" if ":" in described else f"to-{described}"
        )
        node = self._add(SinkSpec(sink), default_name=default)
        return SinkStage(node)


class GroupedStage(Stage, CoGroupMethods):
    """Items grouped by key: ``aggregate()``, ``apply()``, or a stage of ``(key, [items])``."""

    def __init__(self, upstream: Stage, key_fn: Callable[[Any], Any]) -> None:
        self._upstream = upstream
        self._key_fn = key_fn
        self._materialized: Transform | None = None
        self._pending_name: str | None = None

    @property
    def name(self) -> str:
        """The name the grouped stage gets (set with ``set_name``, else generated)."""
        if self._materialized is not None:
            return self._materialized.name
        return self._pending_name or "group-by"

    def set_name(self, name: str) -> GroupedStage:
        """Name the stage this grouping becomes (its ``aggregate()``/``apply()``)."""
        validated = validate_stage_name(name)
        if self._materialized is not None:
            self._materialized.explicit_name = validated
        else:
            self._pending_name = validated
        return self

    def _named(self, node: Transform) -> Transform:
        if self._pending_name is not None:
            node.explicit_name = self._pending_name
        return node

    @property
    def _node(self) -> Transform:
        # Used as a plain stage: (key, [items]) through the to_list aggregation.
        if self._materialized is None:
            from sparkjet.core.pipeline.aggregation import to_list

            self._materialized = self._named(self._upstream._add(
                GroupAggregateSpec(self._key_fn, to_list()), default_name="group-by",
            ))
        return self._materialized

    @_node.setter
    def _node(self, value: Transform) -> None:
        self._materialized = value

    def aggregate(
        self,
        operation: AggregateOperation | None = None,
        *,
        accumulator: Callable[[Any, Any], Any] | None = None,
        initial: Any = None,
        combiner: Callable[[Any, Any], Any] | None = None,
        finisher: Callable[[Any], Any] | None = None,
    ) -> Stage:
        """Aggregate each key's items; emits ``(key, result)`` per key."""
        op = operation_of(self._upstream.name, operation, accumulator, initial, combiner, finisher)
        node = self._upstream._add(
            GroupAggregateSpec(self._key_fn, op), default_name="group-aggregate",
        )
        return Stage(self._named(node))

    def map_stateful(
        self,
        create_fn: Callable[[], Any],
        map_fn: Callable[[Any, Any, Any], Any],
        *,
        ttl_millis: int | None = None,
    ) -> Stage:
        """Jet's ``mapStateful``: per key, a state object and a function of it.

        ``create_fn()`` makes a key's state when the key is first seen;
        ``map_fn(state, key, item)`` runs for each of the key's items in
        encounter order, may change ``state`` in place, and returns the item to
        emit (``None`` emits nothing). In a streaming job the state lives in
        the job's checkpoint; with ``ttl_millis`` a key's state is dropped that
        long after its last item.
        """
        for label, fn in (("create_fn", create_fn), ("map_fn", map_fn)):
            if not callable(fn):
                raise PipelineDefinitionError(
                    f"map_stateful() after stage '{self._upstream.name}': {label} must be "
                    f"callable, got {fn!r}",
                    self._upstream.name,
                )
        node = self._upstream._add(
            MapStatefulSpec(self._key_fn, create_fn, map_fn, ttl_ms(ttl_millis)),
            default_name="map-stateful",
        )
        return Stage(self._named(node))

    def apply(self, transform: StatefulTransform) -> Stage:
        """Run a keyed :class:`~sparkjet.plugin.StatefulTransform` over each key's items."""
        from sparkjet.core.host.contracts.base_classes import StatefulTransform

        if not isinstance(transform, StatefulTransform):
            raise PipelineDefinitionError(
                f"apply() takes a sparkjet.plugin.StatefulTransform, got {transform!r}",
                self._upstream.name,
            )
        node = self._upstream._add(
            GroupApplySpec(self._key_fn, transform), default_name=transform.kind,
        )
        return Stage(self._named(node))


class WindowedStage:
    """Items cut into windows: ``group_by(key_fn).aggregate(op)`` or ``aggregate(op)``."""

    def __init__(self, upstream: Stage, definition: WindowDefinition) -> None:
        self._upstream = upstream
        self.definition = definition

    def group_by(self, key_fn: Callable[[Any], Any]) -> WindowedGroupedStage:
        """Aggregate each key's items per window (emits ``KeyedWindowResult``)."""
        return WindowedGroupedStage(self, self._upstream._fn("group_by", key_fn))

    def aggregate(
        self,
        operation: AggregateOperation | None = None,
        *,
        accumulator: Callable[[Any, Any], Any] | None = None,
        initial: Any = None,
        combiner: Callable[[Any, Any], Any] | None = None,
        finisher: Callable[[Any], Any] | None = None,
    ) -> Stage:
        """Aggregate all items per window (emits ``WindowResult``)."""
        op = operation_of(self._upstream.name, operation, accumulator, initial, combiner, finisher)
        return Stage(self._node(None, op, None))

    def _node(
        self, key_fn: Callable[[Any], Any] | None, op: AggregateOperation, name: str | None
    ) -> Transform:
        node = self._upstream._add(
            WindowSpec(key_fn, op, self.definition),
            default_name=f"{self.definition.kind}-window",
        )
        if name is not None:
            node.explicit_name = name
        return node


class WindowedGroupedStage(CoGroupMethods):
    """Windowed items grouped by key: ``aggregate(op)`` emits ``KeyedWindowResult``."""

    def __init__(self, windowed: WindowedStage, key_fn: Callable[[Any], Any]) -> None:
        self._windowed = windowed
        self._key_fn = key_fn
        self._name: str | None = None

    def set_name(self, name: str) -> WindowedGroupedStage:
        """Name the stage ``aggregate()`` makes (its state is matched by it on upgrades)."""
        self._name = validate_stage_name(name)
        return self

    def aggregate(
        self,
        operation: AggregateOperation | None = None,
        *,
        accumulator: Callable[[Any, Any], Any] | None = None,
        initial: Any = None,
        combiner: Callable[[Any, Any], Any] | None = None,
        finisher: Callable[[Any], Any] | None = None,
    ) -> Stage:
        """Aggregate each key's items per window.

        Emits ``KeyedWindowResult(start, end, key, result, is_early)``.
        """
        upstream = self._windowed._upstream
        op = operation_of(upstream.name, operation, accumulator, initial, combiner, finisher)
        return Stage(self._windowed._node(self._key_fn, op, self._name))

    def _cogroup(
        self,
        method: str,
        others: Sequence[CoGroupMethods],
        ops: Sequence[AggregateOperation],
        wrap: Callable[[tuple[Any, ...]], Any],
    ) -> Stage:
        """A co-group per window: emits ``KeyedWindowResult`` whose result is ``wrap(results)``."""
        merged = cogroup_merge(method, GroupedStage(self._windowed._upstream, self._key_fn),
                               others, ops)
        spec = WindowSpec(cogroup_key, co_aggregate(tuple(ops), wrap), self._windowed.definition)
        node = merged._add(spec, default_name=f"{self._windowed.definition.kind}-window")
        if self._name is not None:
            node.explicit_name = self._name
        return Stage(node)


class SinkStage(_Handle):
    """The end of a branch. A sink has no downstream stages."""

    def set_name(self, name: str) -> SinkStage:
        """Name this sink stage."""
        super().set_name(name)
        return self

    def __getattr__(self, attr: str) -> Any:
        if attr in Stage.__dict__ or attr in ("group_by", "aggregate"):
            raise PipelineDefinitionError(
                f"stage '{self.name}' is a sink: a sink must be the last stage of its branch, "
                f"so it has no {attr}()",
                self.name,
            )
        raise AttributeError(attr)
