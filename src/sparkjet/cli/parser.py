"""The argument parser of the ``sparkjet`` command and its argument types."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from sparkjet import Client
from sparkjet.cli import commands
from sparkjet.job import ProcessingGuarantee

#: How long ``cancel``, ``suspend``, ``resume`` and ``restart`` wait for the job's new
#: status, unless ``--timeout`` says otherwise.
DEFAULT_TIMEOUT = 60.0

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


def _guarantee(text: str) -> ProcessingGuarantee:
    try:
        return ProcessingGuarantee.parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected none, at_least_once or exactly_once, got {text!r}"
        ) from None


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

    plugins = subcommands.add_parser(
        "plugins", help="list loaded plugins, what they register and the guarantees supported",
        description="List every loaded plugin with the sources, sinks, stateful transforms "
        "and snapshot backends it registers and the processing guarantees each supports.",
    )
    plugins.set_defaults(handler=commands.plugins)
    return parser
