"""How the store names things on disk: file-safe names for data structures, and its pickles.

The bottom of the store's modules, so the store, its streams and the
checkpoint name files the same way without importing one another. Every
pickle sparkjet reads back from the store goes through :func:`loads`, which
also reads pickles written before a module of sparkjet's moved
(:data:`MOVED_MODULES`): a job suspended, a snapshot exported or a list
written by an older release names classes where they were then.
"""

from __future__ import annotations

import io
import json
import pickle
import urllib.parse
from collections.abc import Callable
from typing import Any

from sparkjet.core.errors import StoreError

#: The pickle protocol of every payload sparkjet writes to the store.
PICKLE_PROTOCOL = 5

#: Where sparkjet's internal modules moved (under ``sparkjet.core``): old, new.
#: A class a pickle names at an old module (or a module inside an old
#: package) is looked up at the new one. Rows are only added, never removed,
#: so every pickle an earlier release wrote stays readable.
MOVED_MODULES: tuple[tuple[str, str], ...] = (
    ("checkpoint", "state.checkpoint"),
    ("state_files", "state.files"),
    ("state_cache", "state.cache"),
    ("state_warming", "state.warming"),
    ("compaction", "state.compaction"),
    ("exports", "state.export"),
    ("restore", "state.restore"),
    ("keygroups", "state.keygroups"),
    ("snapshots", "state.snapshots"),
    ("engine", "engine.boundary"),
    ("adaptive", "engine.adaptive"),
    ("runtime.reports", "engine.spark.accumulators"),
    ("runtime.spark_engine", "engine.spark.engine"),
    ("runtime", "engine.spark"),
    ("inprocess", "engine.inprocess"),
    ("tasks.plan", "engine.tasks.runs"),
    ("tasks", "engine.tasks"),
    ("microbatch_loop", "microbatch.loop"),
    ("batch_commit", "microbatch.commit"),
    ("maintenance", "maintenance.gc"),
    ("retention", "maintenance.retention"),
    ("hookspecs", "host.hookspecs"),
    ("plugin_manager", "host.manager"),
    ("contracts", "host.contracts"),
    ("graph", "pipeline.graph"),
    ("planner", "pipeline.planner"),
    ("keyed", "pipeline.keyed"),
    ("windowing", "pipeline.window_fold"),
    ("windows", "pipeline.windows"),
    ("event_time", "pipeline.event_time"),
    ("timers", "pipeline.timers"),
    ("fusion", "pipeline.fusion"),
    ("aggregation", "pipeline.aggregation"),
    ("dead_letters", "pipeline.dead_letters"),
    ("naming", "store.naming"),
    ("jobs.streaming", "jobs.stream_run"),
    ("store.files", "store.protocol"),
)
_MOVED = sorted(MOVED_MODULES, key=lambda row: len(row[0]), reverse=True)


def moved_module(module: str) -> str | None:
    """Where ``module`` (a dotted name a pickle holds) lives now, if it moved."""
    for old, new in _MOVED:
        old_name = f"sparkjet.core.{old}"
        if module == old_name:
            return f"sparkjet.core.{new}"
        if module.startswith(old_name + "."):
            return f"sparkjet.core.{new}" + module[len(old_name):]
    return None


class _Unpickler(pickle.Unpickler):
    """An unpickler that finds a class at its module's new place when the old one is gone."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            new = moved_module(module)
            if new is None:
                raise
            return super().find_class(new, name)


def loads(data: bytes | memoryview) -> Any:
    """``pickle.loads`` (and so ``cloudpickle.loads``) that also reads pickles of moved modules."""
    return _Unpickler(io.BytesIO(data)).load()


def encode_name(kind: str, name: str) -> str:
    """A file-safe folder name for a data structure; refuses names that cannot be one."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        raise StoreError(f"invalid {kind} name {name!r}: expected a non-empty string")
    if any(ord(ch) < 32 for ch in name):
        raise StoreError(f"invalid {kind} name {name!r}: control characters are not allowed")
    return urllib.parse.quote(name, safe="")


def decode_name(encoded: str) -> str:
    """The name :func:`encode_name` encoded."""
    return urllib.parse.unquote(encoded)


def decode(
    raw: bytes,
    what: str,
    *,
    loads: Callable[[bytes], Any],
    keys: tuple[str, ...] = (),
    check: Callable[[Any], None] | None = None,
    redact: Callable[[str], str] = str,
    where: str = "",
) -> Any:
    """``raw`` decoded by ``loads``, or a StoreError saying ``what`` (a file, named) is corrupt.

    Every file sparkjet reads back from a store goes through here (JSON or
    pickle alike), so a truncated or damaged one is an error naming it, its
    size and the decoder's complaint, never a bare ``UnpicklingError`` or
    ``JSONDecodeError``; ``where`` (`` in store '...'``) follows the size.
    A dict result must hold ``keys``; ``check`` may raise on anything else
    wrong. A MemoryError is passed on as it is: the
    file is too big for this process, not corrupt.
    """
    try:
        data = loads(raw)
        missing = [k for k in keys if k not in data]
        if missing:
            raise KeyError(f"no {', '.join(missing)}")
        if check is not None:
            check(data)
    except MemoryError:
        raise
    except Exception as exc:
        raise StoreError(redact(
            f"{what} is corrupt or truncated ({len(raw)} bytes){where}: "
            f"{type(exc).__name__}: {exc}"
        )) from exc
    return data


def unpickle(
    raw: bytes,
    what: str,
    *,
    keys: tuple[str, ...] = (),
    check: Callable[[Any], None] | None = None,
    redact: Callable[[str], str] = str,
    loads: Callable[[bytes], Any] = loads,
) -> Any:
    """``raw`` unpickled, or a StoreError saying ``what`` (a file, named) is corrupt.

    :func:`decode` with :func:`loads` as the default decoder.
    """
    return decode(raw, what, loads=loads, keys=keys, check=check, redact=redact)


def json_loads(raw: bytes) -> Any:
    """``raw`` (UTF-8 JSON) parsed: the decoder of the store's JSON files."""
    return json.loads(raw)
