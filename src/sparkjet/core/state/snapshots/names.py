"""Names and paths in a snapshot backend: snapshot folders, attempt ids, data-file paths.

Snapshot names are encoded by their own rule (:func:`snapshot_folder`), not
the store's (:func:`sparkjet.core.store.naming.encode_name`): a snapshot folder is
one percent-encoded path segment that never starts with ``_`` or ``.``
(those are the backend's own, like the create-only probe), so any name a
user types round-trips, while the store's names carry a kind prefix.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from typing import Any

from sparkjet.core.errors import SnapshotError

#: The manifest's file name in an attempt folder.
MANIFEST = "MANIFEST.json"
ATTEMPT = re.compile(r"^(\d{15})-([0-9a-f]{16})$")




def snapshot_folder(name: str) -> str:
    """The folder of snapshot ``name``: percent-encoded, never starting with ``_`` or ``.``.

    Folders starting with ``_`` are the backend's own (the create-only probe);
    a name that cannot be a folder is a :class:`SnapshotError`.
    """
    if not isinstance(name, str) or not name.strip():
        raise SnapshotError(f"invalid snapshot name {name!r}: expected a non-empty string")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise SnapshotError(
            f"invalid snapshot name {name!r}: control characters are not allowed", name
        )
    encoded = urllib.parse.quote(name, safe="")
    if encoded[0] in "_.":
        encoded = f"%{ord(encoded[0]):02X}{encoded[1:]}"
    return encoded


def snapshot_name(folder: str) -> str | None:
    """The snapshot name of a folder :func:`snapshot_folder` made, or None for any other folder."""
    try:
        name = urllib.parse.unquote(folder, errors="strict")
        return name if snapshot_folder(name) == folder else None
    except (SnapshotError, UnicodeDecodeError):
        return None


def check_relpath(path: Any, where: str, snapshot: str | None) -> str:
    """A data file's path inside a snapshot: relative, ``/``-separated, no ``.``/``..``."""
    if not isinstance(path, str) or not path:
        raise SnapshotError(f"{where}: a file path must be a non-empty string, got {path!r}",
                            snapshot)
    parts = path.split("/")
    if (
        any(p in ("", ".", "..") or "\\" in p for p in parts)
        or any(ord(ch) < 32 for ch in path)
        or path == MANIFEST
    ):
        raise SnapshotError(
            f"{where}: invalid file path {path!r} (relative, '/'-separated, no '.' or '..' "
            f"segments, not {MANIFEST})", snapshot, path,
        )
    return path


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def attempt_start(attempt: str) -> int:
    match = ATTEMPT.match(attempt)
    return int(match.group(1)) if match else 0


