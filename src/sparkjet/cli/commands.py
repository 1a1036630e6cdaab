"""The commands: one function each, taking the parsed arguments and the client.

Each returns the exit status, or raises :class:`~sparkjet.cli.CliError` (or a
:class:`~sparkjet.errors.SparkjetError`) for :func:`~sparkjet.cli.main` to report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from typing import TYPE_CHECKING, Any

from sparkjet import Client
from sparkjet.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from sparkjet.cli.follow import await_end, await_status, follow
from sparkjet.cli.loading import load_pipeline
from sparkjet.cli.output import format_time, out, resume_command, state_line, table
from sparkjet.job import Job, JobConfig, JobStatus

if TYPE_CHECKING:
    from sparkjet.plugin import PluginInfo


def submit(args: argparse.Namespace, client: Client) -> int:
    """``submit``: load the pipeline file, submit it and keep the job in the foreground."""
    upgrade: JobConfig | None = args.upgrade
    if upgrade is not None and args.snapshot is None:
        given = ", ".join(upgrade_options(upgrade))
        raise CliError(
            f"submit: {given} only apply when the job starts from a snapshot: add -s SNAPSHOT "
            "(or leave them out)"
        )
    job_args = list(args.args)
    if job_args[:1] == ["--"]:
        job_args = job_args[1:]
    pipeline = load_pipeline(args.file, job_args)
    config = job_config(args.name, job_args, args.guarantee, args.snapshot_interval,
                        args.suspend_on_failure, args.snapshot, error_policy=args.on_error,
                        dead_letter_stream=args.dead_letter_stream, upgrade=upgrade,
                        state_cache_bytes=args.state_cache,
                        adaptive_micro_batches=args.adaptive)
    job = client.get_jet().submit(pipeline, config)
    out(f"Submitted job {job.id}, name: {job.name or 'N/A'}")
    restore = job.get_metrics().get("snapshotRestore") if args.snapshot is not None else None
    if restore:
        stages = ", ".join(f"{stage} {status}" for stage, status in restore["stages"].items())
        sources = ", ".join(f"{stage} {status}"
                            for stage, status in restore.get("sources", {}).items())
        out(
            f"Starting from snapshot '{restore['snapshot']}' (batch {restore['batch']}): "
            f"{stages or 'no stateful stages'}; sources: {sources or 'none'}"
        )
    return follow(job, client, progress_every=args.progress_every)


def job_config(
    name: str | None,
    arguments: list[str],
    guarantee: Any = None,
    snapshot_interval: int | None = None,
    suspend_on_failure: bool = False,
    snapshot: str | None = None,
    *,
    error_policy: str | None = None,
    dead_letter_stream: str | None = None,
    upgrade: JobConfig | None = None,
    state_cache_bytes: int | None = None,
    adaptive_micro_batches: bool | None = None,
) -> JobConfig:
    """The JobConfig of a job started from the command line (``submit``, ``apply``).

    Options left unset (None) keep JobConfig's defaults. ``upgrade``: a
    JobConfig whose upgrade fields (``allow_dropped_state``,
    ``allow_changed_state``, ``stage_renames``, ``source_starts``) are copied.
    """
    config = JobConfig(name=name, arguments=arguments)
    if guarantee is not None:
        config.processing_guarantee = guarantee
    if snapshot_interval is not None:
        config.snapshot_interval_millis = snapshot_interval
    if suspend_on_failure:
        config.suspend_on_failure = True
    if snapshot is not None:
        config.initial_snapshot_name = snapshot
    if error_policy is not None:
        config.error_policy = error_policy
    if dead_letter_stream is not None:
        config.dead_letter_stream = dead_letter_stream
    if upgrade is not None:
        for field in UPGRADE_FIELDS:
            setattr(config, field, getattr(upgrade, field))
    if state_cache_bytes is not None:
        config.state_cache_bytes = state_cache_bytes
    if adaptive_micro_batches is not None:
        config.adaptive_micro_batches = adaptive_micro_batches
    return config


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes from ``text``: a number with an optional unit (``512MiB``, ``2GB``, ``0``)."""
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(
            f"expected a size such as 512MiB, 2GiB or a number of bytes (units: B, KB, MB, "
            f"GB, TB, KiB, MiB, GiB, TiB), got {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


#: The upgrade fields of JobConfig and the option that sets each (``submit``, ``check-upgrade``).
UPGRADE_FIELDS = {
    "allow_dropped_state": "--allow-dropped-state",
    "allow_changed_state": "--allow-changed-state",
    "stage_renames": "--rename",
    "source_starts": "--source-start",
}


def upgrade_options(upgrade: JobConfig) -> list[str]:
    """The options that set ``upgrade``'s upgrade fields away from their defaults."""
    default = JobConfig()
    return [
        option for field, option in UPGRADE_FIELDS.items()
        if getattr(upgrade, field) != getattr(default, field)
    ]


def list_jobs(args: argparse.Namespace, client: Client) -> int:
    """``list-jobs``: the active jobs (all with ``-a``), newest first, as a table."""
    rows = []
    for job in client.get_jet().get_jobs():
        status = job.status
        if not args.all and status.is_terminal():
            continue
        rows.append((job.id, status.value, format_time(job.submission_time), job.name or "N/A"))
    for line in table(("ID", "STATUS", "SUBMISSION TIME", "NAME"), rows):
        out(line)
    return EXIT_OK


def status(args: argparse.Namespace, client: Client) -> int:
    """``status``: the job's status with why it is suspended or how it failed."""
    job = find_job(client, args.job)
    out(state_line(job, client))
    status = job.status
    if status is JobStatus.FAILED and not job.is_user_cancelled():
        failure = job.get_failure()
        if failure:
            out(f"Failure: {client.redact(failure)}")
    elif status is JobStatus.SUSPENDED:
        out(f"Resume it with: {resume_command(job)}")
    return EXIT_OK


def find_job(client: Client, ref: str) -> Job:
    """The job with id ``ref``, else the one named ``ref``; CliError (exit 1) if none."""
    job = client.get_jet().get_job(ref)
    if job is None:
        raise CliError(f"no job with id or name '{ref}'", EXIT_FAILED)
    return job


def cancel(args: argparse.Namespace, client: Client) -> int:
    """``cancel``: cancel the job and wait until it has stopped."""
    job = find_job(client, args.job)
    job.cancel()
    out(f"Cancelling job {job.label}")
    await_end(job, args.timeout, client)
    if job.is_user_cancelled():
        return EXIT_OK
    failure = job.get_failure()
    detail = f": {failure}" if failure else ""
    raise CliError(
        f"job {job.label} ended {job.status.value} before the cancel request took effect"
        f"{detail}",
        EXIT_FAILED,
    )


def suspend(args: argparse.Namespace, client: Client) -> int:
    """``suspend``: ask the streaming job to suspend and wait until it is SUSPENDED."""
    job = find_job(client, args.job)
    job.suspend()
    out(f"Suspending job {job.label}")
    await_status(job, JobStatus.SUSPENDED, args.timeout, client)
    out(state_line(job, client))
    return EXIT_OK


def resume(args: argparse.Namespace, client: Client) -> int:
    """``resume``: resume the job and wait until it is RUNNING.

    When the process that ran the job is gone, the job continues in this
    process, in the foreground, as with ``submit``.
    """
    job = find_job(client, args.job)
    if not resume_job(job, client, args.timeout):
        return EXIT_OK
    # The job runs here now: stay in the foreground, as `submit` does.
    return follow(job, client, resumed=True)


def resume_job(job: Job, client: Client, timeout: float) -> bool:
    """Resume ``job`` and wait until it is RUNNING; True if it now runs in this process.

    A job whose driver died is taken over here: the caller keeps it in the
    foreground (:func:`~sparkjet.cli.follow.follow` with ``resumed``).
    """
    job.resume()
    taken_over = False

    def take_over_if_orphaned() -> bool:
        # The driver asked to resume died before it did: continue the job here.
        nonlocal taken_over
        if job.status is JobStatus.SUSPENDED and not job.is_driver_alive():
            job.resume()
            taken_over = job.is_driven_here()
        return taken_over

    if job.is_driven_here():
        out(f"Resuming job {job.label} in this process: the process that ran it is gone")
        return True
    out(f"Resuming job {job.label}")
    await_status(job, JobStatus.RUNNING, timeout, client, retake=take_over_if_orphaned)
    if not taken_over:
        out(state_line(job, client))
        return False
    out(f"The process that ran job {job.label} is gone: it resumes in this process")
    return True


def restart(args: argparse.Namespace, client: Client) -> int:
    """``restart``: ask the streaming job to restart and wait until it is RUNNING."""
    job = find_job(client, args.job)
    job.restart()
    out(f"Restarting job {job.label}")
    await_status(job, JobStatus.RUNNING, args.timeout, client, refuse=(JobStatus.SUSPENDED,))
    out(state_line(job, client))
    return EXIT_OK


def _read_json_lines(file: str) -> list[Any]:
    """Every item of a JSON-lines file (``-``: stdin); blank lines are skipped.

    :raises CliError: the file cannot be read, is not UTF-8, or a line is not
        JSON (the line is named).
    """
    shown = "stdin" if file == "-" else file
    items: list[Any] = []
    try:
        with contextlib.ExitStack() as stack:
            if file == "-":
                lines: Any = getattr(sys.stdin, "buffer", sys.stdin)
            else:
                lines = stack.enter_context(open(file, "rb"))
            for lineno, raw in enumerate(lines, 1):
                try:
                    line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
                except UnicodeDecodeError:
                    raise CliError(f"{shown}: not UTF-8 text (line {lineno})") from None
                if lineno == 1:
                    line = line.removeprefix("\ufeff")  # a byte order mark
                if not line.strip():
                    continue
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise CliError(
                        f"{shown}: invalid JSON (line {lineno}, column {exc.colno}): {exc.msg}"
                    ) from None
    except FileNotFoundError:
        raise CliError(f"{shown}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{shown}: is a directory, expected a file of JSON lines") from None
    except OSError as exc:
        raise CliError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    return items


def publish(args: argparse.Namespace, client: Client) -> int:
    """``publish``: append the JSON lines of a file to a stream (all of them, or none)."""
    items = _read_json_lines(args.file)  # all of it first: a bad line publishes nothing
    if args.partitions is None and not client.get_stream(args.stream).exists():
        store = client.redact(client.config.store_url)
        raise CliError(
            f"stream '{args.stream}' does not exist in store '{store}': "
            "pass --partitions N to create it",
            EXIT_FAILED,
        )
    stream = client.get_stream(args.stream, args.partitions)
    stream.publish_all(items)
    noun = "item" if len(items) == 1 else "items"
    out(f"Published {len(items)} {noun} to stream '{args.stream}'")
    return EXIT_OK


def gc(args: argparse.Namespace, client: Client) -> int:
    """``gc``: collect what the store no longer needs; one line per kind, with its count."""
    report = client.collect_garbage(
        grace_seconds=args.grace, retention_seconds=args.retention, dry_run=args.dry_run
    )
    verb = "Would remove" if report.dry_run else "Removed"
    if not report.total:
        out("Nothing to remove.")
        return EXIT_OK
    rows = [(kind, str(len(paths))) for kind, paths in report.removed.items()]
    for line in table(("KIND", "COUNT"), rows):
        out(line)
    if args.verbose or report.dry_run:
        for kind, paths in report.removed.items():
            for path in paths:
                out(f"  {kind}: {path}")
    out(f"{verb} {report.total} in all.")
    return EXIT_OK


def plugins(args: argparse.Namespace, client: Client) -> int:
    """``plugins``: every plugin, what it registers and the guarantees supported.

    A plugin that is not in use is listed with why: unavailable (an optional
    dependency is not installed) or broken (its error, and how to block it).
    Neither fails the command: it lists what it found.
    """
    rows: list[tuple[str, str, str, str]] = []
    owners: list[tuple[PluginInfo, int]] = []  # each plugin, with how many rows it has
    for info in client.list_plugins():
        for entry in info.registered:
            guarantees = sorted(getattr(entry.cls, "guarantees", ()), key=lambda g: g.rank)
            rows.append((
                entry.category,
                entry.kind,
                f"{entry.cls.__module__}.{entry.cls.__qualname__}",
                ", ".join(g.value for g in guarantees) or "-",
            ))
        owners.append((info, len(info.registered)))
    lines = table(("CATEGORY", "KIND", "CLASS", "GUARANTEES"), rows)
    header, body = lines[0], iter(lines[1:])
    if owners:
        out(f"  {header}")
    else:
        out("No plugins loaded.")
    for info, count in owners:
        out(f"{info.name} ({info.origin})")
        if info.broken is not None:
            out(f"  broken: {info.broken}")
            out(f"  skipped; {info.block_hint()}")
        elif info.unavailable is not None:
            out(f"  unavailable: {info.unavailable}")
        elif count == 0:
            out("  (registers no classes: lifecycle hooks only)")
        for _ in range(count):
            out(f"  {next(body)}")
    blocked = client.blocked_plugins()
    if blocked:
        out(
            f"Blocked plugins: {', '.join(blocked)} "
            "(SPARKJET_BLOCK_PLUGINS or [plugins] disable)"
        )
    return EXIT_OK
