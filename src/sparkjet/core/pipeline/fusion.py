"""Per-partition Python kernels: fused stateless passes and map-side stateful work.

Consecutive stateless stages (map, filter, flat_map, peek) are compiled into
one generated Python function per partition, so an item costs one loop
iteration and one call per stage, with no per-stage iterator or wrapper.
The generated function can end in a *terminal* that does the map side of a
stateful stage in the same pass (partial aggregation, first-seen for
``distinct``, position tagging for order-keeping shuffles).

Each line of generated code belongs to one stage, so when a user function
raises, the traceback's line number names the stage at no per-item cost.
A stage whose error policy is dead-letter (``Op.dead``) gets its call wrapped
in ``try``: the item it failed on becomes a dead letter (:func:`dead_letter`,
kept in ``state["dead"]``) and goes no further; see
:mod:`sparkjet.core.pipeline.dead_letters`. Nothing here imports Spark.
"""

from __future__ import annotations

import base64
import enum
import logging
import pickle
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import cloudpickle

from sparkjet.core.pipeline.graph import OpKind
from sparkjet.core.store.naming import PICKLE_PROTOCOL

_MISSING = object()
#: Stateless ops that change the number of items, so the pass counts their output.
_COUNTED = frozenset({OpKind.FILTER, OpKind.FLAT_MAP})
_ids = count()
_peek_log = logging.getLogger("sparkjet.peek")

STAGE_FAILURE_MARKER = "SPARKJET_STAGE_FAILURE"


@dataclass
class Op:
    """A stateless operation in a fused pass."""

    op: OpKind  # a graph.StatelessSpec's kind: map, filter, flat_map or peek
    stage: str
    fn: Callable[..., Any]
    #: The stage's error policy is dead-letter: an item it fails on is set aside, not fatal.
    dead: bool = False

    @property
    def counted(self) -> bool:
        """Whether the pass counts what the op emits (it may emit fewer items than it gets)."""
        return self.op in _COUNTED or self.dead


class TerminalKind(enum.StrEnum):
    """What a fused pass ends in; see :class:`Terminal`."""

    YIELD = "yield"
    KEYED = "keyed"
    SORTKEY = "sortkey"
    GROUP = "group"
    FOLD = "fold"
    DISTINCT = "distinct"
    FRAMES = "frames"
    SESSIONS = "sessions"
    EVENTS = "events"


#: Terminals that fold the partition into ``state`` and yield nothing themselves.
FOLDING = frozenset({TerminalKind.GROUP, TerminalKind.FOLD, TerminalKind.DISTINCT,
                     TerminalKind.FRAMES, TerminalKind.SESSIONS, TerminalKind.EVENTS})


class StampKind(enum.StrEnum):
    """Where a pass's items get their timestamp ``t`` from; see :class:`Stamp`."""

    FN = "fn"
    NOW = "now"
    PAIRED = "paired"


@dataclass(frozen=True)
class Stamp:
    """How the items entering a fused pass carry event time.

    - ``fn``: the pass reads a source's items and computes ``t = fn(x)``
      (errors name ``stage``, the source);
    - ``now``: the pass reads a source's items, all stamped ``now_ms``
      (ingestion time: the micro-batch's planned time);
    - ``paired``: the items are ``(t, x)`` pairs a pass before made.

    A pass that computes timestamps keeps the partition's highest in
    ``state["hi"]`` (None: no item), for the watermark.
    """

    kind: StampKind
    stage: str | None = None
    fn: Callable[[Any], Any] | None = None
    now_ms: int = 0


