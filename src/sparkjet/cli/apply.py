"""``sparkjet apply FILE.toml``: make the jobs and snapshots match a declaration.

Like the Jet operator's ``JetJob`` and ``JetJobSnapshot`` resources: ``[[job]]``
tables say which jobs should exist and whether they run or are suspended,
``[[snapshot]]`` tables which snapshots should be exported (once). The whole
file is checked before anything is changed.

A job's pipeline is part of the declaration: apply records the fingerprint of
the pipeline it submitted (in the store map :data:`APPLIED_MAP`), and when the
pipeline it loads now has another one, a streaming job is upgraded from a
snapshot (exported, checked against the new pipeline, then the old job is
cancelled at that snapshot and the new one started from it), never silently
left running the old code nor restarted without its state.
"""

from __future__ import annotations

import argparse
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import fsspec

from sparkjet import Client
from sparkjet.cli import output
from sparkjet.cli.commands import job_config, parse_size, resume_job
from sparkjet.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from sparkjet.cli.follow import await_status, follow_all, wait_until
from sparkjet.cli.loading import load_pipeline
from sparkjet.cli.output import error, format_count, out, state_line
from sparkjet.errors import ConfigError, PipelineDefinitionError, SparkjetError
from sparkjet.job import Job, JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline

#: How long apply waits for a job to become RUNNING or SUSPENDED, and for an export.
TIMEOUT = 600.0

#: The store map where apply records what it applied: job name -> ``{"job_id": ...,
#: "fingerprint": ..., "pipeline": ...}`` (and ``"upgrade_snapshot"`` while an upgrade
#: is between cancelling the old job and submitting the new one).
APPLIED_MAP = "sparkjet.apply"
#: How many characters of a fingerprint an upgrade snapshot's name carries.
SHORT_FINGERPRINT = 8

_STATES = ("running", "suspended")
_SOURCE_STARTS = ("initial", "latest")
_JOB_KEYS = (
    "name", "pipeline", "state", "initial_snapshot", "credentials", "arguments",
    "processing_guarantee", "snapshot_interval_millis", "suspend_on_failure",
    "error_policy", "dead_letter_stream", "allow_dropped_state", "allow_changed_state",
    "renames", "source_starts", "state_cache_bytes", "adaptive_micro_batches",
)
_SNAPSHOT_KEYS = ("name", "job", "cancel_job")


@dataclass
class JobSpec:
    """One ``[[job]]`` table."""

    where: str
    name: str
    pipeline: str
    state: str = "running"
    initial_snapshot: str | None = None
    credentials: str | None = None
    arguments: list[str] = field(default_factory=list)
    processing_guarantee: ProcessingGuarantee | None = None
    snapshot_interval_millis: int | None = None
    suspend_on_failure: bool = False
    error_policy: str | None = None
    dead_letter_stream: str | None = None
    #: The upgrade options (``JobConfig`` fields of the same meaning).
    allow_dropped_state: bool = False
    allow_changed_state: bool = False
    renames: dict[str, str] = field(default_factory=dict)
    source_starts: dict[str, str] = field(default_factory=dict)
    #: ``JobConfig.state_cache_bytes`` (None: its default).
    state_cache_bytes: int | None = None
    #: ``JobConfig.adaptive_micro_batches`` (None: the configuration's ``[engine] adaptive``).
    adaptive_micro_batches: bool | None = None


@dataclass
class SnapshotSpec:
    """One ``[[snapshot]]`` table."""

    where: str
    name: str
    job: str
    cancel_job: bool = False


def _is_url(text: str) -> bool:
    return "://" in text


def _get(table: dict[str, Any], where: str, key: str, kind: type, required: bool = False) -> Any:
    if key not in table:
        if required:
            raise CliError(f"{where}: missing key '{key}'")
        return None
    value = table[key]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise CliError(f"{where}: {key}: expected a {kind.__name__}, got {value!r}")
    if isinstance(value, str) and not value.strip():
        raise CliError(f"{where}: {key}: must not be empty")
    return value


def _size_of(table: dict[str, Any], where: str, key: str) -> int | None:
    """A size: an int of bytes or a string with a unit (``"512MiB"``); None if absent."""
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as exc:
            raise CliError(f"{where}: {key}: {exc}") from None
    raise CliError(f"{where}: {key}: expected bytes (an int, 0 or more) or a size string such "
                   f"as \"512MiB\", got {value!r}")


