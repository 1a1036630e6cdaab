"""Every exception a sparkjet user can catch.

All of them derive from :class:`SparkjetError`. Each message names the culprit
(stage, plugin, file, key, job) and, where there is one, chains the cause.
"""

from __future__ import annotations

from sparkjet.core.errors import (
    ConfigError,
    JobAlreadyExistsError,
    JobCancelledError,
    JobFailedError,
    JobFencedError,
    JobNotFoundError,
    JobStateError,
    PipelineDefinitionError,
    PluginError,
    ProcessingGuaranteeError,
    SnapshotBackendError,
    SnapshotCorruptedError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotNotFoundError,
    SnapshotReplacedError,
    SnapshotSignatureError,
    SourceOffsetsError,
    SparkjetError,
    StateIncompatibleError,
    StoreError,
    TimeoutException,
)

__all__ = [
    "ConfigError",
    "JobAlreadyExistsError",
    "JobCancelledError",
    "JobFailedError",
    "JobFencedError",
    "JobNotFoundError",
    "JobStateError",
    "PipelineDefinitionError",
    "PluginError",
    "ProcessingGuaranteeError",
    "SnapshotBackendError",
    "SnapshotCorruptedError",
    "SnapshotError",
    "SnapshotFormatError",
    "SnapshotNotFoundError",
    "SnapshotReplacedError",
    "SnapshotSignatureError",
    "SourceOffsetsError",
    "SparkjetError",
    "StateIncompatibleError",
    "StoreError",
    "TimeoutException",
]
