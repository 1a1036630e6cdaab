"""The built-in snapshot backends: ``local``, ``memory``, ``s3`` and ``gcs``, on fsspec.

Each keeps snapshots under one URL in a :class:`sparkjet.plugin.FileStore`
(sparkjet's own fsspec machinery): fresh listings and reads, atomic whole-file
writes, and create-only writes that use the filesystem's conditional create
(a hard link on a local folder, ``If-None-Match`` on S3,
``ifGenerationMatch=0`` on GCS) and recognise a retried create by reading it
back.

Configured in ``[snapshots]``::

    [snapshots]
    backend = "s3"
    url = "s3://team-bucket/sparkjet/snapshots"
    [snapshots.options]
    endpoint_url = "http://127.0.0.1:9000"
    key = "${env:AWS_ACCESS_KEY_ID}"
    secret = "${env:AWS_SECRET_ACCESS_KEY}"

The URL's scheme must fit the kind, and every option must be one the
filesystem takes (gcsfs would silently ignore a misspelt one and talk to
Google instead): both are checked when the backend is made, before any I/O.
A missing ``s3fs`` or ``gcsfs`` is an error that says what to install.
"""

from __future__ import annotations

import builtins
import contextlib
import difflib
import importlib
import inspect
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar

import fsspec

from sparkjet.errors import SnapshotBackendError, StoreError
from sparkjet.plugin import SnapshotBackend, hookimpl, open_file_store

__all__ = [
    "FsspecSnapshotBackend",
    "GCSSnapshotBackend",
    "LocalSnapshotBackend",
    "MemorySnapshotBackend",
    "S3SnapshotBackend",
]

#: Options every fsspec filesystem takes (its instance cache and listing cache).
_FSSPEC_OPTIONS = frozenset(
    {"skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths"}
)


