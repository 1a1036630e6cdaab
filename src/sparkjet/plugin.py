"""The plugin author's API: the hook marker, the base classes and the contexts.

A plugin is a module (or object) with functions marked ``@hookimpl`` whose
names are hooks from :mod:`sparkjet.core.hookspecs` (documented in
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
"""


from __future__ import annotations

from sparkjet.core.contracts import (
    ALL_GUARANTEES,
    AT_LEAST_ONCE_AT_MOST,
    BatchedItems,
    CommitLogSink,
    JobContext,
    Sink,
    SnapshotBackend,
    Source,
    StatefulTransform,
    StoreAccess,
    TaskContext,
)
from sparkjet.core.hookspecs import JobView, ManifestView, StageView, hookimpl
from sparkjet.core.model import ProcessingGuarantee
from sparkjet.core.plugin_manager import Category, PluginInfo, Registered
from sparkjet.core.store import CommitLog, Store
from sparkjet.core.stream_log import StreamLog

__all__ = [
    "ALL_GUARANTEES",
    "AT_LEAST_ONCE_AT_MOST",
    "BatchedItems",
    "Category",
    "CommitLog",
    "CommitLogSink",
    "JobContext",
    "JobView",
    "ManifestView",
    "PluginInfo",
    "ProcessingGuarantee",
    "Registered",
    "Sink",
    "SnapshotBackend",
    "Source",
    "StageView",
    "StatefulTransform",
    "Store",
    "StoreAccess",
    "StreamLog",
    "TaskContext",
    "hookimpl",
]
