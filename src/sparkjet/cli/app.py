""":func:`main`: parse the command line, connect, run the command, map errors to exit statuses."""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Sequence

import sparkjet
from sparkjet import Client
from sparkjet.cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CliError
from sparkjet.cli.output import describe, error, logging_to_stderr, out, version_text
from sparkjet.cli.parser import Handler, UsageError, build_parser
from sparkjet.errors import ConfigError, PipelineDefinitionError, PluginError, SparkjetError


def _exit_status(code: object) -> int:
    """The exit status for a ``SystemExit`` code."""
    if code is None:
        return EXIT_OK
    return code if isinstance(code, int) else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``sparkjet`` command with ``argv`` (default ``sys.argv[1:]``); returns the status."""
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
        except KeyboardInterrupt:
            error("interrupted")
            return EXIT_INTERRUPTED
        except Exception as exc:
            # A bug, not an expected error: keep the traceback, without secrets.
            sys.stderr.write(redact(traceback.format_exc()))
            error(redact(f"unexpected {describe(exc)}"))
            return EXIT_FAILED
