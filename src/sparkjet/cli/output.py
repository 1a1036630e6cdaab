"""What the command prints: lines, tables, times, job states, and sparkjet's log records."""

from __future__ import annotations

import contextlib
import logging
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version

from sparkjet import Client, __version__
from sparkjet.errors import JobStateError
from sparkjet.job import Job, JobStatus

TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"


def out(line: str = "") -> None:
    """Print ``line`` on stdout, at once."""
    print(line, file=sys.stdout, flush=True)


def error(message: str) -> None:
    """Print ``ERROR: <message>`` on stderr, at once."""
    print(f"ERROR: {message}", file=sys.stderr, flush=True)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return lines


def format_time(millis: int) -> str:
    """Epoch milliseconds as local time, ``%Y-%m-%dT%H:%M:%S``."""
    if millis < 0:
        return "N/A"
    return datetime.fromtimestamp(millis / 1000).strftime(TIME_FORMAT)


def format_time_millis(millis: int) -> str:
    """Epoch milliseconds as local time with milliseconds, ``2020-03-15T14:37:01.011`` (Jet)."""
    if millis < 0:
        return "N/A"
    moment = datetime.fromtimestamp(millis // 1000)
    return f"{moment.strftime(TIME_FORMAT)}.{millis % 1000:03d}"


def format_count(value: int) -> str:
    """An integer with thousands separators, ``1,196`` (Jet's ``%,d``)."""
    return f"{value:,}"


def describe(exc: BaseException) -> str:
    """``<type>: <message>`` of an exception, or its type alone when it has no message."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def version_text() -> str:
    """``sparkjet <version> (pyspark <version>, Python <version>)``.

    The Spark Connect client (``pyspark-client``, the ``connect`` extra) shows as
    ``pyspark-client <version>``.
    """
    pyspark = "not installed"
    for name in ("pyspark", "pyspark-client"):
        try:
            found = version(name)
        except PackageNotFoundError:
            continue
        pyspark = found if name == "pyspark" else f"{name} {found}"
        break
    python = ".".join(str(part) for part in sys.version_info[:3])
    return f"sparkjet {__version__} (pyspark {pyspark}, Python {python})"


# --- job states ---------------------------------------------------------------------


def status_text(job: Job) -> str:
    """The job's status, with `` (cancelled by user)`` after a user cancelled it."""
    status = job.status
    if status.is_terminal() and job.is_user_cancelled():
        return f"{status.value} (cancelled by user)"
    return status.value


def suspension_cause(job: Job, client: Client) -> str:
    """Why the job is suspended (secrets redacted), or ``no longer suspended``."""
    try:
        cause = job.get_suspension_cause(how_to_resume=f"continue it with: {resume_command(job)}")
    except JobStateError:  # it changed status meanwhile
        return "no longer suspended"
    return client.redact(cause)


def resume_command(job: Job) -> str:
    """``sparkjet resume <name or id>``, quoted for a shell where it must be."""
    return f"sparkjet resume {shlex.quote(job.name or job.id)}"


def state_line(job: Job, client: Client) -> str:
    """``Job <label> finished: <status>``, or ``Job <label> is <status>`` while it lives."""
    status = job.status
    if status.is_terminal():
        return f"Job {job.label} finished: {status_text(job)}"
    if status is JobStatus.SUSPENDED:
        return f"Job {job.label} is SUSPENDED ({suspension_cause(job, client)})"
    return f"Job {job.label} is {status.value}"


# --- logging --------------------------------------------------------------------------


class StderrHandler(logging.Handler):
    """Writes records to whatever ``sys.stderr`` is at the time, with secrets redacted."""

    def __init__(self) -> None:
        super().__init__()
        #: Masks secrets in a formatted record; the client's once there is one.
        self.redact: Callable[[str], str] = lambda text: text

    def emit(self, record: logging.LogRecord) -> None:
        """Write the formatted, redacted record and a newline to stderr."""
        try:
            text = self.redact(self.format(record))
            stream = sys.stderr
            stream.write(text + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def logging_to_stderr(level: int) -> Iterator[StderrHandler]:
    """Print the ``sparkjet`` loggers' records at ``level`` and above on stderr, quiet py4j.

    Only the ``sparkjet`` logger hierarchy is touched (the root logger is left
    alone), and everything is restored on exit, so :func:`~sparkjet.cli.main`
    can be called in-process.
    """
    logger = logging.getLogger("sparkjet")
    py4j = logging.getLogger("py4j")
    saved = (logger.level, logger.propagate, py4j.level)
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATE_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    py4j.setLevel(logging.WARNING)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        py4j.setLevel(saved[2])
