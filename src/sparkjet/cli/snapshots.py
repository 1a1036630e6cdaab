"""The snapshot commands: save, list, delete, inspect, check an upgrade, copy.

Like the job commands, each takes the parsed arguments and the client and
returns the exit status, or raises :class:`~sparkjet.cli.CliError` (or a
:class:`~sparkjet.errors.SparkjetError`) for :func:`~sparkjet.cli.main` to
report: a missing, corrupt or untrusted snapshot and a job in the wrong status
exit 1, an incompatible upgrade 2 (as ``submit -s`` would).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from sparkjet import Client
from sparkjet.cli.commands import find_job
from sparkjet.cli.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from sparkjet.cli.follow import await_end
from sparkjet.cli.loading import load_pipeline
from sparkjet.cli.output import format_count, format_time_millis, out, table
from sparkjet.errors import ConfigError, SnapshotBackendError
from sparkjet.job import Snapshot, UpgradeRow

#: Jet's ``list-snapshots`` columns: time, size and job name are padded to these widths.
LIST_WIDTHS = (23, 15, 24)
#: How long a job name may be in ``list-snapshots`` before it is cut (Jet's limit).
MAX_JOB_NAME = 24


def _job_label(snapshot: Snapshot) -> str:
    """``'name' (id)`` of the job a snapshot was taken of, or its id alone if unnamed."""
    if snapshot.job_name is None:
        return snapshot.job_id
    return f"'{snapshot.job_name}' ({snapshot.job_id})"


def _signature(value: Any) -> str:
    """A state signature as compact JSON with sorted keys; ``-`` for none."""
    if value is None:
        return "-"
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), default=repr)


def _plural(count: int, noun: str) -> str:
    return f"{format_count(count)} {noun}{'' if count == 1 else 's'}"


# --- save-snapshot -------------------------------------------------------------------------


def save_snapshot(args: argparse.Namespace, client: Client) -> int:
    """``save-snapshot [-C] JOB NAME``: export the job's state, optionally cancel the job."""
    job = find_job(client, args.job)
    if job.is_terminal():
        pass  # export_snapshot refuses it, naming the status: no "Saving" line first
    elif args.cancel:
        out(f"Saving snapshot '{args.name}' of job {job.label} and cancelling the job")
    else:
        out(f"Saving snapshot '{args.name}' of job {job.label}")
    snapshot = job.export_snapshot(args.name, cancel_job=args.cancel, timeout=args.timeout)
    manifest = snapshot.manifest
    out(
        f"Exported snapshot '{snapshot.name}': batch {manifest.batch_id}, "
        f"{_plural(len(manifest.stages), 'stateful stage')}, "
        f"{_plural(snapshot.payload_size, 'byte')}"
    )
    if args.cancel:
        await_end(job, args.timeout, client, " after the export")
    return EXIT_OK


# --- list-snapshots ------------------------------------------------------------------------


def _shorten(name: str) -> str:
    """Jet's trim: a name longer than 24 characters is cut to 23 and marked with ``*``."""
    return name if len(name) <= MAX_JOB_NAME else name[: MAX_JOB_NAME - 1] + "*"


def _list_line(cells: Sequence[str]) -> str:
    padded = [cell.ljust(width) for cell, width in zip(cells, LIST_WIDTHS, strict=False)]
    return " ".join([*padded, *cells[len(LIST_WIDTHS):]]).rstrip()


def list_snapshots(args: argparse.Namespace, client: Client) -> int:
    """``list-snapshots [-F]``: Jet's columns, by snapshot name; unnamed jobs show their id."""
    out(_list_line(("TIME", "SIZE (bytes)", "JOB NAME", "SNAPSHOT NAME")))
    for snapshot in sorted(client.get_jet().list_snapshots(), key=lambda s: s.name):
        job = snapshot.job_name if snapshot.job_name is not None else snapshot.job_id
        out(_list_line((
            format_time_millis(snapshot.creation_time),
            format_count(snapshot.payload_size),
            job if args.full_job_name else _shorten(job),
            snapshot.name,
        )))
    return EXIT_OK


# --- delete-snapshot -----------------------------------------------------------------------


def delete_snapshot(args: argparse.Namespace, client: Client) -> int:
    """``delete-snapshot NAME``: delete the snapshot, whole (its manifest need not be sound)."""
    store = client.snapshots
    if not store.delete(args.name):
        raise CliError(
            f"no snapshot named '{args.name}' in {store.backend.describe()}", EXIT_FAILED
        )
    out(f"Deleted snapshot '{args.name}'")
    return EXIT_OK