def _check_keys(table: Any, where: str, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise CliError(f"{where}: expected a table")
    for key in table:
        if key not in known:
            raise CliError(
                f"{where}: unknown key '{key}' (expected one of: {', '.join(known)})"
            )
    return table


def parse(path: Path) -> tuple[list[JobSpec], list[SnapshotSpec]]:
    """Read and check ``FILE.toml``; every error names the file, the table and the key."""
    shown = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CliError(f"{shown}: no such file") from None
    except OSError as exc:
        raise CliError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"{shown}: invalid TOML: {exc}") from None
    for key in data:
        if key not in ("job", "snapshot"):
            raise CliError(f"{shown}: unknown table '{key}' (expected [[job]] or [[snapshot]])")
    jobs: list[JobSpec] = []
    for where, table, name in _named_tables(data, "job", _JOB_KEYS, shown):
        spec = JobSpec(where, name, _get(table, where, "pipeline", str, required=True))
        state = _get(table, where, "state", str)
        if state is not None:
            if state.lower() not in _STATES:
                raise CliError(f"{where}: state: expected 'running' or 'suspended', got {state!r}")
            spec.state = state.lower()
        spec.initial_snapshot = _get(table, where, "initial_snapshot", str)
        spec.credentials = _get(table, where, "credentials", str)
        arguments = _get(table, where, "arguments", list) or []
        if not all(isinstance(a, str) for a in arguments):
            raise CliError(f"{where}: arguments: expected a list of strings")
        spec.arguments = arguments
        guarantee = _get(table, where, "processing_guarantee", str)
        if guarantee is not None:
            try:
                spec.processing_guarantee = ProcessingGuarantee.parse(guarantee)
            except ValueError:
                raise CliError(
                    f"{where}: processing_guarantee: expected none, at_least_once or "
                    f"exactly_once, got {guarantee!r}"
                ) from None
        interval = _get(table, where, "snapshot_interval_millis", int)
        if interval is not None and interval <= 0:
            raise CliError(f"{where}: snapshot_interval_millis: expected a positive integer")
        spec.snapshot_interval_millis = interval
        spec.suspend_on_failure = bool(_get(table, where, "suspend_on_failure", bool))
        policy = _get(table, where, "error_policy", str)
        if policy is not None and policy not in ("fail", "dead-letter"):
            raise CliError(f"{where}: error_policy: expected 'fail' or 'dead-letter', "
                           f"got {policy!r}")
        spec.error_policy = policy
        spec.dead_letter_stream = _get(table, where, "dead_letter_stream", str)
        spec.state_cache_bytes = _size_of(table, where, "state_cache_bytes")
        spec.adaptive_micro_batches = _get(table, where, "adaptive_micro_batches", bool)
        _parse_upgrade_options(spec, table, where)
        if not _is_url(spec.pipeline):
            file = path.parent / spec.pipeline
            if not file.is_file():
                raise CliError(f"{where}: pipeline: no such file: {file}")
            spec.pipeline = str(file)
        jobs.append(spec)
    snapshots: list[SnapshotSpec] = []
    for where, table, name in _named_tables(data, "snapshot", _SNAPSHOT_KEYS, shown):
        snapshots.append(SnapshotSpec(
            where, name, _get(table, where, "job", str, required=True),
            bool(_get(table, where, "cancel_job", bool)),
        ))
    return jobs, snapshots


def _string_table(table: dict[str, Any], where: str, key: str, what: str) -> dict[str, str]:
    """The table ``key`` of strings to non-empty strings (``{}`` when absent)."""
    value = _get(table, where, key, dict) or {}
    for name, item in value.items():
        if not name.strip():
            raise CliError(f"{where}: {key}: a stage name must not be empty")
        if not isinstance(item, str) or not item.strip():
            raise CliError(f"{where}: {key}.{name}: expected {what}, got {item!r}")
    return dict(value)


def _parse_upgrade_options(spec: JobSpec, table: dict[str, Any], where: str) -> None:
    """The keys that say what an upgrade may do with the old job's state (JobConfig's)."""
    spec.allow_dropped_state = bool(_get(table, where, "allow_dropped_state", bool))
    spec.allow_changed_state = bool(_get(table, where, "allow_changed_state", bool))
    spec.renames = _string_table(table, where, "renames", "the stage's new name (a string)")
    spec.source_starts = _string_table(table, where, "source_starts", "'initial' or 'latest'")
    for stage, start in spec.source_starts.items():
        if start not in _SOURCE_STARTS:
            raise CliError(f"{where}: source_starts.{stage}: expected 'initial' or 'latest', "
                           f"got {start!r}")
    try:
        JobConfig(stage_renames=spec.renames)  # one new name for two stages, say
    except ConfigError as exc:
        raise CliError(f"{where}: renames: {str(exc).split(': ', 1)[-1]}") from None


