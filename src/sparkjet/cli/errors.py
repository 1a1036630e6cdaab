"""The exit statuses of the ``sparkjet`` command and :class:`CliError`."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: Whoever read stdout stopped reading (``sparkjet get list L | head -1``): 128 + SIGPIPE,
#: the status a shell shows for a command that the signal ended.
EXIT_BROKEN_PIPE = 141


class CliError(Exception):
    """An expected error of the command: printed as ``ERROR: <message>``, exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        #: The process exit status this error leads to.
        self.code = code
