"""A job's checkpoint folder as its runner keeps it: named in the record, opened, deleted.

A job with a processing guarantee keeps its checkpoint in the job's durable
folder; one with NONE in a scratch folder of its own, thrown away on a
restart. The record names the folder once the job has one (so a driver that
takes the job over finds it), and the folder's name is checked as the
record's field wherever it is read. The folder is deleted when a NONE job
restarts, and when a streaming job ends FAILED (as Jet deletes a failed
job's snapshots), but only once the store holds FAILED: until then another
process may find the driver gone and resume the job from it.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from sparkjet.core.errors import JobFencedError
from sparkjet.core.jobs.record import Lease, checkpoint_path
from sparkjet.core.model import ProcessingGuarantee
from sparkjet.core.state.checkpoint import Checkpoint
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords

if TYPE_CHECKING:
    from sparkjet.core.jobs.handle import Job

log = logging.getLogger("sparkjet.jobs")


class CheckpointFolder:
    """The checkpoint folder of one job driven here (``streaming``: a streaming job)."""

    def __init__(self, records: JobRecords, store: Store, lease: Lease, job: Job,
                 streaming: bool) -> None:
        self.records, self.store, self.lease = records, store, lease
        self.job, self.streaming = job, streaming

    def open(self, record_now: bool = True) -> Checkpoint:
        """The job's checkpoint; a new one is named in the record (written now, or staged)."""
        path = checkpoint_path(self.records, self.lease.record)
        if path is None:
            layout = self.records.layout
            if self.job.config.processing_guarantee is ProcessingGuarantee.NONE:
                folder = layout.new_scratch_checkpoint()  # thrown away on restart
            else:
                folder = layout.DURABLE_CHECKPOINT
            if record_now:
                self.lease.write(lambda r: replace(r, checkpoint=folder))
            else:
                self.lease.stage(lambda r: replace(r, checkpoint=folder))
            path = layout.checkpoint(self.job.id, folder)
        return Checkpoint(self.store, path)

    def discard(self) -> None:
        """Delete the checkpoint and unname it in the record (unless the job was taken over)."""
        self.lease.check_fence()  # the checkpoint belongs to the newer driver now
        path = checkpoint_path(self.records, self.lease.record)
        if path is not None:
            Checkpoint(self.store, path).delete()
            self.lease.write(lambda r: replace(r, checkpoint=None))

    def discard_of_failed(self) -> None:
        """Delete a FAILED streaming job's checkpoint, as Jet deletes its snapshots.

        Only once the store holds FAILED: until then another process may find
        the driver gone and resume the job from this checkpoint. The watcher
        deletes it when it stores the record later.
        """
        if not self.streaming or self.lease.unwritten is not None:
            return
        try:
            self.discard()
        except JobFencedError:
            raise
        except Exception:  # the job failed all the same; gc removes the folder in time
            log.exception("job %s: deleting its checkpoint failed", self.job.label)