def _named_tables(
    data: dict[str, Any], key: str, known: tuple[str, ...], shown: str
) -> Iterator[tuple[str, dict[str, Any], str]]:
    """Each ``[[key]]`` table: where it is (for messages), its keys checked, and its name.

    A table without a name, or with a name an earlier one has, is an error.
    """
    tables = data.get(key, [])
    if not isinstance(tables, list):
        raise CliError(f"{shown}: '{key}' must be an array of tables, written [[{key}]]")
    seen: set[str] = set()
    for index, raw in enumerate(tables, 1):
        where = f"{shown}: [[{key}]] #{index}"
        table = _check_keys(raw, where, known)
        name = _get(table, where, "name", str, required=True)
        where = f"{shown}: [[{key}]] '{name}'"
        if name in seen:
            raise CliError(f"{where}: name: duplicate {key} name '{name}'")
        seen.add(name)
        yield where, table, name


def _load(spec: JobSpec, client: Client) -> Pipeline:
    """The pipeline of ``spec``: a local file, or one read through fsspec from its URL."""
    if not _is_url(spec.pipeline):
        return load_pipeline(spec.pipeline, spec.arguments)
    options: dict[str, Any] = {}
    if spec.credentials is not None:
        try:
            options = client.bucket_options(spec.credentials)
        except SparkjetError as exc:
            raise CliError(f"{spec.where}: credentials: {exc}") from None
    try:
        with fsspec.open(spec.pipeline, "rb", **options) as source:
            text = source.read()
    except FileNotFoundError:
        raise CliError(f"{spec.where}: pipeline: no such file: {spec.pipeline}") from None
    except Exception as exc:
        raise CliError(
            f"{spec.where}: pipeline: cannot read {spec.pipeline}: {exc}", EXIT_FAILED
        ) from None
    name = Path(spec.pipeline.rstrip("/").rsplit("/", 1)[-1] or "pipeline.py").name
    with tempfile.TemporaryDirectory(prefix="sparkjet-apply-") as folder:
        file = Path(folder) / name
        file.write_bytes(text)
        try:
            return load_pipeline(file, spec.arguments)
        except CliError as exc:
            raise CliError(str(exc).replace(str(file), spec.pipeline), exc.code) from None


def _config(spec: JobSpec, snapshot: str | None = None) -> JobConfig:
    """The JobConfig of ``spec``; ``snapshot``: start from it instead of ``initial_snapshot``."""
    config = job_config(spec.name, list(spec.arguments), spec.processing_guarantee,
                        spec.snapshot_interval_millis, spec.suspend_on_failure,
                        snapshot or spec.initial_snapshot, error_policy=spec.error_policy,
                        dead_letter_stream=spec.dead_letter_stream,
                        state_cache_bytes=spec.state_cache_bytes,
                        adaptive_micro_batches=spec.adaptive_micro_batches)
    config.allow_dropped_state = spec.allow_dropped_state
    config.allow_changed_state = spec.allow_changed_state
    config.stage_renames = dict(spec.renames)
    config.source_starts = dict(spec.source_starts)
    return config


def _suspend(job: Job, client: Client) -> None:
    # A job just submitted reads NOT_RUNNING, then STARTING: suspend refuses both.
    waiting = (JobStatus.NOT_RUNNING, JobStatus.STARTING)
    if job.status in waiting:
        wait_until(job, lambda s: s not in waiting, TIMEOUT)
    job.suspend()
    out(f"Suspending job {job.label}")
    await_status(job, JobStatus.SUSPENDED, TIMEOUT, client)
    out(state_line(job, client))


class _Jet(Protocol):
    """What the upgrade asks of ``client.get_jet()`` (typed here: the CLI sees no core)."""

    def submit(self, pipeline: Any, config: JobConfig | None = None) -> Job: ...

    def check_upgrade(
        self, pipeline: Any, snapshot: str, config: JobConfig | None = None
    ) -> list[Any]: ...


