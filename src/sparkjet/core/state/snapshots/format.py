"""The snapshot's data format: state-file names, state signatures, the pipeline fingerprint.

Each stateful stage's state is one file per range of key groups the cut
batch's state tasks owned, ``state/<stage>/<lo>-<hi>-<keys>.state``, holding
what a checkpoint's full copy holds (``{"values": {key: entry}, "touched":
{key: millis}}``, cloudpickled; see :mod:`sparkjet.core.state.files`). A
stage's *state signature* says what its state looks like, so a restore can
refuse a stage whose state changed shape; the *pipeline fingerprint*
identifies the shape of the pipeline that wrote the snapshot.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import types
from typing import Any, assert_never

from sparkjet.core.host.contracts import Source
from sparkjet.core.pipeline.aggregation import AggregateOperation, CoAccumulate, cogroup_key
from sparkjet.core.pipeline.graph import (
    DistinctSpec,
    GroupAggregateSpec,
    GroupApplySpec,
    IntervalJoinSpec,
    MapSpec,
    MapStatefulSpec,
    Transform,
    WindowSpec,
    keyed_spec,
)
from sparkjet.core.pipeline.graph.cogroup_stages import CoGroupTagger
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.store.naming import encode_name as encode_store_name

#: The snapshot's data file holding event time at the cut (sources' highest
#: timestamps, windowed stages' watermarks), when the job had any.
EVENT_TIME_FILE = "event_time.json"


def state_file_path(stage: str, lo: int, hi: int, keys: int) -> str:
    """Where a snapshot keeps key groups ``[lo, hi)`` of ``stage``'s state (``keys`` keys).

    The file holds what a checkpoint's full copy holds: a cloudpickle of
    ``{"values": {key: entry}, "touched": {key: millis}}``.
    """
    return f"state/{encode_store_name('stage', stage)}/{lo:05d}-{hi:05d}-{keys}.state"


def parse_state_file(path: str) -> tuple[int, int, int] | None:
    """``(lo, hi, keys)`` of a :func:`state_file_path`, or None if it is not one."""
    stem = path.rsplit("/", 1)[-1]
    if not stem.endswith(".state"):
        return None
    parts = stem[: -len(".state")].split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    lo, hi, keys = map(int, parts)
    return (lo, hi, keys) if lo < hi else None


def stateful_stages(plan: Plan) -> dict[str, Transform]:
    """The plan's stateful stages (keyed stages, which keep state in a stream), by name."""
    return {plan.name(n): n for n in plan.nodes if keyed_spec(n) is not None}


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}")


def code_identity(fn: Any, _depth: int = 0) -> str:
    """A function's identity for the upgrade rules: its name and a hash of its code.

    The hash covers the bytecode, constants and names (nested functions'
    too), default arguments, and what the closure holds (functions by their
    own identity, plain values by ``repr``), but not line numbers or the
    module it was loaded as: moving a function in its file keeps it, editing
    what it computes changes it. So does a new Python release (its bytecode
    differs): ``JobConfig.allow_changed_state`` accepts that. A callable
    without code (``operator.itemgetter``, a class instance) is known by its
    ``repr`` or its class.
    """
    if isinstance(fn, functools.partial):
        inner = code_identity(fn.func, _depth + 1)
        return f"partial({inner}, {_value_identity(fn.args, _depth)}, " \
               f"{_value_identity(sorted(fn.keywords.items()), _depth)})"
    code = getattr(fn, "__code__", None)
    # The name, not the qualified name: ``v1.<locals>.<lambda>`` and
    # ``v2.<locals>.<lambda>`` are the same function in two versions of a file.
    name = getattr(fn, "__name__", None) or type(fn).__qualname__
    if not isinstance(code, types.CodeType):
        if type(fn).__module__ in ("operator", "builtins"):
            return repr(fn)
        return f"{type(fn).__module__}.{type(fn).__qualname__}"
    digest = hashlib.sha256()
    _feed_code(digest, code)
    digest.update(_value_identity(getattr(fn, "__defaults__", None), _depth).encode())
    cells = getattr(fn, "__closure__", None) or ()
    for cell in cells:
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell (a name bound later)
            held = None
        digest.update(_value_identity(held, _depth).encode())
    return f"{name}#{digest.hexdigest()[:12]}"


