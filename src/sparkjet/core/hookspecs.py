"""Every hook sparkjet calls, in one module (the plugin author's reference).

Hooks are called on the driver only, never on Spark executors; the plugin
manager is never shipped to workers. An implementation may accept fewer
arguments than its spec, so specs can grow without breaking plugins.

Registration hooks hand the plugin a ``register`` callback; the plugin calls
it once per class it contributes. Lifecycle hooks observe; their results are
ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from sparkjet.core.contracts import Sink, SnapshotBackend, Source, StatefulTransform
    from sparkjet.core.jobs import Job
    from sparkjet.core.model import JobStatus

PROJECT = "sparkjet"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


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
def on_job_status_changed(job: Job, old_status: JobStatus, new_status: JobStatus) -> None:
    """Observe a job changing status.

    Called on the driver that runs the job, after the new status has been
    written to the job record, from the job's own thread. An exception raised
    here is logged and does not affect the job.

    :param job: the job handle.
    :param old_status: the status before.
    :param new_status: the status now.
    """


@hookspec
def on_job_error(job: Job, error: BaseException) -> None:
    """Observe a job failing.

    Called on the driver that runs the job, once, before its status becomes
    FAILED. An exception raised here is logged and does not affect the job.

    :param job: the job handle.
    :param error: the error that ends the job (a
        :class:`~sparkjet.errors.JobFailedError`, cause chained).
    """
