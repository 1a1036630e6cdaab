"""Where a store lives in the test kit: :class:`StoreLocation`, an fsspec URL and its options.

A location gives a :class:`~sparkjet.core.store.fs.Store`, the built-in
snapshot backend for its scheme, and the ``store=`` table of
``sparkjet.connect()``; the servers of :mod:`sparkjet.testing.servers` and
the fixtures of :mod:`sparkjet.testing.fixtures` hand them out.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkjet.core.host.contracts import SnapshotBackend
from sparkjet.core.host.manager import Category, PluginHost
from sparkjet.core.state.snapshots import kind_for_url
from sparkjet.core.store.fs import Store


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

    def store(self, *, separate_client: bool = False) -> Store:
        """A :class:`~sparkjet.core.store.fs.Store` here.

        ``separate_client`` gives it a filesystem instance of its own (fsspec
        shares one per set of options in a process), as another process has:
        with its own listing cache.
        """
        options = dict(self.options)
        if separate_client:
            options["skip_instance_cache"] = True
        return Store(self.url, options)

    def snapshot_backend(
        self, kind: str | None = None, *, separate_client: bool = False
    ) -> SnapshotBackend:
        """The built-in snapshot backend for this location (``kind`` from the URL's scheme).

        ``separate_client`` as for :meth:`store`.
        """
        kind = kind or kind_for_url(self.url)
        if kind is None:
            raise ValueError(f"no built-in snapshot backend for {self.url!r}; name its kind")
        options = dict(self.options)
        if separate_client:
            options["skip_instance_cache"] = True
        cls: Callable[..., SnapshotBackend] = _builtin_plugins().lookup_kind(
            Category.SNAPSHOT_BACKEND, kind
        ).cls
        return cls(self.url, options)

    def connect_overrides(self) -> dict[str, Any]:
        """The ``store=`` table for ``sparkjet.connect()``."""
        return {"url": self.url, "options": dict(self.options)} if self.options else {
            "url": self.url
        }


_HOST: list[PluginHost] = []


def _builtin_plugins() -> PluginHost:
    """The built-in plugins only (no third-party entry points), loaded once."""
    if not _HOST:
        _HOST.append(PluginHost(autoload=False))
    return _HOST[0]