class _Applied:
    """What apply recorded of each job it applied, in the store map :data:`APPLIED_MAP`.

    Keyed by job name; a record counts only for the job whose id it holds, so a
    job of that name submitted some other way is not taken for the applied one.
    """

    def __init__(self, client: Client) -> None:
        self._map = client.get_map(APPLIED_MAP)

    def get(self, name: str, job: Job | None) -> dict[str, Any]:
        """The record of ``job`` (``{}``: none, or it belongs to another job of that name)."""
        value = self._map.get(name)
        if job is None or not isinstance(value, dict) or value.get("job_id") != job.id:
            return {}
        return dict(value)

    def put(self, spec: JobSpec, job: Job, fingerprint: str, upgrade_snapshot: str = "") -> None:
        """Record that ``job`` runs ``spec``'s pipeline, of ``fingerprint``."""
        value = {"job_id": job.id, "fingerprint": fingerprint, "pipeline": spec.pipeline}
        if upgrade_snapshot:
            value["upgrade_snapshot"] = upgrade_snapshot
        self._map.put(spec.name, value)


def _refusal(row: Any) -> str:
    """Why an upgrade row is refused ("": accepted)."""
    refusal = str(getattr(row, "refusal", "") or "")
    if not refusal and row.status == "incompatible":
        refusal = "incompatible: the state's type changed"
    return refusal


def _print_rows(rows: list[Any]) -> None:
    """The check-upgrade report, one row per stateful stage and source."""
    cells = []
    for row in rows:
        stage = row.stage
        renamed_from = getattr(row, "renamed_from", "") or ""
        if renamed_from:
            stage = f"{renamed_from} -> {stage}"
        cells.append((stage, str(getattr(row, "kind", "state") or "state"), row.status,
                      format_count(row.keys), _refusal(row) or row.note or ""))
    if not cells:
        out("     (no stateful stages)")
    for line in output.table(("STAGE", "KIND", "STATUS", "KEYS", "REFUSED / NOTE"), cells):
        out(f"     {line.rstrip()}")


def _upgrade(
    spec: JobSpec, job: Job, pipeline: Pipeline, fingerprint: str, old: str,
    jet: _Jet, applied: _Applied, client: Client,
) -> Job:
    """Move the streaming ``job`` onto ``pipeline`` with its state; returns the new job.

    1. export snapshot ``<job name>-upgrade-<fingerprint>`` (the job goes on);
    2. check the new pipeline against it with the job's upgrade options; a refusal
       is a CliError (exit 2) and nothing else changes;
    3. export it again with ``cancel_job``: the old job runs no batch after that
       cut, so no item is counted by both jobs;
    4. submit the new pipeline from it, under the same name.

    Between 3 and 4 the applied record holds the snapshot, so an apply that
    stopped there starts the job from it the next time, never from nothing.
    """
    name = f"{spec.name}-upgrade-{fingerprint[:SHORT_FINGERPRINT]}"
    out(f"Upgrading job {job.label}: its pipeline changed (fingerprint {old} -> {fingerprint})")
    if job.status is JobStatus.STARTING:
        wait_until(job, lambda s: s is not JobStatus.STARTING, TIMEOUT)
    exported = job.export_snapshot(name, timeout=TIMEOUT)
    out(f"  1. Exported snapshot '{name}' (batch {exported.manifest.batch_id}); "
        f"the job goes on running")
    config = _config(spec, name)
    try:
        rows = jet.check_upgrade(pipeline, name, config=config)
    except PipelineDefinitionError as exc:  # the job's guarantee refuses a stage, a rename
        raise CliError(                     # names nothing: refused before anything changes
            f"{spec.where}: pipeline: cannot upgrade job {job.label}: {exc}. Nothing "
            f"changed: the job goes on running the previous pipeline (snapshot '{name}' "
            f"stays; 'sparkjet delete-snapshot {name}' removes it)"
        ) from None
    refused = [row for row in rows if _refusal(row)]
    verdict = "refused" if refused else "accepted"
    out(f"  2. Checked {spec.pipeline} against snapshot '{name}': {verdict}")
    _print_rows(rows)
    if refused:
        details = "; ".join(f"'{row.stage}': {_refusal(row)}" for row in refused)
        raise CliError(
            f"{spec.where}: pipeline: cannot upgrade job {job.label}: {details}. Nothing "
            f"changed: the job goes on running the previous pipeline (snapshot '{name}' "
            f"stays; 'sparkjet delete-snapshot {name}' removes it)"
        )
    applied.put(spec, job, old, upgrade_snapshot=name)
    final = job.export_snapshot(name, cancel_job=True, timeout=TIMEOUT)
    wait_until(job, lambda s: s.is_terminal(), TIMEOUT)
    out(f"  3. Exported snapshot '{name}' again at the job's last batch "
        f"({final.manifest.batch_id}) and cancelled job {job.label}")
    try:
        new = jet.submit(pipeline, config)
    except SparkjetError as exc:
        raise CliError(
            f"{spec.where}: pipeline: job {job.label} is cancelled and its state is in "
            f"snapshot '{name}', but the new pipeline did not start: {exc}. Apply again "
            f"once it is fixed: the job starts from that snapshot", EXIT_FAILED,
        ) from None
    applied.put(spec, new, fingerprint)
    out(f"  4. Submitted job {new.id}, name: {new.name}, from snapshot '{name}'")
    return new


def apply(args: argparse.Namespace, client: Client) -> int:
    """``apply FILE.toml``: submit, upgrade, suspend or resume jobs, then export snapshots."""
    specs, snapshot_specs = parse(Path(args.file))
    jet = client.get_jet()
    applied = _Applied(client)
    changed = False
    status = EXIT_OK
    here: list[Job] = []  # jobs this process drives now: kept in the foreground
    resumed: set[str] = set()
    for spec in specs:
        try:
            job = jet.get_job_by_name(spec.name)
            record = applied.get(spec.name, job)
            if job is None or job.is_terminal():
                pipeline = _load(spec, client)
                fingerprint = jet.pipeline_fingerprint(pipeline)
                pending = record.get("upgrade_snapshot")
                if job is not None and pending:
                    out(f"Job {job.label} was cancelled by an upgrade that did not finish: "
                        f"its state is in snapshot '{pending}'")
                job = jet.submit(pipeline, _config(spec, pending))
                applied.put(spec, job, fingerprint)
                started = f", from snapshot '{pending}'" if pending else ""
                out(f"Submitted job {job.id}, name: {job.name}{started}")
                changed = True
                if spec.state == "suspended":
                    _suspend(job, client)
                here.append(job)
                continue
            pipeline = _load(spec, client)
            fingerprint = jet.pipeline_fingerprint(pipeline)
            if "fingerprint" not in record:
                # Submitted some other way (or by an apply before fingerprints):
                # taken as running this pipeline from now on, and said so.
                applied.put(spec, job, fingerprint)
                changed = True
                out(f"Recorded job {job.label} as running {spec.pipeline} (fingerprint "
                    f"{fingerprint}): apply did not submit it; a change to the pipeline "
                    "upgrades it from now on")
            elif record["fingerprint"] != fingerprint:
                changed = True
                if not job.is_streaming():
                    out(f"Job {job.label} is a batch job running the previous pipeline: it "
                        "is left to finish; the next apply after it ends submits the new one")
                    continue
                job = _upgrade(spec, job, pipeline, fingerprint, record["fingerprint"],
                               jet, applied, client)
                if spec.state == "suspended":
                    _suspend(job, client)
                here.append(job)
                continue
            if spec.state == "suspended" and job.status in (
                JobStatus.RUNNING, JobStatus.STARTING
            ):
                changed = True
                _suspend(job, client)
            elif spec.state == "running" and job.status is JobStatus.SUSPENDED:
                changed = True
                if resume_job(job, client, TIMEOUT):
                    here.append(job)
                    resumed.add(job.id)
        except (CliError, SparkjetError) as exc:
            error(client.redact(str(exc)))
            status = max(status, exc.code if isinstance(exc, CliError) else EXIT_FAILED)
    for snap in snapshot_specs:
        if jet.find_snapshot(snap.name) is not None:
            continue  # exported once already: left alone
        changed = True
        try:
            job = jet.get_job_by_name(snap.job)
            if job is None:
                raise CliError(
                    f"{snap.where}: job: no job named '{snap.job}'", EXIT_FAILED
                )
            if job.status is JobStatus.STARTING:
                wait_until(job, lambda s: s is not JobStatus.STARTING, TIMEOUT)
            exported = job.export_snapshot(snap.name, cancel_job=snap.cancel_job, timeout=TIMEOUT)
            cancelled = " and cancelled the job" if snap.cancel_job else ""
            out(
                f"Exported snapshot '{exported.name}' of job {job.label}{cancelled} "
                f"(batch {exported.manifest.batch_id})"
            )
        except (CliError, SparkjetError) as exc:
            error(client.redact(f"snapshot '{snap.name}': {exc}"))
            status = max(status, exc.code if isinstance(exc, CliError) else EXIT_FAILED)
    if not changed:
        out("Nothing to change.")
    if here:  # as `submit` does: this process drives them until they end
        status = max(status, follow_all(here, client, resumed))
    return status
