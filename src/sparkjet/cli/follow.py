"""Waiting for a job's status, keeping a job in the foreground, and interrupts.

Every wait of the command for a job's status goes through :func:`wait_until`,
the one place that polls.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from types import FrameType
from typing import Any

from sparkjet import Client
from sparkjet.cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, CliError
from sparkjet.cli.output import (
    error,
    format_time_millis,
    out,
    state_line,
    status_text,
    suspension_cause,
)
from sparkjet.errors import JobFailedError, JobStateError, SparkjetError
from sparkjet.job import Job, JobStatus, ProcessingGuarantee

#: How often a command reads the status of a job while it waits.
POLL_SECONDS = 0.2
#: How often a streaming job's progress line is printed when stdout is not a terminal.
PROGRESS_SECONDS = 30.0
#: How long an interrupted ``submit`` waits for its job to stop (cancelled) or suspend.
INTERRUPT_GRACE_SECONDS = 30.0

_ACTIVE = (JobStatus.RUNNING, JobStatus.STARTING)


def _settled(status: JobStatus) -> bool:
    """Whether a job with this status no longer runs: it ended or is SUSPENDED."""
    return status.is_terminal() or status is JobStatus.SUSPENDED


def wait_until(
    job: Job,
    done: Callable[[JobStatus], bool],
    timeout: float | None = None,
    wake: threading.Event | None = None,
) -> JobStatus:
    """Read ``job``'s status until ``done(status)``; return the last status read.

    The status is read every :data:`POLL_SECONDS`, or as soon as ``wake`` is
    set (by a status listener). After ``timeout`` seconds (None: no limit) the
    wait gives up and returns a status for which ``done`` was false.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if wake is not None:
            wake.clear()
        status = job.status
        if done(status) or (deadline is not None and time.monotonic() >= deadline):
            return status
        if wake is not None:
            wake.wait(POLL_SECONDS)
        else:
            time.sleep(POLL_SECONDS)


def await_end(job: Job, timeout: float, client: Client, after: str = "") -> None:
    """Wait until ``job`` has stopped and print its state; CliError (exit 1) after ``timeout`` s.

    ``after``: what the wait follows, for the message (``" after the export"``).
    """
    status = wait_until(job, JobStatus.is_terminal, timeout)
    if not status.is_terminal():
        raise CliError(
            f"job {job.label} did not stop within {timeout:g} s{after} (status "
            f"{status.value}); it may still stop later",
            EXIT_FAILED,
        )
    out(state_line(job, client))


def await_status(
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
    retaken = False

    def done(status: JobStatus) -> bool:
        nonlocal retaken
        if status is wanted or status.is_terminal() or status in refuse:
            return True
        retaken = retake is not None and retake()
        return retaken

    status = wait_until(job, done, timeout)
    if status is wanted or retaken:
        return
    if status.is_terminal():
        failure = job.get_failure()
        detail = f": {client.redact(failure)}" if failure else ""
        raise CliError(
            f"job {job.label} ended {status_text(job)} before it was {wanted.value}{detail}",
            EXIT_FAILED,
        )
    if status in refuse:
        raise CliError(
            f"job {job.label} is {status.value}, not {wanted.value}: "
            f"{suspension_cause(job, client)}",
            EXIT_FAILED,
        )
    raise CliError(
        f"job {job.label} did not become {wanted.value} within {timeout:g} s (status "
        f"{status.value}); it may still do so later",
        EXIT_FAILED,
    )


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


def follow_all(jobs: Sequence[Job], client: Client, resumed: Collection[str] = ()) -> int:
    """Keep jobs that run in this process in the foreground until each ends or is suspended.

    Each is followed as :func:`follow` does, in turn; ``resumed``: the ids of
    those just resumed here. Interrupted, every job still running is suspended
    or cancelled as an interrupted ``submit`` does. Returns the worst status.
    """
    codes = [EXIT_OK]
    for index, job in enumerate(jobs):
        code = follow(job, client, resumed=job.id in resumed)
        if code == EXIT_INTERRUPTED:
            for other in jobs[index + 1:]:
                if not _settled(other.status) or other.id in resumed:
                    _interrupted(other, client, starting=other.status is JobStatus.SUSPENDED)
            return EXIT_INTERRUPTED
        codes.append(code)
    return max(codes)


def follow(
    job: Job, client: Client, resumed: bool = False, progress_every: float | None = None
) -> int:
    """Keep a job that runs in this process in the foreground until it ends or is suspended.

    ``resumed``: the job was SUSPENDED and has just been resumed here, so
    SUSPENDED counts only once it has run again (RUNNING is printed then).
    Meanwhile a streaming job's progress is shown (see :class:`LiveStatus`):
    on a terminal, one line kept up to date; otherwise a line every
    ``progress_every`` seconds (:data:`PROGRESS_SECONDS` if None; 0: none).
    """
    changed = threading.Event()
    job.add_status_listener(lambda event: changed.set())
    waiting_to_run = resumed
    try:
        with _sigterm_as_interrupt():
            if waiting_to_run:
                status = wait_until(
                    job, lambda s: s not in (JobStatus.SUSPENDED, JobStatus.STARTING), wake=changed
                )
                waiting_to_run = False
                if not status.is_terminal():
                    out(state_line(job, client))
            every = PROGRESS_SECONDS if progress_every is None else progress_every
            with LiveStatus(job, every) as live:
                while True:
                    status = wait_until(job, _settled, timeout=live.tick, wake=changed)
                    if _settled(status):
                        break
                    live.update()
    except KeyboardInterrupt:
        return _interrupted(job, client, starting=waiting_to_run)
    if status is JobStatus.SUSPENDED:
        out(state_line(job, client))
        out(f"Resume it with: sparkjet resume {job.id}")
        return EXIT_OK
    try:
        job.join()
    except JobFailedError as exc:
        out(state_line(job, client))
        error(client.redact(str(exc)))
        return EXIT_FAILED
    out(state_line(job, client))
    return EXIT_OK


class LiveStatus:
    """A streaming job's progress while the command keeps it in the foreground.

    On a terminal (stdout is a TTY) one line, redrawn every half second by
    rich and gone when the job stops; otherwise a plain line every ``every``
    seconds (none when 0), for logs. Batch jobs show nothing: they have no
    micro-batches to report.
    """

    def __init__(self, job: Job, every: float) -> None:
        self.job = job
        self.every = every
        self.streaming = job.is_streaming()
        self.tty = self.streaming and sys.stdout.isatty()
        self._live: Any = None
        self._last_print = time.monotonic()
        #: How long the follower waits between updates (seconds; None: only for a status).
        self.tick: float | None = None
        if self.tty:
            self.tick = 0.5
        elif self.streaming and every > 0:
            self.tick = min(every, 1.0)

    def __enter__(self) -> LiveStatus:
        if self.tty:
            from rich.console import Console
            from rich.live import Live
            from rich.text import Text

            self._text = Text
            self._live = Live(Text(self.line()), console=Console(), transient=True,
                              auto_refresh=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def update(self) -> None:
        """Redraw the line (terminal), or print it if ``every`` seconds have passed."""
        if self._live is not None:
            self._live.update(self._text(self.line()), refresh=True)
        elif self.tick is not None and time.monotonic() - self._last_print >= self.every:
            self._last_print = time.monotonic()
            out(self.line())

    def line(self) -> str:
        """``Job 'x': batch 41, 1,200 in/s, ...``, from the job's metrics."""
        return progress_line(self.job.label, self.job.get_metrics())


def progress_line(label: str, metrics: dict[str, Any]) -> str:
    """One line of a streaming job's progress from ``Job.get_metrics()``."""
    batch = metrics.get("lastCommittedBatch", -1)
    if batch is None or batch < 0:
        return f"Job {label}: no micro-batch committed yet"
    parts = [
        f"batch {batch:,}",
        f"{metrics.get('inputRate', 0.0):,.0f} in/s",
        f"{metrics.get('processingRate', 0.0):,.0f} processed/s",
        f"last batch {metrics.get('lastBatchDurationMillis', 0):,} ms",
    ]
    stages: dict[str, dict[str, Any]] = metrics.get("stages", {})
    lags = {name: int(s["sourceLag"]) for name, s in stages.items() if "sourceLag" in s}
    if len(lags) == 1:
        parts.append(f"lag {next(iter(lags.values())):,}")
    elif lags:
        parts.append("lag " + ", ".join(f"{name} {lag:,}" for name, lag in lags.items()))
    keys = sum(int(s.get("snapshotKeys", 0)) for s in stages.values())
    size = sum(int(s.get("snapshotBytes", 0)) for s in stages.values())
    if any("snapshotKeys" in s for s in stages.values()):
        parts.append(f"state {keys:,} keys, {_size(size)}")
    dead = sum(int(s.get("deadLetters", 0)) for s in stages.values())
    if dead:
        parts.append(f"{dead:,} dead letters")
    for name, stage in stages.items():
        if "watermark" in stage:
            mark = int(stage["watermark"])
            shown = format_time_millis(mark) if mark > 0 else "none yet"
            parts.append(f"{name} watermark {shown}")
            if stage.get("lateEventsDropped"):
                parts.append(f"{name} late {int(stage['lateEventsDropped']):,}")
    return f"Job {label}: " + ", ".join(parts)


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} GB"


def _interrupted(job: Job, client: Client, starting: bool = False) -> int:
    """Ctrl-C or SIGTERM in the foreground: suspend a job with a guarantee, else cancel it.

    Only a streaming job can be suspended; it keeps its checkpoint, so
    ``sparkjet resume`` continues it. One that has not started running yet
    (``starting``: still SUSPENDED while it resumes here) is suspended as soon
    as it runs. A second interrupt cancels the job.
    """
    suspending = (
        job.is_streaming() and job.config.processing_guarantee is not ProcessingGuarantee.NONE
    )
    if suspending:
        error(
            f"interrupted: suspending job {job.label} after its current micro-batch "
            "(interrupt again to cancel it)"
        )
    else:
        error(f"interrupted: cancelling job {job.label}")
        with contextlib.suppress(SparkjetError):
            job.cancel()
    try:
        with _sigterm_as_interrupt():
            if suspending:
                # Not running yet: suspend it once it is.
                status = wait_until(
                    job,
                    lambda s: s in _ACTIVE or s.is_terminal()
                    or (s is JobStatus.SUSPENDED and not starting),
                )
                if status in _ACTIVE:
                    with contextlib.suppress(JobStateError):  # it stopped meanwhile
                        job.suspend()
            wait_until(
                job,
                _settled if suspending else JobStatus.is_terminal,
                timeout=INTERRUPT_GRACE_SECONDS,
            )
    except KeyboardInterrupt:
        error(f"interrupted again: cancelling job {job.label}")
        with contextlib.suppress(SparkjetError):
            job.cancel()
        with contextlib.suppress(SparkjetError):
            job.join(timeout=INTERRUPT_GRACE_SECONDS)
    out(state_line(job, client))
    if suspending and not job.is_terminal():
        out(f"Resume it with: sparkjet resume {job.id}")
    return EXIT_INTERRUPTED
