"""Reading a store's files: whole files, many at once, byte ranges, and decoding them.

Every read asks the store afresh (s3fs sizes a read from its listing cache,
which another process may have made stale), is counted
(:mod:`~sparkjet.core.store.requests`) and names the path in its errors; a
file that does not decode becomes a StoreError naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkjet.core.store import requests
from sparkjet.core.store.fs_access import FsAccess
from sparkjet.core.store.naming import decode, json_loads
from sparkjet.core.store.naming import loads as pickle_loads


class FsReads(FsAccess):
    """Whole-file and ranged reads of a store, and decoding what they read."""

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
        loads: Callable[[bytes], Any] = pickle_loads,
    ) -> Any:
        """The pickle file ``path`` loaded; FileNotFoundError if absent (see :meth:`decode`)."""
        return self.decode(path, self.read_bytes(path), loads, what, keys=keys, check=check)
