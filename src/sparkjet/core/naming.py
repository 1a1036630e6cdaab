"""How the store names things on disk: file-safe names for data structures, pickle protocol.

The bottom of the store's modules, so the store, its streams and the
checkpoint name files the same way without importing one another.
"""

from __future__ import annotations

import json
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
    loads: Callable[[bytes], Any] = pickle.loads,
) -> Any:
    """``raw`` unpickled, or a StoreError saying ``what`` (a file, named) is corrupt.

    :func:`decode` with ``pickle.loads`` as the default decoder.
    """
    return decode(raw, what, loads=loads, keys=keys, check=check, redact=redact)


def json_loads(raw: bytes) -> Any:
    """``raw`` (UTF-8 JSON) parsed: the decoder of the store's JSON files."""
    return json.loads(raw)
