"""Co-groups: ``aggregate2``, ``aggregate3`` and the aggregate builder of grouped stages.

Jet's ``aggregate2`` folds the items of two (or more) keyed stages into one
result per key: each input's items go through that input's aggregate
operation, and the stage emits ``(key, (result0, result1, ...))``. Here a
co-group is built from what a pipeline already has, so it runs wherever a
keyed aggregation runs (batch jobs, rolling in streams, windows):

- each input gets a stateless stage (``co-group-key``) tagging its items
  ``(input, key_fn(item), item)`` with the input's own key function;
- a merge brings the tagged items together (event time kept);
- one keyed aggregation groups them by key with
  :func:`~sparkjet.core.pipeline.aggregation.co_aggregate`: one
  accumulator per input, in that input's order.

Its state (in a stream) is the aggregation's, matched by its stage name on
upgrades like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sparkjet.core.errors import PipelineDefinitionError
from sparkjet.core.pipeline.aggregation import AggregateOperation, co_aggregate, cogroup_key
from sparkjet.core.pipeline.graph.specs import (
    JOIN_HOWS,
    GroupAggregateSpec,
    IntervalJoinSpec,
    MapSpec,
    MergeSpec,
)
from sparkjet.core.pipeline.joins import ItemsByTag, Tag

__all__ = ["AggregateBuilder", "CoGroupMethods", "CoGroupTagger", "cogroup_merge"]


@dataclass(frozen=True)
class CoGroupTagger:
    """The ``co-group-key`` stage of input ``tag``: ``item -> (tag, key_fn(item), item)``."""

    tag: int
    key_fn: Callable[[Any], Any]

    def __call__(self, item: Any) -> tuple[int, Any, Any]:
        return (self.tag, self.key_fn(item), item)


def _by_tag(results: tuple[Any, ...]) -> ItemsByTag:
    return ItemsByTag(results)


class CoGroupMethods:
    """``aggregate2``, ``aggregate3``, ``aggregate_builder``: a base of the grouped stage."""

    if TYPE_CHECKING:
        _upstream: Any
        _key_fn: Callable[[Any], Any]

        @property
        def name(self) -> str: ...

        def _named(self, node: Any) -> Any: ...

    def aggregate2(
        self, other: CoGroupMethods, op0: AggregateOperation, op1: AggregateOperation
    ) -> Any:
        """Co-group with another grouped stage: emits ``(key, (result0, result1))`` per key.

        This stage's items go through ``op0``, ``other``'s through ``op1``; a
        key only one side has gets the other's result of no items. Batch
        output is in order of each key's first item, this stage's items first.
        """
        return self._cogroup("aggregate2", [other], [op0, op1], tuple)

    def aggregate3(
        self,
        other1: CoGroupMethods,
        other2: CoGroupMethods,
        op0: AggregateOperation,
        op1: AggregateOperation,
        op2: AggregateOperation,
    ) -> Any:
        """Co-group with two other grouped stages: emits ``(key, (result0, result1, result2))``."""
        return self._cogroup("aggregate3", [other1, other2], [op0, op1, op2], tuple)

    def interval_join(
        self,
        other: CoGroupMethods,
        lower: int,
        upper: int,
        map_fn: Callable[[Any, Any], Any],
        *,
        how: str = "inner",
    ) -> Any:
        """Pair this stage's items with ``other``'s of the same key, close in event time.

        A pair is an item of this stage at ``t`` and one of ``other`` at
        ``t2`` with ``t + lower <= t2 <= t + upper`` (milliseconds, both
        bounds inclusive); it emits ``map_fn(item, other_item)`` once, in the
        micro-batch where the later of the two arrives. Both inputs need
        timestamps; the stage's watermark is the lower of theirs. ``how``:
        ``"inner"`` (pairs only), ``"left"``, ``"right"`` or ``"full"``
        (also ``map_fn(item, None)`` / ``map_fn(None, other_item)`` once for
        an item that matched nothing, when the watermark passes its bound).
        Late items are dropped and counted (``on_error("dead-letter")`` sets
        them aside); each key's buffered items are evicted as the
        watermark passes their bound. A ``None`` output is dropped.
        """
        where = self._upstream.name
        for label, bound in (("lower", lower), ("upper", upper)):
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise PipelineDefinitionError(
                    f"interval_join() after stage '{where}': {label} must be a whole number "
                    f"of milliseconds, got {bound!r}", where)
        if lower > upper:
            raise PipelineDefinitionError(
                f"interval_join() after stage '{where}': the bounds are the wrong way round "
                f"(lower {lower} > upper {upper}); pairs have t + lower <= t2 <= t + upper",
                where)
        if how not in JOIN_HOWS:
            raise PipelineDefinitionError(
                f"interval_join() after stage '{where}': how is one of "
                f"{', '.join(repr(h) for h in JOIN_HOWS)}, got {how!r}", where)
        candidate: object = map_fn
        if not callable(candidate):
            raise PipelineDefinitionError(
                f"interval_join() after stage '{where}' takes a function making the output, "
                f"got {map_fn!r}", where)
        merged = cogroup_merge("interval_join", self, [other], [])
        node = merged._add(IntervalJoinSpec(cogroup_key, lower, upper, map_fn, how),
                           default_name="interval-join")
        return merged._wrap(self._named(node))

    def aggregate_builder(self, op0: AggregateOperation) -> AggregateBuilder[Any]:
        """A co-group of any number of grouped stages; this one's items go through ``op0``."""
        return AggregateBuilder(self, op0)

    def _cogroup(
        self,
        method: str,
        others: Sequence[CoGroupMethods],
        ops: Sequence[AggregateOperation],
        wrap: Callable[[tuple[Any, ...]], Any],
    ) -> Any:
        merged = cogroup_merge(method, self, others, ops)
        spec = GroupAggregateSpec(cogroup_key, co_aggregate(tuple(ops), wrap))
        node = merged._add(spec, default_name=method.replace("_", "-"))
        return merged._wrap(self._named(node))


