"""Configuration: where it is read from, what it may contain, and secrets.

Sources, first found wins for the file: the file named by ``SPARKJET_CONFIG``,
``./sparkjet.toml``, ``[tool.sparkjet]`` in ``./pyproject.toml``, then the
user's own ``sparkjet.toml`` (``$XDG_CONFIG_HOME/sparkjet/``, by default
``~/.config/sparkjet/``). ``SPARKJET_STORE`` then replaces the store's URL,
and keyword overrides given to ``sparkjet.connect()`` are applied on top,
table by table. A relative local path in a file is relative to the file's
folder, so a command run from anywhere finds the same store.
``${env:NAME}`` in any string is replaced by that environment variable; such
values are secrets and are never printed (see :meth:`Config.redact`).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from sparkjet.core.errors import ConfigError

ENV_CONFIG = "SPARKJET_CONFIG"
#: Replaces ``[store] url`` of the configuration file.
ENV_STORE = "SPARKJET_STORE"
#: The Spark Connect URL, as PySpark reads it (``[spark] remote`` wins).
ENV_REMOTE = "SPARK_REMOTE"
DEFAULT_STORE_URL = "./.sparkjet"
_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")

# Schema: section -> key -> (python types, description). A key whose type is
# dict is a free-form table (its own keys are not checked).
_SCALAR = (str, int, float, bool)
_SCHEMA: dict[str, dict[str, tuple[tuple[type, ...], str]]] = {
    "spark": {
        "master": ((str,), "a Spark master URL string such as 'local[*]'"),
        "remote": ((str,), "a Spark Connect URL string"),
        "app_name": ((str,), "a string"),
        "conf": ((dict,), "a table of Spark settings"),
    },
    "store": {
        "url": ((str,), "an fsspec URL or a local path string"),
        "options": ((dict,), "a table of fsspec storage options"),
    },
    "snapshots": {
        "backend": ((str,), "a snapshot backend kind string"),
        "url": ((str,), "an fsspec URL or a local path string"),
        "options": ((dict,), "a table of storage options"),
        "signing_key": ((str,), "a string (use ${env:NAME})"),
    },
    "plugins": {
        "disable": ((list,), "a list of plugin names"),
    },
    # [buckets.<name>]: fsspec storage options of a bucket (``sparkjet apply``'s
    # ``credentials``); its keys are free-form, only tables are allowed here.
    "buckets": {},
    # [streams.<name>]: the stream's retention (see _STREAM_KEYS).
    "streams": {},
    # [engine]: where a micro-batch runs (EngineSettings); the numbers are 0 or more.
    "engine": {
        "adaptive": ((bool,), "true or false"),
        "driver_only": ((bool,), "true or false"),
        "local_max_items": ((int,), "a whole number of items, 0 or more"),
        "local_max_bytes": ((int,), "a whole number of bytes, 0 or more"),
        "driver_state_bytes": ((int,), "a whole number of bytes, 0 or more"),
        "cold_state_bytes": ((int,), "a whole number of bytes, 0 or more"),
        "join_table_max_bytes": ((int,), "a whole number of bytes, 0 or more"),
        "stream_poll_seconds": ((int, float), "a number of seconds, more than 0"),
        "idle_poll_max_seconds": ((int, float), "a number of seconds, more than 0"),
    },
}

#: ``[engine]`` keys that must be more than 0 (the other numbers may be 0).
_POSITIVE = frozenset({"stream_poll_seconds", "idle_poll_max_seconds"})

#: The keys of a ``[streams.<name>]`` table: stream retention limits.
_STREAM_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "keep_items": ((int,), "a whole number of items, 0 or more"),
    "keep_seconds": ((int, float), "a number of seconds, 0 or more"),
    "keep_bytes": ((int,), "a whole number of bytes, 0 or more"),
}


#: ``[engine]`` defaults: on S3 or GCS an idle streaming job first looks for
#: new data this long after its last look, and makes the interval four times
#: as long after each look that found nothing, up to ``idle_poll_max_seconds``
#: (see docs/streaming.md).
DEFAULT_STREAM_POLL_SECONDS = 0.05
DEFAULT_IDLE_POLL_MAX_SECONDS = 5.0
#: ``[engine]`` defaults: a micro-batch of at most this many items and bytes in
#: all may run on the driver (the sizes the sources plan, before it runs).
DEFAULT_LOCAL_MAX_ITEMS = 5000
DEFAULT_LOCAL_MAX_BYTES = 4 << 20
#: ``[engine]`` defaults: the most bytes of a job's keyed state a micro-batch on the
#: driver may touch while the driver holds some of it loaded, and while it holds none
#: (then each range is read from the checkpoint first, which costs time per byte).
DEFAULT_DRIVER_STATE_BYTES = 256 << 20
DEFAULT_COLD_STATE_BYTES = 32 << 20
#: ``[engine]`` default: the most bytes a hash join's build table may take pickled
#: (it is held once per worker process, and once in the driver).
DEFAULT_JOIN_TABLE_MAX_BYTES = 256 << 20


@dataclass(frozen=True)
class EngineSettings:
    """The ``[engine]`` table: when a micro-batch runs on the driver instead of on Spark.

    With ``adaptive`` on (a job may turn it off with
    ``JobConfig.adaptive_micro_batches``), a micro-batch whose planned input is
    known and small, at most ``local_max_items`` items and ``local_max_bytes``
    bytes over all its sources, runs in the driver process; so does a batch
    job over such an input. The job's keyed state must be small enough too:
    at most ``driver_state_bytes`` while the driver holds some of the job's
    state loaded, at most ``cold_state_bytes`` while it holds none (all of
    it would be read from the checkpoint first). See
    :func:`sparkjet.core.engine.adaptive.choose_local`.

    On an object store (S3, GCS), where another process's append is seen
    only by listing, an idle streaming job looks for new data
    ``stream_poll_seconds`` after its last look, and makes the interval four
    times as long after each look that found nothing, up to
    ``idle_poll_max_seconds``;
    data starts it over. There an idle job also looks at its control folder
    (requests from other processes) every 2 s, or ``idle_poll_max_seconds``
    if less. See docs/streaming.md.
    """

    adaptive: bool = True
    #: Every job's work in the driver's process (the in-process engine), Spark never
    #: started: for tests, a laptop, jobs whose input and state fit one process.
    driver_only: bool = False
    local_max_items: int = DEFAULT_LOCAL_MAX_ITEMS
    local_max_bytes: int = DEFAULT_LOCAL_MAX_BYTES
    driver_state_bytes: int = DEFAULT_DRIVER_STATE_BYTES
    cold_state_bytes: int = DEFAULT_COLD_STATE_BYTES
    #: The most bytes a hash join's build table may take pickled; a bigger one
    #: fails its job at start, naming the stage and the size.
    join_table_max_bytes: int = DEFAULT_JOIN_TABLE_MAX_BYTES
    stream_poll_seconds: float = DEFAULT_STREAM_POLL_SECONDS
    idle_poll_max_seconds: float = DEFAULT_IDLE_POLL_MAX_SECONDS


@dataclass
class Config:
    """The effective configuration of one client."""

    spark_master: str = "local[*]"
    #: A Spark Connect URL (``sc://host:port``, or ``local[N]`` for a server in this
    #: process): jobs run there instead of on a classic session (``[spark] remote``,
    #: ``SPARK_REMOTE``).
    spark_remote: str | None = None
    #: Where ``[spark] master`` and ``[spark] remote`` were set (None: not set); a
    #: client runs on one of the two.
    spark_master_source: str | None = None
    spark_remote_source: str | None = None
    spark_app_name: str = "sparkjet"
    spark_conf: dict[str, str] = field(default_factory=dict)
    store_url: str = DEFAULT_STORE_URL
    store_options: dict[str, Any] = field(default_factory=dict)
    snapshots_backend: str = "local"
    snapshots_url: str | None = None
    snapshots_options: dict[str, Any] = field(default_factory=dict)
    snapshots_signing_key: str | None = None
    plugins_disable: list[str] = field(default_factory=list)
    plugin_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: ``[buckets.<name>]`` tables as written: ``${env:NAME}`` is resolved on use
    #: (:meth:`~sparkjet.Client.bucket_options`), so an unused one needs no variable set.
    buckets: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: ``[streams.<name>]`` tables: each stream's retention limits (``keep_items``, ...).
    streams: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: ``[engine]``: when a micro-batch runs on the driver instead of on Spark.
    engine: EngineSettings = field(default_factory=EngineSettings)
    #: Where the file part came from (for messages), or None.
    source: str | None = None
    #: Where :attr:`store_url` came from: ``default``, the file, ``SPARKJET_STORE``
    #: or ``connect() arguments``.
    store_source: str = "default"
    secrets: list[str] = field(default_factory=list, repr=False)

    def __repr__(self) -> str:
        return self.redact(
            f"Config(source={self.source!r}, spark_master={self.spark_master!r}, "
            f"store_url={self.store_url!r}, snapshots_backend={self.snapshots_backend!r})"
        )

    def redact(self, text: str) -> str:
        """Replace every secret value in ``text`` with ``***``."""
        for secret in sorted(self.secrets, key=len, reverse=True):
            if secret:
                text = text.replace(secret, "***")
        return text


def find_config_file(cwd: Path | None = None) -> tuple[Path, bool] | None:
    """Find the configuration file to read; also say whether it is a pyproject.toml."""
    cwd = cwd or Path.cwd()
    named = os.environ.get(ENV_CONFIG)
    if named:
        path = Path(named)
        if not path.is_file():
            raise ConfigError(f"{ENV_CONFIG}={named}: no such file")
        return path, path.name == "pyproject.toml"
    if (cwd / "sparkjet.toml").is_file():
        return cwd / "sparkjet.toml", False
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file():
        return pyproject, True
    user = user_config_file()
    if user.is_file():
        return user, False
    return None


def user_config_file() -> Path:
    """The user's own configuration file: ``$XDG_CONFIG_HOME/sparkjet/sparkjet.toml``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sparkjet" / "sparkjet.toml"


