"""Naming what in a stage's output cannot be pickled.

An engine pickles what a task yields where its work ends (a shuffle, a
persist, a collect); when a batch does not pickle, :func:`unpicklable` finds
the item that does not and makes it the
:class:`~sparkjet.core.pipeline.fusion.StageFailure` of the stage that emitted it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkjet.core.pipeline.fusion import StageFailure, UnpicklableItem

__all__ = ["culprit", "unpicklable"]

#: How deep :func:`culprit` looks into lists, tuples, sets and dicts.
_DEPTH = 8


def culprit(value: Any, dumps: Callable[[Any], bytes], depth: int = _DEPTH) -> Any:
    """The innermost part of ``value`` that ``dumps`` refuses (``value`` itself at the end)."""
    if depth > 0:
        if isinstance(value, dict):
            parts: Any = (p for pair in value.items() for p in pair)
        elif isinstance(value, list | tuple | set | frozenset):
            parts = iter(value)
        else:
            parts = iter(())
        for part in parts:
            try:
                dumps(part)
            except Exception:
                return culprit(part, dumps, depth - 1)
    return value


def unpicklable(
    stage: str, value: Any, dumps: Callable[[Any], bytes], via: str = ""
) -> StageFailure | None:
    """The StageFailure naming ``stage`` and what in ``value`` cannot be pickled (None: all can).

    ``via``: where the item was found, added to the message.
    """
    found = culprit(value, dumps)
    try:
        dumps(found)
    except Exception as exc:
        kind = type(found)
        cause = exc.__cause__ or exc.__context__ or exc
        return StageFailure(stage, UnpicklableItem(
            f"item of type {kind.__module__}.{kind.__qualname__} cannot be pickled"
            f"{f' ({via})' if via else ''}: {type(cause).__name__}: {cause}"
        ))
    return None
