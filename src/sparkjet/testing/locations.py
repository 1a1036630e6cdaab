"""Where a store lives in the test kit: :class:`StoreLocation`, an fsspec URL and its options.

A location gives the store there as plugins see it (a
:class:`~sparkjet.plugin.StoreAccess`), the built-in snapshot backend for its
scheme, and the ``store=`` table of ``sparkjet.connect()``; the servers of
:mod:`sparkjet.testing.servers` and the fixtures of
:mod:`sparkjet.testing.fixtures` hand them out. Like the whole kit, it uses
the public modules and the plugin API only, never ``sparkjet.core``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from sparkjet.errors import ConfigError
from sparkjet.plugin import SnapshotBackend, StoreAccess, builtin_snapshot_backend, open_store


@dataclass(frozen=True)
class StoreLocation:
    """Where a store lives: an fsspec URL and the options to open it with.

    ``connect_overrides()`` gives what ``sparkjet.connect(store=...)`` takes.
    """

    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def fresh(self) -> StoreLocation:
        """A new, empty folder under this location (one per test)."""
        return StoreLocation(f"{self.url.rstrip('/')}/{uuid.uuid4().hex[:12]}", self.options)

    def store(self, *, separate_client: bool = False) -> StoreAccess:
        """The store here, as plugins see it (:func:`sparkjet.plugin.open_store`).

        ``separate_client`` gives it a filesystem instance of its own (fsspec
        shares one per set of options in a process), as another process has:
        with its own listing cache.
        """
        options = dict(self.options)
        if separate_client:
            options["skip_instance_cache"] = True
        return open_store(self.url, options)

    def snapshot_backend(
        self, kind: str | None = None, *, separate_client: bool = False
    ) -> SnapshotBackend:
        """The built-in snapshot backend for this location (``kind`` from the URL's scheme).

        ``separate_client`` as for :meth:`store`.
        """
        options = dict(self.options)
        if separate_client:
            options["skip_instance_cache"] = True
        try:
            return builtin_snapshot_backend(self.url, options, kind)
        except ConfigError:  # only for a URL whose scheme has no built-in backend
            raise ValueError(
                f"no built-in snapshot backend for {self.url!r}; name its kind") from None

    def connect_overrides(self) -> dict[str, Any]:
        """The ``store=`` table for ``sparkjet.connect()``."""
        return {"url": self.url, "options": dict(self.options)} if self.options else {
            "url": self.url
        }