def load_config(
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
    cwd: Path | None = None,
) -> Config:
    """Read the configuration file (if any) and apply ``overrides``."""
    tables: Mapping[str, Any] = {}
    source: str | None = None
    found = (Path(path), Path(path).name == "pyproject.toml") if path else find_config_file(cwd)
    if found is not None:
        file, is_pyproject = found
        try:
            data: Any = tomllib.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: invalid TOML: {exc}") from exc
        if is_pyproject:
            tool = data.get("tool", {})
            data = tool.get("sparkjet") if isinstance(tool, Mapping) else None
            source = f"{file} [tool.sparkjet]" if data is not None else None
        else:
            source = str(file)
        if data is not None and not isinstance(data, Mapping):
            raise ConfigError(f"{source}: expected a table, got {_kind(data)}")
        if data is not None:
            _check(data, source or str(file))
            tables = data
    config = Config(source=source)
    _apply(config, tables, source or "defaults")
    if found is not None and "url" in tables.get("store", {}):
        config.store_url = _beside(config.store_url, found[0])
        config.store_source = source or str(found[0])
    if found is not None and config.snapshots_url is not None:
        config.snapshots_url = _beside(config.snapshots_url, found[0])
    env_store = os.environ.get(ENV_STORE)
    if env_store:
        config.store_url = env_store
        config.store_source = ENV_STORE
    env_remote = os.environ.get(ENV_REMOTE)
    if env_remote and config.spark_remote is None:
        config.spark_remote = env_remote
        config.spark_remote_source = ENV_REMOTE
    if overrides:
        for section, table in overrides.items():
            if not isinstance(table, Mapping):
                raise ConfigError(
                    f"connect() arguments: {section}= must be a dict of [{section}] keys, "
                    f"got {_kind(table)}"
                )
        plain = {k: dict(v) for k, v in overrides.items()}
        _check(plain, "connect() arguments")
        _apply(config, plain, "connect() arguments")
        if "url" in plain.get("store", {}):
            config.store_source = "connect() arguments"
    _check_one_spark(config)
    return config