@dataclass
class Terminal:
    """What the fused pass does with each surviving item.

    - ``yield``: emit the item;
    - ``keyed``: emit ``(key, (partition, position, key, item))`` with ``key =
      fn(item)``: the ITEM record of :mod:`sparkjet.core.pipeline.keyed`;
    - ``sortkey``: emit ``(SortKey, item)`` ordering by ``fn(item)`` (or the item);
    - ``group``: fold into per-key accumulators (``state["accs"]``, first
      positions in ``state["firsts"]``) with ``fn`` as key function;
    - ``fold``: fold everything into ``state["acc"]``;
    - ``distinct``: keep the first item per key in ``state["seen"]``;
    - ``frames``: drop late items (frame end at or before ``state["wm"]``,
      counted in ``state["late"]``), fold the rest into per ``(key, frame
      end)`` accumulators in ``state["accs"]`` (first positions in
      ``state["firsts"]``); ``fn`` is the key function (None: one key, 0);
    - ``sessions``: drop late items (timestamp below ``state["wm"]``), gather
      the rest as ``(t, item)`` per key in ``state["accs"]``;
    - ``events``: the same, gathering ``(t, item, position)`` per key (an
      interval join's map side).

    Positions are the item's index in this partition's terminal input; the
    partition index comes from ``state["pidx"]``.
    """

    kind: TerminalKind
    stage: str | None = None
    fn: Callable[..., Any] | None = None
    create: Callable[[], Any] | None = None
    accumulate: Callable[[Any, Any], Any] | None = None
    reverse: bool = False
    #: An AggregateOperation's ``inline`` form, compiled in place of ``accumulate``.
    inline: tuple[str, Callable[[Any], Any] | None] | None = None
    #: ``frames``: the slide; ``sessions``: the timeout (milliseconds).
    span: int = 0
    #: ``frames``/``sessions``: late items become dead letters too (still counted late).
    late_letters: bool = False


