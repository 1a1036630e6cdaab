"""The fsspec store: one URL's files read, written create-only and listed afresh.

Hazelcast keeps IList and IMap in the cluster; sparkjet keeps them in a folder
that every process (driver and executors) can reach: a local path on a laptop,
an S3 or GCS prefix on a cluster. :class:`Store` is that folder's file
operations (whole-file reads and writes, create-only writes, listings that
trust no cache, deletes that never leave the root) and the door to what it
holds: lists and maps (:mod:`~sparkjet.core.store.commit_log`), streams
(:mod:`~sparkjet.core.store.stream_log`); every path comes from its
:class:`~sparkjet.core.store.layout.StoreLayout`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import pickle
import posixpath
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.memory import MemoryFileSystem

from sparkjet.core.errors import StoreError
from sparkjet.core.naming import decode, json_loads
from sparkjet.core.store import requests
from sparkjet.core.store.commit_log import CommitLog
from sparkjet.core.store.files import Entry
from sparkjet.core.store.layout import StoreLayout
from sparkjet.core.store.memoryfs import ThreadSafeMemoryFileSystem
from sparkjet.core.store.stream_log import PollSettings, StreamLog

log = logging.getLogger("sparkjet.store")

_T = TypeVar("_T")

#: How often :meth:`Store.now` measures the store's clock again.
CLOCK_PROBE_SECONDS = 60.0


def _no_secrets(text: str) -> str:
    return text


class Store:
    """One fsspec location holding lists, maps, streams and job records.

    Picklable: executors rebuild the filesystem from the URL and options.
    Options may hold credentials; they are never included in ``repr``.
    """

    def __init__(
        self,
        url: str,
        options: dict[str, Any] | None = None,
        redact: Callable[[str], str] | None = None,
    ) -> None:
        self.url = url
        self.options = dict(options or {})
        #: Masks secrets (``${env:...}`` values) in anything shown to users.
        self.redact = redact or _no_secrets
        self._fs: Any = None
        self._layout: StoreLayout | None = None
        self._conditional: bool | None = None
        #: The store's time at a probe, and this process's monotonic time then.
        self._clock: tuple[float, float] | None = None
        #: How streams are polled on an object store (the client sets its configuration's).
        self.poll = PollSettings()
        #: Streams' partition counts read here: meta path -> (partitions, monotonic time).
        self.stream_meta: dict[str, tuple[int, float]] = {}
        #: Whole stream chunks a header's read fetched, for the read that follows.
        self.read_ahead: dict[str, tuple[bytes, float]] = {}

    def _error(self, message: str) -> StoreError:
        return StoreError(self.redact(message))

    @property
    def shown_url(self) -> str:
        """The URL as it may be printed: resolved secrets masked."""
        return self.redact(self.url)

    def __repr__(self) -> str:
        return f"Store({self.shown_url!r})"

    def __getstate__(self) -> dict[str, Any]:
        # The redactor travels too, so errors raised on executors mask secrets.
        return {"url": self.url, "options": self.options, "redact": self.redact}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["options"], state.get("redact"))  # type: ignore[misc]

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (created on first use)."""
        if self._fs is None:
            try:
                fs, root = fsspec.core.url_to_fs(self.url, **self.options)
            except (ImportError, ValueError) as exc:
                raise self._error(f"cannot open store {self.shown_url!r}: {exc}") from exc
            if _is_local(fs):
                root = os.path.abspath(root)
            elif type(fs) is MemoryFileSystem:
                fs = ThreadSafeMemoryFileSystem(**self.options)
            self._fs, self._layout = fs, StoreLayout(root.rstrip("/"))
        return self._fs

    @property
    def layout(self) -> StoreLayout:
        """Where everything lies in the store (opens the filesystem, which finds the root)."""
        self.fs  # noqa: B018 - opens the filesystem, which sets the layout
        assert self._layout is not None
        return self._layout

    @property
    def root(self) -> str:
        """The store's root path inside its filesystem."""
        return self.layout.root

    def path(self, *parts: str) -> str:
        """Join ``parts`` under the root (for a plugin's own files)."""
        return self.layout.under_root(*parts)

    # --- primitive file operations, all errors naming the path ------------
    #
    # Object stores as they are: s3fs and gcsfs cache listings per process, and
    # another process (a publisher, a second driver, an executor) may have
    # written since. Every listing and existence check here asks the store
    # afresh; nothing is trusted from a cache.

    def _inside(self, path: str) -> str:
        """``path`` if it lies under the root; StoreError otherwise (never touch outside)."""
        root = self.root
        normal = posixpath.normpath(path)
        if not root:
            return normal
        if normal != root and not normal.startswith(root.rstrip("/") + "/"):
            raise self._error(
                f"refusing to touch {path!r}: it is outside store {self.shown_url!r}"
            )
        return normal

    @property
    def _protocol(self) -> str:
        """``"s3"``, ``"gcs"``, ``"file"``, ``"memory"`` or the filesystem's first protocol."""
        protocol = self.fs.protocol
        names = protocol if isinstance(protocol, tuple) else (protocol,)
        for name in ("s3", "gcs", "file", "memory"):
            if name in names or (name == "gcs" and "gs" in names):
                return name
        return str(names[0])

    @property
    def object_store(self) -> bool:
        """Whether the store is remote (S3, GCS, ...): each request goes to a server and is billed.

        False for a local folder and for memory.
        """
        return not (_is_local(self.fs) or self._memory)

    @property
    def _memory(self) -> bool:
        return self._protocol == "memory"

    @property
    def _one_get(self) -> dict[str, Any]:
        """What makes a whole-file read one GET (s3fs would HEAD first to size a parallel read)."""
        return {"max_concurrency": 1} if self._protocol == "s3" else {}

    def _folder_for(self, path: str) -> None:
        """Make ``path``'s folder where folders exist; S3 and GCS have none (no request).

        s3fs and gcsfs would ask whether the bucket exists, a request per write.
        """
        if self._protocol not in ("s3", "gcs"):
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)

    def _count_stat(self, found: bool) -> None:
        """Count one existence check or stat as S3 and GCS answer it.

        S3: a HEAD, and a listing when nothing is found (a folder of that
        name?). GCS: the object's metadata and a listing at once, and often
        the metadata again (counted as two HEADs and a listing).
        """
        protocol = self._protocol
        if protocol == "gcs":
            requests.count("head", 2)
            requests.count("list")
        else:
            requests.count("head")
            if not found and protocol == "s3":
                requests.count("list")

    def _fresh(self, path: str) -> None:
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)

    def read_bytes(self, path: str) -> bytes:
        """The whole file ``path``; FileNotFoundError if it does not exist."""
        self._fresh(path)  # s3fs sizes a read from its (maybe stale) listing cache
        requests.count("get")
        try:
            data: bytes = self.fs.cat_file(path, **self._one_get)
            return data
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._error(f"cannot read {path!r} in store {self.shown_url!r}: {exc}") from exc

    def read_many(self, paths: list[str]) -> dict[str, bytes]:
        """Whole files, by path; on S3 and GCS fetched at once (one GET each, concurrently).

        FileNotFoundError if one does not exist. A micro-batch reading many
        small stream chunks so waits for about one round trip, not one each.
        """
        if len(paths) < 2 or not self.object_store:
            return {path: self.read_bytes(path) for path in paths}
        for path in paths:
            self._fresh(path)
        requests.count("get", len(paths))
        try:
            data: dict[str, bytes] = self.fs.cat(paths, on_error="raise", **self._one_get)
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._error(f"cannot read {len(paths)} files ({paths[0]!r}, ...) in store "
                              f"{self.shown_url!r}: {exc}") from exc
        # fsspec names the files as its filesystem does (without the protocol).
        named = {self.fs._strip_protocol(path).rstrip("/"): path for path in paths}
        return {named[key.rstrip("/")]: raw for key, raw in data.items()}

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of ``path`` (fewer if the file is shorter)."""
        self._fresh(path)
        requests.count("get")
        try:
            data: bytes = self.fs.cat_file(path, start=start, end=end)
            return data
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._error(f"cannot read {path!r} in store {self.shown_url!r}: {exc}") from exc

    def decode(
        self,
        path: str,
        raw: bytes,
        loads: Callable[[bytes], Any],
        what: str = "file",
        *,
        keys: tuple[str, ...] = (),
        check: Callable[[Any], None] | None = None,
    ) -> Any:
        """``raw`` (the bytes of ``path``) decoded by ``loads``.

        A decode error (a truncated or damaged file), a dict missing
        ``keys`` or whatever ``check`` raises becomes a StoreError: "``what``
        '``path``' is corrupt or truncated (N bytes) in store '``url``':
        JSONDecodeError: ...", secrets masked.
        """
        return decode(raw, f"{what} {path!r}", loads=loads, keys=keys, check=check,
                      redact=self.redact, where=f" in store {self.shown_url!r}")

    def read_json(
        self,
        path: str,
        what: str = "file",
        *,
        keys: tuple[str, ...] = (),
        check: Callable[[Any], None] | None = None,
    ) -> Any:
        """The JSON file ``path`` parsed; FileNotFoundError if absent (see :meth:`decode`)."""
        return self.decode(path, self.read_bytes(path), json_loads, what, keys=keys, check=check)

    def read_pickle(
        self,
        path: str,
        what: str = "file",
        *,
        keys: tuple[str, ...] = (),
        check: Callable[[Any], None] | None = None,
        loads: Callable[[bytes], Any] = pickle.loads,
    ) -> Any:
        """The pickle file ``path`` loaded; FileNotFoundError if absent (see :meth:`decode`)."""
        return self.decode(path, self.read_bytes(path), loads, what, keys=keys, check=check)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file; readers see the old or the new content, never a mix."""
        requests.count("put")
        try:
            self._folder_for(path)
            if _is_local(self.fs):
                tmp = _complete_temp_file(path, data)
                try:
                    os.replace(tmp, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
            else:
                # A single-object PUT is atomic on S3, GCS and in memory.
                self.fs.pipe_file(path, data)
        except Exception as exc:
            raise self._error(f"cannot write {path!r} in store {self.shown_url!r}: {exc}") from exc

    @property
    def conditional_writes(self) -> bool:
        """Whether the store enforces create-only writes (probed once per process).

        Local folders always do (a hard link fails on an existing name). On
        other filesystems a probe file is created twice through the
        filesystem's create-only call (``pipe_file(mode="create")`` where the
        filesystem implements it, as s3fs and gcsfs do with ``If-None-Match``
        and ``ifGenerationMatch=0``; else ``open(mode="xb")``): the second
        create must be refused. Where it is not, :meth:`create_exclusive`
        falls back to check-then-write, which two writers can race, and
        EXACTLY_ONCE is refused at submit.
        """
        if self._conditional is None:
            self._conditional = _is_local(self.fs) or self._probe_conditional()
        return self._conditional

    def _create_only(self, path: str, data: bytes) -> None:
        """The filesystem's own create-only write; FileExistsError if ``path`` exists."""
        requests.count("put")
        if _implements_pipe_file(self.fs):
            self.fs.pipe_file(path, data, mode="create")
        else:
            with self.fs.open(path, "xb") as fh:
                fh.write(data)

    def _probe_conditional(self) -> bool:
        path = self.layout.new_probe()
        try:
            self._folder_for(path)
            try:
                self._create_only(path, b"1")
            except (ValueError, NotImplementedError, TypeError):
                return False  # the filesystem has no create-only mode at all
            try:
                self._create_only(path, b"2")
            except FileExistsError:
                return True
            except (ValueError, NotImplementedError, TypeError):
                return False
            log.warning(
                "store %s does not enforce create-only writes (a probe file was created "
                "twice); EXACTLY_ONCE is refused on it", self.shown_url,
            )
            return False  # the second create went through: the server ignores the condition
        except Exception as exc:
            raise self._error(
                f"cannot probe store {self.shown_url!r} for create-only writes: {exc}"
            ) from exc
        finally:
            requests.count("delete")
            with contextlib.suppress(Exception):
                self.fs.rm(path)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` only if it does not exist; False if it already does.

        A create that the filesystem client retried after it had landed
        reports "already exists"; the file is then read back, and a file
        holding exactly ``data`` counts as written by this call. So callers
        whose payloads could collide with another writer's make them unique
        (a writer token or a nonce in the payload).
        """
        try:
            self._folder_for(path)
            if _is_local(self.fs):
                requests.count("put")
                tmp = _complete_temp_file(path, data)
                try:
                    os.link(tmp, path)  # atomic, fails if path exists; content complete
                except FileExistsError:
                    return self._landed(path, data)  # the same rule on every filesystem
                finally:
                    # Gone already if the folder was removed once the file landed
                    # (a newer snapshot export retiring this attempt at once).
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
                return True
            if not self.conditional_writes:
                # Check, then write: documented as racy; EXACTLY_ONCE is refused here.
                if self.exists(path):
                    return False
                requests.count("put")
                self.fs.pipe_file(path, data)
                return True
            try:
                self._create_only(path, data)
                return True
            except FileExistsError:
                return self._landed(path, data)
            finally:
                self._fresh(path)
        except StoreError:
            raise
        except Exception as exc:
            raise self._error(
                f"cannot create {path!r} in store {self.shown_url!r}: {exc}"
            ) from exc

    def _landed(self, path: str, data: bytes) -> bool:
        """After "already exists": True if the file holds ``data`` (our own retried write)."""
        try:
            return self.read_bytes(path) == data
        except FileNotFoundError:
            return False

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

    def now(self) -> float | None:
        """The store's current time, in seconds since the epoch; None if it cannot tell.

        Measured without trusting this machine's wall clock: a probe file is
        written and its modification time (stamped by the store) read back,
        then advanced by this process's monotonic clock; probed again every
        :data:`CLOCK_PROBE_SECONDS`. The probe is taken after the write
        returns, so the result may run behind the store by the write's latency
        (never ahead of it). A store that takes no writes (full, read-only)
        keeps the last probe; before any probe succeeded, this machine's clock
        stands in.
        """
        anchored = self._clock
        if anchored is None or time.monotonic() - anchored[1] > CLOCK_PROBE_SECONDS:
            try:
                stamp = self._probe_clock()
            except StoreError as exc:
                if anchored is None:
                    # A store that takes no writes (full, read-only): this machine's
                    # clock is the best there is until a probe succeeds.
                    log.debug("cannot probe the clock of store %s, using this machine's: %s",
                              self.shown_url, exc)
                    return time.time()
                stamp = None  # the last probe, advanced, stays right
            if stamp is not None:
                anchored = self._clock = (stamp, time.monotonic())
            elif anchored is None:
                return None
        return anchored[0] + (time.monotonic() - anchored[1])

    def _probe_clock(self) -> float | None:
        """The store's time now: the modification time of a probe file written now."""
        path = self.layout.new_probe("clock")
        try:
            self.write_bytes(path, b"")
            return self.modified(path)
        finally:
            requests.count("delete")
            with contextlib.suppress(Exception):
                self.fs.rm(path)

    def temp_files(self) -> list[str]:
        """Temp files of writes that never finished (their process was killed), anywhere.

        Only a local folder has them: other filesystems write whole objects.
        """
        if not _is_local(self.fs):
            return []
        found: list[str] = []
        for folder, _, files in os.walk(self.root):
            found.extend(os.path.join(folder, f) for f in files if _TEMP_FILE.search(f))
        return sorted(found)

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

    def remove(self, path: str, recursive: bool = False) -> None:
        """Delete ``path`` (a whole folder with ``recursive``); never anything outside the root."""
        target = self._inside(path)
        if recursive and target == self.root:
            raise self._error(f"refusing to delete the whole store {self.shown_url!r}")
        if recursive and self._protocol in ("s3", "gcs"):
            # A listing, then the deletes: S3 takes 1,000 keys a request, GCS one.
            try:
                files = sorted(self.find(target))
            except FileNotFoundError:
                files = []
            if files:
                requests.count("delete", _pages(files) if self._protocol == "s3" else len(files))
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(files)
            else:  # a file, or nothing: as asked
                requests.count("delete")
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(target, recursive=True)
        else:
            requests.count("delete")
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(target, recursive=recursive)
        self._fresh(target)

    def remove_many(self, paths: list[str]) -> None:
        """Delete the files ``paths`` (those already gone are no error).

        On S3 one request per 1,000 files (a bulk delete), on GCS one
        delete each, sent together: a fold removing a hundred records, or a
        checkpoint its old plans, waits about one round trip, not one each.
        """
        if len(paths) < 2 or not self.object_store:
            for path in paths:
                self.remove(path)
            return
        targets = [self._inside(path) for path in paths]
        requests.count("delete", _pages(targets) if self._protocol == "s3" else len(targets))
        try:
            self.fs.rm(targets)
        except FileNotFoundError:
            for target in targets:  # one was gone already: the rest one by one
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(target)
        except Exception as exc:
            raise self._error(f"cannot delete {len(paths)} files ({paths[0]!r}, ...) in store "
                              f"{self.shown_url!r}: {exc}") from exc
        for target in targets:
            self._fresh(target)

    def move(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` inside the store."""
        target = self._inside(dst)
        self._folder_for(target)
        requests.count("put")  # a copy on S3 and GCS (or a rename), then the delete
        requests.count("delete")
        self.fs.mv(self._inside(src), target)

    # --- data structures ---------------------------------------------------

    @property
    def files(self) -> Store:
        """The store's files: the store itself (what plugins reach as ``context.store.files``)."""
        return self

    def list_log(self, name: str) -> CommitLog:
        """The commit log of the list ``name``."""
        return CommitLog(self, self.layout.list_paths(name).folder, f"list {name!r}")

    def map_log(self, name: str) -> CommitLog:
        """The commit log of the map ``name``."""
        return CommitLog(self, self.layout.map_paths(name).folder, f"map {name!r}", "map")

    def stream_log(self, name: str) -> StreamLog:
        """The stream ``name``."""
        return StreamLog(self, name)

    def list_names(self) -> list[str]:
        """Names of the lists in the store."""
        return [self.layout.name_of(n) for n in self.listdir(self.layout.lists)]

    def map_names(self) -> list[str]:
        """Names of the maps in the store."""
        return [self.layout.name_of(n) for n in self.listdir(self.layout.maps)]


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


#: The name of a temp file :func:`_complete_temp_file` writes beside its target.
_TEMP_FILE = re.compile(r"\.[0-9a-f]{32}\.tmp$")


def is_temp_file(path: str) -> bool:
    """Whether ``path`` is the temp file of a local write (beside its target, for a moment).

    A create-only write links its complete temp file into place and then
    removes it, so a listing between the two shows both: readers that
    check a folder's exact contents leave such names out.
    """
    return _TEMP_FILE.search(path) is not None


def _complete_temp_file(path: str, data: bytes) -> str:
    """A uniquely named file beside ``path`` holding ``data``, to rename or link into place.

    A write that fails (a full disk) removes its temp file before raising.
    """
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _implements_pipe_file(fs: Any) -> bool:
    """Whether ``fs`` has a ``pipe_file`` of its own (fsspec's default checks, then writes)."""
    from fsspec.asyn import AsyncFileSystem
    from fsspec.spec import AbstractFileSystem

    if isinstance(fs, AsyncFileSystem) and type(fs)._pipe_file is not AsyncFileSystem._pipe_file:
        return True
    return type(fs).pipe_file is not AbstractFileSystem.pipe_file


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol
