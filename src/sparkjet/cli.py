"""The ``sparkjet`` command: submit pipeline files and manage jobs, like Jet's ``hz-cli``.

Commands::

    sparkjet --version
    sparkjet [--config FILE] [-v] submit [-n NAME] [-g GUARANTEE] [--snapshot-interval MILLIS]
                                        [--suspend-on-failure] FILE.py [ARGS...]
    sparkjet [--config FILE] list-jobs [-a]
    sparkjet [--config FILE] cancel [--timeout SECONDS] JOB
    sparkjet [--config FILE] suspend [--timeout SECONDS] JOB
    sparkjet [--config FILE] resume [--timeout SECONDS] JOB
    sparkjet [--config FILE] restart [--timeout SECONDS] JOB
    sparkjet [--config FILE] publish [--partitions N] STREAM FILE
    sparkjet [--config FILE] plugins

The configuration is found as ``sparkjet.connect()`` finds it (``--config``,
``SPARKJET_CONFIG``, ``./sparkjet.toml``, ``[tool.sparkjet]`` in
``./pyproject.toml``). Only ``submit`` starts Spark, and ``resume`` when the
job's driver died and the job continues in this process; the other commands
read and write the store and load the plugins.

``submit`` loads ``FILE.py`` (as ``python FILE.py`` would, but without running
its ``if __name__ == "__main__"`` block) and takes its module-level
``pipeline``: a :class:`~sparkjet.pipeline.Pipeline`, or a function returning
one, which is given the list of ``ARGS`` if it takes a parameter. The job runs
in this process, in the foreground, until it ends; a streaming job runs until
it is cancelled or suspended. Interrupted (Ctrl-C, SIGTERM), ``submit``
suspends a streaming job that has a processing guarantee, so that ``sparkjet
resume`` continues it later, and cancels any other job. ``sparkjet cancel``,
``suspend`` and ``restart`` from another shell act on it through the store.

Exit status: 0 on success (also when a foreground streaming job is suspended);
1 when a job failed or was cancelled, or an action on a job or stream could
not be done (unknown job or stream, wrong status, timeout); 2 when the command
line, the configuration, a plugin, the pipeline file or the file to publish is
wrong; 130 when interrupted. Expected errors print ``ERROR: <message>`` on
stderr, without a traceback, and never a configured secret.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import runpy
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from sparkjet.core.client import Client
    from sparkjet.core.graph import Pipeline
    from sparkjet.core.jobs import JetService, Job
    from sparkjet.job import JobStatus, ProcessingGuarantee

__all__ = ["CliError", "load_pipeline", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: How long ``cancel``, ``suspend``, ``resume`` and ``restart`` wait for the job's new
#: status, unless ``--timeout`` says otherwise.
DEFAULT_TIMEOUT = 60.0
DEFAULT_CANCEL_TIMEOUT = DEFAULT_TIMEOUT
#: How often a command reads the status of a job while it waits.
POLL_SECONDS = 0.2
CANCEL_POLL_SECONDS = POLL_SECONDS
#: How long an interrupted ``submit`` waits for its job to stop (cancelled) or suspend.
INTERRUPT_GRACE_SECONDS = 30.0

TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"


class CliError(Exception):
    """An expected error of the command: printed as ``ERROR: <message>``, exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        #: The process exit status this error leads to.
        self.code = code


class _UsageError(Exception):
    """A command-line error found by argparse (the parser prints its usage)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class _Parser(argparse.ArgumentParser):
    """An argument parser that reports errors to :func:`main` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(self, message)


# --- output ---------------------------------------------------------------------


def _out(line: str = "") -> None:
    print(line, file=sys.stdout, flush=True)


def _error(message: str) -> None:
    print(f"ERROR: {message}", file=sys.stderr, flush=True)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return lines


