"""Which snapshot backend the configuration means, made through the plugin host."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import fsspec

from sparkjet.core.errors import (
    ConfigError,
    PluginError,
    SnapshotBackendError,
    SparkjetError,
)
from sparkjet.core.host.contracts import SnapshotBackend
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.host.plugin_info import Category

if TYPE_CHECKING:
    from sparkjet.core.config import Config

from sparkjet.core.state.snapshots.storage import SnapshotStore

#: The built-in backend kind for each store URL scheme (snapshots beside the store).
_KIND_OF_SCHEME: dict[str | None, str] = {
    None: "local", "file": "local", "local": "local", "memory": "memory",
    "s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs",
}
#: The folder under the store where snapshots go when ``[snapshots] url`` is unset.
STORE_SUBFOLDER = "snapshots"


def kind_for_url(url: str) -> str | None:
    """The built-in backend kind for a URL's scheme (``local``, ``memory``, ``s3``, ``gcs``)."""
    scheme, _ = fsspec.core.split_protocol(url)
    return _KIND_OF_SCHEME.get(scheme)


#: The built-in plugins alone (no third-party entry points), loaded on first use.
_BUILTIN: list[PluginHost] = []


def builtin_snapshot_backend(
    url: str, options: Mapping[str, Any] | None = None, kind: str | None = None
) -> SnapshotBackend:
    """The built-in snapshot backend at ``url``: ``kind``, or the one for the URL's scheme.

    ``local`` for a local path or ``file://``, ``memory``, ``s3`` or ``gcs``
    (see :func:`kind_for_url`); ``options`` are its storage options. Only
    sparkjet's own backends, whatever third-party plugins are installed: for
    a backend that wraps one of them, and for the test kit.

    :raises ConfigError: no ``kind`` given and none for the URL's scheme.
    :raises PluginError: no built-in backend of that kind.
    """
    kind = kind or kind_for_url(url)
    if kind is None:
        raise ConfigError(f"no built-in snapshot backend for {url!r}; name its kind")
    if not _BUILTIN:
        _BUILTIN.append(PluginHost(autoload=False))
    cls: Callable[..., SnapshotBackend] = _BUILTIN[0].lookup_kind(
        Category.SNAPSHOT_BACKEND, kind).cls
    return cls(url, dict(options or {}))


def backend_settings(config: Config) -> tuple[str, str, dict[str, Any]]:
    """``(kind, url, options)`` of the configured snapshot backend.

    With ``[snapshots] url`` set: ``backend`` (default ``local``), that URL and
    ``[snapshots.options]``. Without it, snapshots are kept beside the store,
    in ``<store url>/snapshots``, on the store's own kind of storage with the
    store's options (``[snapshots.options]`` added on top); ``backend`` must
    then be left unset or name that kind.
    """
    where = config.source or "configuration"
    if config.snapshots_url is not None:
        return config.snapshots_backend, config.snapshots_url, dict(config.snapshots_options)
    kind = kind_for_url(config.store_url)
    if kind is None:
        raise ConfigError(config.redact(
            f"{where}: [store] url {config.store_url!r} has no built-in snapshot backend to "
            "keep snapshots beside it: set [snapshots] backend and url"
        ))
    if config.snapshots_backend not in ("local", kind):
        raise ConfigError(
            f"{where}: [snapshots] backend = {config.snapshots_backend!r} needs "
            "[snapshots] url (without it snapshots are kept in the store, on its own "
            f"kind of storage, {kind!r})"
        )
    url = f"{config.store_url.rstrip('/')}/{STORE_SUBFOLDER}"
    return kind, url, {**config.store_options, **config.snapshots_options}


def make_backend(config: Config, plugins: PluginHost) -> SnapshotBackend:
    """The configured snapshot backend (see :func:`backend_settings`), secrets masked."""
    where = config.source or "configuration"
    kind, url, options = backend_settings(config)
    try:
        entry = plugins.lookup_kind(Category.SNAPSHOT_BACKEND, kind)
    except PluginError as exc:
        raise ConfigError(f"{where}: [snapshots] backend: {exc}") from exc
    cls: Callable[..., SnapshotBackend] = entry.cls
    try:
        backend = cls(url, options)
    except SparkjetError as exc:
        raise type(exc)(config.redact(str(exc))) from exc.__cause__
    except Exception as exc:
        raise SnapshotBackendError(config.redact(
            f"snapshot backend {kind!r} (plugin {entry.plugin!r}) at {url}: cannot be made "
            f"with these options: {exc!r}"
        )) from None  # the plugin's own message may hold a secret
    backend.add_secrets(config.secrets)
    return backend


def snapshot_store(config: Config, plugins: PluginHost) -> SnapshotStore:
    """The :class:`SnapshotStore` ``[snapshots]`` configures: its backend and signing key."""
    return SnapshotStore(make_backend(config, plugins), config.snapshots_signing_key)