def _check_one_spark(config: Config) -> None:
    """Refuse ``[spark] master`` together with ``[spark] remote``: a client runs on one."""
    if config.spark_remote is not None and config.spark_master_source is not None:
        raise ConfigError(
            f"[spark] master = {config.spark_master!r} (from {config.spark_master_source}) and "
            f"[spark] remote = {config.spark_remote!r} (from {config.spark_remote_source}) are "
            "both set: a client runs on a classic Spark session (master) or on a Spark "
            "Connect server (remote); remove one"
        )


def _beside(url: str, file: Path) -> str:
    """A relative local path of ``file`` made relative to the file's folder."""
    if "://" in url or "::" in url or os.path.isabs(url) or url.startswith("~"):
        return url
    return str(file.resolve().parent / url)


def _check(data: Mapping[str, Any], where: str) -> None:
    for section, table in data.items():
        if section not in _SCHEMA:
            known = ", ".join(f"[{s}]" for s in _SCHEMA)
            raise ConfigError(f"{where}: unknown section [{section}] (expected one of {known})")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: [{section}] must be a table, got {_kind(table)}")
        value: Any
        for key, value in table.items():
            spec = _SCHEMA[section].get(key)
            if spec is None:
                if section == "streams":
                    _check_stream(where, key, value)
                    continue
                if section in ("plugins", "buckets") and isinstance(value, Mapping):
                    continue  # [plugins.<name>], [buckets.<name>]: free-form tables
                if section == "buckets":
                    raise ConfigError(
                        f"{where}: [buckets] {key}: expected a table of storage options "
                        f"([buckets.{key}]), got {_kind(value)}"
                    )
                known = ", ".join(sorted(_SCHEMA[section]))
                raise ConfigError(
                    f"{where}: unknown key '{key}' in [{section}] (expected one of: {known})"
                )
            types, expected = spec
            if isinstance(value, bool) and bool not in types:
                raise ConfigError(f"{where}: [{section}] {key}: expected {expected}, got a bool")
            if not isinstance(value, types):
                raise ConfigError(
                    f"{where}: [{section}] {key}: expected {expected}, got {_kind(value)}"
                )
            if section == "engine" and key not in ("adaptive", "driver_only") and (
                    cast(float, value) < 0 or (key in _POSITIVE and not cast(float, value) > 0)):
                raise ConfigError(
                    f"{where}: [{section}] {key}: expected {expected}, got {_kind(value)}"
                )
            if section == "spark" and key == "conf":
                for ck, cv in _flatten(cast(Mapping[str, Any], value)).items():
                    if not isinstance(cv, _SCALAR):
                        raise ConfigError(
                            f"{where}: [spark.conf] {ck}: expected a string, number or bool, "
                            f"got {_kind(cv)}"
                        )
            if section == "plugins" and key == "disable":
                for name in cast(list[Any], value):
                    if not isinstance(name, str):
                        raise ConfigError(
                            f"{where}: [plugins] disable: expected a list of plugin names, "
                            f"got an item {_kind(name)}"
                        )


