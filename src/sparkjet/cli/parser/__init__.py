"""The argument parser of the ``sparkjet`` command, built from one module per command group.

:func:`build_parser` adds the groups in the order ``sparkjet --help`` lists
them: :mod:`~sparkjet.cli.parser.jobs`, :mod:`~sparkjet.cli.parser.store`,
:mod:`~sparkjet.cli.parser.snapshots`, :mod:`~sparkjet.cli.parser.declarative`,
then ``plugins`` and ``migrate-snapshot``; the argument types and actions they
share are in :mod:`~sparkjet.cli.parser.arguments`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from sparkjet.cli import commands, migrate
from sparkjet.cli.parser.arguments import SOURCE_STARTS as SOURCE_STARTS
from sparkjet.cli.parser.arguments import Handler as Handler
from sparkjet.cli.parser.declarative import add_declarative_commands
from sparkjet.cli.parser.jobs import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from sparkjet.cli.parser.jobs import add_job_commands
from sparkjet.cli.parser.snapshots import EXPORT_TIMEOUT as EXPORT_TIMEOUT
from sparkjet.cli.parser.snapshots import add_snapshot_commands
from sparkjet.cli.parser.store import add_store_commands


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

    #: The arguments this parser was last given, as typed (see
    #: :class:`~sparkjet.cli.parser.arguments._PipelineArguments`).
    given: list[str] = []

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.given = list(args) if args is not None else sys.argv[1:]
        return super().parse_known_args(args, namespace)


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
    add_job_commands(subcommands, global_options)
    add_store_commands(subcommands)
    add_snapshot_commands(subcommands, global_options)
    add_declarative_commands(subcommands)

    plugins = subcommands.add_parser(
        "plugins", help="list loaded plugins, what they register and the guarantees supported",
        description="List every loaded plugin with the sources, sinks, stateful transforms "
        "and snapshot backends it registers and the processing guarantees each supports.",
    )
    plugins.set_defaults(handler=commands.plugins)
    migrate.add_command(subcommands)
    return parser
