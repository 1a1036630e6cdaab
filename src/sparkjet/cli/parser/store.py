"""The parsers of the commands on the store's data and upkeep: publish, gc and trim.

Their handlers are in :mod:`sparkjet.cli.commands` (publish, gc) and
:mod:`sparkjet.cli.results` (trim).
"""

from __future__ import annotations

from typing import Any

from sparkjet.cli import commands, results
from sparkjet.cli.parser.arguments import _non_negative_seconds, _offset, _positive_int


def add_store_commands(subcommands: Any) -> None:
    """Add ``publish``, ``gc`` and ``trim``."""
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