def _feed_code(digest: Any, code: types.CodeType) -> None:
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed_code(digest, const)
        elif isinstance(const, frozenset):  # ``x in {"a", "b"}``: its repr's order varies
            digest.update(repr(sorted(map(repr, const))).encode())  # with the hash seed
        else:
            digest.update(repr(const).encode())


def _value_identity(value: Any, depth: int) -> str:
    """A closure cell's or default's part of an identity."""
    if depth > 4:
        return type(value).__qualname__
    if callable(value) and not isinstance(value, type):
        return code_identity(value, depth + 1)
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return repr(value)
    if isinstance(value, list | tuple):
        return "(" + ",".join(_value_identity(v, depth + 1) for v in value) + ")"
    return type(value).__qualname__


def operation_identity(operation: AggregateOperation) -> str:
    """An aggregate operation's identity: its name and what it accumulates with.

    A built-in compiled into the runtime's loop (``counting()``,
    ``summing(get)``) is known by its kind and its value function; any other
    by its ``accumulate`` function. ``finish`` is not part of it: it only
    shapes results, never state (Jet lets it change).
    """
    if operation.inline is not None:
        kind, get = operation.inline
        return kind if get is None else f"{kind}({code_identity(get)})"
    if isinstance(operation.accumulate, CoAccumulate):  # a co-group: each input's own
        return "co_aggregate(" + ", ".join(operation_identity(op)
                                           for op in operation.accumulate.ops) + ")"
    return f"{operation.name}({code_identity(operation.accumulate)})"


def _key_identity(node: Transform, key: Any) -> str:
    """The key function's identity; a co-group's names each input's stage and key, in order.

    So a co-group whose inputs were swapped, or one of whose inputs is keyed
    another way, keeps the shape of its state but not its meaning.
    """
    if key is not cogroup_key:
        return code_identity(key)
    names = node.pipeline.stage_names()
    taggers = sorted(((n.spec.fn, names[n.inputs[0]]) for n in node.inputs[0].inputs
                      if isinstance(n.spec, MapSpec) and isinstance(n.spec.fn, CoGroupTagger)),
                     key=lambda found: found[0].tag)
    return "co_group(" + ", ".join(f"{stage}:{code_identity(tagger.key_fn)}"
                                   for tagger, stage in taggers) + ")"