@dataclass
class FusedPass:
    """A compiled chain of stateless ops plus a terminal; picklable, compiled lazily."""

    ops: list[Op]
    terminal: Terminal = field(default_factory=lambda: Terminal(TerminalKind.YIELD))
    metrics: bool = True
    #: How the items carry event time (None: they have none).
    stamp: Stamp | None = None
    #: A ``yield`` terminal yields ``(t, item)`` pairs (for a later pass to window).
    pairs_out: bool = False
    _compiled: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"ops": self.ops, "terminal": self.terminal, "metrics": self.metrics,
                "stamp": self.stamp, "pairs_out": self.pairs_out}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    # --- code generation ---------------------------------------------------

    def _source(self) -> tuple[str, dict[int, str], dict[str, Any]]:
        env: dict[str, Any] = {"_MISSING": _MISSING, "_peek": _peek, "_freeze": freeze,
                               "_dead": _dead, "_late": _late}
        lines = ["def run(it, counts, state):"]
        line_stage: dict[int, str] = {}
        counters = [f"c{i}" for i, op in enumerate(self.ops) if op.counted]
        t = self.terminal
        # A dead letter says which input item it was: the pass counts its input then too.
        counting_in = self.metrics or t.late_letters or any(op.dead for op in self.ops)
        if counting_in:
            lines.append("    n_in = 0")
        if self.metrics:
            lines.extend(f"    {c} = 0" for c in counters)
        lines.append("    pos = -1")
        lines.append("    pidx = state.get('pidx', 0)")
        if t.kind == TerminalKind.GROUP:
            env.update(_key=t.fn, _create=t.create, _acc=t.accumulate)
            if t.inline is not None:
                env["_get"] = t.inline[1]
            lines.append("    accs = state['accs']; firsts = state['firsts']; get = accs.get")
        elif t.kind == TerminalKind.FOLD:
            env.update(_acc=t.accumulate)
            lines.append("    acc = state['acc']")
        elif t.kind == TerminalKind.DISTINCT:
            env.update(_key=t.fn)
            lines.append("    seen = state['seen']")
        elif t.kind == TerminalKind.KEYED:
            env.update(_key=t.fn)
        elif t.kind == TerminalKind.SORTKEY:
            env.update(_key=t.fn, _SK=SortKey, _rev=bool(t.reverse))
        elif t.kind in (TerminalKind.FRAMES, TerminalKind.SESSIONS, TerminalKind.EVENTS):
            env.update(_key=t.fn, _create=t.create, _acc=t.accumulate, _span=t.span)
            if t.inline is not None:
                env["_get"] = t.inline[1]
            lines.append("    accs = state['accs']; firsts = state['firsts']; get = accs.get")
            lines.append("    wm = state['wm']; late = 0")
        stamp = self.stamp
        computes = stamp is not None and stamp.kind != StampKind.PAIRED
        if computes:
            lines.append("    hi = None")
        if stamp is not None and stamp.kind == StampKind.NOW:
            env["_now"] = stamp.now_ms
        lines.append("    try:")
        if stamp is not None and stamp.kind == StampKind.PAIRED:
            lines.append("        for t, x in it:")
        else:
            lines.append("        for x in it:")
        depth = 3
        if counting_in:
            lines.append("    " * depth + "n_in += 1")

        def emit(text: str, stage: str | None) -> None:
            lines.append("    " * depth + text)
            if stage is not None:
                line_stage[len(lines)] = stage

        if computes:
            assert stamp is not None
            if stamp.kind == StampKind.FN:
                env["_ts"] = stamp.fn
                emit("t = _ts(x)", stamp.stage)
            else:
                emit("t = _now", None)
            # Compared with an int: a timestamp of another type fails here, naming the source.
            emit("if hi is None or t > hi: hi = t + 0", stamp.stage)

        def guarded(call: str, op: Op) -> None:
            """``call`` as is, or, for a dead-letter op, the item it fails on set aside."""
            if not op.dead:
                emit(call, op.stage)
                return
            emit("try:", None)
            emit(f"    {call}", op.stage)
            emit("except Exception as e:", None)
            emit(f"    _dead(state, {op.stage!r}, x, e, n_in - 1); continue", None)

        for i, op in enumerate(self.ops):
            env[f"f{i}"] = op.fn
            if op.op == OpKind.MAP:
                guarded(f"x = f{i}(x)", op)  # x stays the input when f raises
            elif op.op == OpKind.FILTER:
                if op.dead:
                    guarded(f"drop = not f{i}(x)", op)
                    emit("if drop: continue", None)
                else:
                    emit(f"if not f{i}(x): continue", op.stage)
            elif op.op == OpKind.PEEK:
                guarded(f"_peek({op.stage!r}, f{i}, x)", op)
            elif op.op == OpKind.FLAT_MAP:
                if op.dead:  # the outputs are taken whole first: a failure midway emits none
                    guarded(f"xs = list(f{i}(x))", op)
                    emit("for x in xs:", op.stage)
                else:
                    emit(f"for x in f{i}(x):", op.stage)
                depth += 1
            else:  # pragma: no cover - the planner only fuses the four above
                raise ValueError(op.op)
            if self.metrics and op.counted:
                emit(f"c{i} += 1", None)
        emit("pos += 1", None)
        stage = t.stage
        if t.kind == TerminalKind.YIELD:
            emit("yield (t, x)" if self.pairs_out else "yield x", None)
        elif t.kind == TerminalKind.KEYED:
            emit("k = _key(x)", stage)
            emit("hash(k)", stage)  # fail here, naming the stage, not in Spark's shuffle
            # keyed.ITEM's layout, built inline: a call per item would cost more.
            emit("yield (k, (pidx, pos, k, x))", None)
        elif t.kind == TerminalKind.SORTKEY:
            emit(f"yield (_SK({'x' if t.fn is None else '_key(x)'}, (pidx, pos), _rev), x)", stage)
        elif t.kind in (TerminalKind.GROUP, TerminalKind.FRAMES):
            if t.kind == TerminalKind.FRAMES:
                # The frame an item lies in ends at the first multiple of the slide above t.
                emit("f = t - t % _span + _span", stage)
                emit("if f <= wm:", None)
                if t.late_letters:
                    emit(f"    _late(state, {stage!r}, x, t, wm, n_in - 1)", None)
                emit("    late += 1; continue", None)
                emit("k = (0 if _key is None else _key(x), f)", stage)
            else:
                emit("k = _key(x)", stage)
            emit("a = get(k, _MISSING)", stage)
            emit("if a is _MISSING:", None)
            depth += 1
            emit("firsts[k] = pos", stage)
            emit("a = _create()", stage)
            depth -= 1
            if t.inline is None:
                emit("accs[k] = _acc(a, x)", stage)
            elif t.inline[0] == "count":
                emit("accs[k] = a + 1", stage)
            elif t.inline[0] == "sum":
                emit("accs[k] = a + _get(x)", stage)
            else:  # pragma: no cover - only the built-ins set inline
                raise ValueError(t.inline[0])
        elif t.kind == TerminalKind.FOLD:
            emit("acc = _acc(acc, x)", stage)
        elif t.kind == TerminalKind.DISTINCT:
            emit("k = x" if t.fn is None else "k = _key(x)", stage)
            emit("try:", None)
            emit("    new = k not in seen", stage)
            emit("except TypeError:", None)
            emit("    k = _freeze(k); new = k not in seen", stage)
            emit("if new: seen[k] = (pos, x)", stage)
        elif t.kind in (TerminalKind.SESSIONS, TerminalKind.EVENTS):
            # Late items dropped (timestamp below the watermark), the rest gathered per key:
            # (t, item) for sessions, (t, item, position) for an interval join.
            emit("if t < wm:", None)
            if t.late_letters:
                emit(f"    _late(state, {stage!r}, x, t, wm, n_in - 1)", None)
            emit("    late += 1; continue", None)
            emit("k = 0 if _key is None else _key(x)", stage)
            emit("evs = get(k)", stage)
            emit("if evs is None:", None)
            emit("    firsts[k] = pos; accs[k] = evs = []", None)
            emit("evs.append((t, x, pos))" if t.kind == TerminalKind.EVENTS
                 else "evs.append((t, x))", None)
        else:  # pragma: no cover
            raise ValueError(t.kind)
        lines.append("    finally:")
        if computes:
            lines.append("        state['hi'] = hi if state.get('hi') is None or (")
            lines.append("            hi is not None and hi > state['hi']) else state['hi']")
        if t.kind in (TerminalKind.FRAMES, TerminalKind.SESSIONS, TerminalKind.EVENTS):
            lines.append("        state['late'] = state.get('late', 0) + late")
        if t.kind == TerminalKind.FOLD:
            lines.append("        state['acc'] = acc")
        if self.metrics:
            lines.append("        counts['in'] = counts.get('in', 0) + n_in")
            for c in counters:
                lines.append(f"        counts[{c!r}] = counts.get({c!r}, 0) + {c}")
        else:
            lines.append("        pass")
        if t.kind in FOLDING:
            lines.append("    if False:  # a generator either way, so callers drive it alike")
            lines.append("        yield None")
        return "\n".join(lines) + "\n", line_stage, env

    def compile(self) -> tuple[Callable[..., Iterator[Any]], dict[int, str], str]:
        if self._compiled is None:
            source, line_stage, env = self._source()
            filename = f"<sparkjet-fused-{next(_ids)}>"
            exec(compile(source, filename, "exec"), env)  # our own generated source
            object.__setattr__(self, "_compiled", (env["run"], line_stage, filename))
        return self._compiled  # type: ignore[no-any-return]

    def run(
        self, items: Iterator[Any], counts: dict[str, int], state: dict[str, Any] | None = None
    ) -> Iterator[Any]:
        """Apply the pass to one partition's items."""
        fn, _, _ = self.compile()
        return fn(items, counts, state if state is not None else {})

    def consume(
        self, items: Iterator[Any], counts: dict[str, int], state: dict[str, Any]
    ) -> dict[str, Any]:
        """Run a folding terminal (group, fold, distinct) over one partition; returns ``state``."""
        for _ in self.run(items, counts, state):
            pass
        return state

    def stage_of(self, exc: BaseException) -> str | None:
        """The stage whose line of generated code raised ``exc``, if it was one of ours."""
        _, line_stage, filename = self.compile()
        found = None
        # A StopIteration from a user function surfaces as RuntimeError (PEP 479),
        # raised where the generator stopped; the stage is in the cause's traceback.
        chain: BaseException | None = exc
        while chain is not None and found is None:
            tb = chain.__traceback__
            while tb is not None:
                if tb.tb_frame.f_code.co_filename == filename:
                    found = line_stage.get(tb.tb_lineno, found)
                tb = tb.tb_next
            chain = chain.__cause__
        return found

    def stage_counts(self, counts: dict[str, int]) -> dict[str, tuple[int, int]]:
        """Per-stage (received, emitted) from the raw counters of :meth:`run`."""
        out: dict[str, tuple[int, int]] = {}
        flowing = counts.get("in", 0)
        for i, op in enumerate(self.ops):
            received = flowing
            if op.counted:
                flowing = counts.get(f"c{i}", 0)
            out[op.stage] = (received, flowing)
        return out


def _dead(state: dict[str, Any], stage: str, item: Any, exc: Exception, index: int) -> None:
    """Set ``item`` aside as a dead letter of ``stage`` (generated code calls this)."""
    if isinstance(exc, StageFailure):  # fatal whatever the policy (a service not made)
        raise exc
    state.setdefault("dead", []).append(dead_letter(stage, item, exc, index))


def _late(state: dict[str, Any], stage: str, item: Any, t: int, wm: int, index: int) -> None:
    """Set late ``item`` aside as a dead letter of window ``stage`` (generated code calls this)."""
    state.setdefault("dead", []).append(late_letter(stage, item, t, wm, index))


def late_letter(
    stage: str, item: Any, timestamp: int, watermark: int, index: int
) -> dict[str, Any]:
    """The dead letter of ``item``, which windowed ``stage`` received behind its watermark.

    As :func:`dead_letter`'s, with no traceback (nothing raised) and the
    item's ``timestamp`` and the ``watermark`` it was judged by.
    """
    kept, pickled = _kept(item)
    return {
        "stage": stage,
        "item": kept,
        "item_pickled": pickled,
        "error": f"late: timestamp {timestamp} is behind the watermark {watermark}",
        "traceback": None,
        "index": index,
        "timestamp": timestamp,
        "watermark": watermark,
    }


