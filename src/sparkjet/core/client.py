"""The client, the composition root: configuration, store, plugins, engine and jet service.

It is the one place that picks the engine (Spark, from :mod:`sparkjet.core.engine.spark`,
or a Spark Connect server's, from :mod:`sparkjet.core.engine.connect`) and hands it
to the services, which know it only as :class:`~sparkjet.core.engine.boundary.Engine`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from sparkjet.core.config import Config, load_config
from sparkjet.core.config import _resolve as resolve_env  # ${env:...}, as the file does
from sparkjet.core.engine.boundary import Engine
from sparkjet.core.errors import ConfigError
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.host.plugin_info import PluginInfo
from sparkjet.core.jobs import JetService, Services
from sparkjet.core.maintenance.gc import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_RETENTION_SECONDS,
    GarbageReport,
    collect_garbage,
)
from sparkjet.core.maintenance.retention import Holders, Retention, TrimReport, trim_stream
from sparkjet.core.state.snapshots import SnapshotStore, kind_for_url, snapshot_store
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords
from sparkjet.core.store.stream_log import PollSettings
from sparkjet.core.store.structures import IList, IMap, IStream

#: How many partitions a ``driver_only`` client's in-process engine spreads a
#: batch over: the machine's cores, 2 to 8.
DRIVER_ONLY_PARALLELISM = max(2, min(os.cpu_count() or 2, 8))


class Client:
    """Entry point to sparkjet, like Hazelcast's client: ``sparkjet.connect()`` makes one.

    Creating a client reads the configuration and loads plugins; Spark starts
    lazily, with the first job.
    """

    def __init__(self, config: Config, engine: Engine | None = None) -> None:
        self.config = config
        self.store = Store(config.store_url, config.store_options, config.redact)
        self.store.poll = PollSettings(config.engine.stream_poll_seconds,
                                       config.engine.idle_poll_max_seconds)
        self.plugins = PluginHost(config.plugins_disable)
        self._engine = engine
        #: The Connect engine, when ``[spark] remote`` is set (checked at submit).
        self._connect: Any = None
        #: Whether the client was given its engine (then every batch runs there).
        self._given_engine = engine is not None
        self._jet: JetService | None = None
        self._snapshots: SnapshotStore | None = None

    def __repr__(self) -> str:
        return self.config.redact(f"<sparkjet Client store={self.store.url!r}>")

    def __reduce__(self) -> Any:
        # A client holds the whole configuration, secrets included; a function
        # that captured it would carry them into pipeline.pkl in the store and
        # to every executor. Submit names the stage whose function does.
        raise TypeError(
            "a sparkjet Client cannot be pickled (it holds the configuration and its "
            "secrets): do not capture the client in a pipeline's functions; read what they "
            "need before submitting, or use a source"
        )

    @property
    def spark(self) -> Any:
        """The Spark session (started on first use): a Connect session with ``[spark] remote``."""
        if self.config.spark_remote:
            from sparkjet.core.engine.connect.session import remote_session

            return remote_session(self.config, self.plugins)
        from sparkjet.core.engine.spark.session import get_session

        return get_session(self.config, self.plugins)

    @property
    def engine(self) -> Engine:
        """The engine jobs run on, made on first use.

        The adaptive engine (:class:`~sparkjet.core.engine.adaptive.AdaptiveEngine`):
        Spark (or, with ``[spark] remote``, the Spark Connect server), and the
        in-process engine for what is small; with ``[engine] driver_only`` the
        in-process engine alone. A client built with an
        engine of its own runs every job there.
        """
        if self._engine is None:
            from sparkjet.core.engine.inprocess.engine import InProcessEngine

            if self.config.engine.driver_only:
                self._engine = InProcessEngine(DRIVER_ONLY_PARALLELISM)
            else:
                from sparkjet.core.engine.adaptive import AdaptiveEngine

                spark: Any
                if self.config.spark_remote:
                    from sparkjet.core.engine.connect.engine import ConnectEngine

                    spark = self._connect = ConnectEngine(self.config, self.plugins)
                else:
                    from sparkjet.core.engine.spark.engine import SparkEngine

                    spark = SparkEngine(self.config, self.plugins)
                # The parallelism a job sees does not depend on where a batch runs.
                self._engine = AdaptiveEngine(spark, InProcessEngine(spark.parallelism),
                                              self.config.engine)
        return self._engine

    @property
    def runs_on_spark(self) -> bool:
        """Whether this client's jobs may run on Spark (False: ``driver_only``, or given one)."""
        return not (self.config.engine.driver_only or self._given_engine)

    @property
    def snapshots(self) -> SnapshotStore:
        """Where exported snapshots are kept: ``[snapshots]`` of the configuration."""
        if self._snapshots is None:
            self._snapshots = snapshot_store(self.config, self.plugins)
        return self._snapshots

    def snapshot_store_at(
        self, url: str, options: Mapping[str, Any] | None = None, *, backend: str | None = None
    ) -> SnapshotStore:
        """A snapshot store at ``url`` other than the configured one (``copy-snapshot --to``).

        ``backend`` is the backend kind; by default the built-in one for the
        URL's scheme (a local path or ``file://``: ``local``, ``memory://``,
        ``s3://``, ``gs://``). ``options`` are the backend's storage options,
        not the configured ones; ``${env:NAME}`` in a value is replaced by that
        environment variable and masked like a configured secret. The store
        signs and checks manifests with the configured ``[snapshots]
        signing_key``, if any.

        :raises ConfigError: no backend kind for the URL, an unknown kind, or
            an unset environment variable.
        :raises SnapshotBackendError: the backend refuses the URL or options.
        """
        kind = backend or kind_for_url(url)
        if kind is None:
            raise ConfigError(self.redact(
                f"no built-in snapshot backend for {url!r}: use a local path, file://, "
                "memory://, s3:// or gs://, or name the backend kind"
            ))
        resolved = resolve_env(dict(options or {}), f"snapshot store {url}", "options",
                               self.config.secrets)
        config = dataclasses.replace(
            self.config, snapshots_backend=kind, snapshots_url=url, snapshots_options=resolved
        )
        return snapshot_store(config, self.plugins)

    def bucket_options(self, name: str) -> dict[str, Any]:
        """The fsspec storage options of ``[buckets.<name>]`` in the configuration.

        ``${env:NAME}`` in a value is replaced by that environment variable and
        masked like any configured secret.

        :raises ConfigError: there is no such table, or a variable is not set.
        """
        table = self.config.buckets.get(name)
        where = self.config.source or "configuration"
        if table is None:
            known = ", ".join(f"[buckets.{b}]" for b in sorted(self.config.buckets)) or "none"
            raise ConfigError(f"{where}: no table [buckets.{name}] (known: {known})")
        resolved: dict[str, Any] = resolve_env(
            dict(table), where, f"[buckets.{name}]", self.config.secrets
        )
        return resolved

    def get_jet(self) -> JetService:
        """The jet service: submit and find jobs."""
        if self._jet is None:
            self._jet = JetService(Services(
                store=self.store,
                records=JobRecords(self.store),
                plugins=self.plugins,
                engine=self.engine,
                redact=self.config.redact,
                plugin_options=self.config.plugin_options,
                snapshots=lambda: self.snapshots,
                engine_settings=self.config.engine,
                before_submit=self._before_submit,
            ))
        return self._jet

    def _before_submit(self, pipeline: Any) -> None:
        """Refuse, before the job exists, a pipeline the engine cannot run.

        On Spark Connect: connect and check the server, ship the pipeline's
        modules. On classic Spark: pyspark must be installed (and not the
        Connect client alone); the session itself starts with the first work.
        """
        if not self.runs_on_spark:
            return
        if self.config.spark_remote:
            import cloudpickle

            self.engine  # noqa: B018 - made now, so the Connect engine is known
            self._connect.check(cloudpickle.dumps(pipeline))
        else:
            from sparkjet.core.engine.spark.session import check_classic

            check_classic(self.config)

    def get_list(self, name: str) -> IList:
        """The store's list ``name`` (created on first write)."""
        return IList(self.store, name)

    def get_map(self, name: str) -> IMap:
        """The store's map ``name`` (created on first write)."""
        return IMap(self.store, name)

    def get_stream(self, name: str, partitions: int | None = None) -> IStream:
        """The store's stream ``name``; created with ``partitions`` partitions if given.

        Publishing to a stream that was never created is an error naming it.
        """
        return IStream(self.store, name, partitions)

    def collect_garbage(
        self,
        *,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        dry_run: bool = False,
    ) -> GarbageReport:
        """Remove what the store no longer needs; returns what was (or would be) removed.

        Orphan segments and abort markers, old take-over claims, unused scratch
        checkpoints, quarantined control requests and probe files older than
        ``grace_seconds``, and the folders of jobs that ended more than
        ``retention_seconds`` ago (see ``sparkjet gc``); and in the snapshot
        backend, attempts that failed or killed exports left (older than
        ``grace_seconds``) and complete ones a newer export of their name
        replaced.
        """
        report = collect_garbage(
            self.store, grace_seconds=grace_seconds, retention_seconds=retention_seconds,
            dry_run=dry_run,
        )
        for folder in self.snapshots.gc(grace_seconds, dry_run=dry_run):
            report.add("snapshot export attempts", folder)
        holders = None  # what jobs and snapshots need, read once for every stream
        for name in sorted(self.config.streams):
            if not IStream(self.store, name).exists():
                continue
            if holders is None:
                holders = Holders(self.store, self.snapshots)
            trimmed = trim_stream(self.store, self.snapshots, name, self._retention(name),
                                  dry_run=dry_run, holders=holders)
            for part in trimmed.partitions:
                if part.trimmed:
                    report.add("stream items past their retention",
                               f"stream {name!r} partition {part.partition}: offsets "
                               f"{part.start_before} to {part.start_after - 1}")
        return report

    def trim_stream(
        self,
        name: str,
        *,
        keep_items: int | None = None,
        keep_seconds: float | None = None,
        keep_bytes: int | None = None,
        dry_run: bool = False,
    ) -> TrimReport:
        """Remove stream ``name``'s oldest items past the limits; returns what went.

        Without limits, those of ``[streams.<name>]`` in the configuration.
        Never removes what a job that is not COMPLETED or FAILED, or a
        snapshot, still needs (see ``sparkjet trim``): the report says what
        held each partition back. ValueError if no limit is given or configured.
        """
        retention = self._retention(name, {"keep_items": keep_items,
                                           "keep_seconds": keep_seconds,
                                           "keep_bytes": keep_bytes})
        return trim_stream(self.store, self.snapshots, name, retention, dry_run=dry_run)

    def _retention(self, name: str, limits: dict[str, Any] | None = None) -> Retention:
        """``limits``, or without any the configured ``[streams.<name>]``, as a Retention."""
        if limits is None or all(value is None for value in limits.values()):
            limits = dict(self.config.streams.get(name) or {})
            if not limits:
                raise ValueError(
                    f"stream {name!r}: no retention given, and none configured "
                    f"([streams.{name}] keep_items, keep_seconds or keep_bytes)"
                )
        try:
            return Retention(**limits)
        except ValueError as exc:
            raise ValueError(f"stream {name!r}: {exc}") from None

    def redact(self, text: str) -> str:
        """``text`` with every configured secret (``${env:...}`` value) masked."""
        return self.config.redact(text)

    def list_plugins(self) -> list[PluginInfo]:
        """Every loaded plugin, in load order, with where it came from and what it registered."""
        return list(self.plugins.plugins.values())

    def blocked_plugins(self) -> list[str]:
        """Names of the plugins blocked by ``[plugins] disable`` or ``SPARKJET_BLOCK_PLUGINS``."""
        return sorted(self.plugins.blocked)

    def register_plugin(self, plugin: object, name: str) -> None:
        """Register a plugin object (a module or instance with ``@hookimpl`` functions) now."""
        self.plugins.register(plugin, name)


def connect(
    config_file: str | os.PathLike[str] | None = None, **overrides: Mapping[str, Any]
) -> Client:
    """Create a client from the configuration, with per-section overrides.

    ``connect(store={"url": "s3://bucket/jet"}, spark={"master": "local[2]"})``
    overrides those keys of the file's ``[store]`` and ``[spark]`` tables.
    """
    return Client(load_config(overrides, path=config_file))
