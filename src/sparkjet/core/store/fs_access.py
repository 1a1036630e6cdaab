"""Opening a store's URL: the fsspec filesystem, its root, and what every file operation shares.

:class:`FsAccess` is the base of the fsspec :class:`~sparkjet.core.store.fs.Store`:
its URL, options and secret masking, the filesystem opened on first use (a
local root made absolute, fsspec's memory filesystem made safe between
threads), the store's :class:`~sparkjet.core.store.layout.StoreLayout`,
which kind of store it is, the guard that keeps every path under the root,
and how a stat is counted as S3 and GCS answer it
(:mod:`~sparkjet.core.store.requests`). Pickling keeps the URL, the options
and the redactor only: executors open the filesystem again.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Callable
from typing import Any

import fsspec
from fsspec.implementations.memory import MemoryFileSystem

from sparkjet.core.errors import StoreError
from sparkjet.core.store import requests
from sparkjet.core.store.layout import StoreLayout
from sparkjet.core.store.memoryfs import ThreadSafeMemoryFileSystem
from sparkjet.core.store.stream_wait import PollSettings


def _no_secrets(text: str) -> str:
    return text


class FsAccess:
    """One fsspec location opened: its filesystem, root and layout; picklable.

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


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol
