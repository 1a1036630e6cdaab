"""Hash joins: the join clause users write, the tables built from a bounded side, the probe.

A hash join enriches each item of its *primary* stage (batch or stream) from
one or more bounded *build* stages, as Jet's ``hashJoin`` does:

- every build side is read in full, before the first primary item, into a
  :class:`Table`: its items grouped by ``clause.right_key(item)``, each
  stored as ``clause.project(item)``, in the side's order;
- each primary item is looked up by ``clause.left_key(item)`` in each
  table; keys match as in a dict (``1``, ``1.0`` and ``True`` are one key,
  ``None`` is a key);
- a key with several build items gives one output per match (per
  combination, with two or more sides), in the build side's order;
- a left outer join (the default) passes ``None`` for a side with no match;
  an inner join drops the item;
- an output of ``None`` is dropped, as Jet drops a null.

This module is the pure part: the clause, the table and the probe
(:class:`Joiner`). Where the tables are kept and how a task finds them is
:mod:`sparkjet.core.engine.tasks.tables`. Nothing here touches Spark.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ItemsByTag", "JoinClause", "Joiner", "Table", "Tag", "build_table"]


def _identity(item: Any) -> Any:
    return item


def _entry_key(entry: Any) -> Any:
    return entry[0]


def _entry_value(entry: Any) -> Any:
    return entry[1]


@dataclass(frozen=True, slots=True)
class JoinClause:
    """How a primary item finds its build items: Jet's ``JoinClause``.

    ``left_key(item)`` is the primary item's key, ``right_key(build_item)``
    a build item's; ``project(build_item)`` is what the join hands on of a
    matching build item (the item itself unless :meth:`projecting` says).
    """

    left_key: Callable[[Any], Any]
    right_key: Callable[[Any], Any]
    project: Callable[[Any], Any] = _identity

    @staticmethod
    def on_keys(left_key: Callable[[Any], Any], right_key: Callable[[Any], Any]) -> JoinClause:
        """Join where ``left_key(item) == right_key(build_item)`` (as dict keys are equal)."""
        given: tuple[tuple[str, object], ...] = (("left_key", left_key), ("right_key", right_key))
        for label, fn in given:
            if not callable(fn):
                from sparkjet.core.errors import PipelineDefinitionError

                raise PipelineDefinitionError(
                    f"JoinClause.on_keys(): {label} must be a function, got {fn!r}")
        return JoinClause(left_key, right_key)

    @staticmethod
    def join_map_entries(left_key: Callable[[Any], Any]) -> JoinClause:
        """Join against ``(key, value)`` entries (a ``from_map`` stage), handing on the value."""
        return JoinClause.on_keys(left_key, _entry_key).projecting(_entry_value)

    def projecting(self, project: Callable[[Any], Any]) -> JoinClause:
        """The same clause, handing on ``project(build_item)`` instead of the build item."""
        candidate: object = project
        if not callable(candidate):
            from sparkjet.core.errors import PipelineDefinitionError

            raise PipelineDefinitionError(
                f"JoinClause.projecting() takes a function, got {project!r}")
        return JoinClause(self.left_key, self.right_key, project)


@dataclass(frozen=True, slots=True)
class Tag:
    """Names one build side of a :meth:`hash_join_builder` join (its index among the sides)."""

    index: int

    def __repr__(self) -> str:
        return f"Tag({self.index})"


class ItemsByTag:
    """The build items one output of a builder join got, by the :class:`Tag` of their side."""

    __slots__ = ("_items",)

    def __init__(self, items: Sequence[Any]) -> None:
        self._items = tuple(items)

    def get(self, tag: Tag) -> Any:
        """The matching item of ``tag``'s side (None where a left outer join found none)."""
        if not isinstance(tag, Tag) or not 0 <= tag.index < len(self._items):
            raise KeyError(f"{tag!r} is not a side of this join ({len(self._items)} sides)")
        return self._items[tag.index]

    __getitem__ = get

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ItemsByTag) and other._items == self._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"ItemsByTag{self._items!r}"


#: A build side as the probe sees it: key -> the projected build items, in their order.
Table = Mapping[Any, list[Any]]


def build_table(items: Iterable[Any], clause: JoinClause) -> dict[Any, list[Any]]:
    """A build side's items grouped by ``clause.right_key``, each as ``clause.project(item)``.

    Raises what the functions raise; a TypeError for an unhashable key.
    """
    table: dict[Any, list[Any]] = {}
    key_of, project = clause.right_key, clause.project
    for item in items:
        key = key_of(item)
        found = table.get(key)
        if found is None:
            table[key] = [project(item)]
        else:
            found.append(project(item))
    return table


_NO_MATCH = [None]


class Joiner:
    """The probe of one join stage over its tables: ``joiner(item)`` is the list it emits.

    ``tables`` gives the build tables when first asked (on the task that
    probes, so a table is loaded where it is used); ``map_fn`` takes the
    item and one build item per side (or, with ``tagged``, the item and an
    :class:`ItemsByTag`).
    """

    __slots__ = ("_left", "_loaded", "_tables", "inner", "map_fn", "tagged")

    def __init__(
        self,
        left_keys: Sequence[Callable[[Any], Any]],
        tables: Callable[[], Sequence[Table]],
        map_fn: Callable[..., Any],
        *,
        inner: bool,
        tagged: bool = False,
    ) -> None:
        self._left = tuple(left_keys)
        self._tables = tables
        self._loaded: tuple[Table, ...] | None = None
        self.map_fn, self.inner, self.tagged = map_fn, inner, tagged

    def __call__(self, item: Any) -> list[Any]:
        tables = self._loaded
        if tables is None:
            tables = self._loaded = tuple(self._tables())
        miss = None if self.inner else _NO_MATCH
        if len(tables) == 1:
            found = tables[0].get(self._left[0](item), miss)
            if found is None:
                return []
            fn = self.map_fn
            if self.tagged:
                return [out for match in found
                        if (out := fn(item, ItemsByTag((match,)))) is not None]
            return [out for match in found if (out := fn(item, match)) is not None]
        sides = []
        for key_of, table in zip(self._left, tables, strict=True):
            found = table.get(key_of(item), miss)
            if found is None:
                return []
            sides.append(found)
        out_items = []
        for combination in itertools.product(*sides):
            out = (self.map_fn(item, ItemsByTag(combination)) if self.tagged
                   else self.map_fn(item, *combination))
            if out is not None:
                out_items.append(out)
        return out_items

    def __getstate__(self) -> Any:
        return (self._left, self._tables, self.map_fn, self.inner, self.tagged)

    def __setstate__(self, state: Any) -> None:
        self._left, self._tables, self.map_fn, self.inner, self.tagged = state
        self._loaded = None
