"""The argument parser of the ``sparkjet`` command and its argument types."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from sparkjet import Client
from sparkjet.cli import apply, commands, migrate, results, snapshots
from sparkjet.job import ProcessingGuarantee

#: How long ``cancel``, ``suspend``, ``resume`` and ``restart`` wait for the job's new
#: status, unless ``--timeout`` says otherwise.
DEFAULT_TIMEOUT = 60.0

#: How long ``save-snapshot`` waits for the job's driver to export, unless ``--timeout`` says
#: otherwise (``Job.export_snapshot``'s own default).
EXPORT_TIMEOUT = 600.0

#: What a command's ``handler`` default is: a function of :mod:`sparkjet.cli.commands`.
Handler = Callable[[argparse.Namespace, Client], int]


class UsageError(Exception):
    """A command-line error found by argparse (the parser prints its usage)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        #: The (sub)parser that found the error: its usage is printed.
        self.parser = parser
        #: What argparse says is wrong.
        self.message = message


class _Parser(argparse.ArgumentParser):
    """An argument parser that reports errors to :func:`main` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected 0 or more seconds, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _offset(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an offset (0 or more), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an offset (0 or more), got {text!r}")
    return value


def _guarantee(text: str) -> ProcessingGuarantee:
    try:
        return ProcessingGuarantee.parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected none, at_least_once or exactly_once, got {text!r}"
        ) from None


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _add_job_action(
    subcommands: Any,
    name: str,
    handler: Handler,
    summary: str,
    description: str,
    waits_for: str,
) -> None:
    command = subcommands.add_parser(name, help=summary, description=description)
    command.add_argument("job", metavar="JOB", help="the job's id or name")
    command.add_argument(
        "-t", "--timeout", type=_positive_seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help=f"how long to wait for the job {waits_for} (default {DEFAULT_TIMEOUT:g})",
    )
    command.set_defaults(handler=handler)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of the ``sparkjet`` command."""
    parser = _Parser(
        prog="sparkjet",
        description="Submit sparkjet pipelines and manage their jobs.",
    )
    parser.add_argument(
        "--version", action="store_true", help="print the sparkjet and pyspark versions and exit"
    )
    parser.add_argument(
        "-c", "--config", metavar="FILE",
        help="configuration file (default: $SPARKJET_CONFIG, ./sparkjet.toml or "
        "[tool.sparkjet] in ./pyproject.toml)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="print DEBUG messages of sparkjet's loggers"
    )
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")

    submit = subcommands.add_parser(
        "submit", help="run the pipeline defined in a Python file as a job, in the foreground",
        description="Load FILE.py, submit its module-level 'pipeline' (a Pipeline, or a "
        "function returning one, given the list of ARGS if it takes a parameter) and run the "
        "job in this process until it ends; a streaming job runs until it is cancelled or "
        "suspended (exit 0). Exits 1 if the job fails or is cancelled. Interrupted, it "
        "suspends a streaming job with a processing guarantee and cancels any other job.",
    )
    submit.add_argument("-n", "--name", help="the job's name")
    submit.add_argument(
        "-g", "--guarantee", type=_guarantee, metavar="GUARANTEE",
        help="the job's processing guarantee: none (the default), at_least_once or "
        "exactly_once; a streaming job with a guarantee is suspended, not cancelled, when "
        "this command is interrupted",
    )
    submit.add_argument(
        "--snapshot-interval", type=_positive_int, metavar="MILLIS",
        help="JobConfig.snapshot_interval_millis: a streaming job's micro-batch interval with "
        "a guarantee (default 10000)",
    )
    submit.add_argument(
        "--suspend-on-failure", action="store_true",
        help="suspend a failing streaming job instead of failing it (it can be resumed)",
    )
    submit.add_argument(
        "--on-error", choices=("fail", "dead-letter"), metavar="POLICY",
        help="JobConfig.error_policy: what a failing map, filter, flat_map or peek function "
        "does when its stage sets no on_error(): fail (the default) fails the job; "
        "dead-letter sends the item to the dead-letter stream and goes on (and a window's "
        "late items)",
    )
    submit.add_argument(
        "--dead-letter-stream", metavar="STREAM",
        help="JobConfig.dead_letter_stream: where dead letters go (default "
        "<job name or id>.dead-letters)",
    )
    submit.add_argument(
        "-s", "--snapshot", metavar="NAME",
        help="JobConfig.initial_snapshot_name: start the job from this exported snapshot "
        "(state matched by stage name; refused if it is missing, corrupt or incompatible)",
    )
    submit.add_argument(
        "--progress-every", type=_non_negative_seconds, metavar="SECONDS",
        help="when stdout is not a terminal, print a streaming job's progress line every "
        "SECONDS (default 30; 0: never); on a terminal the line is kept up to date",
    )
    submit.add_argument("file", metavar="FILE.py", help="Python file defining 'pipeline'")
    submit.add_argument(
        "args", metavar="ARGS", nargs=argparse.REMAINDER,
        help="arguments for the pipeline: everything after FILE.py (stored in "
        "JobConfig.arguments); put sparkjet's own options before FILE.py",
    )
    submit.set_defaults(handler=commands.submit)

    list_jobs = subcommands.add_parser(
        "list-jobs", help="list active jobs (all jobs with -a)",
        description="List jobs, newest first: active jobs only, or all with -a.",
    )
    list_jobs.add_argument(
        "-a", "--all", action="store_true", help="include completed and failed jobs"
    )
    list_jobs.set_defaults(handler=commands.list_jobs)

    status = subcommands.add_parser(
        "status", help="show a job's status, why it is suspended or how it failed",
        description="Show the status of the job with this id or name, as any process using "
        "the store sees it: with the cause of a suspension, or the failure of a FAILED job.",
    )
    status.add_argument("job", metavar="JOB", help="the job's id or name")
    status.set_defaults(handler=commands.status)

    _add_job_action(
        subcommands, "cancel", commands.cancel,
        "cancel a running job and wait until it stops",
        "Cancel the job with this id or name (a job running in another process is asked "
        "through the store) and wait until it stops.",
        "to stop",
    )
    _add_job_action(
        subcommands, "suspend", commands.suspend,
        "suspend a running streaming job and wait until it is SUSPENDED",
        "Ask the streaming job with this id or name to stop after its current micro-batch "
        "commits (through the store if another process runs it) and wait until it is "
        "SUSPENDED. Its checkpoint is kept; 'sparkjet resume' continues it.",
        "to be SUSPENDED",
    )
    _add_job_action(
        subcommands, "resume", commands.resume,
        "resume a suspended streaming job and wait until it is RUNNING",
        "Continue the SUSPENDED streaming job with this id or name from its last committed "
        "micro-batch and wait until it is RUNNING. If the process that ran it has died, the "
        "job continues in this process, in the foreground, as with 'submit'.",
        "to be RUNNING",
    )
    _add_job_action(
        subcommands, "restart", commands.restart,
        "restart a running streaming job",
        "Stop the RUNNING streaming job with this id or name after its current micro-batch "
        "and start it again: from its last committed micro-batch with a processing "
        "guarantee, from scratch with NONE.",
        "to be RUNNING",
    )

    publish = subcommands.add_parser(
        "publish", help="append the JSON lines of a file to a stream",
        description="Parse every line of FILE ('-' for stdin) as JSON and append the values "
        "to the store's stream STREAM, spread over its partitions. Blank lines are skipped; "
        "a line that is not JSON is an error and nothing is published.",
    )
    publish.add_argument("stream", metavar="STREAM", help="the stream's name")
    publish.add_argument("file", metavar="FILE", help="a file of JSON lines, or - for stdin")
    publish.add_argument(
        "-p", "--partitions", type=_positive_int, metavar="N",
        help="create the stream with N partitions if it does not exist (an existing stream "
        "must have N partitions)",
    )
    publish.set_defaults(handler=commands.publish)

    gc = subcommands.add_parser(
        "gc", help="remove what the store no longer needs",
        description="Remove what crashes and ended jobs left in the store: segments no "
        "commit names, abort markers, old take-over claims, unused scratch checkpoints, "
        "quarantined control requests and probe files older than --grace, and the folders "
        "of jobs that ended more than --retention ago.",
    )
    gc.add_argument(
        "--grace", type=_non_negative_seconds, default=3600.0, metavar="SECONDS",
        help="leave files younger than this alone (default 3600)",
    )
    gc.add_argument(
        "--retention", type=_non_negative_seconds, default=7 * 24 * 3600.0, metavar="SECONDS",
        help="forget jobs that ended longer ago than this (default 604800: 7 days, as Jet)",
    )
    gc.add_argument(
        "-n", "--dry-run", action="store_true", help="list what would go, remove nothing"
    )
    gc.set_defaults(handler=commands.gc)

    trim = subcommands.add_parser(
        "trim", help="remove a stream's oldest items, keeping what jobs and snapshots need",
        description="Remove the oldest items of STREAM past the limits given (or those of "
        "[streams.<name>] in the configuration): at most N newest items, items younger "
        "than SECONDS, at most BYTES per partition; an item goes once any limit says so. "
        "What a job that is not COMPLETED or FAILED, or a snapshot, still needs is never "
        "removed: the output says what held each partition back.",
    )
    trim.add_argument("stream", metavar="STREAM", help="the stream's name")
    trim.add_argument("--keep-items", type=_offset, metavar="N",
                      help="keep at most the newest N items of each partition")
    trim.add_argument("--keep-seconds", type=_non_negative_seconds, metavar="SECONDS",
                      help="keep only items published less than SECONDS ago")
    trim.add_argument("--keep-bytes", type=_offset, metavar="BYTES",
                      help="keep at most BYTES of each partition (whole chunks)")
    trim.add_argument(
        "-n", "--dry-run", action="store_true", help="say what would go, remove nothing"
    )
    trim.set_defaults(handler=results.trim)

    _add_snapshot_commands(subcommands)
    _add_declarative_commands(subcommands)

    plugins = subcommands.add_parser(
        "plugins", help="list loaded plugins, what they register and the guarantees supported",
        description="List every loaded plugin with the sources, sinks, stateful transforms "
        "and snapshot backends it registers and the processing guarantees each supports.",
    )
    plugins.set_defaults(handler=commands.plugins)
    migrate.add_command(subcommands)
    return parser


