"""The join methods of a stage (``hash_join`` and friends) and the hash join builder.

:class:`JoinMethods` is a base of :class:`~.builder.Stage`: each method adds
one :class:`~.specs.HashJoinSpec` node whose first input is the stage and
whose other inputs are the build stages, one :class:`JoinClause` each. The
semantics are :mod:`sparkjet.core.pipeline.joins`'; what a streaming job
allows as a build side is the planner's to check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from sparkjet.core.errors import PipelineDefinitionError
from sparkjet.core.pipeline.graph.specs import HashJoinSpec
from sparkjet.core.pipeline.joins import ItemsByTag, JoinClause, Tag


class JoinMethods:
    """``hash_join``, ``inner_hash_join``, ``hash_join2``, ``inner_hash_join2``, the builder.

    A base of :class:`~.builder.Stage`, which gives the node (``_node``), its
    ``name``, ``_add`` (a node downstream) and ``_wrap`` (a node's handle).
    """

    if TYPE_CHECKING:
        _node: Any

        @property
        def name(self) -> str: ...

        def _add(self, spec: Any, *inputs: Any, default_name: str | None = None) -> Any: ...

        def _wrap(self, node: Any) -> Self: ...

    def hash_join(
        self, other: JoinMethods, clause: JoinClause, map_fn: Callable[[Any, Any], Any]
    ) -> Self:
        """Enrich each item from the bounded stage ``other``: Jet's ``hashJoin``.

        ``other`` is read in full first and kept as a table keyed by
        ``clause.right_key``; each item emits ``map_fn(item, match)`` for each
        build item whose key equals ``clause.left_key(item)`` (as dict keys
        are equal), in ``other``'s order, and ``map_fn(item, None)`` when none
        does (a left outer join). A ``None`` output is dropped.
        """
        return self._join("hash_join", [(other, clause)], map_fn, inner=False)

    def inner_hash_join(
        self, other: JoinMethods, clause: JoinClause, map_fn: Callable[[Any, Any], Any]
    ) -> Self:
        """:meth:`hash_join`, dropping the items ``other`` has no match for."""
        return self._join("inner_hash_join", [(other, clause)], map_fn, inner=True)

    def hash_join2(
        self,
        other1: JoinMethods,
        clause1: JoinClause,
        other2: JoinMethods,
        clause2: JoinClause,
        map_fn: Callable[[Any, Any, Any], Any],
    ) -> Self:
        """Enrich each item from two bounded stages: ``map_fn(item, match1, match2)``.

        Left outer on both sides (``None`` for a side with no match); several
        matches give every combination, ``other1``'s order outermost.
        """
        return self._join("hash_join2", [(other1, clause1), (other2, clause2)], map_fn,
                          inner=False)

    def inner_hash_join2(
        self,
        other1: JoinMethods,
        clause1: JoinClause,
        other2: JoinMethods,
        clause2: JoinClause,
        map_fn: Callable[[Any, Any, Any], Any],
    ) -> Self:
        """:meth:`hash_join2`, dropping the items either side has no match for."""
        return self._join("inner_hash_join2", [(other1, clause1), (other2, clause2)], map_fn,
                          inner=True)

    def map_using_map(
        self, map_name: str, key_fn: Callable[[Any], Any], map_fn: Callable[[Any, Any], Any]
    ) -> Self:
        """Look each item up in the store's map ``map_name``: Jet's ``mapUsingIMap``.

        Emits ``map_fn(item, value)``, ``value`` being the map's value for
        ``key_fn(item)`` (``None`` if the map has none); a ``None`` output is
        dropped. The map is read as the job starts (and anew when it resumes
        or restarts), as a hash join's build side is: a hash join against
        ``Pipeline.from_map(map_name)`` with ``JoinClause.join_map_entries``.
        """
        from sparkjet.core.host.manager import PluginHost
        from sparkjet.core.host.plugin_info import Category

        if not isinstance(map_name, str) or not map_name:
            raise PipelineDefinitionError(
                f"map_using_map() after stage '{self.name}' takes a map's name, got "
                f"{map_name!r}", self.name)
        candidate: object = key_fn
        if not callable(candidate):
            raise PipelineDefinitionError(
                f"map_using_map() after stage '{self.name}' takes a key function, got "
                f"{key_fn!r}", self.name)
        source = PluginHost().lookup_kind(Category.SOURCE, "map").cls(map_name)
        table = self._wrap(self._node.pipeline.read_from(source)._node)
        return self._join("map_using_map", [(table, JoinClause.join_map_entries(key_fn))],
                          map_fn, inner=False)

    def hash_join_builder(self) -> HashJoinBuilder[Self]:
        """A join against any number of bounded stages: ``add()`` each, then ``build()``."""
        return HashJoinBuilder(self)

    def _join(
        self,
        method: str,
        sides: list[tuple[JoinMethods, JoinClause]],
        map_fn: Callable[..., Any],
        *,
        inner: bool,
        tagged: bool = False,
    ) -> Self:
        if not sides:
            raise PipelineDefinitionError(
                f"{method}() after stage '{self.name}' has no build side: add() one first",
                self.name)
        for other, clause in sides:
            candidate: object = other
            if not isinstance(candidate, JoinMethods) and hasattr(candidate, "_node"):
                raise PipelineDefinitionError(
                    f"{method}() after stage '{self.name}': '{other.name}' is a sink stage, and "
                    "a sink has no items to join against",
                    self.name)
            if not isinstance(candidate, JoinMethods):
                raise PipelineDefinitionError(
                    f"{method}() after stage '{self.name}' takes a stage to join against, got "
                    f"{other!r}",
                    self.name)
            if other._node.pipeline is not self._node.pipeline:
                raise PipelineDefinitionError(
                    f"{method}() after stage '{self.name}': stage '{other.name}' belongs to "
                    "another pipeline",
                    self.name)
            if other._node is self._node:
                raise PipelineDefinitionError(
                    f"{method}() after stage '{self.name}': a stage cannot be its own build "
                    "side; join it against a branch of its own (stage.map(...) of the same "
                    "input, or a second read_from())",
                    self.name)
            if not isinstance(clause, JoinClause):
                raise PipelineDefinitionError(
                    f"{method}() after stage '{self.name}' takes a JoinClause "
                    f"(JoinClause.on_keys(left_key, right_key)), got {clause!r}",
                    self.name)
        if not callable(map_fn):
            raise PipelineDefinitionError(
                f"{method}() after stage '{self.name}' takes a function making the output, "
                f"got {map_fn!r}",
                self.name)
        spec = HashJoinSpec(tuple(clause for _, clause in sides), map_fn, inner, tagged)
        node = self._add(spec, *(other._node for other, _ in sides),
                         default_name=method.replace("_", "-"))
        return self._wrap(node)


S = TypeVar("S", bound=JoinMethods)


class HashJoinBuilder(Generic[S]):
    """Jet's ``hashJoinBuilder``: a left outer hash join against any number of bounded stages.

    ::

        builder = orders.hash_join_builder()
        customer = builder.add(customers, JoinClause.on_keys(by_customer, by_id))
        product = builder.add(products, JoinClause.on_keys(by_product, by_id))
        enriched = builder.build(lambda order, found: (order, found.get(customer),
                                                       found.get(product)))

    ``build(map_fn)`` calls ``map_fn(item, items_by_tag)`` with an
    :class:`~sparkjet.core.pipeline.joins.ItemsByTag` holding one build item
    per side (``None`` where the side has no match).
    """

    def __init__(self, primary: S) -> None:
        self._primary = primary
        self._sides: list[tuple[JoinMethods, JoinClause]] = []

    def add(self, stage: JoinMethods, clause: JoinClause) -> Tag:
        """Add a build side; the tag finds its item in ``build()``'s ``ItemsByTag``."""
        self._sides.append((stage, clause))
        return Tag(len(self._sides) - 1)

    def build(self, map_fn: Callable[[Any, ItemsByTag], Any], *, inner: bool = False) -> S:
        """The join stage; with ``inner`` an item some side has no match for is dropped."""
        return self._primary._join("hash_join_builder", list(self._sides), map_fn,
                                   inner=inner, tagged=True)
