"""Key-group assignment: which key group a key belongs to, and which groups a state task owns.

Like Flink's ``KeyGroupRangeAssignment``: a keyed stage's state is split
into a fixed number of *key groups* (fixed for a checkpoint's life); a key
belongs to group ``stable_hash(key) % key_groups``, and the state tasks of a
micro-batch each own a contiguous range ``[lo, hi)`` of groups. The hash
must be the same in every process, so it never uses Python's seeded
``hash()`` of strings.
"""

from __future__ import annotations

import zlib
from typing import Any


def stable_hash(key: Any) -> int:
    """A hash that is the same in every process, whatever PYTHONHASHSEED says.

    Equal keys hash equally (``1``, ``1.0`` and ``True`` too): numbers use
    Python's numeric hash, which does not depend on the seed; strings and bytes
    use CRC-32; tuples and frozensets combine their elements. Other keys fall
    back to ``hash()``, which must then be stable across processes.
    """
    if key is None:
        return 0
    if isinstance(key, int | float | complex):
        return hash(key)
    if isinstance(key, str):
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if isinstance(key, bytes):
        return zlib.crc32(key) ^ 0x5BD1E995
    if isinstance(key, tuple):
        h = 0x345678
        for item in key:
            h = (h * 1000003) ^ stable_hash(item)
            h &= 0xFFFFFFFFFFFF
        return h
    if isinstance(key, frozenset):
        h = 0
        for item in key:
            h ^= stable_hash(item)
        return h
    return hash(key)


def key_group(key: Any, groups: int) -> int:
    """The key group a key belongs to: ``stable_hash(key) % groups``."""
    return stable_hash(key) % groups


def task_range(task: int, tasks: int, groups: int) -> tuple[int, int]:
    """The key groups ``[lo, hi)`` task ``task`` of ``tasks`` owns (contiguous, as in Flink)."""
    return (task * groups + tasks - 1) // tasks, ((task + 1) * groups + tasks - 1) // tasks


class KeyGroupPartition:
    """The state shuffle's partition function: a key goes to the task owning its key group.

    Key group ``g`` of ``groups`` belongs to task ``g * tasks // groups``, the
    inverse of :func:`task_range`. Spark's ``partitionBy(tasks, ...)`` takes
    the result modulo ``tasks``, which changes nothing.
    """

    def __init__(self, groups: int, tasks: int) -> None:
        self.groups, self.tasks = groups, tasks

    def __call__(self, key: Any) -> int:
        return (stable_hash(key) % self.groups) * self.tasks // self.groups
