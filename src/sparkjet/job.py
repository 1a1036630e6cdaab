"""Jobs: configuration, processing guarantees, statuses, the job handle and snapshots.

Mirrors Hazelcast Jet's ``JobConfig`` (snake_case names, same defaults) and
``JobStatus``. :class:`Job` handles come from ``client.get_jet().submit(...)``
or ``get_job`` / ``get_job_by_name`` / ``get_jobs``. :class:`Snapshot` is an
exported snapshot (``job.export_snapshot``, ``jet.get_snapshot``), kept in a
:class:`SnapshotStore` (``client.snapshots``); :class:`UpgradeRow` is one row
of ``jet.check_upgrade``.
"""

from __future__ import annotations

from sparkjet.core.jobs import Job, JobStatusEvent
from sparkjet.core.model import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.core.state.snapshots import Snapshot, SnapshotStore
from sparkjet.core.state.snapshots.upgrade import UpgradeRow

__all__ = [
    "Job",
    "JobConfig",
    "JobStatus",
    "JobStatusEvent",
    "ProcessingGuarantee",
    "Snapshot",
    "SnapshotStore",
    "UpgradeRow",
]
