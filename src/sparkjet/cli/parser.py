"""The argument parser of the ``sparkjet`` command and its argument types."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from sparkjet import Client
from sparkjet.cli import apply, commands, migrate, results, snapshots
from sparkjet.job import JobConfig, ProcessingGuarantee

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

    #: The arguments this parser was last given, as typed (see :class:`_PipelineArguments`).
    given: list[str] = []

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.given = list(args) if args is not None else sys.argv[1:]
        return super().parse_known_args(args, namespace)


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


def _size(text: str) -> int:
    try:
        return commands.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


def _rename(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not sep or not old or not new:
        raise argparse.ArgumentTypeError(
            f"expected OLD=NEW (a stage's name in the snapshot, '=', its name in this "
            f"pipeline), got {text!r}"
        )
    return old, new


def _source_start(text: str) -> tuple[str, str]:
    stage, sep, where = text.partition("=")
    if not sep or not stage or where not in SOURCE_STARTS:
        raise argparse.ArgumentTypeError(
            f"expected STAGE=initial or STAGE=latest (STAGE a source stage's name, or * for "
            f"every source the snapshot has no offsets for), got {text!r}"
        )
    return stage, where


#: Where a source the snapshot has no offsets for starts (``--source-start STAGE=WHERE``).
SOURCE_STARTS = ("initial", "latest")


def _upgrade(namespace: argparse.Namespace) -> JobConfig:
    """The JobConfig that collects the upgrade options given (``namespace.upgrade``)."""
    config: JobConfig | None = getattr(namespace, "upgrade", None)
    if config is None:
        config = JobConfig()
        namespace.upgrade = config
    return config


class _UpgradeFlag(argparse.Action):
    """``--allow-dropped-state`` / ``--allow-changed-state``: set the JobConfig field."""

    def __init__(self, option_strings: list[str], dest: str, field: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.field = field

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
        values: Any, option_string: str | None = None,
    ) -> None:
        setattr(_upgrade(namespace), self.field, True)


class _UpgradeEntry(argparse.Action):
    """``--rename OLD=NEW`` / ``--source-start STAGE=WHERE``: one entry of a JobConfig dict.

    A key given twice is refused (which one wins would be a guess), and so is a
    new name given to two stages (two states cannot become one).
    """

    def __init__(self, option_strings: list[str], dest: str, field: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.field = field

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
        values: Any, option_string: str | None = None,
    ) -> None:
        key, value = values
        config = _upgrade(namespace)
        entries: dict[str, str] = dict(getattr(config, self.field))
        option = option_string or self.option_strings[0]
        if key in entries:
            parser.error(
                f"argument {option}: {key!r} is given twice ({key}={entries[key]} and "
                f"{key}={value}): give it once"
            )
        if self.field == "stage_renames":
            for old, new in entries.items():
                if new == value:
                    parser.error(
                        f"argument {option}: {value!r} is the new name of both {old!r} and "
                        f"{key!r} (two stages' state cannot become one)"
                    )
        entries[key] = value
        setattr(config, self.field, entries)


def _add_upgrade_options(command: argparse.ArgumentParser, summary: str) -> None:
    """Add the upgrade options (JobConfig's upgrade fields) to ``submit`` or ``check-upgrade``.

    They are collected in one JobConfig, ``args.upgrade`` (None when none is given).
    """
    group = command.add_argument_group(
        "upgrade options", f"{summary} (see docs/snapshots.md for the upgrade rules)"
    )
    group.add_argument(
        "--allow-dropped-state", action=_UpgradeFlag, field="allow_dropped_state",
        dest="upgrade", default=None,
        help="JobConfig.allow_dropped_state: accept that the state or offsets the snapshot "
        "holds for a stage this pipeline no longer has are dropped",
    )
    group.add_argument(
        "--allow-changed-state", action=_UpgradeFlag, field="allow_changed_state",
        dest="upgrade", default=None,
        help="JobConfig.allow_changed_state: keep the state of a stage whose key function "
        "or operation changed (its state's type did not)",
    )
    group.add_argument(
        "--rename", action=_UpgradeEntry, field="stage_renames", type=_rename,
        dest="upgrade", default=None, metavar="OLD=NEW",
        help="JobConfig.stage_renames: the state (or offsets) of stage OLD in the snapshot "
        "go to stage NEW of this pipeline (repeatable)",
    )
    group.add_argument(
        "--source-start", action=_UpgradeEntry, field="source_starts", type=_source_start,
        dest="upgrade", default=None, metavar="STAGE=initial|latest",
        help="JobConfig.source_starts: where source STAGE starts when the snapshot has no "
        "offsets for it: initial (as without a snapshot) or latest (at the data's end now); "
        "STAGE * for every such source (repeatable)",
    )


class _PipelineArguments(argparse.Action):
    """The ARGS after FILE.py: passed to the pipeline, but never a sparkjet option.

    argparse hands everything after FILE.py to the pipeline, so ``submit v1.py
    -s snap`` would quietly start from scratch. An option of the command (or
    of ``sparkjet`` itself), written as argparse would take it (``-s``,
    ``-sNAME``, ``--snapshot=NAME``, an abbreviation such as ``--snap``), is
    refused there, naming it; the pipeline's own options (``--scale 3``) and
    everything after a ``--`` pass on untouched.
    """

    def __init__(
        self, option_strings: list[str], dest: str, global_options: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.global_options = global_options

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
        values: Any, option_string: str | None = None,
    ) -> None:
        arguments = list(values)
        given = getattr(parser, "given", [])
        # argparse drops a '--' right after FILE.py from the values: it was typed if the
        # token before them is one (the token before them is FILE.py otherwise).
        cut = len(given) - len(arguments) - 1
        if cut >= 0 and given[cut] == "--" and given[cut + 1:] == arguments:
            setattr(namespace, self.dest, arguments)
            return
        known = sorted({*parser._option_string_actions, *self.global_options})
        for token in arguments:
            if token == "--":
                break  # the rest is the pipeline's, whatever it looks like
            matched = _sparkjet_option(token, known)
            if matched is None:
                continue
            command = parser.prog.split()[-1]
            file = getattr(namespace, "file", "FILE.py")
            stem = token.split("=", 1)[0] if token.startswith("--") else token[:2]
            what = token if matched == stem else f"{token} (an abbreviation of {matched})"
            if matched not in parser._option_string_actions and matched in self.global_options:
                where = f"an option of sparkjet, which goes before the command: sparkjet " \
                    f"{token} {command} ... {file}"
            else:
                where = f"an option of sparkjet {command}, which goes before {file}: " \
                    f"sparkjet {command} {token} ... {file}"
            parser.error(
                f"{what} after {file} is {where}; to pass it to the pipeline, put the "
                f"pipeline's arguments after '--': sparkjet {command} {file} -- "
                f"{shlex.join(arguments)}"
            )
        setattr(namespace, self.dest, arguments)


def _sparkjet_option(token: str, known: list[str]) -> str | None:
    """The sparkjet option ``token`` would be taken as by argparse, or None.

    ``--name``, ``--name=x``, an unambiguous or ambiguous abbreviation
    (``--na``), ``-n`` and ``-nx`` all are; ``-1``, ``--scale`` and ``x`` are not.
    """
    if token.startswith("--") and len(token) > 2:
        stem = token.split("=", 1)[0]
        if stem in known:
            return stem
        candidates = [option for option in known if option.startswith(stem)]
        if candidates:
            return " or ".join(candidates) if len(candidates) > 1 else candidates[0]
        return None
    if token.startswith("-") and len(token) >= 2 and token[1] != "-":
        short = token[:2]
        return short if short in known else None
    return None


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
    #: The options of ``sparkjet`` itself, refused after FILE.py as the command's own are.
    global_options = tuple(sorted(parser._option_string_actions))
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
        "--state-cache", type=_size, metavar="SIZE",
        help="JobConfig.state_cache_bytes: the most of the job's keyed state each Python "
        "worker keeps loaded between micro-batches, e.g. 512MiB or 4GiB (default 1GiB; 0 "
        "keeps none: every batch reads its state from the checkpoint)",
    )
    submit.add_argument(
        "--no-adaptive", dest="adaptive", action="store_const", const=False, default=None,
        help="JobConfig.adaptive_micro_batches=False: run every micro-batch as a Spark job, "
        "even a small one (by default the configuration's [engine] adaptive decides; on "
        "unless turned off there)",
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
    _add_upgrade_options(submit, "starting from a snapshot (-s) only")
    submit.add_argument("file", metavar="FILE.py", help="Python file defining 'pipeline'")
    submit.add_argument(
        "args", metavar="ARGS", nargs=argparse.REMAINDER, action=_PipelineArguments,
        global_options=global_options,
        help="arguments for the pipeline: everything after FILE.py (stored in "
        "JobConfig.arguments); sparkjet's own options go before FILE.py (one after it is "
        "refused), the pipeline's that look like them after '--': FILE.py -- --name x",
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

    _add_snapshot_commands(subcommands, global_options)
    _add_declarative_commands(subcommands)

    plugins = subcommands.add_parser(
        "plugins", help="list loaded plugins, what they register and the guarantees supported",
        description="List every loaded plugin with the sources, sinks, stateful transforms "
        "and snapshot backends it registers and the processing guarantees each supports.",
    )
    plugins.set_defaults(handler=commands.plugins)
    migrate.add_command(subcommands)
    return parser


def _add_snapshot_commands(subcommands: Any, global_options: tuple[str, ...]) -> None:
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