class FsspecSnapshotBackend(SnapshotBackend):
    """A snapshot backend on an fsspec filesystem; subclasses say which one.

    Runs on the driver. Every error about the storage is a
    :class:`~sparkjet.errors.SnapshotBackendError` naming the kind and the URL,
    with secrets masked; a missing file is :class:`FileNotFoundError`.
    """

    #: The URL schemes this kind accepts (``None``: a plain local path).
    schemes: ClassVar[tuple[str | None, ...]]
    #: The fsspec protocol whose filesystem class checks the options.
    protocol: ClassVar[str]
    #: ``(module, pip requirement)`` the filesystem needs, or None when fsspec has it.
    requires: ClassVar[tuple[str, str] | None] = None

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, options)
        if not isinstance(url, str) or not url.strip():
            raise SnapshotBackendError(
                f"snapshot backend {self.kind!r}: the URL must be a non-empty string, "
                f"got {type(url).__name__}"
            )
        self._check_url()
        self._check_options()
        self._store = open_file_store(url, self.options, self.redact)

    # --- checks when the backend is made -----------------------------------------

    def _error(self, message: str) -> SnapshotBackendError:
        return SnapshotBackendError(self.redact(f"{self.describe()}: {message}"))

    def _check_url(self) -> None:
        scheme, _ = fsspec.core.split_protocol(self.url)
        if scheme in self.schemes:
            return
        wanted = " or ".join(
            "a local path" if s is None else f"{s}://" for s in self.schemes
        )
        fitting = [cls.kind for cls in _BUILTINS if scheme in cls.schemes]
        hint = f' (for this URL use backend = "{fitting[0]}")' if fitting else ""
        raise self._error(f"the URL must be {wanted}{hint}")

    def _filesystem_class(self) -> type[Any]:
        if self.requires is not None:
            module, requirement = self.requires
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise self._error(
                    f"needs the {module} package, which is not installed: "
                    f"pip install '{requirement}'"
                ) from exc
        try:
            cls: type[Any] = fsspec.get_filesystem_class(self.protocol)
        except (ImportError, ValueError) as exc:
            raise self._error(f"cannot load fsspec's {self.protocol!r} filesystem: {exc}") from exc
        return cls

    def accepted_options(self) -> builtins.list[str]:
        """The option names this backend takes: its filesystem's parameters, sorted."""
        names = set(_FSSPEC_OPTIONS) | set(self._extra_options())
        for klass in self._filesystem_class().__mro__:
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            with contextlib.suppress(TypeError, ValueError):
                for param in inspect.signature(init).parameters.values():
                    if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
                        names.add(param.name)
        names.discard("self")
        return sorted(names)

    def _extra_options(self) -> Iterable[str]:
        """Options the filesystem passes on to something else (S3: the botocore session)."""
        return ()

    def _check_options(self) -> None:
        accepted = self.accepted_options()
        for name in self.options:
            if name in accepted:
                continue
            close = difflib.get_close_matches(str(name), accepted, n=1)
            suggestion = f"; did you mean {close[0]!r}?" if close else ""
            raise self._error(
                f"unknown option {name!r} in [snapshots.options]{suggestion} "
                f"(accepted: {', '.join(accepted)})"
            )

    # --- paths -------------------------------------------------------------------

    def _path(self, relative: str) -> str:
        """``relative`` under the root; refuses anything that could leave it."""
        if not isinstance(relative, str):
            raise self._error(f"a path must be a string, got {type(relative).__name__}")
        parts = [p for p in relative.strip("/").split("/")] if relative.strip("/") else []
        if any(p in ("", ".", "..") or "\\" in p for p in parts):
            raise self._error(f"refusing path {relative!r}: empty, '.' or '..' segments")
        return self._store.path(*parts) if parts else self._store.root

    def _relative(self, absolute: str) -> str:
        root = self._store.root.rstrip("/")
        absolute = absolute.rstrip("/")
        if root and absolute.startswith(root + "/"):
            return absolute[len(root) + 1 :]
        return absolute.lstrip("/") if not root else absolute

    def _fresh(self, path: str) -> None:
        with contextlib.suppress(Exception):
            self._store.fs.invalidate_cache(path)

    @contextlib.contextmanager
    def _errors(self, action: str, relative: str) -> Iterator[None]:
        """Turn storage failures into SnapshotBackendError naming backend, URL and path."""
        try:
            yield
        except (FileNotFoundError, SnapshotBackendError):
            raise
        except StoreError as exc:
            raise self._error(str(exc)) from exc
        except Exception as exc:
            raise self._error(f"cannot {action} {relative!r}: {exc!r}") from exc

    # --- the contract ----------------------------------------------------------------

    @property
    def create_only_enforced(self) -> bool:
        """Whether the filesystem refuses a second create (probed once per process)."""
        with self._errors("probe create-only writes in", ""):
            return self._store.conditional_writes

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` only if absent, atomically where the storage can; False if it exists."""
        target = self._path(path)
        with self._errors("create", path):
            return self._store.create_exclusive(target, data)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file; readers see the old or the new content, never a mix."""
        target = self._path(path)
        with self._errors("write", path):
            self._store.write_bytes(target, data)

    def write_chunks(self, path: str, chunks: Iterable[bytes]) -> None:
        """Stream a file to the storage (a multipart upload on S3, resumable on GCS).

        An error from ``chunks`` itself propagates as it is; the upload is
        then abandoned where the filesystem can (S3, GCS).
        """
        target = self._path(path)
        fs = self._store.fs
        with self._errors("write", path):
            fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            handle = fs.open(target, "wb")
        try:
            for chunk in chunks:
                with self._errors("write", path):
                    handle.write(chunk)
            with self._errors("write", path):
                handle.close()
        except BaseException:
            with contextlib.suppress(Exception):
                if isinstance(handle, fsspec.spec.AbstractBufferedFile):
                    handle.discard()  # abort the multipart / resumable upload
                else:
                    handle.close()
            raise
        finally:
            self._fresh(target)

    def read_bytes(self, path: str) -> bytes:
        """A whole file, read afresh; FileNotFoundError if absent."""
        target = self._path(path)
        with self._errors("read", path):
            return self._store.read_bytes(target)

    def read_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The file in chunks, read afresh; FileNotFoundError if absent."""
        target = self._path(path)
        self._fresh(target)  # s3fs sizes a read from its listing cache
        with self._errors("read", path):
            handle = self._store.fs.open(target, "rb")
        with handle:
            while True:
                with self._errors("read", path):
                    chunk = handle.read(chunk_size)
                if not chunk:
                    return
                yield chunk

    def exists(self, path: str) -> bool:
        """Whether the file exists, asked afresh."""
        target = self._path(path)
        with self._errors("check", path):
            return self._store.exists(target)

    def size(self, path: str) -> int:
        """The file's size in bytes, asked afresh; FileNotFoundError if absent."""
        target = self._path(path)
        with self._errors("check the size of", path):
            return self._store.size(target)

    def list(self, prefix: str) -> builtins.list[str]:
        """Every file under the folder ``prefix``, relative to the root, listed afresh."""
        target = self._path(prefix)
        with self._errors("list", prefix):
            try:
                found = list(self._store.find(target))
            except FileNotFoundError:
                return []
        inside = target.rstrip("/") + "/"
        return sorted(
            self._relative(p) for p in found
            if p.startswith(inside) and not p.endswith("/")
        )

    def list_children(self, prefix: str) -> builtins.list[str]:
        """Names of the files and folders directly in ``prefix``, listed afresh (one level)."""
        target = self._path(prefix)
        with self._errors("list", prefix):
            return self._store.listdir(target)

    def delete(self, prefix: str) -> None:
        """Delete a file or a whole folder; never the root itself."""
        if not prefix.strip("/"):
            raise self._error("refusing to delete the backend's whole root")
        target = self._path(prefix)
        with self._errors("delete", prefix):
            self._store.remove(target, recursive=True)


class LocalSnapshotBackend(FsspecSnapshotBackend):
    """Snapshots in a local folder (``url`` a path or ``file://``); the default backend."""

    kind = "local"
    schemes = (None, "file", "local")
    protocol = "file"


class MemorySnapshotBackend(FsspecSnapshotBackend):
    """Snapshots in fsspec's in-memory filesystem (``memory://``): one process, for tests."""

    kind = "memory"
    schemes = ("memory",)
    protocol = "memory"


class S3SnapshotBackend(FsspecSnapshotBackend):
    """Snapshots in S3 or an S3-compatible store (``s3://bucket/prefix``; needs ``sparkjet[s3]``).

    Options are s3fs's (``endpoint_url``, ``key``, ``secret``, ``client_kwargs``,
    ``config_kwargs``, ...) and botocore session's (``profile``).
    """

    kind = "s3"
    schemes = ("s3", "s3a")
    protocol = "s3"
    requires = ("s3fs", "sparkjet[s3]")

    def _extra_options(self) -> Iterable[str]:
        """s3fs hands options it does not know to aiobotocore's session."""
        try:
            from aiobotocore.session import AioSession
        except ImportError:
            return ()
        params = inspect.signature(AioSession.__init__).parameters
        return [name for name in params if name != "self"]


class GCSSnapshotBackend(FsspecSnapshotBackend):
    """Snapshots in Google Cloud Storage (``gs://bucket/prefix``; needs ``sparkjet[gcs]``).

    Options are gcsfs's (``project``, ``token``, ``endpoint_url``, ...).
    """

    kind = "gcs"
    schemes = ("gs", "gcs")
    protocol = "gcs"
    requires = ("gcsfs", "sparkjet[gcs]")


_BUILTINS: tuple[type[FsspecSnapshotBackend], ...] = (
    LocalSnapshotBackend,
    MemorySnapshotBackend,
    S3SnapshotBackend,
    GCSSnapshotBackend,
)


@hookimpl
def register_snapshot_backends(register: Any) -> None:
    """Register the local, memory, S3 and GCS snapshot backends."""
    for cls in _BUILTINS:
        register(cls)
