"""Jobs: the jet service, the job handle, the runner, the job record and the lifecycle.

- :mod:`.service`: submits and finds jobs, takes over a job whose driver died;
- :mod:`.handle`: :class:`Job`, what users hold;
- :mod:`.polling`: a handle's waits, polled, and its requests to a driver in
  another process, answered in the record;
- :mod:`.runner`: drives one job in this process, on the engine: its threads,
  the actions asked of it, its lifecycle;
- :mod:`.outcome`: how a job driven here ends (its failures, its end in the
  record) and what its run counted;
- :mod:`.checkpointing`: a job's checkpoint folder, named in its record,
  deleted on a NONE restart or a failure;
- :mod:`.heartbeat`: the runner's watcher thread: control requests taken,
  heartbeats written, an outcome the store refused stored later;
- :mod:`.statuses`: a job's status changes: checked, stored, told to listeners;
- :mod:`.batch`: the engine a batch job runs on (the driver's when small);
- :mod:`.streaming`: a streaming job's micro-batch loop in its runner, and the
  loop's host;
- :mod:`.exporting`: snapshot exports (the cut and its export; requests,
  threads, pins);
- :mod:`.seeding`: a new job's checkpoint started from a snapshot at submit;
- :mod:`.metrics`: a job's metrics and its stages' counts (pure);
- :mod:`.control`: requests from other processes, answered in the record;
- :mod:`.ports`: what the handle asks of the service and the runner;
- :mod:`.record`: the stored record (``JobRecord``), the driver's lease on it,
  take-over claims;
- :mod:`.lifecycle`: Jet's statuses and the moves allowed between them (pure);
- :mod:`.policy`: Jet's auto-scaling and split-brain rules (pure).
"""

from sparkjet.core.jobs.handle import UPDATABLE_FIELDS, Job
from sparkjet.core.jobs.lifecycle import JobStatusEvent
from sparkjet.core.jobs.runner import Services
from sparkjet.core.jobs.service import JetService

__all__ = ["UPDATABLE_FIELDS", "JetService", "Job", "JobStatusEvent", "Services"]
