""":func:`main`: parse the command line, connect, run the command, map errors to exit statuses."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence

import sparkjet
from sparkjet import Client
from sparkjet.cli.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
)
from sparkjet.cli.output import describe, error, logging_to_stderr, out, version_text
from sparkjet.cli.parser import Handler, UsageError, build_parser
from sparkjet.errors import ConfigError, PipelineDefinitionError, PluginError, SparkjetError


def _exit_status(code: object) -> int:
    """The exit status for a ``SystemExit`` code."""
    if code is None:
        return EXIT_OK
    return code if isinstance(code, int) else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``sparkjet`` command with ``argv`` (default ``sys.argv[1:]``); returns the status.

    The one place errors become exit statuses: an expected error is one line
    on stderr (``ERROR: <message>``); so is an unexpected one, whose
    traceback only ``-v`` prints. A reader that stops reading (``| head -1``)
    ends the command quietly with :data:`EXIT_BROKEN_PIPE`; Ctrl-C anywhere,
    with ``interrupted`` and :data:`EXIT_INTERRUPTED`.
    """
    try:
        return _main(argv)
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:  # before or after a command runs (while parsing, connecting)
        error("interrupted")
        return EXIT_INTERRUPTED


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so flushing it at exit raises no BrokenPipeError again."""
    with contextlib.suppress(Exception):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        exc.parser.print_usage(sys.stderr)
        error(exc.message)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return _exit_status(exc.code)
    if args.version:
        out(version_text())
        return EXIT_OK
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE

    client: Client | None = None

    def redact(text: str) -> str:
        return client.redact(text) if client is not None else text

    with logging_to_stderr(logging.DEBUG if args.verbose else logging.INFO) as handler:
        try:
            client = sparkjet.connect(args.config)
            handler.redact = client.redact
            run: Handler = args.handler
            return run(args, client)
        except CliError as exc:
            error(redact(str(exc)))
            return exc.code
        except (ConfigError, PluginError, PipelineDefinitionError) as exc:
            error(redact(str(exc)))
            return EXIT_USAGE
        except SparkjetError as exc:
            error(redact(str(exc)))
            return EXIT_FAILED
        except (BrokenPipeError, KeyboardInterrupt):
            raise  # see main()
        except OSError as exc:
            # The operating system refused something (a file, a socket, a permission):
            # its message names what, so it needs no traceback.
            error(redact(describe(exc)))
            return EXIT_FAILED
        except Exception as exc:
            # A bug, not an expected error: one line, the traceback with -v (without secrets).
            if args.verbose:
                sys.stderr.write(redact(traceback.format_exc()))
                error(redact(f"unexpected {describe(exc)}"))
            else:
                error(redact(f"unexpected {describe(exc)} (-v prints the traceback)"))
            return EXIT_FAILED
