"""One owner for a micro-batch's way into the checkpoint: plan, fence, sinks, commit point.

A micro-batch is committed in one sequence, and :class:`BatchCommit` is the
only code that runs it, so its steps and their store requests are read in
one place:

1. **plan**: the batch's ranges, written ahead (create-only) to
   ``checkpoint/offsets/<b>.json``; a plan already there (a batch a driver
   planned before it died, or a racing driver's) stands and is replayed;
2. the batch runs (the engine's work: sources read, state tasks fold and
   write their state files, sinks write what they will commit);
3. **fence**: one check that no other driver took the job over
   (``owner-<epoch+1>``, one GET), just before the first thing another
   process can see: a driver that was replaced commits nothing;
4. **sinks**: dead letters first, then each sink's idempotent commit with
   the batch id (a replay finds what landed and skips it);
5. **commit point**: ``checkpoint/commits/<b>.json``, create-only, naming
   the state files that count;
6. **pruning**: every :data:`~sparkjet.core.state.checkpoint.KEEP_LOG` batches the
   plans, records and state files that no longer count are removed, on the
   loop's upkeep thread (:mod:`~sparkjet.core.store.upkeep`) while the next
   batch runs; once that succeeded the loop forgets their files;
7. **recovery**: when the commit point was taken (another driver committed
   the batch first), the fence is checked again (a driver that was replaced
   stops here) and that driver's record stands: its state files count, its
   event time and stage totals go on.

Why one fence check and not one per write: the plan needs none (a plan is
only where a batch's ranges are written down, and whoever replays it runs the
same work), and the commit point needs none of its own (it is create-only: a
replaced driver that gets there first wrote the same batch from the same
plan, which the new driver then takes as committed, and one that gets there
second is stopped by the check of step 7). What a replaced driver must never
do is make its batch visible outside the checkpoint, and the sinks' commits
are the first such step: the check stands right before them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from sparkjet.core.engine.boundary import MicroBatch
from sparkjet.core.state.checkpoint import KEEP_LOG, BatchPlan, Checkpoint, CommitRecord
from sparkjet.core.state.files import StatePaths
from sparkjet.core.state.versions import Counted
from sparkjet.core.store import upkeep

__all__ = ["BatchCommit"]

log = logging.getLogger("sparkjet.streaming")


class BatchCommit:
    """Runs each micro-batch's commit sequence on ``checkpoint`` (see the module).

    ``fence`` raises once another driver took the job over. Keeps which
    state files count (per batch whose commit record is kept), read from the
    checkpoint once and then followed batch by batch.
    """

    def __init__(
        self, checkpoint: Checkpoint, state: StatePaths, fence: Callable[[], None]
    ) -> None:
        self.checkpoint = checkpoint
        self.fence = fence
        self._state = state
        #: Per batch whose commit record is kept, the state files it says count.
        self.counted: Counted = checkpoint.counted()
        #: The newest batch whose record a prune removed (set by the upkeep thread):
        #: what counts for it and older batches is no longer needed.
        self.pruned = -1

    def state(self, pinned: int) -> StatePaths:
        """Where a batch's state tasks read and write, with what counts and the export pin."""
        return self._state.with_counted(self.counted).with_pin(pinned)

    def listed(self, stages: list[str]) -> dict[str, list[str]]:
        """Each stateful stage's state folder, listed once for all of a batch's state tasks."""
        return {stage: self._state.store.listdir(self._state.stage_dir(stage))
                for stage in stages}

    def planned(self, batch: int) -> BatchPlan | None:
        """The plan written ahead for ``batch``, if any (read from the store)."""
        return self.checkpoint.planned(batch)

    def plan(self, planned: BatchPlan) -> BatchPlan:
        """Write ``planned`` ahead, create-only; the plan that stands (another's, if first)."""
        return self.checkpoint.write_plan(planned)

    def commit(self, run: MicroBatch, record: CommitRecord) -> CommitRecord:
        """Fence, commit ``run``'s sinks, then the commit point; the record that stands.

        ``run`` has run; ``record`` is this driver's record of it. Raises
        :class:`~sparkjet.core.errors.JobFencedError` (nothing committed,
        the sinks' writes aborted) when another driver took the job over,
        and the sinks' :class:`~sparkjet.core.errors.JobFailedError` when one
        fails to commit. Returns ``record``, or the record another driver
        committed for the batch first.
        """
        batch = record.batch
        try:
            self.fence()
        except BaseException:
            run.abort()
            raise
        run.commit()
        self.counted[batch] = dict(record.state or {})
        if self.checkpoint.write_commit(record, prune=False):
            standing = record
        else:
            self.fence()  # committed by another driver: one that took over stops this one
            log.warning("micro-batch %d was committed already; going on after it", batch)
            self.counted = self.checkpoint.counted()  # its record names the files that count
            standing = self.checkpoint.commit_record(batch)
        if self.checkpoint.prune_due(batch):
            # What counts as of now: the prune needs it for every batch it removes.
            state = self._state.with_counted(dict(self.counted))
            upkeep.later(("prune", self.checkpoint.root),
                         functools.partial(self._prune, batch, state),
                         f"pruning the log of checkpoint {self.checkpoint.id}")
        forget = min(batch - 2 * KEEP_LOG, self.pruned)
        for old in [b for b in self.counted if b <= forget]:
            del self.counted[old]  # its record is gone, and the files that did not count
        return standing

    def _prune(self, batch: int, state: StatePaths) -> None:
        """Prune after ``batch`` (on the upkeep thread); then the loop may forget what went."""
        upto = self.checkpoint.prune(batch, state)
        if upto is not None:
            self.pruned = max(self.pruned, upto)
