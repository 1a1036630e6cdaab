"""Aggregate operations: the four functions of an aggregation and the built-in ones.

The public face, with the contract of each function, is :mod:`sparkjet.aggregate`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), frozenset)


def _identity(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class AggregateOperation:
    """The four functions of an aggregation; see the module docstring."""

    create: Callable[[], Any]
    accumulate: Callable[[Any, Any], Any]
    combine: Callable[[Any, Any], Any] | None = None
    finish: Callable[[Any], Any] = _identity
    #: A short name for messages and ``repr``.
    name: str = "aggregate"
    #: For built-ins only: ``("count", None)`` or ``("sum", get_value)``, which the
    #: runtime compiles into its loop instead of calling ``accumulate`` per item.
    #: Must mean exactly what ``accumulate`` does.
    inline: tuple[str, Callable[[Any], Any] | None] | None = None
    #: ``deduct(acc, other)`` undoes ``combine(acc, other)`` (Jet's ``deductFn``):
    #: a sliding window then moves from one window to the next by adding the
    #: newest frame and deducting the oldest, instead of combining all its
    #: frames. Optional; ``finish`` must not return the accumulator itself when set.
    deduct: Callable[[Any, Any], Any] | None = None

    @classmethod
    def of(
        cls,
        accumulator: Callable[[Any, Any], Any],
        initial: Any = None,
        combiner: Callable[[Any, Any], Any] | None = None,
        finisher: Callable[[Any], Any] | None = None,
    ) -> AggregateOperation:
        """Build an operation from the Jet-Python style ``aggregate()`` keywords.

        Each key starts from its own deep copy of ``initial``, so a mutable
        initial value (``[]``, ``{}``) is never shared between keys.
        """
        return cls(
            create=_initial_factory(initial),
            accumulate=accumulator,
            combine=combiner,
            finish=finisher if finisher is not None else _identity,
        )


def _initial_factory(initial: Any) -> Callable[[], Any]:
    if _is_immutable(initial):
        return lambda: initial
    return lambda: copy.deepcopy(initial)


def _is_immutable(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_is_immutable(v) for v in value)
    return isinstance(value, _IMMUTABLE)


def counting() -> AggregateOperation:
    """Count the items."""
    return AggregateOperation(
        create=lambda: 0,
        accumulate=lambda acc, _item: acc + 1,
        combine=lambda a, b: a + b,
        name="counting",
        inline=("count", None),
        deduct=lambda a, b: a - b,
    )


def summing(get_value: Callable[[Any], Any] = _identity) -> AggregateOperation:
    """Sum ``get_value(item)`` over the items (0 for none)."""
    return AggregateOperation(
        create=lambda: 0,
        accumulate=lambda acc, item: acc + get_value(item),
        combine=lambda a, b: a + b,
        name="summing",
        inline=("sum", get_value),
        deduct=lambda a, b: a - b,
    )


def averaging(get_value: Callable[[Any], Any] = _identity) -> AggregateOperation:
    """Arithmetic mean of ``get_value(item)``; ``None`` when there are no items."""

    def accumulate(acc: list[Any], item: Any) -> list[Any]:
        acc[0] += get_value(item)
        acc[1] += 1
        return acc

    return AggregateOperation(
        create=lambda: [0, 0],
        accumulate=accumulate,
        combine=lambda a, b: [a[0] + b[0], a[1] + b[1]],
        finish=lambda acc: acc[0] / acc[1] if acc[1] else None,
        name="averaging",
        deduct=lambda a, b: [a[0] - b[0], a[1] - b[1]],
    )


def _extreme_by(key_fn: Callable[[Any], Any], want_max: bool, name: str) -> AggregateOperation:
    # The accumulator is None (no item yet) or (key, item); the first of equal
    # items wins, as with Python's min()/max().
    def better(candidate_key: Any, best_key: Any) -> bool:
        return bool(candidate_key > best_key if want_max else candidate_key < best_key)

    def accumulate(acc: Any, item: Any) -> Any:
        key = key_fn(item)
        if acc is None or better(key, acc[0]):
            return (key, item)
        return acc

    def combine(left: Any, right: Any) -> Any:
        if right is None:
            return left
        if left is None or better(right[0], left[0]):
            return right
        return left

    return AggregateOperation(
        create=lambda: None,
        accumulate=accumulate,
        combine=combine,
        finish=lambda acc: None if acc is None else acc[1],
        name=name,
    )


def min_by(key_fn: Callable[[Any], Any] = _identity) -> AggregateOperation:
    """The item with the smallest ``key_fn(item)`` (the first one on ties); ``None`` if empty."""
    return _extreme_by(key_fn, want_max=False, name="min_by")


def max_by(key_fn: Callable[[Any], Any] = _identity) -> AggregateOperation:
    """The item with the largest ``key_fn(item)`` (the first one on ties); ``None`` if empty."""
    return _extreme_by(key_fn, want_max=True, name="max_by")


def _append(acc: list[Any], item: Any) -> list[Any]:
    acc.append(item)
    return acc


def _extend(left: list[Any], right: list[Any]) -> list[Any]:
    left.extend(right)
    return left


def to_list() -> AggregateOperation:
    """All items, in encounter order."""
    return AggregateOperation(
        create=list, accumulate=_append, combine=_extend, name="to_list"
    )


def _add(acc: set[Hashable], item: Hashable) -> set[Hashable]:
    acc.add(item)
    return acc


def _union(left: set[Hashable], right: set[Hashable]) -> set[Hashable]:
    left |= right
    return left


def to_set() -> AggregateOperation:
    """The set of items (items must be hashable)."""
    return AggregateOperation(create=set, accumulate=_add, combine=_union, name="to_set")


# --- co-groups: one accumulator per input, items tagged by their input ----------------------


@dataclass(frozen=True)
class _CoCreate:
    ops: tuple[AggregateOperation, ...]

    def __call__(self) -> list[Any]:
        return [op.create() for op in self.ops]


@dataclass(frozen=True)
class CoAccumulate:
    """A co-group's ``accumulate``: each tagged item into its input's accumulator."""

    ops: tuple[AggregateOperation, ...]

    def __call__(self, acc: list[Any], tagged: tuple[int, Any, Any]) -> list[Any]:
        tag, _key, item = tagged
        acc[tag] = self.ops[tag].accumulate(acc[tag], item)
        return acc


@dataclass(frozen=True)
class _CoPairwise:
    """``combine`` or ``deduct`` of every input's accumulator with its counterpart."""

    fns: tuple[Callable[[Any, Any], Any], ...]

    def __call__(self, left: list[Any], right: list[Any]) -> list[Any]:
        return [fn(a, b) for fn, a, b in zip(self.fns, left, right, strict=True)]


