"""Event time's user-facing model: window definitions, timestamps, window results.

Jet's windowing, as ``docs/windows.md`` tells it:

- a *sliding* window of ``size`` advancing by ``slide`` covers
  ``[end - size, end)`` for every ``end`` that is a multiple of ``slide``
  (windows are aligned to time 0); a *tumbling* window is a sliding one whose
  slide is its size; ``size`` must be a multiple of ``slide``. An event at
  ``ts`` lies in the *frame* ending at the first multiple of ``slide``
  strictly above ``ts``, and a window is the union of the ``size / slide``
  frames ending in ``(end - size, end]``;
- a *session* window of ``timeout`` lets each event at ``ts`` cover
  ``[ts, ts + timeout)``; events whose spans overlap form one session, so a
  session is ``[first ts, last ts + timeout)``; sessions that only touch stay
  apart;
- a window is emitted once, when the watermark reaches its end, and never
  when it holds no event; with ``early_results(period)`` every open window
  holding events is also emitted every ``period`` of wall-clock time, with
  ``is_early`` set.

Nothing here imports Spark or the rest of sparkjet's runtime; the folding of
frames and sessions is :mod:`sparkjet.core.pipeline.window_fold`'s, the watermark
:mod:`sparkjet.core.pipeline.event_time`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from sparkjet.core.errors import PipelineDefinitionError

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_MS",
    "KeyedWindowResult",
    "Timestamps",
    "WindowDefinition",
    "WindowResult",
]

#: How long a source partition may go without events before it stops holding
#: the watermark back (Jet's default partition idle timeout).
DEFAULT_IDLE_TIMEOUT_MS = 60_000


def _positive(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PipelineDefinitionError(f"{what} must be a positive int of milliseconds, "
                                      f"got {value!r}")
    return value


@dataclass(frozen=True)
class WindowDefinition:
    """How a windowed stage cuts event time into windows; build one with the class methods.

    ``WindowDefinition.tumbling(60_000)``, ``.sliding(3_600_000, 60_000)``,
    ``.session(30_000)``; ``.early_results(period)`` on any of them returns
    a copy that also emits open windows every ``period`` milliseconds.
    """

    #: ``"tumbling"``, ``"sliding"`` or ``"session"``.
    kind: str
    #: The window's length (sliding and tumbling; 0 for sessions).
    size: int = 0
    #: How far consecutive windows are apart (sliding and tumbling; 0 for sessions).
    slide: int = 0
    #: How long a session stays open after its last event (sessions; 0 otherwise).
    timeout: int = 0
    #: Early results every this many milliseconds of wall-clock time (0: none).
    early_period: int = 0

    @classmethod
    def tumbling(cls, size: int) -> WindowDefinition:
        """Back-to-back windows of ``size`` milliseconds: ``[0, size)``, ``[size, 2 size)``..."""
        size = _positive("a tumbling window's size", size)
        return cls("tumbling", size=size, slide=size)

    @classmethod
    def sliding(cls, size: int, slide: int) -> WindowDefinition:
        """Windows of ``size`` milliseconds, one ending every ``slide``; ``size % slide == 0``."""
        size = _positive("a sliding window's size", size)
        slide = _positive("a sliding window's slide", slide)
        if size % slide:
            raise PipelineDefinitionError(
                f"a sliding window's size ({size} ms) must be a multiple of its slide "
                f"({slide} ms): windows are made of whole frames of one slide"
            )
        return cls("tumbling" if size == slide else "sliding", size=size, slide=slide)

    @classmethod
    def session(cls, timeout: int) -> WindowDefinition:
        """Sessions of events less than ``timeout`` milliseconds apart."""
        return cls("session", timeout=_positive("a session window's timeout", timeout))

    def early_results(self, period: int) -> WindowDefinition:
        """A copy that also emits every open window every ``period`` ms (``is_early``)."""
        return replace(self, early_period=_positive("early_results() period", period))

    def without_early_results(self) -> WindowDefinition:
        """A copy that emits each window only once it is complete."""
        return replace(self, early_period=0)

    @property
    def is_session(self) -> bool:
        """Whether this is a session window."""
        return self.kind == "session"

    def describe(self) -> str:
        """A short description, e.g. ``sliding(size=3600000, slide=60000, early=10000)``."""
        if self.is_session:
            text = f"session(timeout={self.timeout}"
        elif self.kind == "tumbling":
            text = f"tumbling(size={self.size}"
        else:
            text = f"sliding(size={self.size}, slide={self.slide}"
        return text + (f", early={self.early_period})" if self.early_period else ")")

    def to_json(self) -> dict[str, Any]:
        """The definition as a snapshot's manifest and ``check-upgrade`` show it."""
        data: dict[str, Any] = {"kind": self.kind}
        if self.is_session:
            data["timeout"] = self.timeout
        else:
            data.update(size=self.size, slide=self.slide)
        if self.early_period:
            data["early_period"] = self.early_period
        return data

    @classmethod
    def from_json(cls, data: Any) -> WindowDefinition | None:
        """The definition :meth:`to_json` wrote; None for anything else."""
        if not isinstance(data, dict) or data.get("kind") not in ("tumbling", "sliding",
                                                                   "session"):
            return None
        try:
            return cls(str(data["kind"]), int(data.get("size", 0)), int(data.get("slide", 0)),
                       int(data.get("timeout", 0)), int(data.get("early_period", 0)))
        except (TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Timestamps:
    """How a source stage's items get their event time (``with_timestamps`` and friends)."""

    #: ``fn(item)`` gives the item's timestamp in milliseconds; None: ingestion time
    #: (the micro-batch's planned time, the same on a replay).
    fn: Callable[[Any], int] | None
    #: How far behind the highest timestamp seen the watermark stays.
    allowed_lag_ms: int
    #: A source partition without events this long stops holding the watermark back.
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS

    def describe(self) -> str:
        """E.g. ``event time, lag 5000 ms``."""
        what = "ingestion time" if self.fn is None else "event time"
        return f"{what}, lag {self.allowed_lag_ms} ms"


class KeyedWindowResult(NamedTuple):
    """One key's result of one window: what ``window(...).group_by(...).aggregate(...)`` emits.

    A tuple ``(start, end, key, result, is_early)``; a map sink stores it as
    ``key -> result`` (as Jet's ``KeyedWindowResult`` is a map entry).
    """

    #: The window's start (inclusive), in milliseconds.
    start: int
    #: The window's end (exclusive), in milliseconds.
    end: int
    key: Any
    result: Any
    #: True for an early result of a window still open.
    is_early: bool = False

    def entry(self) -> tuple[Any, Any]:
        """``(key, result)``: the item as a map entry."""
        return (self.key, self.result)


class WindowResult(NamedTuple):
    """One window's result: what ``window(...).aggregate(...)`` emits."""

    #: The window's start (inclusive), in milliseconds.
    start: int
    #: The window's end (exclusive), in milliseconds.
    end: int
    result: Any
    #: True for an early result of a window still open.
    is_early: bool = False
