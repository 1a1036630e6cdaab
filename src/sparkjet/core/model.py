"""The job model: guarantees, statuses, ``JobConfig``, per-stage count keys, planned batches.

Plain values with no I/O, so every layer may use them; the public face is
:mod:`sparkjet.job`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, NamedTuple

from sparkjet.core.errors import ConfigError

__all__ = [
    "CountKind", "JobConfig", "JobStatus", "PlannedBatch", "ProcessingGuarantee", "StageCount",
]


#: What a per-stage count counts: the items the stage emitted, its dead letters,
#: or (a windowed stage) the late items it dropped.
CountKind = Literal["items", "dead", "late"]


class StageCount(NamedTuple):
    """The key of one of a job's per-stage counts: which stage, and what it counts.

    The tasks add counts under these keys, the engine sums them by key, the
    streaming loop keeps the totals in its commit records (in their own string
    form, see :mod:`sparkjet.core.state.checkpoint`) and the job's metrics read them.
    A tuple, so it pickles small and hashes fast on the way from the tasks.
    """

    #: The stage's name.
    stage: str
    #: What is counted (see :data:`CountKind`).
    kind: CountKind


class ProcessingGuarantee(enum.Enum):
    """What a job promises about each item after a failure (Jet's three levels)."""

    #: No snapshots: after a restart the job starts from scratch.
    NONE = "NONE"
    #: Snapshots; items processed since the last one may be processed again.
    AT_LEAST_ONCE = "AT_LEAST_ONCE"
    #: Snapshots and idempotent sinks: every item affects the result exactly once.
    EXACTLY_ONCE = "EXACTLY_ONCE"

    @property
    def rank(self) -> int:
        """Strength of the guarantee: NONE < AT_LEAST_ONCE < EXACTLY_ONCE."""
        return _RANK[self]

    @classmethod
    def parse(cls, value: ProcessingGuarantee | str) -> ProcessingGuarantee:
        """Accept an enum member or its name in any case (``"exactly_once"``, ``"exactlyOnce"``)."""
        if isinstance(value, ProcessingGuarantee):
            return value
        if isinstance(value, str):
            wanted = value.replace("-", "_").replace(" ", "_")
            for member in cls:
                if member.value.replace("_", "").lower() == wanted.replace("_", "").lower():
                    return member
        choices = ", ".join(m.value for m in cls)
        raise ValueError(f"processing_guarantee must be one of {choices}, got {value!r}")


_RANK = {
    ProcessingGuarantee.NONE: 0,
    ProcessingGuarantee.AT_LEAST_ONCE: 1,
    ProcessingGuarantee.EXACTLY_ONCE: 2,
}


class JobStatus(enum.Enum):
    """The eight statuses of a Jet job."""

    NOT_RUNNING = "NOT_RUNNING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    SUSPENDED_EXPORTING_SNAPSHOT = "SUSPENDED_EXPORTING_SNAPSHOT"
    COMPLETING = "COMPLETING"
    FAILED = "FAILED"
    COMPLETED = "COMPLETED"

    def is_terminal(self) -> bool:
        """True for COMPLETED and FAILED: the job will never run again."""
        return self in (JobStatus.COMPLETED, JobStatus.FAILED)


_INT_FIELDS = ("snapshot_interval_millis",)
#: ``JobConfig.error_policy`` values (:mod:`sparkjet.core.pipeline.dead_letters` says what they do).
ERROR_POLICIES = ("fail", "dead-letter")
#: Key groups of a new streaming job's state (``JobConfig.key_groups``), and the most allowed.
DEFAULT_KEY_GROUPS = 128
MAX_KEY_GROUPS = 32768
#: The most bytes of one job's keyed state a worker process keeps loaded
#: between micro-batches (``JobConfig.state_cache_bytes``).
DEFAULT_STATE_CACHE_BYTES = 1 << 30
_BOOL_FIELDS = (
    "auto_scaling_enabled",
    "split_brain_protection_enabled",
    "suspend_on_failure",
    "metrics_enabled",
    "store_metrics_after_job_completion",
    "allow_dropped_state",
    "allow_changed_state",
)
#: Where a source the snapshot has no offsets for starts (``JobConfig.source_starts``).
SOURCE_STARTS = ("initial", "latest")


@dataclass
class JobConfig:
    """Configuration of one job, validated whenever a field is set.

    Field names and defaults follow Jet's ``JobConfig``. ``arguments`` carries
    values to the job (the CLI puts its ``ARGS`` there); they must be JSON
    serialisable because they are stored in the job record.

    ``key_groups`` is sparkjet's own (Flink calls it the maximum
    parallelism): the number of parts a streaming job's keyed state is split
    into, fixed when the job first starts. Each micro-batch runs as many state
    tasks as the cluster runs at once, at most this many; more key groups let
    a job grow onto a bigger cluster later, at a small cost per group.
    """

    name: str | None = None
    processing_guarantee: ProcessingGuarantee = ProcessingGuarantee.NONE
    snapshot_interval_millis: int = 10_000
    auto_scaling_enabled: bool = True
    split_brain_protection_enabled: bool = False
    suspend_on_failure: bool = False
    initial_snapshot_name: str | None = None
    metrics_enabled: bool = True
    store_metrics_after_job_completion: bool = False
    arguments: list[Any] = field(default_factory=list)
    key_groups: int = DEFAULT_KEY_GROUPS
    #: What a failing map, filter, flat_map or peek function does to the job when its
    #: stage sets no policy (``Stage.on_error``): ``"fail"`` (Jet's behaviour) or
    #: ``"dead-letter"`` (the item goes to the dead-letter stream, the job goes on; a
    #: windowed stage sends its late items there too).
    error_policy: str = "fail"
    #: The stream dead letters go to; default ``<job name or id>.dead-letters``.
    dead_letter_stream: str | None = None
    #: Starting from a snapshot: accept that state or offsets the snapshot holds for a
    #: stage this pipeline does not have are dropped (Flink's ``allowNonRestoredState``);
    #: without it such a submit is refused.
    allow_dropped_state: bool = False
    #: Starting from a snapshot: keep the state of a stage whose key function or
    #: operation changed (its state's type did not); without it such a submit is refused.
    allow_changed_state: bool = False
    #: Starting from a snapshot: ``{old name: new name}``, the state of stage (or the
    #: offsets of source) ``old`` in the snapshot go to stage ``new`` of this pipeline.
    stage_renames: dict[str, str] = field(default_factory=dict)
    #: Starting from a snapshot: ``{source stage: "initial" | "latest"}``, where a source
    #: the snapshot has no offsets for (a new one, or one that reads something else now)
    #: starts: where it would without a snapshot, or at the data's end now. ``"*"`` names
    #: every such source. Without an entry such a submit is refused.
    source_starts: dict[str, str] = field(default_factory=dict)
    #: The most bytes of this job's keyed state each worker process keeps loaded between
    #: micro-batches (estimated; 0: keep none). Past it, the least recently used key-group
    #: ranges are dropped and reload from the checkpoint when next needed.
    state_cache_bytes: int = DEFAULT_STATE_CACHE_BYTES
    #: Whether a streaming job's small micro-batches (and a batch job over a small
    #: input) may run on the driver instead of as a Spark job: ``None`` follows the
    #: configuration's ``[engine] adaptive`` (on by default), ``False`` always uses
    #: Spark, ``True`` turns it on even when the configuration turns it off. What counts
    #: as small is the configuration's ``[engine]`` table; results are the same either way.
    adaptive_micro_batches: bool | None = None

    def __setattr__(self, key: str, value: Any) -> None:
        object.__setattr__(self, key, _validate(key, value))

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON-ready data (as stored in the job record)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["processing_guarantee"] = self.processing_guarantee.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobConfig:
        """Rebuild a configuration from :meth:`to_dict` output."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"JobConfig: unknown field(s) {', '.join(unknown)}")
        return cls(**data)


def _validate(key: str, value: Any) -> Any:
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"JobConfig.{key}: expected {expected}, got {value!r}")

    if key == "error_policy":
        if value not in ERROR_POLICIES:
            raise bad("'fail' or 'dead-letter'")
    elif key == "name" or key == "initial_snapshot_name" or key == "dead_letter_stream":
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise bad("a non-empty string or None")
    elif key == "processing_guarantee":
        try:
            return ProcessingGuarantee.parse(value)
        except ValueError as exc:
            raise ConfigError(f"JobConfig.{key}: {exc}") from None
    elif key == "key_groups":
        if isinstance(value, bool) or not isinstance(value, int) or not (
            1 <= value <= MAX_KEY_GROUPS
        ):
            raise bad(f"an int from 1 to {MAX_KEY_GROUPS}")
    elif key == "adaptive_micro_batches":
        if value is not None and not isinstance(value, bool):
            raise bad("a bool or None (None: the configuration's [engine] adaptive)")
    elif key == "state_cache_bytes":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad("an int of bytes, 0 or more")
    elif key in _INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise bad("a positive int")
    elif key in _BOOL_FIELDS:
        if not isinstance(value, bool):
            raise bad("a bool")
    elif key == "stage_renames":
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()
        ):
            raise bad("a dict of old stage name to new stage name")
        targets = list(value.values())
        twice = sorted({t for t in targets if targets.count(t) > 1})
        if twice:
            raise ConfigError(
                f"JobConfig.{key}: stage {twice[0]!r} is the new name of more than one stage"
            )
        return dict(value)
    elif key == "source_starts":
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and k and v in SOURCE_STARTS for k, v in value.items()
        ):
            raise bad("a dict of source stage name (or '*') to 'initial' or 'latest'")
        return dict(value)
    elif key == "arguments":
        if not isinstance(value, list | tuple):
            raise bad("a list")
        try:
            json.dumps(list(value))
        except (TypeError, ValueError) as exc:
            raise bad(f"JSON-serialisable values ({exc})") from None
        return list(value)
    return value


@dataclass(frozen=True)
class PlannedBatch:
    """A micro-batch of a streaming job as its checkpoint planned it, before it ran.

    What ``job.get_planned_batches()`` returns: the write-ahead plan a replay
    after a crash follows, read-only.
    """

    #: The micro-batch's number (a job started from a snapshot counts on from its batch).
    batch: int
    #: Per source stage, by name: the offsets the batch reads from (where the one before ended).
    starts: Mapping[str, Any]
    #: Per source stage, by name: the offsets the batch reads up to.
    ends: Mapping[str, Any]
    #: When the batch was planned, in milliseconds since the epoch.
    time_ms: int
