"""The plugin author's API: the hook marker, the base classes, the contexts and store views.

A plugin is a module (or object) with functions marked ``@hookimpl`` whose
names are hooks from :mod:`sparkjet.core.host.hookspecs` (documented in
``docs/plugins.md``). Distributions expose plugins through the ``sparkjet``
entry-point group::

    [project.entry-points.sparkjet]
    csv = "sparkjet_csv"

A registration hook hands classes to sparkjet; it does not do I/O::

    from sparkjet.plugin import Source, hookimpl

    class CsvSource(Source):
        kind = "csv"
        ...

    @hookimpl
    def register_sources(register):
        register(CsvSource)

Every class says where each method runs: on the **driver** (the process that
submitted the job) or on **executors** (Spark's Python workers). Whatever an
executor method uses must be picklable; instances are shipped with cloudpickle.

File I/O goes through one protocol, :class:`FileStore`: :func:`open_file_store`
opens one on any fsspec URL, and ``context.store.files`` is the job's store's.
``context.store`` (a :class:`StoreAccess`) also reaches the store's lists, maps
and streams, through their logs (:class:`CommitLogAccess`,
:class:`StreamLogAccess`), which carry a commit protocol plain files do not.
These are protocols, never sparkjet's classes, which are internal and may
change; lifecycle hooks see a job as a :class:`JobView` and a snapshot as a
:class:`ManifestView`.
"""


from __future__ import annotations

from sparkjet.core.host.contracts import (
    ALL_GUARANTEES,
    AT_LEAST_ONCE_AT_MOST,
    BatchedItems,
    CommitLogAccess,
    CommitLogSink,
    FileStore,
    InputSize,
    JobContext,
    LogRecord,
    Sink,
    SnapshotBackend,
    Source,
    StatefulTransform,
    StoreAccess,
    StreamLogAccess,
    TaskContext,
    open_file_store,
)
from sparkjet.core.host.hookspecs import JobView, ManifestView, StageView, hookimpl
from sparkjet.core.host.manager import Category, PluginInfo, Registered
from sparkjet.core.model import ProcessingGuarantee
from sparkjet.core.pipeline.windows import KeyedWindowResult, WindowResult
from sparkjet.core.store.fs import file_modified

__all__ = [
    "ALL_GUARANTEES",
    "AT_LEAST_ONCE_AT_MOST",
    "BatchedItems",
    "Category",
    "CommitLogAccess",
    "CommitLogSink",
    "FileStore",
    "InputSize",
    "JobContext",
    "JobView",
    "KeyedWindowResult",
    "LogRecord",
    "ManifestView",
    "PluginInfo",
    "ProcessingGuarantee",
    "Registered",
    "Sink",
    "SnapshotBackend",
    "Source",
    "StageView",
    "StatefulTransform",
    "StoreAccess",
    "StreamLogAccess",
    "TaskContext",
    "WindowResult",
    "file_modified",
    "hookimpl",
    "open_file_store",
]