# --- inspect-snapshot ----------------------------------------------------------------------


def inspect_snapshot(args: argparse.Namespace, client: Client) -> int:
    """``inspect-snapshot [--verify] NAME``: the manifest's fields, then one row per stage."""
    store = client.snapshots
    snapshot = store.get(args.name)
    manifest = snapshot.manifest
    files = manifest.all_files()
    fields: list[tuple[str, str]] = [
        ("Snapshot", f"'{snapshot.name}'"),
        ("Job", _job_label(snapshot)),
        ("Batch", str(manifest.batch_id)),
        ("Created", format_time_millis(snapshot.creation_time)),
        ("Size", f"{_plural(snapshot.payload_size, 'byte')} in {_plural(len(files), 'file')}"),
        ("Format", f"version {manifest.format_version}"),
        ("Signed", "yes (HMAC-SHA256)" if manifest.signed else "no"),
        ("Versions", f"sparkjet {manifest.sparkjet_version}, Spark {manifest.spark_version}"),
        ("Pipeline", f"fingerprint {manifest.pipeline_fingerprint}"),
        ("Stored in", f"{store.backend.describe()}, {snapshot.folder}"),
    ]
    sources = sorted(manifest.sources.items())
    if not sources:
        fields.append(("Sources", "none"))
    for index, (source, offsets) in enumerate(sources):
        fields.append((
            "Sources" if index == 0 else "",
            f"{source}: {json.dumps(offsets, sort_keys=True, default=repr)}",
        ))
    event_time = snapshot.event_time()
    if event_time is not None:
        for index, (stage, mark) in enumerate(sorted(event_time.watermarks.items())):
            fields.append(("Watermarks" if index == 0 else "", f"{stage}: {_millis(mark)}"))
        for index, (source, parts) in enumerate(sorted(event_time.partitions.items())):
            highest = ", ".join(f"{p}: {_millis(v[0])}" for p, v in sorted(parts.items()))
            fields.append(("Event time" if index == 0 else "",
                           f"{source}: highest timestamp by partition: {highest}"))
    width = max(len(label) for label, _ in fields) + 2
    for label, value in fields:
        out(f"{(label + ':') if label else '':<{width}}{value}".rstrip())
    out()
    rows = [
        (
            stage.name,
            stage.kind,
            format_count(stage.key_count),
            format_count(stage.bytes),
            str(stage.key_groups),
            str(len(stage.files)),
            _signature(stage.state_signature),
        )
        for stage in manifest.stages
    ]
    header = ("STAGE", "KIND", "KEYS", "BYTES", "KEY GROUPS", "FILES", "SIGNATURE")
    for line in table(header, rows):
        out(line)
    if not rows:
        out("(no stateful stages)")
    if args.verify:
        snapshot.verify()  # raises SnapshotCorruptedError naming the file
        out()
        out(f"Verified: {_plural(len(files), 'file')}, every size and sha256 as the manifest "
            "says")
    return EXIT_OK


def _millis(value: int) -> str:
    """A watermark or timestamp: the number, and the local time it is when it looks like one."""
    if value <= -(2**62):
        return "none yet"
    if 10**11 < value < 10**14:  # 1973 to 5138: epoch milliseconds
        return f"{value} ({format_time_millis(value)})"
    return str(value)


# --- check-upgrade -------------------------------------------------------------------------

#: What each status of :class:`UpgradeRow` means, for the summary line.
_STATUS_TEXT = {
    "restored": "restored",
    "changed": "changed",
    "new": "new",
    "dropped": "dropped",
    "incompatible": "incompatible",
}


def _what(row: UpgradeRow, value: Any) -> str:
    """A signature (a stage's state) or an identity (a source's data), shortly; ``-`` if none."""
    if value is None:
        return "-"
    if row.kind == "source" and isinstance(value, dict) and "plugin" in value:
        reads = value.get("reads")
        text = f"{value['plugin']}:{reads if isinstance(reads, str) else _signature(reads)}"
        if "partitions" in value:
            text += f" ({_plural(int(value['partitions']), 'partition')})"
        return text
    if isinstance(value, dict) and "op" in value:
        # The state's shape; what changed in its key or operation is the row's note.
        op = str(value["op"])
        kind = value.get("accumulator", value.get("state"))
        if op == "window":
            op = f"window {value.get('window')}"
        elif op == "apply":
            op = f"apply {value.get('transform')}"
        return op if kind is None else f"{op}({kind})"
    return _signature(value)


