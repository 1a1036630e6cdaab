"""What a plugin sees of the job it runs in: :class:`JobContext` and :class:`TaskContext`.

A :class:`JobContext` on the driver (planning, starting, committing), a
:class:`TaskContext` on executors (reading or writing one partition). Both
hand the plugin the job's store as a :class:`~.store_access.StoreAccess`
(wrapped on creation), and both are picklable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkjet.core.host.contracts.store_access import StoreAccess, plugin_store
from sparkjet.core.model import ProcessingGuarantee


@dataclass(frozen=True)
class JobContext:
    """What a plugin sees on the driver while a job is planned, started or committed."""

    #: The job's id.
    job_id: str
    #: The job's name, or None.
    job_name: str | None
    #: The store the job runs against (picklable: may be captured for executors).
    store: StoreAccess
    #: Spark's default parallelism: a good number of partitions to plan.
    parallelism: int
    #: This plugin's table from ``[plugins.<name>]`` in the configuration.
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The guarantee the job runs with.
    processing_guarantee: ProcessingGuarantee = ProcessingGuarantee.NONE
    #: In a streaming job, the micro-batch being committed (None in batch jobs).
    #: A sink that declares EXACTLY_ONCE must commit each batch id at most once.
    batch_id: int | None = None
    #: The name of the stage this context is for (sources, sinks, transforms).
    stage: str = ""
    #: Which checkpoint the batch ids count in: a job with NONE starts a new one
    #: (and counts from 0 again) when it restarts.
    checkpoint_id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "store", plugin_store(self.store))

    @property
    def writer_id(self) -> str:
        """Identifies this job's stage as a writer: the same across its micro-batches."""
        return f"{self.job_id}.{self.stage}"

    @property
    def commit_token(self) -> str | None:
        """Identifies this stage's commit of this micro-batch, for idempotent commits.

        Unique per job, stage and batch, so two sinks of one job writing the
        same target never mistake each other's commits for their own.
        """
        if self.batch_id is None:
            return None
        return f"{self.producer_id}.b{self.batch_id}"

    @property
    def producer_id(self) -> str:
        """Identifies this stage's micro-batch commits in this checkpoint (with ``batch_id``).

        Batches of one producer land in order, each once: a commit log's
        readers skip a record whose batch is not after the producer's last.
        """
        return f"{self.writer_id}.{self.checkpoint_id}"

    @property
    def logger(self) -> logging.Logger:
        """A logger named after the job."""
        return logging.getLogger(f"sparkjet.job.{self.job_name or self.job_id}")


@dataclass(frozen=True)
class TaskContext:
    """What a plugin sees on an executor while it reads or writes one partition."""

    job_id: str
    #: Index of the partition being read or written.
    partition: int
    store: StoreAccess
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The name of the stage being read or written (as ``JobContext.stage``).
    stage: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "store", plugin_store(self.store))
