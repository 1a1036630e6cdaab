"""The jet service (``client.get_jet()``): submits jobs, finds them, takes over orphans."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import cloudpickle

from sparkjet.core.errors import (
    ConfigError,
    JobAlreadyExistsError,
    JobStateError,
    PipelineDefinitionError,
    ProcessingGuaranteeError,
)
from sparkjet.core.jobs.handle import Job
from sparkjet.core.jobs.record import (
    JobRecord,
    all_records,
    new_job_id,
    now_ms,
    read_record,
    this_driver,
)
from sparkjet.core.jobs.runner import JobRunner, Services
from sparkjet.core.model import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.core.pipeline.planner import plan
from sparkjet.core.state.snapshots import Manifest, Snapshot
from sparkjet.core.state.snapshots.format import pipeline_fingerprint, stateful_stages
from sparkjet.core.state.snapshots.migrate import StateTransform, migrate_snapshot
from sparkjet.core.state.snapshots.upgrade import (
    UpgradeOptions,
    UpgradeRow,
    check_upgrade,
    require_compatible,
)
from sparkjet.core.store.naming import loads

log = logging.getLogger("sparkjet.jobs")


#: How long a submit waits for the record of a job that holds the name it wants
#: but has no record yet, before taking the name (its submitter died).
NAME_PENDING_SECONDS = 30.0


class RunnerRegistry:
    """The runners of this process, by job id; adopts jobs whose driver died.

    One lock guards the registry, so two threads taking one job over make one
    runner.
    """

    def __init__(self, service: JetService) -> None:
        self._service = service
        self._runners: dict[str, JobRunner] = {}
        self._lock = threading.Lock()

    def get(self, job_id: str) -> JobRunner | None:
        """The runner driving the job here, or None."""
        return self._runners.get(job_id)

    def all(self) -> list[JobRunner]:
        """Every runner of this process."""
        return list(self._runners.values())

    def add(self, runner: JobRunner) -> None:
        """Register the runner of a job submitted here."""
        with self._lock:
            self._runners[runner.job.id] = runner

    def remove(self, job_id: str) -> None:
        """Forget the runner of a job whose submit failed before it started."""
        with self._lock:
            self._runners.pop(job_id, None)

    def take_over(
        self, job_id: str, then: Callable[[JobRunner], object] | None = None,
        seen_epoch: int | None = None,
    ) -> JobRunner:
        """Adopt a job whose driver died, so it can be resumed or cancelled here.

        ``seen_epoch`` is the epoch the caller saw the dead driver hold: if
        the record shows a newer one, another process took the job over
        meanwhile and this one is refused (JobStateError), as it is when
        another process wins the claim on the next epoch.

        ``then`` acts on the adopted runner before it takes control requests,
        so a request another process sends to the new driver meanwhile (seeing
        it alive) cannot get ahead of the action this process took it over for.
        """
        with self._lock:
            runner = self._runners.get(job_id)
            adopted = runner is None
            if runner is None:
                runner = self._adopt(job_id, seen_epoch)
                self._runners[job_id] = runner
        try:
            if then is not None:
                then(runner)
        finally:
            if adopted and runner.watcher.ident is None:  # resume() started it already
                runner.watcher.start()
        return runner

    def _adopt(self, job_id: str, seen_epoch: int | None) -> JobRunner:
        """Claim the next epoch of the job and make its runner here, SUSPENDED (under the lock)."""
        service = self._service
        record = read_record(service.records, job_id)
        if record is None:
            raise JobStateError(f"job {job_id} cannot continue here: it has no record")
        job = Job(service, record)
        if seen_epoch is not None and record.epoch != seen_epoch:
            raise JobStateError(f"job {job.label}: another process took it over already")
        if record.status.is_terminal():
            # Its driver ended it after the caller saw it dead (it was only slow):
            # adopting it would make a finished job SUSPENDED again.
            raise JobStateError(f"job {job.label} ended ({record.status.value}) meanwhile")
        try:
            pipeline = service.services.store.read_pickle(
                service.records.layout.pipeline(job.id), f"job {job.label}: pipeline",
                loads=loads,
            )
        except FileNotFoundError:
            raise JobStateError(
                f"job {job.label} cannot continue here: its pipeline was not stored"
            ) from None
        validated = plan(pipeline, service.services.plugins, job.config.processing_guarantee)
        epoch = record.epoch + 1
        runner = JobRunner(service.services, job, validated, record)
        if not runner.lease.claim(epoch):
            raise JobStateError(f"job {job.label}: another process is taking it over already")
        for stale in service.records.take_requests(job.id):
            log.info("job %s: dropping request %r left for its dead driver", job.label, stale)
        cause = record.suspension_cause if record.status is JobStatus.SUSPENDED else (
            "the driver process running the job died"
        )
        runner.execution_start = record.execution_start_time
        # The new epoch first: the write checks the fence by it.
        runner.lease.stage(lambda r: replace(
            r, epoch=epoch, status=JobStatus.SUSPENDED, suspension_cause=cause))
        runner.lease.write()
        return runner


class JetService:
    """Submits and finds jobs (``client.get_jet()``), like Jet's ``JetService``."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.records = services.records
        #: The runners of this process (the handles' way to the jobs driven here).
        self.runners = RunnerRegistry(self)
        #: Orders name claims with the registration of the jobs that took them.
        self._submit_lock = threading.Lock()

    def submit(self, pipeline: Any, config: JobConfig | None = None) -> Job:
        """Validate ``pipeline`` and start it as a job; returns at once.

        :raises PipelineDefinitionError: the pipeline cannot run (stage named).
        :raises JobAlreadyExistsError: an active job has the same name.
        """
        return self._submit(pipeline, config, if_absent=False)

    def new_job_if_absent(self, pipeline: Any, config: JobConfig) -> Job:
        """Like :meth:`submit`, but return the active job of the same name if there is one."""
        if not isinstance(config, JobConfig) or not config.name:
            raise ConfigError("new_job_if_absent() needs a JobConfig with a name")
        return self._submit(pipeline, config, if_absent=True)

    def _submit(self, pipeline: Any, config: JobConfig | None, if_absent: bool) -> Job:
        config = config if config is not None else JobConfig()
        if not isinstance(config, JobConfig):
            raise PipelineDefinitionError(f"submit() takes a JobConfig, got {config!r}")
        validated = plan(pipeline, self.services.plugins, config.processing_guarantee)
        restore = None
        snapshot = None
        if config.initial_snapshot_name is not None and not validated.streaming:
            raise PipelineDefinitionError(
                f"JobConfig.initial_snapshot_name={config.initial_snapshot_name!r}: only a "
                "streaming pipeline can start from a snapshot (a batch job keeps no state "
                "between runs)"
            )
        if config.initial_snapshot_name is not None:
            # Refused now, never half restored later: the manifest (and its
            # signature), the attempt's files and the upgrade rules here; each
            # restored file's checksum below, as it is copied into the new job's
            # checkpoint, before the job exists (so each file is read once). The
            # rules run once: the seeding goes by the rows checked here.
            found = self.services.snapshots().get(config.initial_snapshot_name)
            found.check_listing()
            upgrade = require_compatible(validated, found.manifest, UpgradeOptions.of(config))
            snapshot = (found, upgrade)
            rows = upgrade.rows
            restore = {"snapshot": found.name, "batch": found.manifest.batch_id,
                       "stages": {r.stage: r.status for r in rows if r.kind == "state"},
                       "sources": {r.stage: r.status for r in rows if r.kind == "source"}}
        store = self.services.store
        if (
            validated.streaming
            and config.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE
            and not store.conditional_writes
        ):
            raise ProcessingGuaranteeError(
                f"EXACTLY_ONCE needs a store that enforces create-only writes, and store "
                f"{store.shown_url!r} does not: a probe file was created twice (the server, "
                "or the installed fsspec/s3fs/gcsfs release, ignores the condition), so two "
                "drivers could both commit a batch; use AT_LEAST_ONCE here, or a store and "
                "filesystem release that send conditional writes",
                [f"store {store.shown_url}: create-only writes not enforced"],
            )
        if config.suspend_on_failure and not validated.streaming:
            raise PipelineDefinitionError(
                "JobConfig.suspend_on_failure=True: batch jobs cannot be suspended; a failed "
                "batch job leaves its sinks untouched, so submit it again"
            )
        if validated.streaming:
            _warn_unnamed_state(validated, config)
        if self.services.before_submit is not None:
            self.services.before_submit(pipeline)  # the engine refuses before a job exists
        frozen = cloudpickle.dumps(pipeline) if validated.streaming else None
        with self._submit_lock:
            job_id = new_job_id()
            record = JobRecord(
                id=job_id,
                name=config.name,
                status=JobStatus.NOT_RUNNING,
                config=self._stored_config(config),
                submission_time=now_ms(),
                kind="stream" if validated.streaming else "batch",
                driver=this_driver(),
                stages=tuple(validated.names.values()),
                sources={validated.names[n]: spec.source.describe()
                         for n, spec in validated.sources().items()},
                restore=restore,
            )
            job = Job(self, record)
            runner = JobRunner(self.services, job, validated, record)
            # The slow writes (a snapshot's state, the pipeline) come before the name is
            # taken: between taking it and writing the record there is one write, so
            # another submitter finding the name held without a record waits briefly
            # for it (see _claim_name) instead of taking the name too. A submit that
            # fails part-way (or loses the name) leaves none of its files behind.
            try:
                if snapshot is not None:
                    runner.seed(*snapshot)
                if frozen is not None:
                    # A streaming job outlives its driver: resume() elsewhere needs the pipeline.
                    self.services.store.write_bytes(self.records.layout.pipeline(job.id), frozen)
                if config.name:
                    active = self._claim_name(config.name, job_id)
                    if active is not None and not if_absent:
                        raise JobAlreadyExistsError(
                            f"a job named '{config.name}' is already active: {active.id} "
                            f"({active.status.value}); cancel it or use new_job_if_absent()"
                        )
                    if active is not None:
                        self._discard(job_id)
                        return active
                self.runners.add(runner)
                try:
                    runner.lease.write()
                except BaseException:
                    self.runners.remove(job_id)
                    if config.name:
                        self.records.release_name(config.name, job_id)
                    raise
            except BaseException:
                with contextlib.suppress(Exception):
                    self._discard(job_id)
                raise
        runner.start()
        return job

    def _discard(self, job_id: str) -> None:
        """Remove what a failed or beaten submit wrote (a seeded checkpoint, the pipeline)."""
        with contextlib.suppress(FileNotFoundError):
            self.services.store.remove(self.records.layout.job(job_id), recursive=True)

    def _stored_config(self, config: JobConfig) -> dict[str, Any]:
        """The configuration as the job record keeps it: configured secrets masked.

        ``arguments`` come from a command line and may repeat a secret that the
        configuration resolved from the environment; the record is readable by
        everyone with access to the store.
        """
        stored = config.to_dict()
        redact = self.services.redact
        stored["arguments"] = [
            redact(a) if isinstance(a, str) else a for a in stored.get("arguments", [])
        ]
        return stored

    def _claim_name(self, name: str, job_id: str) -> Job | None:
        """Take ``name`` for a new job, or return the active job that holds it.

        The lock file is created only if absent, so two processes cannot both
        take a name; a holder that ended is replaced. A holder without a record
        is a submit between taking the name and writing its record (one
        write): it is waited for, :data:`NAME_PENDING_SECONDS` on this
        process's own clock, and replaced only if its record never comes (its
        process died in between).
        """
        for _ in range(3):
            holder_id = self.records.claim_name(name, job_id)
            if holder_id is None:
                return None
            if holder_id == "unknown":  # released and taken again under us: claim again
                continue
            holder = self.get_job(holder_id)
            deadline = time.monotonic() + NAME_PENDING_SECONDS
            while holder is None and time.monotonic() < deadline:
                time.sleep(0.05)
                holder = self.get_job(holder_id)
            if holder is not None and not holder.is_terminal():
                return holder
            self.records.release_name(name, holder_id)
        raise JobAlreadyExistsError(f"could not take the job name '{name}': another submit races")

    def get_job(self, name_or_id: str) -> Job | None:
        """The job with this id, else the job with this name (Jet's ``getJob``), else None.

        An id wins over a name. By name: the active job of that name, else the
        one of that name submitted last (Jet: "the active or last submitted
        job with the given name"), as :meth:`get_job_by_name`.
        """
        runner = self.runners.get(name_or_id)
        if runner is not None:
            return runner.job
        record = read_record(self.records, name_or_id)
        if record is not None:
            return Job(self, record)
        return self.get_job_by_name(name_or_id)

    def get_job_by_name(self, name: str) -> Job | None:
        """The active job with this name, else the newest job with it, else None."""
        matches = [job for job in self.get_jobs() if job.name == name]
        for job in matches:
            if not job.is_terminal():
                return job
        return matches[0] if matches else None

    def get_snapshot(self, name: str) -> Snapshot:
        """The exported snapshot ``name`` (Jet's ``JobStateSnapshot``); its manifest checked.

        :raises SnapshotNotFoundError: there is none of that name.
        """
        return self.services.snapshots().get(name)

    def snapshot_of(self, manifest: Manifest) -> Snapshot:
        """The snapshot an export of this process just wrote, from the manifest it wrote."""
        return Snapshot(self.services.snapshots(), manifest)

    def find_snapshot(self, name: str) -> Snapshot | None:
        """The exported snapshot ``name``, or None (Jet's ``getJobStateSnapshot``)."""
        store = self.services.snapshots()
        return store.get(name) if store.exists(name) else None

    def list_snapshots(self) -> list[Snapshot]:
        """Every exported snapshot, by name (Jet's ``getJobStateSnapshots``)."""
        return self.services.snapshots().list()

    def pipeline_fingerprint(self, pipeline: Any) -> str:
        """A short hash of ``pipeline``: its stages, their functions' code and its sources.

        Equal fingerprints mean the same pipeline; ``sparkjet apply`` compares
        them to see whether a job needs an upgrade.
        """
        return pipeline_fingerprint(plan(pipeline, self.services.plugins,
                                         ProcessingGuarantee.NONE))

    def check_upgrade(
        self, pipeline: Any, snapshot: str, config: JobConfig | None = None
    ) -> list[UpgradeRow]:
        """What submitting ``pipeline`` from ``snapshot`` would do, per stateful stage; no job.

        One row per stateful stage and per source (see :class:`UpgradeRow`),
        judged with the upgrade options of ``config`` (``allow_dropped_state``,
        ``allow_changed_state``, ``stage_renames``, ``source_starts``); a
        submit with that config succeeds when no row has a ``refusal``. The
        pipeline is validated as submit would (the guarantee does not matter
        here, unless ``config`` sets it) and the snapshot verified whole. A
        source's partitions are checked at submit, where its current offsets
        are read.

        :raises SnapshotError: the snapshot is missing, corrupt or untrusted.
        :raises StateIncompatibleError: a rename names a stage neither side has.
        """
        guarantee = config.processing_guarantee if config else ProcessingGuarantee.NONE
        validated = plan(pipeline, self.services.plugins, guarantee)
        found = self.services.snapshots().get(snapshot)
        found.verify()
        return check_upgrade(validated, found.manifest, UpgradeOptions.of(config))

    def get_jobs(self) -> list[Job]:
        """Every job in the store, newest first."""
        jobs = []
        for record in all_records(self.records):
            runner = self.runners.get(record.id)
            jobs.append(runner.job if runner is not None else Job(self, record))
        jobs.sort(key=lambda j: j.submission_time, reverse=True)
        return jobs

    def migrate_snapshot(
        self,
        src: str,
        dst: str,
        *,
        renames: Mapping[str, str] | None = None,
        drop: Iterable[str] = (),
        transforms: Mapping[str, StateTransform] | None = None,
        overwrite: bool = False,
    ) -> Snapshot:
        """Write a new snapshot ``dst`` from the exported snapshot ``src`` (left as it is).

        Names are those ``src`` uses. ``renames`` maps ``{old: new}`` stateful
        stages (their state) and sources (their offsets); ``drop`` leaves
        stages and sources out; ``transforms`` maps a stateful stage to
        ``fn(key, value)``, called for every key with the value
        :meth:`Snapshot.read_state` shows, returning the key's new ``(key,
        value)`` or None to delete it (keys moved to other key groups are
        placed where the runtime looks for them). Windowed stages can be
        renamed or dropped, not transformed. The new manifest records the
        migration in ``derived_from``; it is checksummed, read back before it
        is published and signed like any export, and nothing is published
        when anything fails.

        :raises SnapshotError: ``src`` missing or untrusted, ``dst`` existing
            without ``overwrite``, ``src`` equal to ``dst``, an unknown or
            clashing name, a transform that raised, collided two keys or
            returned values of two types (each names the stage and key).
        """
        manifest, _ = migrate_snapshot(
            self.services.snapshots(), src, dst, renames=renames, drop=drop,
            transforms=transforms, overwrite=overwrite,
        )
        return self.snapshot_of(manifest)

def _warn_unnamed_state(validated: Any, config: JobConfig) -> None:
    """A streaming job whose stateful stages have generated names: say that upgrades need names."""
    unnamed = [validated.name(n) for n in stateful_stages(validated).values()
               if not n.explicit_name]
    if unnamed:
        log.warning(
            "job %s: stateful stage(s) %s have generated names; a snapshot's state is matched "
            "by name, and generated names shift when stages are added, so an upgraded "
            "pipeline can restore their state only if its stateful stages are unchanged: "
            "name them with set_name()", config.name or "(unnamed)",
            ", ".join(repr(u) for u in unnamed))