def check_upgrade(args: argparse.Namespace, client: Client) -> int:
    """``check-upgrade -s SNAPSHOT FILE.py``: what ``submit -s`` would do, per stage and source."""
    job_args = list(args.args)
    if job_args[:1] == ["--"]:
        job_args = job_args[1:]
    pipeline = load_pipeline(args.file, job_args)
    jet = client.get_jet()
    snapshot = jet.get_snapshot(args.snapshot)
    rows: list[UpgradeRow] = jet.check_upgrade(pipeline, args.snapshot, config=args.upgrade)
    out(
        f"Snapshot '{snapshot.name}' of job {_job_label(snapshot)}, batch "
        f"{snapshot.manifest.batch_id}, with {args.file}:"
    )
    header = ("STAGE", "KIND", "STATUS", "KEYS", "IN THE SNAPSHOT", "IN THE PIPELINE")
    cells = [
        (f"{r.renamed_from} -> {r.stage}" if r.renamed_from else r.stage, r.kind,
         r.status + (" (refused)" if r.refusal else ""),
         format_count(r.keys) if r.kind == "state" else "-",
         _what(r, r.old_signature), _what(r, r.new_signature))
        for r in rows
    ]
    for line in table(header, cells):
        out(line)
    windowed = [r for r in rows if r.old_window is not None or r.new_window is not None]
    if windowed:
        out()
        out("Windows:")
    for r in windowed:
        before = r.old_window.describe() if r.old_window else "(none)"
        after = r.new_window.describe() if r.new_window else "(none)"
        change = f"{after}, unchanged" if before == after else f"{before} -> {after}"
        text = f"  '{r.stage}': {change}"
        if r.status == "incompatible":
            text += ": refused (a sliding or tumbling window cannot become a session window, " \
                    "nor the other way; nor can the accumulator change)"
        elif r.note:
            text += f": {r.note}"
        elif r.status == "new":
            text += ": starts empty, at the sources' watermark"
        out(text)
    noted = [r for r in rows if r.note and not r.refusal and r not in windowed]
    if noted:
        out()
        out("Notes:")
        for r in noted:
            out(f"  '{r.stage}' {r.status}: {r.note}")
    counts = {status: sum(r.status == status for r in rows) for status in _STATUS_TEXT}
    summary = ", ".join(
        f"{count} {_STATUS_TEXT[status]}" for status, count in counts.items() if count
    ) or "no stateful stages or sources"
    bad = [r for r in rows if r.refusal]
    if not bad:
        out(f"Compatible: {summary}; every file of the snapshot checked.")
        return EXIT_OK
    out()
    out("Refused:")
    for r in bad:
        out(f"  '{r.stage}' {r.status}: {r.refusal}")
    noun = "row" if len(bad) == 1 else "rows"
    raise CliError(
        f"{args.file} cannot start from snapshot '{snapshot.name}': {len(bad)} {noun} "
        f"refused ({', '.join(repr(r.stage) for r in bad)}); see above ({summary})",
        EXIT_USAGE,
    )


# --- copy-snapshot -------------------------------------------------------------------------


def copy_snapshot(args: argparse.Namespace, client: Client) -> int:
    """``copy-snapshot NAME --to URL [--as NEW]``: copy to another store, checked by checksum."""
    options = dict(args.to_options)
    if args.to_backend is not None:
        kinds = sorted(
            entry.kind for info in client.list_plugins() for entry in info.registered
            if entry.category == "snapshot backend"
        )
        if args.to_backend not in kinds:
            raise CliError(
                f"copy-snapshot --to-backend: no snapshot backend of kind '{args.to_backend}' "
                f"is registered (known: {', '.join(kinds)}); is its plugin installed and not "
                "blocked?"
            )
    try:
        target = client.snapshot_store_at(args.to, options, backend=args.to_backend)
    except (ConfigError, SnapshotBackendError) as exc:
        message = client.redact(str(exc)).replace("[snapshots.options]", "--to-option")
        raise CliError(f"copy-snapshot --to {client.redact(args.to)}: {message}",
                       EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_FAILED) from None
    source = client.snapshots
    new_name = args.as_name or args.name
    if target.backend.describe() == source.backend.describe() and new_name == args.name:
        raise CliError(
            "copy-snapshot: the target is the configured snapshot store itself: give the "
            "copy another name with --as",
        )
    manifest = source.copy_to(target, args.name, as_name=new_name)
    files = manifest.all_files()
    out(
        f"Copied snapshot '{args.name}' to '{new_name}' in {target.backend.describe()}: "
        f"{_plural(len(files), 'file')}, {_plural(manifest.payload_size, 'byte')}, "
        "every sha256 checked after writing"
    )
    return EXIT_OK