def state_signature(node: Transform) -> dict[str, Any]:
    """What the stage's state is and how it is keyed; the upgrade rules compare them.

    Two kinds of fields. Those of the state's *shape* must match for state
    to be restored: the kind of operation (``op``), the type of each key's
    state (an aggregation's ``accumulator``, what ``create()`` returns, and
    whether it has a ``combiner``; a ``map_stateful``'s ``state``; a plugin
    transform's own ``state``), and a window's kind. The *identity* fields
    say what the state means: ``key``, the key function's
    :func:`code_identity`, and ``operation`` (an aggregation's
    :func:`operation_identity`, a ``map_stateful``'s functions): a change
    there keeps the shape but not the meaning, and is refused unless
    accepted. ``upstream`` (:func:`upstream_identity`) says where its items
    come from. A window's ``definition`` may change (Jet's rules).
    """
    spec = keyed_spec(node)
    key = getattr(spec, "key_fn", None)
    keyed = {"key": _key_identity(node, key)} if key is not None else {}
    keyed["upstream"] = upstream_identity(node)
    match spec:
        case WindowSpec(operation=operation, window=definition):
            # The definition is shown and compared by the upgrade rules, not matched exactly:
            # a window's size, slide or timeout may change between versions.
            return {"op": "window", "window": "session" if definition.is_session else "frames",
                    "accumulator": _type_name(operation.create()),
                    "combiner": operation.combine is not None,
                    "definition": definition.to_json(),
                    **keyed, "operation": operation_identity(operation)}
        case GroupAggregateSpec(operation=operation):
            return {"op": "aggregate", "accumulator": _type_name(operation.create()),
                    "combiner": operation.combine is not None,
                    **keyed, "operation": operation_identity(operation)}
        case MapStatefulSpec(create_fn=create_fn, map_fn=map_fn):
            return {"op": "map_stateful", "state": _type_name(create_fn()), **keyed,
                    "operation": code_identity(map_fn)}
        case DistinctSpec():
            return {"op": "distinct", **keyed}
        case GroupApplySpec(transform=transform):
            return {"op": "apply", "transform": transform.kind,
                    "state": transform.state_signature(), **keyed}
        case IntervalJoinSpec(lower=lower, upper=upper, map_fn=map_fn, how=how):
            # Bounds and how may change the meaning of the buffers, not their shape.
            return {"op": "interval_join", "state": "buffers", **keyed,
                    "operation": f"interval_join(how={how}, lower={lower}, upper={upper}, "
                                 f"{code_identity(map_fn)})"}
        case None:
            raise AssertionError(f"stage '{node.name}' ({node.op}) keeps no state")
        case _:  # pragma: no cover
            assert_never(spec)


#: The fields of a state signature that say what the state means, not its shape.
IDENTITY_FIELDS = ("key", "operation")
#: The field of a state signature that says where the stage's items come from.
UPSTREAM_FIELD = "upstream"


def upstream_identity(node: Transform) -> str:
    """A hash of the stages before ``node``: each one's name and kind, up to the sources.

    Two stateful stages with the same key and operation over different
    inputs (one behind a filter) differ here. The upgrade rules compare it
    only to decide whether generated names may carry state (a stage may be
    put behind a new filter, keeping its state, under a name of its own).
    """
    names = node.pipeline.stage_names()
    seen: set[Transform] = set()
    todo = list(node.inputs)
    while todo:
        upstream = todo.pop()
        if upstream not in seen:
            seen.add(upstream)
            todo.extend(upstream.inputs)
    lineage = sorted(f"{names[n]}:{n.op.value}" for n in seen)
    return hashlib.sha256(json.dumps(lineage).encode()).hexdigest()[:12]


def source_identity(source: Source, offsets: Any) -> dict[str, Any]:
    """What a source reads, for the upgrade rules: its plugin, its ``identity()``, partitions.

    ``partitions`` is how many partitions the source had at ``offsets``
    (``Source.watermark_partitions``).
    """
    return {"plugin": source.kind, "reads": source.identity(),
            "partitions": len(source.watermark_partitions(offsets))}


def pipeline_fingerprint(plan: Plan) -> str:
    """Identifies a pipeline: its stages' names, operations, functions' code, sources, edges.

    Two plans with the same fingerprint run the same code on the same data
    (``sparkjet apply`` upgrades a job whose fingerprint changed).
    """
    shape = []
    for node in plan.nodes:
        spec = node.spec
        parts: list[Any] = [plan.name(node), node.op.value,
                            sorted(plan.name(c) for c in node.consumers)]
        for field_ in dataclasses.fields(spec):
            value = getattr(spec, field_.name)
            if isinstance(value, Source):
                parts.append([value.kind, value.identity()])
            elif isinstance(value, AggregateOperation):
                parts.append(operation_identity(value))
            elif callable(value):
                parts.append(code_identity(value))
            elif value is None or isinstance(value, bool | int | float | str):
                parts.append(value)
            elif hasattr(value, "to_json"):
                parts.append(value.to_json())
            else:
                parts.append(getattr(value, "kind", type(value).__qualname__))
        shape.append(parts)
    encoded = json.dumps(sorted(shape, key=lambda part: part[0]), default=str)
    return hashlib.sha256(encoded.encode()).hexdigest()[:16]
