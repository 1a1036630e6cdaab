"""The folder as the file source's driver sees it: listed, settled, and files changed after a read.

:func:`list_folder` lists the matching files afresh; a :class:`FolderWatch`
is a source's memory of its listings on the driver (never pickled): since
when each file has kept its size and modification time, so only settled
files are read; the last listing, which stands for ``poll_seconds``; and the
files already warned about, changed after they were read.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import math
import posixpath
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sparkjet.contrib.files.common import _open_fs
from sparkjet.plugin import file_modified

# The package's logger, as before the source had a module of its own.
log = logging.getLogger("sparkjet.contrib.files")

#: A listing: each file as (mtime in µs, path relative to the url, size), sorted.
Listing = list[tuple[int, str, int]]


def _mtime_us(info: Mapping[str, Any]) -> int:
    """A listing entry's modification time in microseconds; 0 if the backend gives none."""
    return round((file_modified(info) or 0.0) * 1_000_000)


def _hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def list_folder(
    url: str, storage_options: Mapping[str, Any], glob: str, recursive: bool, where: str,
    missing_ok: bool = True,
) -> Listing:
    """Every matching file as (mtime in µs, path relative to the url, size), sorted.

    A folder that does not exist holds no files yet (a stream's folder may
    appear later); with ``missing_ok`` False it is an error naming it
    (``where``: the source's description).
    """
    fs, root = _open_fs(url, storage_options)
    with contextlib.suppress(Exception):  # a filesystem without a listing cache
        fs.invalidate_cache(root)
    try:
        if recursive:
            entries = list(fs.find(root, detail=True).values())
        else:
            entries = fs.ls(root, detail=True)
    except FileNotFoundError as exc:
        if missing_ok:
            return []
        raise FileNotFoundError(
            f"{where}: folder {root} does not exist") from exc
    prefix = root.rstrip("/") + "/"
    found = []
    for info in entries:
        if info.get("type") not in ("file", None):
            continue
        path = str(info["name"])
        relative = path[len(prefix):] if path.startswith(prefix) else posixpath.basename(path)
        if _hidden(relative) or not fnmatch.fnmatchcase(relative, glob):
            continue
        found.append((_mtime_us(info), relative, int(info.get("size") or 0)))
    return sorted(found)


class FolderWatch:
    """A file source's memory of the folder on the driver: its listings and settled files."""

    def __init__(self) -> None:
        # The previous listing (for "unchanged since") and the settled files
        # of the last one (listed at most every poll_seconds).
        self._seen: dict[str, tuple[int, int, float]] = {}
        self.listing: Listing = []
        self.settled: Listing | None = None
        self._listed_at = -math.inf
        self._warned: set[tuple[str, int]] = set()  # (file, mtime) changed after it was read

    def look(
        self, list_now: Callable[[], Listing], settle_seconds: float, poll_seconds: float,
    ) -> tuple[Listing, Listing]:
        """The listing and its settled files: listed now if ``poll_seconds`` have passed."""
        now = time.monotonic()
        if self.settled is None or now - self._listed_at >= poll_seconds:
            self.listing = list_now()
            self.settled = self.stable(self.listing, settle_seconds)
            self._listed_at = now
        return self.listing, self.settled

    def stable(self, listing: Listing, settle_seconds: float) -> Listing:
        """The files of ``listing`` whose size and mtime have not changed for ``settle_seconds``."""
        now = time.monotonic()
        seen: dict[str, tuple[int, int, float]] = {}
        stable = []
        for mtime, name, size in listing:
            had = self._seen.get(name)
            since = had[2] if had is not None and had[:2] == (size, mtime) else now
            seen[name] = (size, mtime, since)
            if now - since >= settle_seconds:
                stable.append((mtime, name, size))
        self._seen = seen
        return stable

    def warn_changed(
        self, done: Sequence[Sequence[Any]], stable: Listing, where: str, stage: str
    ) -> None:
        """Log, once per change, each file done at one modification time and listed at another.

        ``done``: the offsets' ``[mtime, name]`` of the files read. A file is
        read once: what was written to it after it was read (or after a job
        started at ``latest`` passed it by) is not read.
        """
        read_mtimes = {d[1]: d[0] for d in done}
        for mtime, name, _ in stable:
            read_at = read_mtimes.get(name)
            if read_at is None or read_at == mtime or (name, mtime) in self._warned:
                continue
            self._warned.add((name, mtime))
            log.warning(
                "%s, stage %r: file %s changed after it was read (modified at %d µs, read "
                "at %d µs); a file is read once, so its new content is not read: write "
                "files under a hidden name and rename them into place when complete",
                where, stage, name, mtime, read_at)
