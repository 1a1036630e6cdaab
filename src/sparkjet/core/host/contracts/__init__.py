"""The contracts between sparkjet and its plugins: base classes, contexts, the store's views.

Defined here so the core can use them without importing a public module;
plugin authors import them from :mod:`sparkjet.plugin`, whose docstring is
the guide. One concern per module, from the bottom up:

- :mod:`.store_access`: the job's store as plugins see it (:class:`FileStore`,
  :func:`open_file_store`, the logs' protocols, :class:`StoreAccess` and the
  :class:`PluginStore` that wraps a store as one);
- :mod:`.contexts`: what a plugin sees of its job (:class:`JobContext` on the
  driver, :class:`TaskContext` on executors);
- :mod:`.base_classes`: the bases of the plugins a pipeline's stages run
  (:class:`Source`, :class:`Sink`, :class:`CommitLogSink`,
  :class:`StatefulTransform`), the guarantees they declare, :class:`InputSize`
  and :class:`BatchedItems`;
- :mod:`.snapshot_backend`: the base of snapshot-backend plugins
  (:class:`SnapshotBackend`).

The names below are re-exported so that ``sparkjet.core.host.contracts.<name>``
keeps working (for plugins and pickles that name it); sparkjet's own modules
may import from the module that defines them.
"""

from __future__ import annotations

from sparkjet.core.host.contracts.base_classes import (
    ALL_GUARANTEES,
    AT_LEAST_ONCE_AT_MOST,
    BatchedItems,
    CommitLogSink,
    InputSize,
    Sink,
    Source,
    StatefulTransform,
    lag_of,
    source_lag,
)
from sparkjet.core.host.contracts.contexts import JobContext, TaskContext
from sparkjet.core.host.contracts.snapshot_backend import SnapshotBackend
from sparkjet.core.host.contracts.store_access import (
    CommitLogAccess,
    FileStore,
    LogRecord,
    PluginStore,
    StoreAccess,
    StreamLogAccess,
    open_file_store,
    plugin_store,
)

__all__ = [
    "ALL_GUARANTEES",
    "AT_LEAST_ONCE_AT_MOST",
    "BatchedItems",
    "CommitLogAccess",
    "CommitLogSink",
    "FileStore",
    "InputSize",
    "JobContext",
    "LogRecord",
    "PluginStore",
    "Sink",
    "SnapshotBackend",
    "Source",
    "StatefulTransform",
    "StoreAccess",
    "StreamLogAccess",
    "TaskContext",
    "lag_of",
    "open_file_store",
    "plugin_store",
    "source_lag",
]