def _check_stream(where: str, name: str, table: Any) -> None:
    """A ``[streams.<name>]`` table: known retention keys, numbers of the right kind."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: [streams] {name}: expected a table of retention limits "
                          f"([streams.{name}]), got {_kind(table)}")
    if not table:
        raise ConfigError(f"{where}: [streams.{name}] sets no limit (expected one or more "
                          f"of: {', '.join(_STREAM_KEYS)})")
    for key, value in table.items():
        spec = _STREAM_KEYS.get(key)
        if spec is None:
            known = ", ".join(_STREAM_KEYS)
            raise ConfigError(f"{where}: unknown key '{key}' in [streams.{name}] "
                              f"(expected one of: {known})")
        types, expected = spec
        if (isinstance(value, bool) or not isinstance(value, types)
                or not isinstance(value, int | float) or value < 0):
            raise ConfigError(f"{where}: [streams.{name}] {key}: expected {expected}, "
                              f"got {_kind(value)}")


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``[spark.conf]`` keys as Spark spells them.

    In TOML an unquoted ``spark.ui.enabled = false`` is a nested table
    (``{"spark": {"ui": {"enabled": false}}}``); join such keys with dots.
    """
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _kind(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})" if not isinstance(value, dict) else "a table"


def _resolve(value: Any, where: str, key: str, secrets: list[str]) -> Any:
    """Replace ``${env:NAME}`` references, recording the values as secrets."""
    if isinstance(value, str):
        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(
                    f"{where}: {key} refers to environment variable {name}, which is not set"
                )
            secrets.append(os.environ[name])
            return os.environ[name]

        return _ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: _resolve(v, where, f"{key}.{k}", secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, where, key, secrets) for v in value]
    return value


def _apply(config: Config, data: Mapping[str, Any], where: str) -> None:
    def get(section: str, key: str) -> Any:
        return _resolve(data[section][key], where, f"[{section}] {key}", config.secrets)

    def has(section: str, key: str) -> bool:
        return key in data.get(section, {})

    if has("spark", "master"):
        config.spark_master = get("spark", "master")
        config.spark_master_source = where
    if has("spark", "remote"):
        config.spark_remote = get("spark", "remote")
        config.spark_remote_source = where
    if has("spark", "app_name"):
        config.spark_app_name = get("spark", "app_name")
    if has("spark", "conf"):
        conf = _flatten(get("spark", "conf"))
        config.spark_conf.update(
            {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in conf.items()}
        )
    if has("store", "url"):
        config.store_url = get("store", "url")
    if has("store", "options"):
        config.store_options.update(get("store", "options"))
    if has("snapshots", "backend"):
        config.snapshots_backend = get("snapshots", "backend")
    if has("snapshots", "url"):
        config.snapshots_url = get("snapshots", "url")
    if has("snapshots", "options"):
        config.snapshots_options.update(get("snapshots", "options"))
    if has("snapshots", "signing_key"):
        config.snapshots_signing_key = get("snapshots", "signing_key")
    for key in data.get("plugins", {}):
        if key == "disable":
            config.plugins_disable = list(get("plugins", "disable"))
        else:
            config.plugin_options.setdefault(key, {}).update(get("plugins", key))
    for key, table in data.get("buckets", {}).items():
        config.buckets.setdefault(key, {}).update(table)
    for key, table in data.get("streams", {}).items():
        config.streams.setdefault(key, {}).update(table)
    if data.get("engine"):
        config.engine = replace(config.engine, **data["engine"])
        first, most = config.engine.stream_poll_seconds, config.engine.idle_poll_max_seconds
        if first > most:
            raise ConfigError(
                f"{where}: [engine] stream_poll_seconds ({first:g}) is more than "
                f"idle_poll_max_seconds ({most:g}): an idle job's first look cannot wait "
                "longer than the most it backs off to"
            )
