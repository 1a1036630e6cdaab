"""How the store names things on disk: file-safe names for data structures, pickle protocol.

The bottom of the store's modules, so the store, its streams and the
checkpoint name files the same way without importing one another.
"""

from __future__ import annotations

import pickle
import urllib.parse
from collections.abc import Callable
from typing import Any

from sparkjet.core.errors import StoreError

#: The pickle protocol of every payload sparkjet writes to the store.
PICKLE_PROTOCOL = 5


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


def unpickle(
    raw: bytes,
    what: str,
    *,
    keys: tuple[str, ...] = (),
    check: Callable[[Any], None] | None = None,
    redact: Callable[[str], str] = str,
    loads: Callable[[bytes], Any] = pickle.loads,
) -> Any:
    """``raw`` unpickled, or a StoreError saying ``what`` (a file, named) is corrupt.

    A dict result must hold ``keys``; ``check`` may raise on anything else
    wrong. A MemoryError is passed on as it is: the file is too big for this
    process, not corrupt.
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
            f"{what} is corrupt or truncated ({len(raw)} bytes): {type(exc).__name__}: {exc}"
        )) from exc
    return data