def _add_snapshot_commands(subcommands: Any) -> None:
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
    check.add_argument("file", metavar="FILE.py", help="Python file defining 'pipeline'")
    check.add_argument(
        "args", metavar="ARGS", nargs=argparse.REMAINDER,
        help="arguments for the pipeline, as for submit",
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


def _get(args: argparse.Namespace, client: Client) -> int:
    """``get jobs|snapshots|map|list|stream``: a table of jobs or snapshots, or results."""
    if args.kind == "jobs":
        return commands.list_jobs(args, client)
    if args.kind == "snapshots":
        return snapshots.list_snapshots(args, client)
    handlers: dict[str, Handler] = {
        "map": results.get_map, "list": results.get_list, "stream": results.get_stream,
    }
    return handlers[args.kind](args, client)


def _add_declarative_commands(subcommands: Any) -> None:
    """Add ``apply FILE.toml`` and ``get jobs|snapshots``."""
    apply_ = subcommands.add_parser(
        "apply", help="make jobs and snapshots match a TOML file, like Jet's operator",
        description="Read the [[job]] and [[snapshot]] tables of FILE.toml and make the store "
        "match: submit the jobs that are missing, suspend or resume those whose state "
        "differs, then export each snapshot that does not exist yet (once). One line per "
        "action; 'Nothing to change.' when all matches. Jobs submitted or taken over here "
        "run in this process, in the foreground, as with 'submit'.",
    )
    apply_.add_argument("file", metavar="FILE.toml", help="the declaration file")
    apply_.set_defaults(handler=apply.apply)

    get = subcommands.add_parser(
        "get", help="show the jobs or snapshots there are, or a map, list or stream",
        description="'get jobs' is 'list-jobs' (active jobs; all with -a), 'get snapshots' "
        "is 'list-snapshots'. 'get map NAME [KEY]' shows a map's entries (or one key's "
        "value; exit 1 if absent), 'get list NAME [--tail N]' a list's items with their "
        "index, 'get stream NAME [--from OFFSET] [--partition P]' a stream's items with "
        "partition:offset. --json prints JSON (JSON lines for lists and streams).",
    )
    get.add_argument("kind", choices=("jobs", "snapshots", "map", "list", "stream"),
                     help="what to show")
    get.add_argument("name", nargs="?", metavar="NAME", help="the map's, list's or stream's name")
    get.add_argument("key", nargs="?", metavar="KEY",
                     help="map: the key (as written, or its JSON: 42, [1, 2])")
    get.add_argument(
        "-a", "--all", action="store_true", help="jobs: include completed and failed jobs"
    )
    get.add_argument(
        "-F", "--full-job-name", action="store_true",
        help="snapshots: do not trim job names to 24 characters",
    )
    get.add_argument("--tail", type=_positive_int, metavar="N", help="list: the last N items")
    get.add_argument("--from", dest="start", type=_offset, metavar="OFFSET",
                     help="stream: from this offset of each partition (default: the oldest "
                     "item each still holds)")
    get.add_argument("--partition", type=_offset, metavar="P",
                     help="stream: only this partition")
    get.add_argument("--json", action="store_true",
                     help="map, list, stream: print JSON for tools")
    get.set_defaults(handler=_get)

    metrics = subcommands.add_parser(
        "metrics", help="show a job's metrics, or serve every active job's to Prometheus",
        description="Show the metrics of the job with this id or name (Job.get_metrics()): "
        "execution times, streaming progress and per-stage counts; --json prints them as "
        "one JSON object, --prometheus in Prometheus's text format (counters end in "
        "_total). --serve [HOST:]PORT serves the metrics of every active job in the store "
        "(of JOB alone when given) at http://HOST:PORT/metrics (HOST 127.0.0.1 unless given; "
        "PORT 0 to 65535, 0: any free port) until interrupted.",
    )
    metrics.add_argument("job", nargs="?", metavar="JOB", help="the job's id or name")
    shown_as = metrics.add_mutually_exclusive_group()
    shown_as.add_argument("--json", action="store_true", help="print JSON for tools")
    shown_as.add_argument("--prometheus", action="store_true",
                          help="print Prometheus's text exposition format")
    shown_as.add_argument("--serve", metavar="[HOST:]PORT",
                          help="serve the active jobs' metrics over HTTP for Prometheus")
    metrics.set_defaults(handler=results.metrics)

    info = subcommands.add_parser(
        "info", help="show which configuration and store this command uses",
        description="Show the configuration file read (if any), the store and where its URL "
        "came from (the file, SPARKJET_STORE or the default), where snapshots are kept, "
        "the Spark master, and how many jobs the store holds.",
    )
    info.set_defaults(handler=results.info)
