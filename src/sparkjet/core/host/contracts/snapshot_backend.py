"""The base class of snapshot-backend plugins: where exported snapshots are kept.

:class:`SnapshotBackend` declares four abstract file operations and builds
the others on them; it also masks the backend's secrets in all it shows.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar


class SnapshotBackend(ABC):
    """Where exported snapshots are kept, selected by ``[snapshots] backend = "<kind>"``.

    All methods run on the driver. Paths are relative to the backend's root,
    use ``/`` and never contain ``..``; a folder is just the common prefix of
    the files under it (``a/b`` holds ``a/b/c``, never ``a/bc``).

    Four methods are abstract: :meth:`write_bytes`, :meth:`read_bytes`,
    :meth:`list` and :meth:`delete`. The others have defaults built on them
    that are correct but may be slow; override them where the storage has
    something better. In particular the default :meth:`create_exclusive`
    checks, then writes, which two writers can race: a backend whose storage
    has a real create-only write overrides it and
    :attr:`create_only_enforced`. Snapshots stay whole either way (each export
    writes into a folder of its own), but a backend that enforces it is
    preferred, and the conformance suite
    (:class:`sparkjet.testing.SnapshotBackendConformance`) expects it.

    Errors about the storage itself (unreachable, refused, misconfigured) are
    :class:`~sparkjet.errors.SnapshotBackendError` naming :attr:`kind` and the
    URL; pass every message through :meth:`redact` so no secret is shown.
    A missing file is :class:`FileNotFoundError`.
    """

    #: The name this backend is selected by in ``[snapshots] backend``.
    kind: ClassVar[str]

    #: Words that mark an option as a secret: its values are masked in messages.
    SECRET_OPTION_WORDS: ClassVar[tuple[str, ...]] = (
        "key", "secret", "token", "password", "credential", "auth", "signature",
    )

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        #: Where the snapshots are kept (as configured; may hold a secret: show :attr:`shown_url`).
        self.url = url
        #: Storage options (credentials, endpoints); never shown as they are.
        self.options = dict(options or {})
        self._secrets: list[str] = []

    # --- secrets ------------------------------------------------------------

    def add_secrets(self, values: Iterable[str]) -> None:
        """Mask these values too in all this backend shows (sparkjet adds ``${env:...}`` values)."""
        known = self.__dict__.setdefault("_secrets", [])
        known.extend(v for v in values if isinstance(v, str) and v)

    def redact(self, text: str) -> str:
        """``text`` with every secret masked as ``***``.

        Secrets are the values added by :meth:`add_secrets` and the string
        values of every option whose name contains one of
        :attr:`SECRET_OPTION_WORDS` (``key``, ``secret``, ``token``, ...),
        nested tables included; of the latter, values shorter than four
        characters are left alone (masking every ``k`` in a message would
        make it unreadable and hide nothing worth hiding).
        """
        added: list[str] = self.__dict__.get("_secrets", [])
        options: Mapping[str, Any] = getattr(self, "options", {})
        named = (v for v in _secret_values(options, self.SECRET_OPTION_WORDS) if len(v) >= 4)
        secrets = [*added, *named]
        for secret in sorted(set(secrets), key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    @property
    def shown_url(self) -> str:
        """The URL as it may be printed (secrets masked)."""
        return self.redact(self.url)

    def describe(self) -> str:
        """``snapshot backend '<kind>' at <url>``: how messages name this backend."""
        return f"snapshot backend {self.kind!r} at {self.shown_url}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.shown_url!r})"

    # --- the four every backend implements -------------------------------------

    @abstractmethod
    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file, replacing any old one."""

    @abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """Read a whole file; FileNotFoundError if absent."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every file under the folder ``prefix`` (``""``: all), recursively.

        Paths are relative to the backend's root (as the other methods take
        them), sorted; an absent folder is an empty list. Listed afresh:
        never from a cache another process's writes could have outdated.
        """

    @abstractmethod
    def delete(self, prefix: str) -> None:
        """Delete the file ``prefix``, or every file under the folder ``prefix``; absent is fine."""

    # --- with defaults ---------------------------------------------------------

    @property
    def create_only_enforced(self) -> bool:
        """Whether :meth:`create_exclusive` is atomic (two racing creators: exactly one wins).

        False for the default check-then-write; a backend that overrides
        :meth:`create_exclusive` with its storage's create-only write says True.
        """
        return False

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` only if it does not exist; False if it already does.

        A create that a client retried after it had landed finds the file
        there: the file is read back, and one holding exactly ``data`` counts
        as written by this call (True). So callers make payloads unique.

        The default checks, then writes (see :attr:`create_only_enforced`).
        """
        try:
            return self.read_bytes(path) == data
        except FileNotFoundError:
            pass
        self.write_bytes(path, data)
        return True

    def exists(self, path: str) -> bool:
        """Whether the file ``path`` exists, asked afresh (default: tries to read it)."""
        try:
            self.read_bytes(path)
        except FileNotFoundError:
            return False
        return True

    def size(self, path: str) -> int:
        """The size of the file ``path`` in bytes, asked afresh; FileNotFoundError if absent."""
        return len(self.read_bytes(path))

    def list_children(self, prefix: str) -> builtins.list[str]:
        """Names of the files and folders directly in the folder ``prefix`` (``""``: root), sorted.

        The default derives them from :meth:`list`; override it where the
        storage lists one level at a time (a delimiter listing).
        """
        start = f"{prefix.rstrip('/')}/" if prefix.strip("/") else ""
        return sorted({p[len(start):].split("/", 1)[0] for p in self.list(prefix)})

    def write_chunks(self, path: str, chunks: Iterable[bytes]) -> None:
        """Write a whole file from ``chunks``, replacing any old one.

        For large files; the default joins the chunks and calls
        :meth:`write_bytes`. A file whose write failed half-way may be left
        behind: sparkjet writes data files where no reader looks until the
        manifest that names them exists.
        """
        self.write_bytes(path, b"".join(chunks))

    def read_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The file ``path`` in chunks of at most ``chunk_size`` bytes; FileNotFoundError if absent.

        The default reads the whole file at once.
        """
        data = self.read_bytes(path)
        for start in range(0, len(data), chunk_size):
            yield data[start : start + chunk_size]


def _secret_values(options: Mapping[str, Any], words: tuple[str, ...]) -> Iterator[str]:
    """The string values of options whose name holds one of ``words``, nested tables included."""
    for name, value in options.items():
        secret = any(word in str(name).lower() for word in words)
        if isinstance(value, Mapping):
            if secret:
                yield from _all_strings(value)
            else:
                yield from _secret_values(value, words)
        elif secret:
            yield from _all_strings(value)


#: Values of secret-named options that name a way to authenticate, not a secret (gcsfs tokens).
_NOT_SECRETS = frozenset({"anon", "google_default", "cache", "browser", "cloud"})


def _all_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        if value and value not in _NOT_SECRETS:
            yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _all_strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _all_strings(item)
