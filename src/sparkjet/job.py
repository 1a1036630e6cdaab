"""Jobs: configuration, processing guarantees, statuses and the job handle.

Mirrors Hazelcast Jet's ``JobConfig`` (snake_case names, same defaults) and
``JobStatus``. :class:`Job` handles come from ``client.get_jet().submit(...)``
or ``get_job`` / ``get_job_by_name`` / ``get_jobs``.
"""

from __future__ import annotations

from sparkjet.core.jobs import Job, JobStatusEvent
from sparkjet.core.model import JobConfig, JobStatus, ProcessingGuarantee

__all__ = ["Job", "JobConfig", "JobStatus", "JobStatusEvent", "ProcessingGuarantee"]
