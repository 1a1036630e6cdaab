"""Jet's auto-scaling and split-brain rules, applied to the engine's executors.

Pure: it is given the executor ids seen now and the job's configuration, and
says whether the job goes on, suspends (with the cause) or fails. The runner
asks it between micro-batches.

A lost executor is the engine's business while auto-scaling is on: its tasks
are retried on the executors left, or wait for a new one. With auto-scaling
off the job suspends (a guarantee keeps its state) or fails (NONE); with
split-brain protection it suspends when fewer than half-plus-one of the
executors it started with are left. Executors are told apart by id, so one
replaced by a new one counts as lost.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field

from sparkjet.core.errors import JobFailedError
from sparkjet.core.model import JobConfig, ProcessingGuarantee


@dataclass
class ClusterWatch:
    """Remembers the executors a job started with and those it has seen since."""

    started: int | None = None
    known: set[str] = field(default_factory=set)

    def reset(self) -> None:
        """Forget the baseline: a resumed job counts what it has then."""
        self.started = None
        self.known = set()

    def check(self, now_ids: Set[str] | None, config: JobConfig, label: str) -> str | None:
        """The cause to suspend the job for, or None to go on.

        :param now_ids: the executors alive now; None where the engine has
            nothing to watch (local mode).
        :raises JobFailedError: an executor was lost with auto-scaling off and
            the job has no processing guarantee to resume from.
        """
        if now_ids is None:
            return None
        if self.started is None:  # the baseline: what the job starts with
            if now_ids:
                self.started = len(now_ids)
                self.known = set(now_ids)
            return None
        started = self.started
        lost = self.known - now_ids
        self.known |= now_ids
        self.known -= lost
        quorum = started // 2 + 1
        count = len(now_ids)
        if config.split_brain_protection_enabled and count < quorum:
            return (
                f"split-brain protection: {count} of the {started} executors the job started "
                f"with are left, fewer than the {quorum} it needs"
            )
        if lost and not config.auto_scaling_enabled:
            cause = (
                f"executor(s) {', '.join(sorted(lost))} were lost ({count} of "
                f"{count + len(lost)} left) and auto-scaling is off"
            )
            if config.processing_guarantee is ProcessingGuarantee.NONE:
                raise JobFailedError(f"job {label} failed: {cause}")
            return cause
        return None
