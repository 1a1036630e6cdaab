"""Every hook sparkjet calls, in one module (the plugin author's reference).

Hooks are called on the driver only, never on Spark executors; the plugin
manager is never shipped to workers. An implementation may accept fewer
arguments than its spec, so specs can grow without breaking plugins.

Registration hooks hand the plugin a ``register`` callback; the plugin calls
it once per class it contributes. Lifecycle hooks observe; their results are
ignored. What a lifecycle hook sees of a job and of a snapshot is a small
protocol defined here (:class:`JobView`, :class:`ManifestView`), so this
module depends on no job service; the plugin manager
(:mod:`sparkjet.core.host.manager`) has one typed method per hook.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    from sparkjet.core.host.contracts import Sink, SnapshotBackend, Source, StatefulTransform
    from sparkjet.core.model import JobConfig, JobStatus

PROJECT = "sparkjet"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --- what lifecycle hooks see -------------------------------------------------


class JobView(Protocol):
    """A job as lifecycle hooks see it: the job handle (:class:`sparkjet.job.Job`) has these."""

    @property
    def id(self) -> str:
        """The job's id."""

    @property
    def name(self) -> str | None:
        """The job's name, or None."""

    @property
    def config(self) -> JobConfig:
        """The job's configuration."""

    @property
    def submission_time(self) -> int:
        """When the job was submitted, in milliseconds since the epoch."""

    @property
    def status(self) -> JobStatus:
        """The job's status now."""

    def is_streaming(self) -> bool:
        """True for a streaming job."""

    def get_metrics(self) -> dict[str, Any]:
        """The job's metrics (see :meth:`sparkjet.job.Job.get_metrics`)."""


class StageView(Protocol):
    """One stateful stage in a snapshot's manifest."""

    @property
    def name(self) -> str:
        """The stage's name (state is matched by it on restore)."""

    @property
    def kind(self) -> str:
        """The stage's operation: ``"group_aggregate"``, ``"group_apply"``, ``"distinct"``, ..."""

    @property
    def key_count(self) -> int:
        """How many keys the stage's state holds."""

    @property
    def bytes(self) -> int:
        """The size of the stage's state files together."""


class ManifestView(Protocol):
    """An exported snapshot's manifest as hooks see it (:attr:`sparkjet.job.Snapshot.manifest`)."""

    @property
    def name(self) -> str:
        """The snapshot's name."""

    @property
    def job_id(self) -> str:
        """The id of the job it was exported from."""

    @property
    def job_name(self) -> str | None:
        """The name of that job, or None."""

    @property
    def creation_time(self) -> int:
        """When it was written, in milliseconds since the epoch."""

    @property
    def batch_id(self) -> int:
        """The committed micro-batch it was cut at (-1: before the first)."""

    @property
    def sources(self) -> Mapping[str, Any]:
        """Each source stage's offsets at the cut."""

    @property
    def stages(self) -> Sequence[StageView]:
        """Every stateful stage's state, in stage order."""

    @property
    def payload_size(self) -> int:
        """Bytes of all its data files together."""


# --- registration ----------------------------------------------------------


@hookspec
def register_sources(register: Callable[[type[Source]], None]) -> None:
    """Contribute source classes.

    Called once, on the driver, when the plugin manager loads (at
    ``sparkjet.connect()``).

    :param register: call ``register(SourceSubclass)`` for each source class.
        The class's ``kind`` must be unique among all plugins; a clash is a
        :class:`~sparkjet.errors.PluginError` naming both plugins.
    """


@hookspec
def register_sinks(register: Callable[[type[Sink]], None]) -> None:
    """Contribute sink classes.

    Called once, on the driver, when the plugin manager loads.

    :param register: call ``register(SinkSubclass)`` for each sink class;
        ``kind`` must be unique among all plugins.
    """


@hookspec
def register_stateful_transforms(register: Callable[[type[StatefulTransform]], None]) -> None:
    """Contribute keyed stateful transform classes (used with ``group_by(...).apply(...)``).

    Called once, on the driver, when the plugin manager loads.

    :param register: call ``register(StatefulTransformSubclass)`` for each
        class; ``kind`` must be unique among all plugins.
    """


@hookspec
def register_snapshot_backends(register: Callable[[type[SnapshotBackend]], None]) -> None:
    """Contribute snapshot storage backends, selected by ``[snapshots] backend``.

    Called once, on the driver, when the plugin manager loads.

    :param register: call ``register(SnapshotBackendSubclass)`` for each
        class; ``kind`` is the name used in configuration and must be unique.
    """


# --- lifecycle -------------------------------------------------------------


@hookspec
def before_spark_session_created(builder: Any, spark_conf: dict[str, str]) -> None:
    """Adjust the Spark session before it is created.

    Called once per process, on the driver, when sparkjet builds its Spark
    session (lazily, at the first job or data-structure call that needs Spark).

    :param builder: the ``pyspark.sql.SparkSession.Builder``; call
        ``builder.config(key, value)`` to add settings.
    :param spark_conf: the settings sparkjet is about to apply (read-only view;
        later ``builder.config`` calls win).
    """


@hookspec
def on_job_status_changed(job: JobView, old_status: JobStatus, new_status: JobStatus) -> None:
    """Observe a job changing status.

    Called on the driver that runs the job, after the new status has been
    written to the job record, from the job's own thread. An exception raised
    here is logged and does not affect the job.

    :param job: the job handle.
    :param old_status: the status before.
    :param new_status: the status now.
    """


@hookspec
def on_job_error(job: JobView, error: BaseException) -> None:
    """Observe a job failing.

    Called on the driver that runs the job, once, before its status becomes
    FAILED. An exception raised here is logged and does not affect the job.

    :param job: the job handle.
    :param error: the error that ends the job (a
        :class:`~sparkjet.errors.JobFailedError`, cause chained).
    """


@hookspec
def on_snapshot_exported(
    job: JobView, name: str, manifest: ManifestView, cancel_job: bool
) -> None:
    """Observe a snapshot exported from a job.

    Called once per successful export, on the driver that runs the job, after
    the manifest was written: the snapshot is complete and visible to readers.
    Called from the thread that asked for the export (the caller of
    ``job.export_snapshot``, or the job's own thread serving a request from
    another process). Not called for an export that failed. An exception
    raised here is logged and does not affect the job or the export.

    :param job: the job handle.
    :param name: the snapshot's name.
    :param manifest: the snapshot's manifest (the stages and key counts,
        the source offsets and the batch it was cut at).
    :param cancel_job: True for ``cancel_and_export_snapshot`` (or
        ``export_snapshot(..., cancel_job=True)``): the job is cancelled after
        the export and may already have ended.
    """
