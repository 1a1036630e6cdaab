"""Dead letters: items a stateless stage failed on, set aside while the job goes on.

A stage's error policy is ``"fail"`` (Jet's behaviour, the default: the job
fails, naming the stage) or ``"dead-letter"``. It is set per stage with
``Stage.on_error()`` and per job with ``JobConfig.error_policy``, the default
of the stages that set none; it applies to the stateless stages (map,
filter, flat_map, peek), where a bad item is the item's fault and dropping it
leaves the rest of the results right, and to windowed aggregations, whose
late items (behind the watermark: the window drops them either way) it sets
aside instead of only counting them. Key, timestamp and aggregation
functions fail the job whatever the policy: skipping an item there would
corrupt state silently.

How a letter travels, and why it is written once:

1. On an executor, the fused pass catches the exception of a dead-letter
   stage's function, builds a letter (:func:`sparkjet.core.pipeline.fusion.dead_letter`:
   the item, the stage, the error and its traceback, the item's index in the
   partition) and drops the item.
2. The task reports the partition's letters, with the source stage and
   source partition it read, to the batch's reports (on Spark an accumulator;
   see :mod:`sparkjet.core.engine.tasks.reports`), keyed by pass, partition and
   position: a recomputed task replaces its own letters instead of adding
   them again.
3. Before the sinks commit, the driver appends the batch's letters to the
   dead-letter stream (:func:`commit_dead_letters`), as a stream sink does:
   once per micro-batch token, so a replayed micro-batch (after a crash or a
   failed commit) finds them written and adds nothing. Under EXACTLY_ONCE
   each letter is written once; under the other guarantees too, since the
   append is idempotent whatever the guarantee.

The stream is ``<job name or id>.dead-letters`` unless
``JobConfig.dead_letter_stream`` names another; it has one partition when
sparkjet creates it. Letters are dicts, see :func:`commit_dead_letters`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkjet.core.host.contracts import JobContext
from sparkjet.core.model import ERROR_POLICIES
from sparkjet.core.pipeline.graph import ErrorPolicySpec, Transform

__all__ = [
    "DEAD_LETTER",
    "ERROR_POLICIES",
    "DeadLetterPlan",
    "commit_dead_letters",
    "default_stream",
    "plan_dead_letters",
]

DEAD_LETTER = ERROR_POLICIES[1]
#: The stage name the dead-letter writer commits as (its writer id and tokens).
WRITER_STAGE = "(dead letters)"


def default_stream(job_name: str | None, job_id: str) -> str:
    """The dead-letter stream of a job that names none."""
    return f"{job_name or job_id}.dead-letters"


@dataclass(frozen=True)
class DeadLetterPlan:
    """Where a job's dead letters go, and which stages make them."""

    #: The stream the letters are appended to.
    stream: str
    #: The stages whose error policy is dead-letter: stateless stages (items
    #: their function raises on) and windowed ones (late items).
    stages: frozenset[str]


def plan_dead_letters(
    nodes: list[Transform], names: Mapping[Transform, str], job_policy: str, stream: str
) -> DeadLetterPlan | None:
    """The job's dead-letter plan (None: every stage fails the job on an error).

    A stage's own policy (its spec's ``on_error``) wins over the job's.
    """
    stages = frozenset(
        names[node] for node in nodes
        if isinstance(node.spec, ErrorPolicySpec)
        and (node.spec.on_error or job_policy) == DEAD_LETTER
    )
    return DeadLetterPlan(stream, stages) if stages else None


def commit_dead_letters(
    context: JobContext, stream: str, letters: Mapping[tuple[str, int, int], dict[str, Any]]
) -> int:
    """Append a batch's letters to ``stream``, once per micro-batch; returns how many.

    ``context`` is a driver context of the job (any stage's): its batch id
    and checkpoint make the append's token. Each letter gets the job and the
    batch: ``{"job", "job_id", "batch", "stage", "item", "item_pickled",
    "error", "traceback", "source", "partition", "index", "offset"}``, in
    position order.
    """
    if not letters:
        return 0
    ctx = dataclasses.replace(context, stage=WRITER_STAGE)
    ordered = [
        {"job": ctx.job_name or ctx.job_id, "job_id": ctx.job_id, "batch": ctx.batch_id,
         **letters[key]}
        for key in sorted(letters)
    ]
    log = ctx.store.stream_log(stream)
    if not log.exists():
        log.create(1)
    buckets: list[list[Any]] = [ordered] + [[] for _ in range(log.partitions - 1)]
    log.append_buckets(buckets, ctx.writer_id, ctx.commit_token)
    return len(ordered)