def _kept(item: Any) -> tuple[Any, bool]:
    """``item`` as a letter keeps it, and whether that is the item (else its ``repr``)."""
    try:  # as the stream log will pickle it (plain pickle: no lambdas, no local classes)
        pickle.dumps(item, protocol=PICKLE_PROTOCOL)
        return item, True
    except Exception:
        return repr(item), False


def dead_letter(stage: str, item: Any, exc: BaseException, index: int) -> dict[str, Any]:
    """The dead letter of ``item``, which ``stage`` failed on with ``exc``.

    ``index``: the item's position in the pass's input in this partition
    (the source partition's, for a pass that reads a source). An item or
    exception that cannot be pickled is kept as its ``repr``: a dead letter
    must reach the driver whatever went wrong.
    """
    kept, pickled = _kept(item)
    # From the user's function on: the first frame is the generated pass's.
    tb = exc.__traceback__
    lines = traceback.format_exception(type(exc), exc, tb.tb_next if tb is not None else None)
    return {
        "stage": stage,
        "item": kept,
        "item_pickled": pickled,
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": "".join(lines),
        "index": index,
    }


def _peek(stage: str, fn: Callable[[Any], Any], item: Any) -> None:
    if not _peek_ready:
        _prepare_peek_log()
    _peek_log.info("[%s] %s", stage, fn(item))


