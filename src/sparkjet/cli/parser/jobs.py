"""The parsers of the job commands: submit, list-jobs, status, cancel, suspend, resume, restart.

Their handlers are in :mod:`sparkjet.cli.commands`.
"""

from __future__ import annotations

import argparse
from typing import Any

from sparkjet.cli import commands
from sparkjet.cli.parser.arguments import (
    Handler,
    _add_upgrade_options,
    _guarantee,
    _non_negative_seconds,
    _PipelineArguments,
    _positive_int,
    _positive_seconds,
    _size,
)

#: How long ``cancel``, ``suspend``, ``resume`` and ``restart`` wait for the job's new
#: status, unless ``--timeout`` says otherwise.
DEFAULT_TIMEOUT = 60.0


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


def add_job_commands(subcommands: Any, global_options: tuple[str, ...]) -> None:
    """Add ``submit``, ``list-jobs``, ``status`` and the job actions (cancel ... restart)."""
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
