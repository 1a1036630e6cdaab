"""What each kind of pipeline node does: :class:`OpKind` and one frozen spec per kind.

A node's *spec* is a frozen dataclass whose fields are typed
(:class:`SourceSpec`, :class:`MapSpec`, ..., :class:`WindowSpec`); the
:data:`NodeSpec` union lists every kind, :data:`KeyedSpec` the keyed ones
and :data:`ErrorPolicySpec` those an error policy applies to. Code that runs
a node narrows its spec by kind (``isinstance(node.spec, SourceSpec)`` or
``match``) and reads the fields.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from sparkjet.core.pipeline.aggregation import AggregateOperation
from sparkjet.core.pipeline.joins import JoinClause
from sparkjet.core.pipeline.services import ServiceFactory
from sparkjet.core.pipeline.windows import Timestamps, WindowDefinition

if TYPE_CHECKING:
    from sparkjet.core.host.contracts.base_classes import Sink, Source, StatefulTransform


class OpKind(enum.StrEnum):
    """What a pipeline node does.

    A ``StrEnum`` so that a kind equals its name as a string (``OpKind.SINK ==
    "sink"``) and formats as it in stage names and messages.
    """

    SOURCE = "source"
    MAP = "map"
    FILTER = "filter"
    FLAT_MAP = "flat_map"
    PEEK = "peek"
    MERGE = "merge"
    HASH_JOIN = "hash_join"
    MAP_USING_SERVICE = "map_using_service"
    MAP_USING_SERVICE_ASYNC = "map_using_service_async"
    SINK = "sink"
    GROUP_AGGREGATE = "group_aggregate"
    GROUP_APPLY = "group_apply"
    MAP_STATEFUL = "map_stateful"
    DISTINCT = "distinct"
    AGGREGATE = "aggregate"
    SORT = "sort"
    WINDOW = "window_aggregate"
    INTERVAL_JOIN = "interval_join"


# --- node specs: what each kind of node does ----------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """``read_from(source)``: reads ``source``; its items have event time from ``timestamps``."""

    op: ClassVar[OpKind] = OpKind.SOURCE
    source: Source
    #: Set by ``with_timestamps()``/``with_ingestion_timestamps()``; None: no event time.
    timestamps: Timestamps | None = None


@dataclass(frozen=True, slots=True)
class StatelessSpec:
    """A stateless stage: ``fn`` applied per item (fused into one Python pass per partition)."""

    op: ClassVar[OpKind]
    fn: Callable[[Any], Any]
    #: The stage's own error policy (``on_error()``); None: the job's.
    on_error: str | None = None


@dataclass(frozen=True, slots=True)
class MapSpec(StatelessSpec):
    """``map(fn)``: emits ``fn(item)``."""

    op: ClassVar[OpKind] = OpKind.MAP


@dataclass(frozen=True, slots=True)
class FilterSpec(StatelessSpec):
    """``filter(fn)``: keeps the items ``fn`` is true for."""

    op: ClassVar[OpKind] = OpKind.FILTER


@dataclass(frozen=True, slots=True)
class FlatMapSpec(StatelessSpec):
    """``flat_map(fn)``: emits each element of ``fn(item)``."""

    op: ClassVar[OpKind] = OpKind.FLAT_MAP


@dataclass(frozen=True, slots=True)
class PeekSpec(StatelessSpec):
    """``peek(fn)``: logs ``fn(item)`` and passes the item on."""

    op: ClassVar[OpKind] = OpKind.PEEK


@dataclass(frozen=True, slots=True)
class MergeSpec:
    """``merge(other)``: the items of every input (the node's ``inputs``)."""

    op: ClassVar[OpKind] = OpKind.MERGE


@dataclass(frozen=True, slots=True)
class HashJoinSpec:
    """``hash_join(...)``: each item of the first input enriched from the other (build) inputs.

    One clause per build input, in order; ``map_fn(item, *build_items)``
    (``map_fn(item, ItemsByTag)`` with ``tagged``) makes the output. See
    :mod:`sparkjet.core.pipeline.joins` for the semantics.
    """

    op: ClassVar[OpKind] = OpKind.HASH_JOIN
    clauses: tuple[JoinClause, ...]
    map_fn: Callable[..., Any]
    #: Drop an item that a build side has no match for (else: ``None`` for that side).
    inner: bool = False
    #: ``map_fn`` takes the item and an ``ItemsByTag`` (the builder's form).
    tagged: bool = False


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """``map_using_service(factory, fn)``: emits ``fn(service, item)`` (``None``: nothing).

    The service is made by ``factory`` once per process, job and stage; see
    :mod:`sparkjet.core.pipeline.services`.
    """

    op: ClassVar[OpKind] = OpKind.MAP_USING_SERVICE
    factory: ServiceFactory
    fn: Callable[[Any, Any], Any]
    #: The stage's own error policy (``on_error()``); None: the job's.
    on_error: str | None = None


@dataclass(frozen=True, slots=True)
class AsyncServiceSpec(ServiceSpec):
    """``map_using_service_async(...)``: ``fn(service, item)`` returns an awaitable or a Future.

    At most ``max_concurrent_ops`` calls in flight per task; outputs in input
    order with ``preserve_order``, else as calls finish; a call taking longer
    than ``timeout_ms`` (None: no limit) fails as the stage's error.
    """

    op: ClassVar[OpKind] = OpKind.MAP_USING_SERVICE_ASYNC
    max_concurrent_ops: int = 4
    preserve_order: bool = True
    timeout_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SinkSpec:
    """``write_to(sink)``: the end of a branch."""

    op: ClassVar[OpKind] = OpKind.SINK
    sink: Sink


@dataclass(frozen=True, slots=True)
class GroupAggregateSpec:
    """``group_by(key_fn).aggregate(operation)`` (or a grouped stage used as is: ``to_list``)."""

    op: ClassVar[OpKind] = OpKind.GROUP_AGGREGATE
    key_fn: Callable[[Any], Any]
    operation: AggregateOperation


@dataclass(frozen=True, slots=True)
class GroupApplySpec:
    """``group_by(key_fn).apply(transform)``: a plugin's keyed stateful transform."""

    op: ClassVar[OpKind] = OpKind.GROUP_APPLY
    key_fn: Callable[[Any], Any]
    transform: StatefulTransform


@dataclass(frozen=True, slots=True)
class MapStatefulSpec:
    """``group_by(key_fn).map_stateful(create_fn, map_fn, ttl_millis=ttl_ms)``."""

    op: ClassVar[OpKind] = OpKind.MAP_STATEFUL
    key_fn: Callable[[Any], Any]
    create_fn: Callable[[], Any]
    map_fn: Callable[[Any, Any, Any], Any]
    ttl_ms: int | None = None


@dataclass(frozen=True, slots=True)
class DistinctSpec:
    """``distinct(key_fn, ttl_millis=ttl_ms)``; no ``key_fn``: items are their own keys."""

    op: ClassVar[OpKind] = OpKind.DISTINCT
    key_fn: Callable[[Any], Any] | None = None
    ttl_ms: int | None = None


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """``window(window)[.group_by(key_fn)].aggregate(operation)``; no ``key_fn``: unkeyed."""

    op: ClassVar[OpKind] = OpKind.WINDOW
    key_fn: Callable[[Any], Any] | None
    operation: AggregateOperation
    window: WindowDefinition
    #: The stage's own policy for late items (``on_error()``); None: the job's.
    on_error: str | None = None

    @property
    def keyed(self) -> bool:
        """Whether results are per key (``group_by``) or over all items."""
        return self.key_fn is not None


#: How an interval join treats an item the other input has no match for.
JOIN_HOWS = ("inner", "left", "right", "full")


@dataclass(frozen=True, slots=True)
class IntervalJoinSpec:
    """``a.group_by(k).interval_join(b.group_by(k2), lower, upper, map_fn, how=...)``.

    Its input is the co-group's merge of both inputs' items tagged ``(input,
    key, item)``; a pair is a left item at ``t`` and a right one at ``t2``
    with ``t + lower <= t2 <= t + upper``. ``how`` says which unmatched items
    are emitted, with ``None`` for the other side, once the watermark passes
    their bound.
    """

    op: ClassVar[OpKind] = OpKind.INTERVAL_JOIN
    key_fn: Callable[[Any], Any]
    lower: int
    upper: int
    map_fn: Callable[[Any, Any], Any]
    how: str = "inner"
    #: The stage's own policy for late items (``on_error()``); None: the job's.
    on_error: str | None = None


@dataclass(frozen=True, slots=True)
class AggregateSpec:
    """``aggregate(operation)`` over all items (batch jobs only)."""

    op: ClassVar[OpKind] = OpKind.AGGREGATE
    operation: AggregateOperation


@dataclass(frozen=True, slots=True)
class SortSpec:
    """``sort(key_fn, reverse)`` (batch jobs only); no ``key_fn``: items compare themselves."""

    op: ClassVar[OpKind] = OpKind.SORT
    key_fn: Callable[[Any], Any] | None = None
    reverse: bool = False


#: The keyed stages: map side, shuffle by key, reduce side per key; streaming jobs keep
#: their state per key (they are a snapshot's stateful stages).
KeyedSpec: TypeAlias = (
    GroupAggregateSpec | GroupApplySpec | MapStatefulSpec | DistinctSpec | WindowSpec
    | IntervalJoinSpec
)
#: The stages an error policy (``on_error()``) applies to: the stateless ones (an item
#: their function raises on), service calls (a call that fails or times out) and windows
#: (an item behind the watermark).
ErrorPolicySpec: TypeAlias = StatelessSpec | WindowSpec | IntervalJoinSpec | ServiceSpec
#: The stages whose work follows event time: a watermark per batch, late items, timers.
TimedSpec: TypeAlias = WindowSpec | IntervalJoinSpec
#: Every kind of node.
NodeSpec: TypeAlias = (
    SourceSpec | MapSpec | FilterSpec | FlatMapSpec | PeekSpec | MergeSpec | SinkSpec
    | KeyedSpec | AggregateSpec | SortSpec | HashJoinSpec | ServiceSpec
)


def state_ttl_ms(spec: KeyedSpec) -> int | None:
    """How long a keyed stage keeps a key's state after its last item (None: for ever)."""
    if isinstance(spec, MapStatefulSpec | DistinctSpec):
        return spec.ttl_ms
    return None
