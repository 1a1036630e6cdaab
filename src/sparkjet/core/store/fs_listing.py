"""Listing and stat-ing a store's files, afresh: folders, entries with sizes and times, existence.

s3fs and gcsfs cache listings per process, and another process may have
written since, so every listing and existence check asks the store again.
A listing is counted as S3 and GCS answer it (a request per page of 1,000
entries); :func:`file_modified` is the one reading of every backend's
modification times.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sparkjet.core.store import requests
from sparkjet.core.store.fs_access import _is_local
from sparkjet.core.store.fs_reads import FsReads
from sparkjet.core.store.protocol import Entry

_T = TypeVar("_T")


class FsListing(FsReads):
    """Listings, stats and existence checks of a store's files, never from a cache."""

    def info(self, path: str) -> dict[str, Any]:
        """The filesystem's details of ``path`` (a file or a folder), asked afresh.

        FileNotFoundError if ``path`` does not exist.
        """
        self._fresh(path)
        try:
            info: dict[str, Any] = self.fs.info(path)
        except FileNotFoundError:
            self._count_stat(found=False)
            raise
        except Exception as exc:
            self._count_stat(found=True)
            raise self._error(f"cannot stat {path!r} in store {self.shown_url!r}: {exc}") from exc
        self._count_stat(found=True)
        return info

    def modified(self, path: str) -> float | None:
        """When ``path`` was last written, in seconds since the epoch by the store's own clock.

        None when the filesystem does not keep modification times;
        FileNotFoundError if ``path`` does not exist.
        """
        self._fresh(path)
        try:
            stamp = self.fs.modified(path)
        except (FileNotFoundError, NotImplementedError, IsADirectoryError) as exc:
            self._count_stat(found=not isinstance(exc, FileNotFoundError))
            if isinstance(exc, FileNotFoundError):
                raise
            return None
        except Exception as exc:
            self._count_stat(found=True)
            raise self._error(f"cannot stat {path!r} in store {self.shown_url!r}: {exc}") from exc
        self._count_stat(found=True)
        return _seconds(stamp)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists, asked afresh."""
        self._fresh(path)
        try:
            found = bool(self.fs.exists(path))
        except Exception as exc:
            self._count_stat(found=True)
            raise self._error(f"cannot stat {path!r} in store {self.shown_url!r}: {exc}") from exc
        self._count_stat(found=found)
        return found

    def file_exists(self, path: str) -> bool:
        """Whether the file ``path`` exists, in one request on every store.

        For files only (a folder is not found). An S3 or GCS existence check
        (:meth:`exists`) costs a HEAD and, when the file is absent, a listing
        to look for a folder of that name (GCS: two or three requests either
        way); this reads the file instead, one GET, so it suits small files
        (a claim, a marker).
        """
        if _is_local(self.fs) or self._memory:
            return self.exists(path)
        try:
            self.read_bytes(path)
        except FileNotFoundError:
            return False
        return True

    def size(self, path: str) -> int:
        """The size of ``path`` in bytes, asked afresh."""
        self._fresh(path)
        try:
            size = int(self.fs.size(path))
        except FileNotFoundError:
            self._count_stat(found=False)
            raise
        except Exception as exc:
            self._count_stat(found=True)
            raise self._error(f"cannot stat {path!r} in store {self.shown_url!r}: {exc}") from exc
        self._count_stat(found=True)
        return size

    def _listing(self, path: str, call: Callable[[], _T]) -> _T:
        """Run the listing ``call`` of ``path``; FileNotFoundError if the folder is absent.

        Counted as one listing per 1,000 entries (a page of S3's and GCS's
        answers).
        """
        try:
            found = call()
        except FileNotFoundError:
            requests.count("list")
            raise
        except Exception:
            requests.count("list")
            raise
        requests.count("list", _pages(found))
        return found

    def listdir(self, path: str) -> list[str]:
        """Base names of the entries in ``path`` (empty if it does not exist), listed afresh."""
        self._fresh(path)
        try:
            entries = self._listing(path, lambda: self._ls(path, detail=False))
        except FileNotFoundError:
            return []
        return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def entries(self, path: str) -> dict[str, Entry]:
        """The entries of the folder ``path`` by base name with their sizes and times.

        One listing, made afresh (a stat per file would cost a request each on
        S3 and GCS). Empty if ``path`` does not exist.
        """
        self._fresh(path)
        try:
            found = self._listing(path, lambda: self._ls(path, detail=True))
        except FileNotFoundError:
            return {}
        return {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]:
                Entry(int(e.get("size") or 0), file_modified(e)) for e in found}

    def entries_after(self, path: str, after: str) -> dict[str, Entry]:
        """:meth:`entries` of the folder ``path`` whose base names sort after ``after``.

        On S3 (``StartAfter``) and GCS (``startOffset``) the server lists only
        those: a folder of thousands of files whose newest few are wanted
        costs a page of a few entries, not pages of all of them (S3 and GCS
        list in name order). Elsewhere the whole folder, filtered.
        """
        protocol = self._protocol
        if protocol not in ("s3", "gcs"):
            return {name: entry for name, entry in self.entries(path).items() if name > after}
        stripped = self.fs._strip_protocol(path).rstrip("/")
        bucket, _, key = stripped.partition("/")
        prefix = f"{key}/" if key else ""
        self._fresh(path)
        found = self._listing(path, lambda: self._ls_after(bucket, prefix, prefix + after))
        return {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]:
                Entry(int(e.get("size") or 0), file_modified(e)) for e in found
                if str(e["name"]).rstrip("/").rsplit("/", 1)[-1] > after}

    def _ls_after(self, bucket: str, prefix: str, start: str) -> list[dict[str, Any]]:
        """The objects directly under ``prefix`` named after ``start`` (its own, on GCS)."""
        from fsspec.asyn import sync

        if self._protocol == "s3":
            out: list[dict[str, Any]] = []
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/",
                                      "StartAfter": start}
            while True:
                page = self.fs.call_s3("list_objects_v2", **kwargs)
                out.extend({"name": f"{bucket}/{c['Key']}", "size": c.get("Size", 0),
                            "LastModified": c.get("LastModified")}
                           for c in page.get("Contents", []))
                if not page.get("IsTruncated"):
                    return out
                kwargs["ContinuationToken"] = page["NextContinuationToken"]
        items, _ = sync(self.fs.loop, self.fs._sequential_list_objects_helper, bucket=bucket,
                        delimiter="/", start_offset=start, end_offset=None,
                        prefix=prefix or None, versions=False, max_results=None)
        return [{**item, "name": f"{bucket}/{item['name']}"} if not str(
            item.get("name", "")).startswith(f"{bucket}/") else item for item in items]

    def _ls(self, path: str, detail: bool) -> list[Any]:
        """The folder ``path`` listed, one request (a page of 1,000) on S3 and GCS.

        s3fs and gcsfs follow an empty listing with a stat and another
        listing (is ``path`` a file?); their listing call alone is asked
        here, and an empty folder is absent (FileNotFoundError) as on
        every filesystem.
        """
        protocol = self._protocol
        raw = {"s3": "_lsdir", "gcs": "_do_list_objects"}.get(protocol)
        method = getattr(self.fs, raw, None) if raw else None
        if method is None:
            found: list[Any] = self.fs.ls(path, detail=detail)
            return found
        from fsspec.asyn import sync

        stripped = self.fs._strip_protocol(path).rstrip("/")
        if protocol == "s3":
            listed = sync(self.fs.loop, method, stripped, refresh=True)
        else:  # gcsfs: objects and the prefixes below (its _ls would stat an empty folder)
            items, prefixes = sync(self.fs.loop, method, stripped)
            bucket = stripped.split("/", 1)[0]
            listed = [*items, *({"name": f"{bucket}/{p.strip('/')}", "size": 0,
                                 "type": "directory"} for p in prefixes)]
        entries = [e for e in listed if str(e.get("name", "")).rstrip("/") != stripped]
        if not entries:
            raise FileNotFoundError(path)
        return entries if detail else [e["name"] for e in entries]

    def find(self, path: str) -> dict[str, dict[str, Any]]:
        """Every file under the folder ``path`` with its details, listed afresh.

        FileNotFoundError if ``path`` does not exist.
        """
        self._fresh(path)
        found: dict[str, dict[str, Any]] = self._listing(
            path, lambda: self.fs.find(path, detail=True)
        )
        if not found and self._protocol in ("s3", "gcs"):
            # Nothing under it: s3fs asks whether it is a file (a HEAD) and
            # lists its parent, gcsfs lists again.
            requests.count("list")
            if self._protocol == "s3":
                requests.count("head")
        return found


def _pages(found: Any) -> int:
    """The requests a listing of ``found`` took: S3 and GCS answer 1,000 entries a page."""
    size = len(found) if isinstance(found, (list, dict)) else 0
    return max(1, -(-size // 1000))


def _seconds(stamp: Any) -> float | None:
    """A filesystem's modification time (a datetime, an ISO string, or seconds) as epoch seconds."""
    if isinstance(stamp, str):
        try:
            stamp = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        except ValueError:
            return None
    if isinstance(stamp, datetime.datetime):
        if stamp.tzinfo is None:  # fsspec's filesystems stamp in UTC
            stamp = stamp.replace(tzinfo=datetime.UTC)
        return float(stamp.timestamp())
    if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
        return float(stamp)
    return None


#: Where fsspec's backends put a listing entry's modification time: local and
#: memory (``mtime``, ``created``), s3fs (``LastModified``), gcsfs (``updated``).
_TIME_KEYS = ("mtime", "LastModified", "updated", "last_modified", "created")


def file_modified(info: Mapping[str, Any]) -> float | None:
    """When a file was last written, in seconds since the epoch, from an fsspec listing entry.

    The one reading of every backend's listing times: local, memory, S3 and
    GCS (a time without a zone is UTC, as fsspec's backends stamp). None when
    the entry carries no time it can read.
    """
    for key in _TIME_KEYS:
        seconds = _seconds(info.get(key))
        if seconds is not None:
            return seconds
    return None
