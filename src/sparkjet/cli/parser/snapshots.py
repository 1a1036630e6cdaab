"""The parsers of the snapshot commands: save, list, delete, inspect, check-upgrade and copy.

Their handlers are in :mod:`sparkjet.cli.snapshots`.
"""

from __future__ import annotations

import argparse
from typing import Any

from sparkjet.cli import snapshots
from sparkjet.cli.parser.arguments import (
    _add_upgrade_options,
    _option,
    _PipelineArguments,
    _positive_seconds,
)

#: How long ``save-snapshot`` waits for the job's driver to export, unless ``--timeout`` says
#: otherwise (``Job.export_snapshot``'s own default).
EXPORT_TIMEOUT = 600.0


def add_snapshot_commands(subcommands: Any, global_options: tuple[str, ...]) -> None:
    """Add the snapshot commands: save, list, delete, inspect, check-upgrade and copy."""
    save = subcommands.add_parser(
        "save-snapshot", help="export a named snapshot of a job, optionally cancelling it",
        description="Export the state of the streaming job with this id or name as snapshot "
        "NAME (Job.export_snapshot), at its last committed micro-batch; a snapshot of that "
        "name is replaced. The job must be RUNNING or SUSPENDED. With -C the job is "
        "cancelled after the export.",
    )
    save.add_argument("job", metavar="JOB", help="the job's id or name")
    save.add_argument("name", metavar="NAME", help="the snapshot's name")
    save.add_argument(
        "-C", "--cancel", action="store_true", help="cancel the job after taking the snapshot"
    )
    save.add_argument(
        "-t", "--timeout", type=_positive_seconds, default=EXPORT_TIMEOUT, metavar="SECONDS",
        help="how long to wait for the export (and with -C for the job to stop) "
        f"(default {EXPORT_TIMEOUT:g})",
    )
    save.set_defaults(handler=snapshots.save_snapshot)

    list_snapshots = subcommands.add_parser(
        "list-snapshots", help="list exported snapshots",
        description="List the exported snapshots of the configured snapshot store, by name: "
        "creation time, size, the job they were taken of and their name.",
    )
    list_snapshots.add_argument(
        "-F", "--full-job-name", action="store_true",
        help="do not trim job names to 24 characters (can break the layout)",
    )
    list_snapshots.set_defaults(handler=snapshots.list_snapshots)

    delete = subcommands.add_parser(
        "delete-snapshot", help="delete a named snapshot",
        description="Delete the exported snapshot NAME (also one whose files are corrupt).",
    )
    delete.add_argument("name", metavar="NAME", help="the snapshot's name")
    delete.set_defaults(handler=snapshots.delete_snapshot)

    inspect = subcommands.add_parser(
        "inspect-snapshot", help="show a snapshot's manifest: job, batch, sources, stages",
        description="Print the manifest of the exported snapshot NAME: where and when it was "
        "taken, its size, format, signature, versions and source offsets, then one row per "
        "stateful stage. With --verify every file is also checked against its checksum.",
    )
    inspect.add_argument("name", metavar="NAME", help="the snapshot's name")
    inspect.add_argument(
        "--verify", action="store_true",
        help="read every file and check its size and sha256 (exit 1 if one is wrong)",
    )
    inspect.set_defaults(handler=snapshots.inspect_snapshot)

    check = subcommands.add_parser(
        "check-upgrade", help="dry-run starting a pipeline file from a snapshot",
        description="Load FILE.py as 'submit' does and say, per stateful stage, what starting "
        "it from snapshot SNAPSHOT would do: restored, new (starts empty), dropped (state "
        "ignored) or incompatible. Submits nothing. Exits 0 only when submit -s would be "
        "accepted: no stage incompatible (else 2) and the snapshot whole and intact (else 1).",
    )
    check.add_argument(
        "-s", "--snapshot", required=True, metavar="SNAPSHOT", help="the snapshot's name"
    )
    _add_upgrade_options(check, "as submit -s would take them")
    check.add_argument("file", metavar="FILE.py", help="Python file defining 'pipeline'")
    check.add_argument(
        "args", metavar="ARGS", nargs=argparse.REMAINDER, action=_PipelineArguments,
        global_options=global_options,
        help="arguments for the pipeline, as for submit (after '--' if they look like "
        "sparkjet's options)",
    )
    check.set_defaults(handler=snapshots.check_upgrade)

    copy = subcommands.add_parser(
        "copy-snapshot", help="copy a snapshot to another snapshot store, verified by checksum",
        description="Copy the exported snapshot NAME to the snapshot store at URL (a local "
        "path, file://, memory://, s3:// or gs://), as NEW with --as. Every file is checked "
        "against the manifest as it is read, and read back and checked again at the target "
        "before the copy's manifest is written; a failed copy leaves the target as it was.",
    )
    copy.add_argument("name", metavar="NAME", help="the snapshot's name")
    copy.add_argument(
        "--to", required=True, metavar="URL", help="where the target snapshot store is"
    )
    copy.add_argument(
        "--as", dest="as_name", metavar="NEW", help="the copy's name (default: NAME)"
    )
    copy.add_argument(
        "-o", "--to-option", dest="to_options", type=_option, action="append", default=[],
        metavar="KEY=VALUE",
        help="a storage option of the target (repeatable), such as endpoint_url=...; "
        "write secrets as ${env:NAME}",
    )
    copy.add_argument(
        "--to-backend", metavar="KIND",
        help="the target's snapshot backend kind (default: from the URL's scheme); for "
        "backends from plugins",
    )
    copy.set_defaults(handler=snapshots.copy_snapshot)
