"""Every exception sparkjet raises on purpose (public face: :mod:`sparkjet.errors`).

All of them derive from :class:`SparkjetError`. Each message names the culprit
(stage, plugin, file, key, job) and, where there is one, chains the cause.
"""

from __future__ import annotations


class SparkjetError(Exception):
    """Base class of every error sparkjet raises on purpose."""


class ConfigError(SparkjetError):
    """A configuration file or override is invalid: names the file, the key, what was expected."""


class PluginError(SparkjetError):
    """A plugin failed to load or registered something invalid: names plugin and distribution."""


class PipelineDefinitionError(SparkjetError):
    """A pipeline cannot be run as defined: names the stage at fault.

    Raised by ``submit`` before any Spark work starts.
    """

    def __init__(self, message: str, stage: str | None = None) -> None:
        super().__init__(message)
        #: Name of the offending stage, when the error is about one.
        self.stage = stage


class ProcessingGuaranteeError(PipelineDefinitionError):
    """A job asks for a processing guarantee that a source, sink or stateful stage cannot keep.

    The message lists every offender with the guarantees it supports.
    """

    def __init__(
        self, message: str, offenders: list[str], stages: list[str] | None = None
    ) -> None:
        stages = stages or []
        super().__init__(message, stages[0] if stages else None)
        #: One line per participant that cannot keep the guarantee.
        self.offenders = offenders
        #: The names of the offending stages, in the same order.
        self.stages = stages


class JobAlreadyExistsError(SparkjetError):
    """A job with the same name is already active (not completed, failed or cancelled)."""


class JobNotFoundError(SparkjetError):
    """No job with the given id or name exists in the store."""


class JobFailedError(SparkjetError):
    """A job ended in FAILED status; raised from ``Job.join()``.

    When a user function failed, :attr:`stage` names its stage and the user's
    exception is chained as ``__cause__``.
    """

    def __init__(self, message: str, stage: str | None = None) -> None:
        super().__init__(message)
        #: Name of the stage whose function raised, if known.
        self.stage = stage


class JobCancelledError(JobFailedError):
    """The job was cancelled by a user (``Job.cancel()``, ``sparkjet cancel``); from ``join()``."""


class JobStateError(SparkjetError):
    """The job is not in a status that allows the requested action (names job and status)."""


class JobFencedError(JobStateError):
    """Another process took over the job this process drove (a newer epoch).

    Raised from ``join()`` in the process that was fenced off: it stopped
    itself without writing anything more, and the message names the newer
    epoch and the driver that holds it. The job goes on there.
    """

    def __init__(self, message: str, epoch: int) -> None:
        super().__init__(message)
        #: The epoch of the driver that took the job over.
        self.epoch = epoch


class StoreError(SparkjetError):
    """Reading or writing the store (lists, maps, job records) failed: names the path."""


class SourceOffsetsError(SparkjetError):
    """A source's offsets went backwards: its data now ends before where the job read to.

    Names the source stage and both offsets. The source was pointed at other
    data (a stream deleted and created again, another topic of the same
    name), or its data was rewritten; reading on would skip or repeat items.
    """


class TimeoutException(SparkjetError, TimeoutError):
    """``Job.join(timeout=...)`` expired before the job reached a terminal status."""


class SnapshotBackendError(SparkjetError):
    """A snapshot backend cannot be opened or reached: names the backend's kind and URL.

    Raised for a missing extra (with the ``pip install`` that brings it), an
    option the backend does not take, a URL of the wrong kind, and an
    endpoint that does not answer. Secrets are masked.
    """


class SnapshotError(SparkjetError):
    """A snapshot cannot be written, found or trusted: names the snapshot and, if any, the file.

    Raised instead of restoring anything from a snapshot that is not whole and
    intact; the subclasses say why.
    """

    def __init__(self, message: str, snapshot: str | None = None, file: str | None = None) -> None:
        super().__init__(message)
        #: The name of the snapshot at fault.
        self.snapshot = snapshot
        #: The file at fault (relative to the snapshot's folder), when the error is about one.
        self.file = file


class SnapshotNotFoundError(SnapshotError):
    """No complete snapshot of that name exists in the snapshot backend."""


class SnapshotCorruptedError(SnapshotError):
    """A snapshot's manifest or one of its files is damaged.

    A checksum mismatch, a truncated or oversized file, a file the manifest
    names but the backend lacks, a file the manifest does not name, or a
    manifest that does not parse or contradicts itself.
    """


class SnapshotFormatError(SnapshotError):
    """A snapshot was written in a format version this sparkjet cannot read."""


class SnapshotSignatureError(SnapshotError):
    """A snapshot's signature is missing, wrong, or cannot be checked.

    With a signing key configured, an unsigned manifest and one whose HMAC
    does not match are refused; without a key, a signed manifest is refused
    too (configure the key to read it).
    """


class SnapshotReplacedError(SnapshotError):
    """A snapshot was replaced by a newer export of its name, or deleted, while being read.

    Nothing read so far may be used: get the snapshot again.
    """


class StateIncompatibleError(PipelineDefinitionError):
    """A stateful stage's state in the initial snapshot does not fit the new pipeline.

    Raised by ``submit`` with ``initial_snapshot_name`` when a stage of the
    same name keeps a different kind of state (another accumulator type, a
    ``distinct`` that became an aggregation); the message names each such
    stage with the signature in the snapshot and in the pipeline. Rename the
    stage to start it empty instead.
    """

    def __init__(self, message: str, stages: list[str]) -> None:
        super().__init__(message, stages[0] if stages else None)
        #: Every incompatible stage, by name.
        self.stages = stages
