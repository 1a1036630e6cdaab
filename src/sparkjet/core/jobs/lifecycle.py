"""Jet's job statuses and every allowed move between them: one pure table, no I/O.

The runner asks :func:`check_transition` before it writes a new status, so a
move the table does not hold is a bug caught where it happens; the job handle
and the runner ask :func:`check_action` before acting on a user's request, so
the rules of what a user may ask in which status are written once.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from sparkjet.core.errors import JobStateError
from sparkjet.core.model import JobStatus

S = JobStatus

#: For each status, the statuses a job may move to from it.
TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = {
    # Submitted: starts, or is cancelled (or its driver dies) before it does.
    S.NOT_RUNNING: frozenset({S.STARTING, S.FAILED, S.SUSPENDED}),
    # Starting (or restarting, or resuming): runs, fails, is cancelled, or its
    # driver dies and the job is taken over SUSPENDED.
    S.STARTING: frozenset({S.RUNNING, S.FAILED, S.SUSPENDED}),
    # Running: a batch job commits (COMPLETING) and completes; a streaming job
    # is suspended, restarted (STARTING) or fails; both may be cancelled (FAILED).
    S.RUNNING: frozenset({S.COMPLETING, S.COMPLETED, S.FAILED, S.SUSPENDED, S.STARTING}),
    S.COMPLETING: frozenset({S.COMPLETED, S.FAILED}),
    # Suspended: resumed (STARTING), or cancelled (FAILED).
    S.SUSPENDED: frozenset({S.STARTING, S.FAILED, S.SUSPENDED_EXPORTING_SNAPSHOT}),
    S.SUSPENDED_EXPORTING_SNAPSHOT: frozenset({S.SUSPENDED, S.FAILED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A status change the table does not allow: a bug in sparkjet, never a user error."""


def check_transition(label: str, old: JobStatus, new: JobStatus) -> None:
    """Refuse a move that :data:`TRANSITIONS` does not hold (``label`` names the job)."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"job {label}: {old.value} -> {new.value} is not a job transition")


class Action(enum.StrEnum):
    """What a user can ask of a job, from its handle, the CLI or another process."""

    CANCEL = "cancel"
    SUSPEND = "suspend"
    RESUME = "resume"
    RESTART = "restart"
    UPDATE_CONFIG = "update_config"
    EXPORT_SNAPSHOT = "export_snapshot"


#: The statuses in which each action may be asked (in the order messages list them).
ACTION_FROM: Mapping[Action, tuple[JobStatus, ...]] = {
    Action.CANCEL: tuple(s for s in JobStatus if not s.is_terminal()),
    Action.SUSPEND: (S.RUNNING, S.STARTING),
    Action.RESUME: (S.SUSPENDED,),
    Action.RESTART: (S.RUNNING,),
    Action.UPDATE_CONFIG: (S.SUSPENDED,),
    # Jet: a snapshot of a running job, or of a suspended one (then the status
    # reads SUSPENDED_EXPORTING_SNAPSHOT while it is written).
    Action.EXPORT_SNAPSHOT: (S.RUNNING, S.SUSPENDED),
}

#: Actions only a streaming job takes (a batch job cannot stop half-way and continue).
STREAMING_ONLY = frozenset(
    {Action.SUSPEND, Action.RESUME, Action.RESTART, Action.EXPORT_SNAPSHOT})


#: How messages name an action whose value does not read as a verb phrase.
_PHRASES: Mapping[Action, str] = {
    Action.EXPORT_SNAPSHOT: "export a snapshot of",
    Action.UPDATE_CONFIG: "update the configuration of",
}


def check_action(action: Action, status: JobStatus, *, streaming: bool, label: str) -> None:
    """Raise :class:`JobStateError` naming the job and its status if ``action`` is not allowed."""
    allowed = ACTION_FROM[action]
    what = f"cannot {_PHRASES.get(action, action.value)} job {label}"
    if status not in allowed:
        if action is Action.CANCEL:
            raise JobStateError(f"{what}: it has already {status.value}")
        wanted = " or ".join(s.value for s in allowed)
        raise JobStateError(f"{what}: it is {status.value}, not {wanted}")
    if action in STREAMING_ONLY and not streaming:
        raise JobStateError(f"{what}: it is a batch job")


@dataclass(frozen=True)
class JobStatusEvent:
    """What a status listener receives (Jet's ``JobStatusEvent``)."""

    previous_status: JobStatus
    new_status: JobStatus
    #: Why, when known: the failure message, or "cancelled by user".
    description: str | None
    #: True when a user asked for the change (cancel).
    user_requested: bool
