"""What the store's logs need of a store: the ``StoreFiles`` protocol.

The commit log and the stream log are built by the fsspec
:class:`~sparkjet.core.store.fs.Store` (``store.list_log(name)``); typing
them against this protocol instead of the class keeps the modules free of a
cycle, and lets a log run on anything that reads and writes files this way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from sparkjet.core.store.layout import StoreLayout


class Entry(NamedTuple):
    """A file as a folder's listing shows it."""

    #: Its size in bytes.
    size: int
    #: When it was last written, in seconds since the epoch by the store's clock
    #: (None where the store keeps no times).
    modified: float | None


class StoreFiles(Protocol):
    """The file operations of a store, every error naming the path with secrets masked."""

    @property
    def shown_url(self) -> str:
        """The store's URL as it may be printed (secrets masked)."""

    @property
    def layout(self) -> StoreLayout:
        """Where everything lies in the store."""

    def redact(self, text: str) -> str:
        """``text`` with configured secrets masked."""

    def read_bytes(self, path: str) -> bytes:
        """A whole file; FileNotFoundError if absent."""

    def read_many(self, paths: list[str]) -> dict[str, bytes]:
        """Whole files by path, fetched at once where it can; FileNotFoundError if one is absent."""

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of ``path`` (fewer if the file is shorter)."""

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
        """``raw`` (read from ``path``) decoded; StoreError naming the file if it is corrupt."""

    def read_json(
        self,
        path: str,
        what: str = "file",
        *,
        keys: tuple[str, ...] = (),
        check: Callable[[Any], None] | None = None,
    ) -> Any:
        """A JSON file parsed; FileNotFoundError if absent, StoreError naming it if corrupt."""

    def read_pickle(
        self,
        path: str,
        what: str = "file",
        *,
        keys: tuple[str, ...] = (),
        check: Callable[[Any], None] | None = None,
        loads: Callable[[bytes], Any] = ...,
    ) -> Any:
        """A pickle file loaded; FileNotFoundError if absent, StoreError naming it if corrupt."""

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file: readers see the old or the new content, never a mix."""

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` only if it does not exist; False if it already does."""

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists, asked afresh."""

    def info(self, path: str) -> dict[str, Any]:
        """The filesystem's details of ``path`` (``size`` among them), asked afresh."""

    def modified(self, path: str) -> float | None:
        """When ``path`` was last written, by the store's clock (None if it cannot tell)."""

    def now(self) -> float | None:
        """The store's current time (see :meth:`Store.now`)."""

    def listdir(self, path: str) -> list[str]:
        """Base names of the entries in ``path`` (empty if it does not exist), listed afresh."""

    def entries(self, path: str) -> dict[str, Entry]:
        """The entries of ``path`` by base name with their sizes and times, in one listing."""

    def entries_after(self, path: str, after: str) -> dict[str, Entry]:
        """:meth:`entries` named after ``after`` (on S3 and GCS only those are listed)."""

    def remove(self, path: str, recursive: bool = False) -> None:
        """Delete ``path`` (a whole folder with ``recursive``)."""

    def remove_many(self, paths: list[str]) -> None:
        """Delete the files ``paths``, together where the store can (those gone: no error)."""
