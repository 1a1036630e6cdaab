"""``sparkjet apply FILE.toml``: make the jobs and snapshots match a declaration.

Like the Jet operator's ``JetJob`` and ``JetJobSnapshot`` resources: ``[[job]]``
tables say which jobs should exist and whether they run or are suspended,
``[[snapshot]]`` tables which snapshots should be exported (once). The whole
file is checked before anything is changed.
"""

from __future__ import annotations

import argparse
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from sparkjet import Client
from sparkjet.cli.commands import job_config, resume_job
from sparkjet.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from sparkjet.cli.follow import await_status, follow_all, wait_until
from sparkjet.cli.loading import load_pipeline
from sparkjet.cli.output import error, out, state_line
from sparkjet.errors import SparkjetError
from sparkjet.job import Job, JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline

#: How long apply waits for a job to become RUNNING or SUSPENDED, and for an export.
TIMEOUT = 600.0

_STATES = ("running", "suspended")
_JOB_KEYS = (
    "name", "pipeline", "state", "initial_snapshot", "credentials", "arguments",
    "processing_guarantee", "snapshot_interval_millis", "suspend_on_failure",
    "error_policy", "dead_letter_stream",
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


def _config(spec: JobSpec) -> JobConfig:
    return job_config(spec.name, list(spec.arguments), spec.processing_guarantee,
                      spec.snapshot_interval_millis, spec.suspend_on_failure,
                      spec.initial_snapshot, error_policy=spec.error_policy,
                      dead_letter_stream=spec.dead_letter_stream)


def _suspend(job: Job, client: Client) -> None:
    if job.status is JobStatus.STARTING:
        wait_until(job, lambda s: s is not JobStatus.STARTING, TIMEOUT)
    job.suspend()
    out(f"Suspending job {job.label}")
    await_status(job, JobStatus.SUSPENDED, TIMEOUT, client)
    out(state_line(job, client))


def apply(args: argparse.Namespace, client: Client) -> int:
    """``apply FILE.toml``: submit, suspend or resume jobs, then export snapshots, once."""
    specs, snapshot_specs = parse(Path(args.file))
    jet = client.get_jet()
    changed = False
    status = EXIT_OK
    here: list[Job] = []  # jobs this process drives now: kept in the foreground
    resumed: set[str] = set()
    for spec in specs:
        try:
            job = jet.get_job_by_name(spec.name)
            if job is None or job.is_terminal():
                pipeline = _load(spec, client)
                job = jet.submit(pipeline, _config(spec))
                out(f"Submitted job {job.id}, name: {job.name}")
                changed = True
                if spec.state == "suspended":
                    _suspend(job, client)
                here.append(job)
            elif spec.state == "suspended" and job.status in (
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
