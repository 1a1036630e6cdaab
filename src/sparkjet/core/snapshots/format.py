"""The snapshot's data format: state-file names, state signatures, the pipeline fingerprint.

Each stateful stage's state is one file per range of key groups the cut
batch's state tasks owned, ``state/<stage>/<lo>-<hi>-<keys>.state``, holding
what a checkpoint's full copy holds (``{"values": {key: entry}, "touched":
{key: millis}}``, cloudpickled; see :mod:`sparkjet.core.state_files`). A
stage's *state signature* says what its state looks like, so a restore can
refuse a stage whose state changed shape; the *pipeline fingerprint*
identifies the shape of the pipeline that wrote the snapshot.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, assert_never

from sparkjet.core.graph import (
    DistinctSpec,
    GroupAggregateSpec,
    GroupApplySpec,
    MapStatefulSpec,
    Transform,
    WindowSpec,
    keyed_spec,
)
from sparkjet.core.naming import encode_name as encode_store_name
from sparkjet.core.planner import Plan

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


def state_signature(node: Transform) -> dict[str, Any]:
    """What the stage's state looks like; a restore refuses a stage whose signature changed.

    The kind of stateful operation and the type of each key's state: an
    aggregation's accumulator (what ``create()`` returns) and whether it has a
    combiner (the two keep different entries); a ``map_stateful``'s state
    object; a plugin transform's own ``state_signature()``. Changing what the
    functions compute with the same types (Jet: "tweak the aggregate
    operation, but accumulator type has to stay the same"), a TTL, or any
    stateless stage keeps the signature.
    """
    spec = keyed_spec(node)
    match spec:
        case WindowSpec(operation=operation, window=definition):
            # The definition is shown and compared by the upgrade rules, not matched exactly:
            # a window's size, slide or timeout may change between versions.
            return {"op": "window", "window": "session" if definition.is_session else "frames",
                    "accumulator": _type_name(operation.create()),
                    "combiner": operation.combine is not None,
                    "definition": definition.to_json()}
        case GroupAggregateSpec(operation=operation):
            return {"op": "aggregate", "accumulator": _type_name(operation.create()),
                    "combiner": operation.combine is not None}
        case MapStatefulSpec(create_fn=create_fn):
            return {"op": "map_stateful", "state": _type_name(create_fn())}
        case DistinctSpec():
            return {"op": "distinct"}
        case GroupApplySpec(transform=transform):
            return {"op": "apply", "transform": transform.kind,
                    "state": transform.state_signature()}
        case None:
            raise AssertionError(f"stage '{node.name}' ({node.op}) keeps no state")
        case _:  # pragma: no cover
            assert_never(spec)


def pipeline_fingerprint(plan: Plan) -> str:
    """Identifies a pipeline's shape: its stages' names and operations, and the edges."""
    shape = [[plan.name(n), n.op.value, sorted(plan.name(c) for c in n.consumers)]
             for n in plan.nodes]
    return hashlib.sha256(json.dumps(sorted(shape)).encode()).hexdigest()[:16]