def cogroup_merge(
    method: str,
    first: CoGroupMethods,
    others: Sequence[CoGroupMethods],
    ops: Sequence[AggregateOperation],
) -> Any:
    """The merged, tagged items of ``first`` and ``others`` (a stage); refuses bad inputs."""
    where = first._upstream.name
    for other in others:
        candidate: object = other
        if not isinstance(candidate, CoGroupMethods):
            raise PipelineDefinitionError(
                f"{method}() after stage '{where}' co-groups with grouped stages "
                f"(stage.group_by(key_fn)), got {other!r}",
                where)
        if other._upstream._node.pipeline is not first._upstream._node.pipeline:
            raise PipelineDefinitionError(
                f"{method}() after stage '{where}': stage '{other._upstream.name}' belongs to "
                "another pipeline",
                where)
    for op in ops:
        if not isinstance(op, AggregateOperation):
            raise PipelineDefinitionError(
                f"{method}() after stage '{where}' takes an AggregateOperation per input, "
                f"got {op!r}",
                where)
    tagged = [side._upstream._wrap(side._upstream._add(
        MapSpec(CoGroupTagger(tag, side._key_fn)), default_name="co-group-key"))
        for tag, side in enumerate([first, *others])]
    return tagged[0]._wrap(tagged[0]._add(MergeSpec(), *(t._node for t in tagged[1:]),
                                          default_name="co-group-merge"))


S = TypeVar("S")


class AggregateBuilder(Generic[S]):
    """Jet's ``aggregateBuilder``: a co-group of any number of grouped stages.

    ::

        builder = clicks.group_by(by_user).aggregate_builder(counting())
        clicks_tag = builder.tag0()
        buys_tag = builder.add(buys.group_by(by_user), summing(amount))
        per_user = builder.build()   # (user, ItemsByTag): found.get(buys_tag) ...
    """

    def __init__(self, first: CoGroupMethods, op0: AggregateOperation) -> None:
        self._first = first
        self._sides: list[tuple[CoGroupMethods, AggregateOperation]] = []
        self._op0 = op0

    def tag0(self) -> Tag:
        """The tag of the first input's result."""
        return Tag(0)

    def add(self, stage: CoGroupMethods, operation: AggregateOperation) -> Tag:
        """Add a grouped stage whose items go through ``operation``; its result's tag."""
        self._sides.append((stage, operation))
        return Tag(len(self._sides))

    def build(self) -> Any:
        """The co-group stage: emits ``(key, ItemsByTag)`` per key."""
        return self._first._cogroup(
            "aggregate_builder", [s for s, _ in self._sides],
            [self._op0, *(op for _, op in self._sides)], _by_tag)
