"""The parsers of the declarative and read-only commands: apply, get, metrics and info.

Their handlers are in :mod:`sparkjet.cli.apply` and :mod:`sparkjet.cli.results`
(``get jobs`` and ``get snapshots`` are ``list-jobs`` and ``list-snapshots``).
"""

from __future__ import annotations

import argparse
from typing import Any

from sparkjet import Client
from sparkjet.cli import apply, commands, results, snapshots
from sparkjet.cli.parser.arguments import Handler, _offset, _positive_int


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


def add_declarative_commands(subcommands: Any) -> None:
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
        "PORT 0 to 65535, 0: any free port) until interrupted, in the text format or in "
        "OpenMetrics when the scraper asks for it.",
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