@dataclass(frozen=True)
class _CoFinish:
    ops: tuple[AggregateOperation, ...]
    wrap: Callable[[tuple[Any, ...]], Any]

    def __call__(self, acc: list[Any]) -> Any:
        return self.wrap(tuple(op.finish(a) for op, a in zip(self.ops, acc, strict=True)))


def cogroup_key(tagged: tuple[int, Any, Any]) -> Any:
    """The key of a co-group's tagged item ``(input, key, item)``."""
    return tagged[1]


def co_aggregate(
    operations: tuple[AggregateOperation, ...],
    wrap: Callable[[tuple[Any, ...]], Any] = tuple,
) -> AggregateOperation:
    """One operation over items tagged ``(input, key, item)``: each input's ``operations[input]``.

    Its result is ``wrap((result0, result1, ...))``. It combines (and
    deducts) when every input's operation does.
    """
    combines = [op.combine for op in operations]
    deducts = [op.deduct for op in operations]
    return AggregateOperation(
        create=_CoCreate(operations),
        accumulate=CoAccumulate(operations),
        combine=_CoPairwise(tuple(combines)) if all(c is not None for c in combines) else None,  # type: ignore[arg-type]
        finish=_CoFinish(operations, wrap),
        name="co_aggregate(" + ", ".join(op.name for op in operations) + ")",
        deduct=_CoPairwise(tuple(deducts)) if all(d is not None for d in deducts) else None,  # type: ignore[arg-type]
    )
