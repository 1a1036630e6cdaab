"""The keyed state's files by name: ranges, versions, and how a chain of them is ordered.

A state file is named for what it holds (:class:`StateVersion`): the batch
it was written in, the key groups ``[lo, hi)`` it covers, its keys and
bytes, the task attempt that wrote it, and whether it is a full copy
(``.state``) or one batch's changelog (``.delta``); see
:mod:`sparkjet.core.state.files` for the layout and the contents, which
:class:`~sparkjet.core.state.files.StatePaths` reads and writes. A batch's
commit record names, per :class:`StateRange`, the file that counts
(:data:`StateFiles`). This module only names and orders files: no I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import NamedTuple

_GROUP_WIDTH = 5  # digits of a key group number in file names
_WIDTH = 20  # digits of a batch number in file names
_ATTEMPT_WIDTH = 8  # characters of an attempt id in file names
_ATTEMPT_CHARS = frozenset("0123456789abcdefz")
_COMPACTED = "z"  # first character of a compaction's attempt id
_SHARD_WIDTH = 4  # digits of a shard number in format-1/2 folder names
_STATE_SUFFIX = ".state"
_DELTA_SUFFIX = ".delta"


class StateRange(NamedTuple):
    """One stage's range of key groups ``[lo, hi)``: what a state task owns and its file covers."""

    stage: str
    lo: int
    hi: int


#: Per range, the name of the state file that counts (``""``: the task wrote
#: none): what one batch's commit record names.
StateFiles = Mapping[StateRange, str]

#: Per batch, the state files that count (:data:`StateFiles`), for the batches
#: whose commit records are kept and name them.
Counted = dict[int, StateFiles]


class StateVersion(NamedTuple):
    """One file of a stage's state: a full copy or one batch's changelog of key groups ``[lo, hi)``.

    ``size`` is the file's size in bytes, from its name (-1 for a format-1
    name, which does not carry it); ``folder`` the sub-folder of a format-1 or
    format-2 file (its shard's), ``""`` for the flat layout of formats 3 and 4;
    ``attempt`` the writer's attempt id (format 4; ``""`` before).
    """

    batch: int
    keys: int
    name: str
    full: bool = True
    size: int = -1
    lo: int = 0
    hi: int = 1
    folder: str = ""
    attempt: str = ""


def chain_order(version: StateVersion) -> tuple[int, bool, int, str]:
    """Batch order; at one batch a changelog before a full copy (the copy includes it)."""
    return version.batch, version.full, version.lo, version.name


def new_version(
    batch: int, lo: int, hi: int, keys: int, data: bytes, full: bool, compacted: bool = False
) -> StateVersion:
    """The version of a format-4 file about to be written with ``data``, by a new attempt.

    A full copy that :meth:`~sparkjet.core.state.files.StatePaths.compact` folds gets an attempt id
    starting with ``z`` (:data:`_COMPACTED`): no commit record names it.
    """
    attempt = uuid.uuid4().hex[: _ATTEMPT_WIDTH - 1 if compacted else _ATTEMPT_WIDTH]
    attempt = _COMPACTED + attempt if compacted else attempt
    name = (f"{batch:0{_WIDTH}d}-{lo:0{_GROUP_WIDTH}d}-{hi:0{_GROUP_WIDTH}d}-{keys}-"
            f"{len(data)}-{attempt}{_STATE_SUFFIX if full else _DELTA_SUFFIX}")
    return StateVersion(batch, keys, name, full, len(data), lo, hi, "", attempt)


def parse_version(entry: str, folder: str = "") -> StateVersion | None:
    """The version a state folder's ``entry`` names (``folder``: its format-1-2 shard), or None."""
    for suffix, full in ((_STATE_SUFFIX, True), (_DELTA_SUFFIX, False)):
        if not entry.endswith(suffix):
            continue
        parts = entry[: -len(suffix)].split("-")
        attempt = ""
        if not folder and len(parts) == 6 and len(parts[5]) == _ATTEMPT_WIDTH and all(
                c in _ATTEMPT_CHARS for c in parts[5]):
            attempt = parts.pop()  # format 4
        if not all(p.isdigit() for p in parts):
            return None
        if folder and len(parts) in (2, 3):  # format 1 or 2, in a shard folder
            shard = int(folder)
            size = int(parts[2]) if len(parts) == 3 else -1
            return StateVersion(int(parts[0]), int(parts[1]), entry, full, size, shard,
                                shard + 1, folder)
        if not folder and len(parts) == 5:  # format 3 (and 4): <batch>-<lo>-<hi>-<keys>-<bytes>
            batch, lo, hi, keys, size = map(int, parts)
            return StateVersion(batch, keys, entry, full, size, lo, hi, "",
                                attempt) if lo < hi else None
    return None


def full_copy_starts(chain: list[StateVersion], lo: int, hi: int) -> dict[int, int]:
    """Per key group in ``[lo, hi)``: the batch of the newest full copy covering it, or -1."""
    starts = dict.fromkeys(range(lo, hi), -1)
    for v in chain:
        if v.full:
            for g in range(max(v.lo, lo), min(v.hi, hi)):
                starts[g] = max(starts[g], v.batch)
    return starts


def replaced_by_full_copies(versions: list[StateVersion], lo: int, hi: int, batch: int) -> bool:
    """Whether ``versions`` hold a full copy after ``batch`` for every key group in ``[lo, hi)``."""
    return all(any(v.full and v.batch > batch and v.lo <= g < v.hi for v in versions)
               for g in range(lo, hi))
