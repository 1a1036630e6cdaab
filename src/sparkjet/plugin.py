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
:class:`StreamLogAccess`), which carry a commit protocol plain files do not;
:func:`open_store` opens the store at a URL the same way, for tests and tools.
These are protocols, never sparkjet's classes, which are internal and may
change; lifecycle hooks see a job as a :class:`JobView` and a snapshot as a
:class:`ManifestView`.

A source's author calls it as the micro-batch loop does with
:func:`latest_offsets`, and reads its lag as the job's metrics count it with
:func:`lag_of` (:func:`source_lag` for a source whose offsets count items);
a snapshot backend that wraps another builds the built-in one for a URL with
:func:`builtin_snapshot_backend`. The test kit, :mod:`sparkjet.testing`, is
written against these names only.
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
    lag_of,
    open_file_store,
    source_lag,
)
from sparkjet.core.host.contracts.store_access import ListedFile, open_store
from sparkjet.core.host.hookspecs import JobView, ManifestView, StageView, hookimpl
from sparkjet.core.host.plugin_info import Category, PluginInfo, Registered
from sparkjet.core.microbatch.loop import latest_offsets
from sparkjet.core.model import ProcessingGuarantee
from sparkjet.core.pipeline.windows import KeyedWindowResult, WindowResult
from sparkjet.core.state.snapshots.backends import builtin_snapshot_backend
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
    "ListedFile",
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
    "builtin_snapshot_backend",
    "file_modified",
    "hookimpl",
    "lag_of",
    "latest_offsets",
    "open_file_store",
    "open_store",
    "source_lag",
]
