"""When each key of a range is next due: an index of keys by due time (a timer service).

A windowed stage's key is due when the watermark reaches its next window
end or session end; so that a watermark step costs the windows that close,
not the keys held, a range keeps its keys filed by due time in a
:class:`DueIndex` (Flink's timer service, Jet's deadline map).

The index is *lazy*: it keeps no map from key to due time, so filing a key
again under a new time leaves its old entry in place, and a key dropped from
the state stays filed. Whoever pops a key checks it against the key's real
state: processes it when it is due, files it anew or drops it. What the
index promises is only that a key with something due at ``t`` is filed at
``t`` or earlier. Due times are window ends (multiples of the slide) and
session ends, so buckets are few and large.

The index goes into the range's state files (:mod:`sparkjet.core.state.files`):
a full copy holds :meth:`DueIndex.to_state`, a changelog the
:meth:`DueIndex.changes` since the last file, which a reader replays with
:meth:`DueIndex.apply_changes`.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Callable, Hashable, Iterable
from typing import Any

__all__ = ["DueIndex", "ready_index"]


class DueIndex:
    """Keys by the time they are next due; see the module docstring.

    ``of`` names what the due times were computed for (a window definition):
    an index of another definition is rebuilt, not trusted.
    """

    __slots__ = ("_buckets", "_heap", "_recent", "_upto", "of", "synced")

    def __init__(self, of: str = "") -> None:
        self.of = of
        #: Whether the index follows the state it is kept with (not just as read
        #: from a file): only such an index is written back.
        self.synced = False
        self._buckets: dict[int, set[Hashable]] = {}
        self._heap: list[int] = []
        #: Keys filed since :meth:`changes` last ran, each with its last due time.
        self._recent: dict[Hashable, int] = {}
        #: The highest time popped since :meth:`changes` last ran (None: none).
        self._upto: int | None = None

    def nbytes(self) -> int:
        """The bytes the index's own containers take (its keys are the state's)."""
        return (sys.getsizeof(self._buckets) + sys.getsizeof(self._heap)
                + sys.getsizeof(self._recent)
                + sum(sys.getsizeof(bucket) for bucket in self._buckets.values()))

    def add(self, key: Hashable, due: int) -> None:
        """File ``key`` under ``due`` (an earlier entry of it stays: lazy deletion)."""
        bucket = self._buckets.get(due)
        if bucket is None:
            self._buckets[due] = {key}
            heapq.heappush(self._heap, due)
        else:
            bucket.add(key)
        self._recent[key] = due

    def pop_due(self, upto: int) -> list[Hashable]:
        """Remove and return the keys filed at ``upto`` or earlier, each once, earliest first."""
        heap, buckets = self._heap, self._buckets
        if not heap or heap[0] > upto:
            return []
        self._upto = upto if self._upto is None else max(self._upto, upto)
        out: dict[Hashable, None] = {}
        while heap and heap[0] <= upto:
            out.update(dict.fromkeys(buckets.pop(heapq.heappop(heap))))
        return list(out)

    def next_due(self) -> int | None:
        """The earliest time a key is filed under (None: the index is empty)."""
        return self._heap[0] if self._heap else None

    def __len__(self) -> int:
        """The entries filed (a key filed twice counts twice)."""
        return sum(len(b) for b in self._buckets.values())

    def entries(self) -> Iterable[tuple[int, Hashable]]:
        """Every ``(due, key)`` entry, in no particular order."""
        for due, keys in self._buckets.items():
            for key in keys:
                yield due, key

    def to_state(self) -> dict[str, Any]:
        """The index as plain data, for a full state file: ``{"for", "buckets": {t: [keys]}}``."""
        return {"for": self.of, "buckets": {t: list(keys) for t, keys in self._buckets.items()}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> DueIndex:
        """The index :meth:`to_state` gave (not :attr:`synced`: its state is the file's)."""
        index = cls(state["for"])
        index._buckets = {int(t): set(keys) for t, keys in state["buckets"].items()}
        index._heap = sorted(index._buckets)
        return index

    def changes(self) -> dict[str, Any]:
        """What changed since the last call, for a changelog: ``{"upto", "due": {key: t}}``.

        ``upto``: the buckets at or before it were popped (None: none were);
        ``due``: the keys filed since, each under its last time.
        """
        out = {"upto": self._upto, "due": self._recent}
        self._recent, self._upto = {}, None
        return out

    def apply_changes(self, changes: dict[str, Any]) -> None:
        """Replay :meth:`changes` of a changelog on the index as of the file before it."""
        upto = changes["upto"]
        if upto is not None:
            self.pop_due(upto)
        for key, due in changes["due"].items():
            self.add(key, due)
        self._recent, self._upto = {}, None


def ready_index(
    timers: dict[str, DueIndex],
    name: str,
    of: str,
    values: dict[Any, Any],
    due_of: Callable[[Any], int | None],
) -> DueIndex:
    """``timers[name]`` ready for a batch: rebuilt where missing or kept for another ``of``.

    A rebuild files every key of ``values`` (``group key -> (key, state)``)
    at ``due_of(state)`` (None: not at all); O(keys), once.
    """
    index = timers.get(name)
    if index is None or index.of != of:
        index = DueIndex(of)
        for group_key, (_key, state) in values.items():
            due = due_of(state)
            if due is not None:
                index.add(group_key, due)
        index.changes()  # a reader without this index rebuilds it just the same
        timers[name] = index
    index.synced = True
    return index
