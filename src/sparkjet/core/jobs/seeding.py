"""Starting a new job from a snapshot: its checkpoint seeded at submit, before its record exists.

The rules (which stages and sources carry over, Jet's upgrade options) are
:mod:`sparkjet.core.state.snapshots.upgrade`'s, and the seeding
:func:`~sparkjet.core.state.restore.seed_checkpoint`'s; this module gives it the
job's sources as the submitting driver sees them, removes a half-made
checkpoint when the seed is refused, and logs what the snapshot restored.

The submit checks the rules before the job exists, and the job's runner
seeds its checkpoint afterwards by what that check found
(:class:`~sparkjet.core.state.snapshots.upgrade.CheckedUpgrade`), so a submit runs
the rules once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sparkjet.core.host.contracts import JobContext
from sparkjet.core.microbatch.loop import latest_offsets
from sparkjet.core.model import JobConfig
from sparkjet.core.pipeline.graph import Transform
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.state.checkpoint import Checkpoint
from sparkjet.core.state.restore import SourceOffsets, seed_checkpoint
from sparkjet.core.state.snapshots import Snapshot
from sparkjet.core.state.snapshots.upgrade import CheckedUpgrade

__all__ = ["seed_job"]

log = logging.getLogger("sparkjet.jobs")


def seed_job(
    checkpoint: Checkpoint, plan: Plan, snapshot: Snapshot, upgrade: CheckedUpgrade,
    config: JobConfig, label: str, make: Callable[[Transform], JobContext],
) -> None:
    """Start job ``label``'s new ``checkpoint`` from ``snapshot``.

    ``make`` builds the driver's context of each source (asked for its
    initial and latest offsets). Each restored file is read once, checked
    against the manifest as it is copied; a bad one refuses the submit (the
    half-made checkpoint is removed), naming the file. The stages and
    sources carry over as ``upgrade``, the submit's check of the rules, says.
    """
    name = snapshot.name
    sources = {plan.name(n): (n, spec) for n, spec in plan.sources().items()}
    offsets = SourceOffsets(
        initial=lambda stage: sources[stage][1].source.initial_offsets(
            make(sources[stage][0])),
        latest=lambda stage: latest_offsets(sources[stage][1].source,
                                            make(sources[stage][0]), None),
        partitions=lambda stage, at: list(
            sources[stage][1].source.watermark_partitions(at)),
    )
    try:
        rows = seed_checkpoint(checkpoint, plan, snapshot, offsets, config.key_groups,
                               upgrade=upgrade)
    except BaseException:
        checkpoint.delete()
        raise
    for row in rows:
        if row.status in ("dropped", "changed") or row.note:
            what = "source" if row.kind == "source" else "stage"
            log.warning("job %s: snapshot %r: %s %r %s%s", label, name, what,
                        row.stage, row.status, f": {row.note}" if row.note else "")
    log.info("job %s: started from snapshot %r (batch %d): %s", label, name,
             snapshot.manifest.batch_id,
             ", ".join(f"{r.stage} {r.status}" for r in rows) or "no stateful stages")