_peek_ready = False


def _prepare_peek_log() -> None:
    """Make ``peek()`` output visible on Spark workers, where nobody configures logging.

    Worker stderr reaches the executor's log (the console, in local mode).
    """
    global _peek_ready
    if not _peek_log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("peek %(message)s"))
        _peek_log.addHandler(handler)
        _peek_log.setLevel(logging.INFO)
        _peek_log.propagate = False
    _peek_ready = True


# --- Python equality for distinct() -----------------------------------------


class _Tag:
    """Marks a frozen list or dict so it never equals a user's tuple or frozenset."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Tag) and other.name == self.name

    def __hash__(self) -> int:
        return 7919 if self.name == "list" else 104729

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Tag, (self.name,))


_LIST = _Tag("list")
_DICT = _Tag("dict")


def freeze(value: Any) -> Any:
    """A hashable stand-in that is equal exactly when the values are equal under ``==``.

    Lists and dicts compare by value (``{1: "a"} == {1.0: "a"}``); sets become
    frozensets (``{1} == frozenset({1})`` in Python too). Raises TypeError for
    other unhashable values.
    """
    try:
        hash(value)
        return value
    except TypeError:
        pass
    if isinstance(value, list):
        return (_LIST, tuple(freeze(v) for v in value))
    if isinstance(value, tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return (_DICT, frozenset((freeze(k), freeze(v)) for k, v in value.items()))
    if isinstance(value, set):
        return frozenset(freeze(v) for v in value)
    raise TypeError(f"unhashable type: {type(value).__name__!r} cannot be compared for distinct()")


# --- ordering for sort() -----------------------------------------------------


class SortKey:
    """Orders as ``sorted(key=..., reverse=...)`` does, ties broken by encounter position."""

    __slots__ = ("key", "position", "reverse")

    def __init__(self, key: Any, position: tuple[int, int], reverse: bool) -> None:
        self.key = key
        self.position = position
        self.reverse = reverse

    def __lt__(self, other: SortKey) -> bool:
        if self.reverse:
            if other.key < self.key:
                return True
            if self.key < other.key:
                return False
        else:
            if self.key < other.key:
                return True
            if other.key < self.key:
                return False
        return self.position < other.position

    def __reduce__(self) -> tuple[Any, ...]:
        return (SortKey, (self.key, self.position, self.reverse))


# --- failures crossing from executors to the driver ---------------------------


class RemoteError(Exception):
    """Stands in for a user exception that could not be pickled back to the driver."""


class UnpicklableItem(TypeError):
    """A stage emitted an item Spark cannot pickle (the message names its type)."""


def encode_failure(stage: str, exc: BaseException) -> str:
    """A marker line carrying the stage and the (pickled) exception to the driver."""
    text = "".join(traceback.format_exception(exc))
    try:
        payload = cloudpickle.dumps((stage, exc, text))
        cloudpickle.loads(payload)
    except Exception:
        stand_in = RemoteError(f"{type(exc).__qualname__}: {exc}")
        payload = cloudpickle.dumps((stage, stand_in, text))
    return f"{STAGE_FAILURE_MARKER}[{base64.b64encode(payload).decode()}]"


def decode_failure(text: str) -> tuple[str, BaseException, str] | None:
    """Find a marker in an error text from Spark; ``(stage, exception, traceback)``."""
    start = text.find(STAGE_FAILURE_MARKER + "[")
    if start < 0:
        return None
    start += len(STAGE_FAILURE_MARKER) + 1
    end = text.find("]", start)
    try:
        stage, exc, tb_text = cloudpickle.loads(base64.b64decode(text[start:end]))
    except Exception:
        return None
    return stage, exc, tb_text


class StageFailure(Exception):
    """Raised on an executor: carries the failing stage and the user's exception."""

    def __init__(self, stage: str, exc: BaseException) -> None:
        super().__init__(encode_failure(stage, exc))
        self.stage = stage