def _format_time(millis: int) -> str:
    """Epoch milliseconds as local time, ``%Y-%m-%dT%H:%M:%S``."""
    if millis < 0:
        return "N/A"
    return datetime.fromtimestamp(millis / 1000).strftime(TIME_FORMAT)


def version_text() -> str:
    """``sparkjet <version> (pyspark <version>, Python <version>)``."""
    from sparkjet import __version__

    try:
        pyspark = version("pyspark")
    except PackageNotFoundError:
        pyspark = "not installed"
    python = ".".join(str(part) for part in sys.version_info[:3])
    return f"sparkjet {__version__} (pyspark {pyspark}, Python {python})"


# --- logging --------------------------------------------------------------------


class _StderrHandler(logging.Handler):
    """Writes records to whatever ``sys.stderr`` is at the time, with secrets redacted."""

    def __init__(self) -> None:
        super().__init__()
        self.redact: Callable[[str], str] = lambda text: text

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.redact(self.format(record))
            stream = sys.stderr
            stream.write(text + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def _logging_to_stderr(level: int) -> Iterator[_StderrHandler]:
    """Print the ``sparkjet`` loggers' records at ``level`` and above on stderr, quiet py4j.

    Only the ``sparkjet`` logger hierarchy is touched (the root logger is left
    alone), and everything is restored on exit, so :func:`main` can be called
    in-process.
    """
    logger = logging.getLogger("sparkjet")
    py4j = logging.getLogger("py4j")
    saved = (logger.level, logger.propagate, py4j.level)
    handler = _StderrHandler()
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


# --- loading a pipeline file ------------------------------------------------------


def _location(exc: BaseException, file: Path) -> str:
    """`` (line N)`` of the innermost frame of ``exc``'s traceback that is in ``file``."""
    target = str(file.resolve())
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        with contextlib.suppress(OSError):
            if str(Path(frame.filename).resolve()) == target:
                line = frame.lineno
    return f" (line {line})" if line is not None else ""


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _accepts_argument(fn: Callable[..., Any], shown: str) -> bool:
    """Whether ``fn`` takes the ARGS list; refuses signatures that need anything else."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = list(signature.parameters.values())
    required = [
        p for p in params
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if len(required) > 1 or any(p.kind is inspect.Parameter.KEYWORD_ONLY for p in required):
        raise CliError(
            f"{shown}: pipeline{signature} must take no parameter or one (the list of ARGS)"
        )
    return any(p.kind in positional or p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)


def load_pipeline(path: str | Path, args: Sequence[str] = ()) -> Pipeline:
    """Run the Python file ``path`` and return the pipeline it defines.

    The file is run like a script (its folder first on ``sys.path`` and
    ``sys.argv`` set to ``[path, *args]`` while it loads) under the module
    name ``__sparkjet_pipeline__``, so its ``if __name__ == "__main__"`` block
    does not run and its functions are shipped to Spark by value. Its
    module-level ``pipeline`` is either a Pipeline or a function returning
    one; a function that takes a parameter is given ``list(args)``.

    :raises CliError: the file is missing, not Python, fails to load, or
        defines no usable ``pipeline``; the message names the file.
    """
    from sparkjet.core.graph import Pipeline

    shown = str(path)
    file = Path(path)
    if not file.exists():
        raise CliError(f"{shown}: no such file")
    if file.is_dir():
        raise CliError(f"{shown}: is a directory, expected a Python file (.py)")
    if file.suffix != ".py":
        raise CliError(f"{shown}: not a Python file (expected a .py file)")
    saved_argv, folder = sys.argv, str(file.resolve().parent)
    sys.argv = [shown, *args]
    sys.path.insert(0, folder)
    try:
        try:
            namespace = runpy.run_path(str(file), run_name="__sparkjet_pipeline__")
        except SyntaxError as exc:
            where = f" (line {exc.lineno})" if exc.lineno else ""
            raise CliError(f"{shown}: invalid Python{where}: {exc.msg}") from None
        except SystemExit as exc:
            raise CliError(f"{shown}: called sys.exit({exc.code!r}) while loading") from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise CliError(
                f"{shown}: raised {_describe(exc)} while loading{_location(exc, file)}"
            ) from None
        if "pipeline" not in namespace:
            raise CliError(
                f"{shown}: defines no module-level 'pipeline' (a Pipeline, or a function "
                "returning one)"
            )
        obj = namespace["pipeline"]
        if not isinstance(obj, Pipeline) and callable(obj):
            call = "pipeline(ARGS)" if _accepts_argument(obj, shown) else "pipeline()"
            try:
                obj = obj(list(args)) if call == "pipeline(ARGS)" else obj()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                raise CliError(
                    f"{shown}: {call} raised {_describe(exc)}{_location(exc, file)}"
                ) from None
            if not isinstance(obj, Pipeline):
                raise CliError(
                    f"{shown}: {call} returned {type(obj).__name__} {obj!r:.80}, not a Pipeline"
                )
        elif not isinstance(obj, Pipeline):
            raise CliError(
                f"{shown}: 'pipeline' is of type {type(obj).__name__}, expected a Pipeline or "
                "a function returning one"
            )
        return obj
    finally:
        sys.argv = saved_argv
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)  # what the file itself added to sys.path stays


# --- commands ---------------------------------------------------------------------


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt while a job runs, so it is cancelled cleanly."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _cmd_submit(args: argparse.Namespace, client: Client) -> int:
    from sparkjet.job import JobConfig

    job_args = list(args.args)
    if job_args[:1] == ["--"]:
        job_args = job_args[1:]
    pipeline = load_pipeline(args.file, job_args)
    config = JobConfig(name=args.name, arguments=job_args)
    if args.guarantee is not None:
        config.processing_guarantee = args.guarantee
    if args.snapshot_interval is not None:
        config.snapshot_interval_millis = args.snapshot_interval
    if args.suspend_on_failure:
        config.suspend_on_failure = True
    job = client.get_jet().submit(pipeline, config)
    _out(f"Submitted job {job.id}, name: {job.name or 'N/A'}")
    return _follow(job, client)


def _runs_here(job: Job) -> bool:
    """Whether this process runs ``job`` (it submitted it, or took it over on resume)."""
    return job._runner is not None


def _driver_gone(job: Job) -> bool:
    """Whether the process that ran ``job`` (not this one) has died."""
    return not _runs_here(job) and not job.is_driver_alive()


def _suspension_cause(job: Job, client: Client) -> str:
    from sparkjet.errors import JobStateError

    try:
        cause = job.get_suspension_cause()
    except JobStateError:  # it changed status meanwhile
        return "no longer suspended"
    return client.config.redact(cause)


def _state_line(job: Job, client: Client) -> str:
    """``Job <label> finished: <status>``, or ``Job <label> is <status>`` while it lives."""
    from sparkjet.job import JobStatus

    status = job.status
    if status.is_terminal():
        return f"Job {job.label} finished: {_status_text(job)}"
    if status is JobStatus.SUSPENDED:
        return f"Job {job.label} is SUSPENDED ({_suspension_cause(job, client)})"
    return f"Job {job.label} is {status.value}"


def _follow(job: Job, client: Client, resumed: bool = False) -> int:
    """Keep a job that runs in this process in the foreground until it ends or is suspended.

    ``resumed``: the job was SUSPENDED and has just been resumed here, so
    SUSPENDED counts only once it has run again (RUNNING is printed then).
    """
    from sparkjet.errors import JobFailedError
    from sparkjet.job import JobStatus

    changed = threading.Event()
    job.add_status_listener(lambda event: changed.set())
    waiting_to_run = resumed
    try:
        with _sigterm_as_interrupt():
            while True:
                changed.clear()
                status = job.status
                if status.is_terminal():
                    break
                if status is JobStatus.SUSPENDED and not waiting_to_run:
                    _out(_state_line(job, client))
                    _out(f"Resume it with: sparkjet resume {job.id}")
                    return EXIT_OK
                if waiting_to_run and status not in (JobStatus.SUSPENDED, JobStatus.STARTING):
                    waiting_to_run = False
                    _out(_state_line(job, client))
                changed.wait(POLL_SECONDS)
    except KeyboardInterrupt:
        return _interrupted(job, client, starting=waiting_to_run)
    try:
        job.join()
    except JobFailedError as exc:
        _out(_state_line(job, client))
        _error(client.config.redact(str(exc)))
        return EXIT_FAILED
    _out(_state_line(job, client))
    return EXIT_OK


def _settled(job: Job) -> bool:
    from sparkjet.job import JobStatus

    status = job.status
    return status.is_terminal() or status is JobStatus.SUSPENDED


def _ended(job: Job) -> bool:
    return job.is_terminal()


def _is_streaming(job: Job) -> bool:
    return job._refresh().get("kind") == "stream"


def _interrupted(job: Job, client: Client, starting: bool = False) -> int:
    """Ctrl-C or SIGTERM in the foreground: suspend a job with a guarantee, else cancel it.

    Only a streaming job can be suspended; it keeps its checkpoint, so
    ``sparkjet resume`` continues it. One that has not started running yet
    (``starting``: still SUSPENDED while it resumes here) is suspended as soon
    as it runs. A second interrupt cancels the job.
    """
    from sparkjet.errors import JobStateError, SparkjetError
    from sparkjet.job import JobStatus, ProcessingGuarantee

    suspending = (
        _is_streaming(job) and job.config.processing_guarantee is not ProcessingGuarantee.NONE
    )
    if suspending:
        _error(
            f"interrupted: suspending job {job.label} after its current micro-batch "
            "(interrupt again to cancel it)"
        )
    else:
        _error(f"interrupted: cancelling job {job.label}")
        with contextlib.suppress(SparkjetError):
            job.cancel()
    try:
        with _sigterm_as_interrupt():
            while suspending:
                status = job.status
                if status in (JobStatus.RUNNING, JobStatus.STARTING):
                    with contextlib.suppress(JobStateError):  # it stopped meanwhile
                        job.suspend()
                    break
                if status.is_terminal() or (status is JobStatus.SUSPENDED and not starting):
                    break
                time.sleep(POLL_SECONDS)  # not running yet: suspend it once it is
            deadline = time.monotonic() + INTERRUPT_GRACE_SECONDS
            done: Callable[[Job], bool] = _settled if suspending else _ended
            while not done(job) and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        _error(f"interrupted again: cancelling job {job.label}")
        with contextlib.suppress(SparkjetError):
            job.cancel()
        with contextlib.suppress(SparkjetError):
            job.join(timeout=INTERRUPT_GRACE_SECONDS)
    _out(_state_line(job, client))
    if suspending and not job.is_terminal():
        _out(f"Resume it with: sparkjet resume {job.id}")
    return EXIT_INTERRUPTED


def _status_text(job: Job) -> str:
    status = job.status
    if status.is_terminal() and job.is_user_cancelled():
        return f"{status.value} (cancelled by user)"
    return status.value


def _cmd_list_jobs(args: argparse.Namespace, client: Client) -> int:
    rows = []
    for job in client.get_jet().get_jobs():
        status = job.status
        if not args.all and status.is_terminal():
            continue
        rows.append((job.id, status.value, _format_time(job.submission_time), job.name or "N/A"))
    for line in _table(("ID", "STATUS", "SUBMISSION TIME", "NAME"), rows):
        _out(line)
    return EXIT_OK


def _find_job(jet: JetService, ref: str) -> Job:
    job = jet.get_job(ref) or jet.get_job_by_name(ref)
    if job is None:
        raise CliError(f"no job with id or name '{ref}'", EXIT_FAILED)
    return job


def _cmd_cancel(args: argparse.Namespace, client: Client) -> int:
    job = _find_job(client.get_jet(), args.job)
    job.cancel()
    _out(f"Cancelling job {job.label}")
    deadline = time.monotonic() + args.timeout
    while not job.is_terminal():
        if time.monotonic() >= deadline:
            raise CliError(
                f"job {job.label} did not stop within {args.timeout:g} s (status "
                f"{job.status.value}); it may still stop later",
                EXIT_FAILED,
            )
        time.sleep(CANCEL_POLL_SECONDS)
    _out(f"Job {job.label} finished: {_status_text(job)}")
    if job.is_user_cancelled():
        return EXIT_OK
    failure = job.get_failure()
    detail = f": {failure}" if failure else ""
    raise CliError(
        f"job {job.label} ended {job.status.value} before the cancel request took effect"
        f"{detail}",
        EXIT_FAILED,
    )


def _await_status(
    job: Job,
    wanted: JobStatus,
    timeout: float,
    client: Client,
    refuse: tuple[JobStatus, ...] = (),
    retake: Callable[[], bool] | None = None,
) -> None:
    """Wait until ``job`` reads ``wanted``; CliError (exit 1) if it ends, or times out first.

    ``refuse``: statuses that mean the action did not take (reported at once).
    ``retake``: called on every poll; returning True stops the wait successfully.
    """
    deadline = time.monotonic() + timeout
    while True:
        status = job.status
        if status is wanted:
            return
        if status.is_terminal():
            failure = job.get_failure()
            detail = f": {client.config.redact(failure)}" if failure else ""
            raise CliError(
                f"job {job.label} ended {_status_text(job)} before it was {wanted.value}"
                f"{detail}",
                EXIT_FAILED,
            )
        if status in refuse:
            raise CliError(
                f"job {job.label} is {status.value}, not {wanted.value}: "
                f"{_suspension_cause(job, client)}",
                EXIT_FAILED,
            )
        if retake is not None and retake():
            return
        if time.monotonic() >= deadline:
            raise CliError(
                f"job {job.label} did not become {wanted.value} within {timeout:g} s (status "
                f"{status.value}); it may still do so later",
                EXIT_FAILED,
            )
        time.sleep(POLL_SECONDS)


def _cmd_suspend(args: argparse.Namespace, client: Client) -> int:
    from sparkjet.job import JobStatus

    job = _find_job(client.get_jet(), args.job)
    job.suspend()
    _out(f"Suspending job {job.label}")
    _await_status(job, JobStatus.SUSPENDED, args.timeout, client)
    _out(_state_line(job, client))
    return EXIT_OK


def _cmd_resume(args: argparse.Namespace, client: Client) -> int:
    from sparkjet.job import JobStatus

    job = _find_job(client.get_jet(), args.job)
    job.resume()
    taken_over = False

    def take_over_if_orphaned() -> bool:
        # The driver asked to resume died before it did: continue the job here.
        nonlocal taken_over
        if job.status is JobStatus.SUSPENDED and _driver_gone(job):
            job.resume()
            taken_over = _runs_here(job)
        return taken_over

    if _runs_here(job):
        _out(f"Resuming job {job.label} in this process: the process that ran it is gone")
    else:
        _out(f"Resuming job {job.label}")
        _await_status(job, JobStatus.RUNNING, args.timeout, client, retake=take_over_if_orphaned)
        if not taken_over:
            _out(_state_line(job, client))
            return EXIT_OK
        _out(f"The process that ran job {job.label} is gone: it resumes in this process")
    # The job runs here now: stay in the foreground, as `submit` does.
    return _follow(job, client, resumed=True)


def _cmd_restart(args: argparse.Namespace, client: Client) -> int:
    from sparkjet.job import JobStatus

    job = _find_job(client.get_jet(), args.job)
    job.restart()
    _out(f"Restarting job {job.label}")
    _await_status(job, JobStatus.RUNNING, args.timeout, client, refuse=(JobStatus.SUSPENDED,))
    _out(_state_line(job, client))
    return EXIT_OK


def _read_json_lines(file: str) -> list[Any]:
    """Every item of a JSON-lines file (``-``: stdin); blank lines are skipped.

    :raises CliError: the file cannot be read, is not UTF-8, or a line is not
        JSON (the line is named).
    """
    shown = "stdin" if file == "-" else file
    items: list[Any] = []
    try:
        with contextlib.ExitStack() as stack:
            if file == "-":
                lines: Any = getattr(sys.stdin, "buffer", sys.stdin)
            else:
                lines = stack.enter_context(open(file, "rb"))
            for lineno, raw in enumerate(lines, 1):
                try:
                    line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
                except UnicodeDecodeError:
                    raise CliError(f"{shown}: not UTF-8 text (line {lineno})") from None
                if lineno == 1:
                    line = line.removeprefix("\ufeff")  # a byte order mark
                if not line.strip():
                    continue
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise CliError(
                        f"{shown}: invalid JSON (line {lineno}, column {exc.colno}): {exc.msg}"
                    ) from None
    except FileNotFoundError:
        raise CliError(f"{shown}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{shown}: is a directory, expected a file of JSON lines") from None
    except OSError as exc:
        raise CliError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    return items


def _cmd_publish(args: argparse.Namespace, client: Client) -> int:
    items = _read_json_lines(args.file)  # all of it first: a bad line publishes nothing
    if args.partitions is None and not client.store.stream_log(args.stream).exists():
        raise CliError(
            f"stream '{args.stream}' does not exist in store '{client.store.shown_url}': "
            "pass --partitions N to create it",
            EXIT_FAILED,
        )
    stream = client.get_stream(args.stream, args.partitions)
    stream.publish_all(items)
    noun = "item" if len(items) == 1 else "items"
    _out(f"Published {len(items)} {noun} to stream '{args.stream}'")
    return EXIT_OK


def _cmd_plugins(args: argparse.Namespace, client: Client) -> int:
    host = client.plugins
    rows: list[tuple[str, str, str, str]] = []
    owners: list[tuple[str, str, int]] = []  # plugin name, origin, number of rows
    for name, info in host.plugins.items():
        for entry in info.registered:
            guarantees = sorted(getattr(entry.cls, "guarantees", ()), key=lambda g: g.rank)
            rows.append((
                entry.category,
                entry.kind,
                f"{entry.cls.__module__}.{entry.cls.__qualname__}",
                ", ".join(g.value for g in guarantees) or "-",
            ))
        owners.append((name, info.origin, len(info.registered)))
    lines = _table(("CATEGORY", "KIND", "CLASS", "GUARANTEES"), rows)
    header, body = lines[0], iter(lines[1:])
    if owners:
        _out(f"  {header}")
    else:
        _out("No plugins loaded.")
    for name, origin, count in owners:
        _out(f"{name} ({origin})")
        if count == 0:
            _out("  (registers no classes: lifecycle hooks only)")
        for _ in range(count):
            _out(f"  {next(body)}")
    if host.blocked:
        _out(
            f"Blocked plugins: {', '.join(sorted(host.blocked))} "
            "(SPARKJET_BLOCK_PLUGINS or [plugins] disable)"
        )
    return EXIT_OK


# --- the parser and main -----------------------------------------------------------


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
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
    from sparkjet.job import ProcessingGuarantee

    try:
        return ProcessingGuarantee.parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected none, at_least_once or exactly_once, got {text!r}"
        ) from None


def _add_job_action(
    commands: Any,
    name: str,
    handler: Callable[[argparse.Namespace, Client], int],
    summary: str,
    description: str,
    waits_for: str,
) -> None:
    command = commands.add_parser(name, help=summary, description=description)
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
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    submit = commands.add_parser(
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
    submit.set_defaults(handler=_cmd_submit)

    list_jobs = commands.add_parser(
        "list-jobs", help="list active jobs (all jobs with -a)",
        description="List jobs, newest first: active jobs only, or all with -a.",
    )
    list_jobs.add_argument(
        "-a", "--all", action="store_true", help="include completed and failed jobs"
    )
    list_jobs.set_defaults(handler=_cmd_list_jobs)

    cancel = commands.add_parser(
        "cancel", help="cancel a running job and wait until it stops",
        description="Cancel the job with this id or name (a job running in another process "
        "is asked through the store) and wait until it stops.",
    )
    cancel.add_argument("job", metavar="JOB", help="the job's id or name")
    cancel.add_argument(
        "-t", "--timeout", type=_positive_seconds, default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long to wait for the job to stop (default {DEFAULT_TIMEOUT:g})",
    )
    cancel.set_defaults(handler=_cmd_cancel)

    _add_job_action(
        commands, "suspend", _cmd_suspend,
        "suspend a running streaming job and wait until it is SUSPENDED",
        "Ask the streaming job with this id or name to stop after its current micro-batch "
        "commits (through the store if another process runs it) and wait until it is "
        "SUSPENDED. Its checkpoint is kept; 'sparkjet resume' continues it.",
        "to be SUSPENDED",
    )
    _add_job_action(
        commands, "resume", _cmd_resume,
        "resume a suspended streaming job and wait until it is RUNNING",
        "Continue the SUSPENDED streaming job with this id or name from its last committed "
        "micro-batch and wait until it is RUNNING. If the process that ran it has died, the "
        "job continues in this process, in the foreground, as with 'submit'.",
        "to be RUNNING",
    )
    _add_job_action(
        commands, "restart", _cmd_restart,
        "restart a running streaming job",
        "Stop the RUNNING streaming job with this id or name after its current micro-batch "
        "and start it again: from its last committed micro-batch with a processing "
        "guarantee, from scratch with NONE.",
        "to be RUNNING",
    )

    publish = commands.add_parser(
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
    publish.set_defaults(handler=_cmd_publish)

    plugins = commands.add_parser(
        "plugins", help="list loaded plugins, what they register and the guarantees supported",
        description="List every loaded plugin with the sources, sinks, stateful transforms "
        "and snapshot backends it registers and the processing guarantees each supports.",
    )
    plugins.set_defaults(handler=_cmd_plugins)
    return parser


def _exit_status(code: object) -> int:
    if code is None:
        return EXIT_OK
    return code if isinstance(code, int) else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``sparkjet`` command with ``argv`` (default ``sys.argv[1:]``); returns the status."""
    from sparkjet.errors import (
        ConfigError,
        PipelineDefinitionError,
        PluginError,
        SparkjetError,
    )

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        exc.parser.print_usage(sys.stderr)
        _error(exc.message)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return _exit_status(exc.code)
    if args.version:
        _out(version_text())
        return EXIT_OK
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE

    client: Client | None = None

    def redact(text: str) -> str:
        return client.config.redact(text) if client is not None else text

    with _logging_to_stderr(logging.DEBUG if args.verbose else logging.INFO) as handler:
        try:
            import sparkjet

            client = sparkjet.connect(args.config)
            handler.redact = client.config.redact
            handler_fn: Callable[[argparse.Namespace, Client], int] = args.handler
            return handler_fn(args, client)
        except CliError as exc:
            _error(redact(str(exc)))
            return exc.code
        except (ConfigError, PluginError, PipelineDefinitionError) as exc:
            _error(redact(str(exc)))
            return EXIT_USAGE
        except SparkjetError as exc:
            _error(redact(str(exc)))
            return EXIT_FAILED
        except KeyboardInterrupt:
            _error("interrupted")
            return EXIT_INTERRUPTED
        except Exception as exc:
            # A bug, not an expected error: keep the traceback, without secrets.
            sys.stderr.write(redact(traceback.format_exc()))
            _error(redact(f"unexpected {_describe(exc)}"))
            return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
