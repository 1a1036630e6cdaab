"""Fault tests of streaming jobs: killed drivers, failing sinks, bad input.

The crash tests run real driver processes (``tests/faults/stream_driver.py``)
and SIGKILL them while a producer publishes to the job's stream; each new
driver resumes the job by name. At the end the sinks must hold every item
exactly once (EXACTLY_ONCE) or at least once (AT_LEAST_ONCE), and the keyed
counts must equal a plain-Python oracle. The test that kills drivers on Spark
(a kill takes the JVM with it, or leaves it to notice) starts a JVM in each
driver; the others test the store, the take-over or the guarantee, and their
drivers run the same micro-batches in process, so they start in a second.

Every wait is bounded, so a hang fails the test instead of blocking CI, and
every process a test starts is killed in its teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.core.jobs import record as record_module
from sparkjet.errors import (
    JobFailedError,
    JobStateError,
    ProcessingGuaranteeError,
    StoreError,
)
from sparkjet.job import Job, JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.testing import StoreLocation
from tests.conftest import wait_until
from tests.faults import flaky_sink
from tests.faults.stream_driver import REJECT_EVERY

#: The jobs of the in-process tests below run on Spark, and so do the drivers of
#: the crash test that kills Spark drivers (tests/faults/stream_driver.py); the
#: other crash tests' drivers run their micro-batches in process.
pytestmark = pytest.mark.spark

FAULTS = Path(__file__).parent / "faults"
DRIVER = FAULTS / "stream_driver.py"
REPO = Path(__file__).parent.parent

N_ITEMS = 50_000
N_KEYS = 97
#: How long a driver's record may go unwritten before the take-over test's
#: processes take it for dead (the default is 20 s; on S3 a driver rewrites an
#: unchanged record every quarter of it, at least every 2 s).
STALE_AFTER = 8.0
#: The producer's items per call for drivers that run in process (see Producer).
IN_PROCESS_CHUNK = (200, 1600)


# --- helpers -----------------------------------------------------------------------




def item(i: int) -> dict[str, Any]:
    return {"seq": i, "key": f"k{i % N_KEYS}"}


def oracle_counts(n: int) -> dict[str, int]:
    return dict(Counter(item(i)["key"] for i in range(n)))


def describe_multiset(seqs: list[int], n: int) -> str:
    """Why a multiset of sequence numbers differs from ``range(n)``."""
    counts = Counter(seqs)
    missing = [i for i in range(n) if i not in counts]
    dups = {i: c for i, c in counts.items() if c > 1}
    extra = [i for i in counts if not 0 <= i < n]
    return (
        f"{len(seqs)} items: {len(missing)} missing (first {missing[:10]}), "
        f"{len(dups)} duplicated (first {sorted(dups.items())[:10]}), "
        f"{len(extra)} out of range"
    )


class Driver:
    """One driver subprocess, in a process group of its own (JVM and workers included)."""

    def __init__(self, args: list[str], log_dir: Path, index: int) -> None:
        self.out_path = log_dir / f"driver-{index}.out"
        self.err_path = log_dir / f"driver-{index}.err"
        env = dict(os.environ)
        env["PYSPARK_PYTHON"] = sys.executable
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep)
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(DRIVER), *args],
                stdout=out, stderr=err, env=env, start_new_session=True,
            )

    def lines(self) -> list[str]:
        return self.out_path.read_text().splitlines()

    def stderr_tail(self, n: int = 40) -> str:
        lines = self.err_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def wait_for_line(self, prefix: str | tuple[str, ...], timeout: float) -> str:
        def found() -> str | None:
            for line in self.lines():
                if line.startswith(prefix):
                    return line
            if self.proc.poll() is not None:
                pytest.fail(
                    f"driver exited ({self.proc.returncode}) before printing {prefix!r}:\n"
                    f"{self.stderr_tail()}"
                )
            return None

        line: str = wait_until(found, timeout, f"the driver to print {prefix!r}")
        return line

    def dump_stacks(self) -> str:
        """Ask a live driver for its threads' stacks (faulthandler on SIGUSR1).

        The stacks are written at once (a stopped driver writes none): wait up
        to 2 s for stderr to grow and then stay still for 0.1 s.
        """
        if self.proc.poll() is None:
            before = self.err_path.stat().st_size
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGUSR1)
            deadline, size = time.monotonic() + 2.0, before
            while time.monotonic() < deadline:
                time.sleep(0.1)
                now = self.err_path.stat().st_size
                if before < now == size:
                    break
                size = now
        return self.stderr_tail(80)

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def kill(self, whole_group: bool = True) -> None:
        """SIGKILL the driver (``whole_group``: with its JVM and Python workers at once).

        Otherwise only the driver's Python process is killed and its JVM is left
        to notice on its own; whatever is still alive after 15 s is killed then.
        The driver is reaped, so its pid is really gone for ``_driver_alive``.
        """
        with contextlib.suppress(ProcessLookupError):
            if whole_group:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + 15
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture
def drivers(tmp_path: Path) -> Iterator[Callable[..., Driver]]:
    """Start driver subprocesses; all of them are killed at teardown."""
    started: list[Driver] = []
    log_dir = tmp_path / "drivers"
    log_dir.mkdir()

    def start(*args: str) -> Driver:
        driver = Driver(list(args), log_dir, len(started) + 1)
        started.append(driver)
        return driver

    yield start
    for driver in started:
        if driver.proc.poll() is None:  # shown with a failing test's captured output
            print(f"--- driver {driver.out_path.stem} at teardown: {driver.lines()}")
            print(driver.dump_stacks())
        driver.kill()


class Producer(threading.Thread):
    """Publishes ``item(0..n-1)`` to a stream in many small ``publish_all`` calls.

    It publishes at most ``allowance`` items (raise it with :meth:`allow`), so
    the test can keep items back until its kills are done and the job always
    has new data while a kill waits for committed micro-batches. Each call
    publishes a random number of items in ``chunk``, every 0.1 to 0.4 s: the
    default paces a driver on Spark, whose JVM takes seconds to start (a
    driver's share then arrives while it starts and runs); drivers that run
    their micro-batches in process start in a second and take
    :data:`IN_PROCESS_CHUNK`.
    """

    def __init__(self, stream: Any, n: int, rng: random.Random, allowance: int,
                 chunk: tuple[int, int] = (50, 400)) -> None:
        super().__init__(name="stream-fault-producer", daemon=True)
        self.stream = stream
        self.n = n
        self.rng = rng
        self.allowance = allowance
        self.chunk = chunk
        self.stop = threading.Event()
        self.published = 0
        self.error: BaseException | None = None

    def allow(self, allowance: int) -> None:
        self.allowance = max(self.allowance, min(allowance, self.n))

    def run(self) -> None:
        try:
            while self.published < self.n and not self.stop.is_set():
                size = min(self.rng.randint(*self.chunk), self.allowance - self.published)
                if size > 0:
                    self.stream.publish_all(
                        [item(i) for i in range(self.published, self.published + size)]
                    )
                    self.published += size
                self.stop.wait(self.rng.uniform(0.1, 0.4))
        except BaseException as exc:  # reported by the test
            self.error = exc


@pytest.fixture
def producers() -> Iterator[list[Producer]]:
    started: list[Producer] = []
    yield started
    for producer in started:
        producer.stop.set()
        producer.join(timeout=30)


def last_committed(job: Job) -> int:
    """The last committed micro-batch, as the driver's record reports it."""
    return int(job.get_metrics().get("lastCommittedBatch", -1))


def caught_up(client: sparkjet.Client, job_id: str) -> bool:
    """Whether the job's last committed micro-batch ends at the end of stream ``events``.

    Sinks commit before the checkpoint commit is written, so their output is
    then complete.
    """
    from sparkjet.core.state.checkpoint import Checkpoint

    checkpoint = Checkpoint(client.store, client.store.layout.checkpoint(job_id, "checkpoint"))
    last = checkpoint.last_commit()
    record = checkpoint.commit_record(last) if last >= 0 else None
    if record is None:
        return False
    ends = record.ends["events"]
    return bool(ends == client.store.stream_log("events").end_offsets())


def wait_settled(size: Callable[[], int], at_least: int, timeout: float) -> int:
    """Wait until ``size()`` is at least ``at_least`` and has not changed for 2 s."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while True:
        now = size()
        if now != last:
            last, since = now, time.monotonic()
        elif now >= at_least and time.monotonic() - since >= 2.0:
            return now
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s: size {now}, wanted >= {at_least} and stable")
        time.sleep(0.25)


# --- 1 and 2: SIGKILLed drivers ----------------------------------------------------------


def driver_args(
    location: StoreLocation, name: str, guarantee: str, marker: Path, engine: str,
    stale_after: float | None = None,
) -> list[str]:
    """The driver subprocess's arguments for a job ``name`` in the store at ``location``.

    ``engine``: ``spark``, or ``in-process`` where the test's promise is not
    Spark's (no JVM to start in each driver). ``stale_after``: the drivers'
    :data:`~sparkjet.core.jobs.record.STALE_AFTER_SECONDS`, when the test sets it.
    """
    args = [location.url, name, guarantee, "--interval", "200",
            "--store-options", json.dumps(location.options), "--marker", str(marker),
            "--engine", engine]
    if stale_after is not None:
        args += ["--stale-after", str(stale_after)]
    return args


def run_crash_scenario(
    guarantee: str,
    location: StoreLocation,
    drivers: Callable[..., Driver],
    producers: list[Producer],
    kills: list[str],
    marker: Path,
    engine: str,
) -> tuple[list[int], dict[str, int], str]:
    """Run the job through ``kills`` SIGKILLs; returns (seqs in list, map, diagnostics).

    ``engine``: what runs the drivers' micro-batches (:func:`driver_args`).

    Kill kinds: ``"committed"`` kills at a random moment after at least two new
    micro-batches committed (one, when the job has caught up with what the
    producer may publish so far); ``"window"`` kills the driver while it is paused
    after a batch's sinks committed and before its checkpoint commit (the
    replayed batch has already landed); ``"early"`` kills at a random moment in
    the first 1.5 s after ``resume()`` returned (restart, replay of the planned
    batch, first batches).
    """
    seed = int(os.environ.get("SPARKJET_FAULT_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"fault seed {seed} (set SPARKJET_FAULT_SEED to repeat)")
    client = sparkjet.connect(store=location.connect_overrides())
    stream = client.get_stream("events", partitions=2)
    seen = client.get_list("seen")
    name = f"faults-{guarantee.lower()}"
    args = driver_args(location, name, guarantee, marker, engine)

    # The producer is held to an allowance: a quarter of the items for the first
    # driver, nine tenths in equal steps as the next drivers resume, the rest once
    # the last one runs. So every driver has new data to work on while it lives.
    chunk = IN_PROCESS_CHUNK if engine == "in-process" else (50, 400)
    producer = Producer(stream, N_ITEMS, rng, allowance=N_ITEMS // 4, chunk=chunk)
    producers.append(producer)
    driver = drivers(*args)
    line = driver.wait_for_line("SUBMITTED", 120)
    job_id = line.split()[1]
    job = client.get_jet().get_job(job_id)
    assert job is not None
    producer.start()
    log = [f"seed {seed}"]
    started = time.monotonic()

    for n, kind in enumerate(kills, 1):
        base = last_committed(job)
        if kind == "committed":
            # Two more committed micro-batches; or one, if the producer is held
            # back at its allowance and the job has caught up (it idles then).
            def progressed(b: int = base) -> bool:
                done = last_committed(job)
                return done >= b + 2 or (done >= b + 1 and caught_up(client, job_id))

            wait_until(progressed, 120, f"committed micro-batches before kill {n} (from {base})",
                       interval=0.05)
            time.sleep(rng.uniform(0.0, 0.8))
        elif kind == "early":
            time.sleep(rng.uniform(0.0, 1.5))
        elif kind == "window":
            # This driver was started with --pause-at: wait for the pause.
            driver.wait_for_line("PAUSED", 120)
        else:  # pragma: no cover - test bug
            raise AssertionError(kind)
        whole_group = rng.random() < 0.5
        driver.kill(whole_group=whole_group)
        log.append(
            f"kill {n} ({kind}, {'group' if whole_group else 'driver only'}) at "
            f"{time.monotonic() - started:.1f} s: record says batch {last_committed(job)}, "
            f"list has {seen.size()}, published {producer.published}"
        )
        assert job.status is JobStatus.SUSPENDED, f"after kill {n}: {job.status}"
        following = kills[n] if n < len(kills) else None
        extra = []
        if following == "window":
            extra = ["--pause-at", str(last_committed(job) + 2)]
        driver = drivers(*args, *extra)
        driver.wait_for_line("RESUMED", 120)
        producer.allow(N_ITEMS * 9 // 10 * (n + 1) // len(kills))

    producer.allow(N_ITEMS)
    producer.join(timeout=120)
    assert not producer.is_alive(), "the producer did not finish"
    assert producer.error is None, f"the producer failed: {producer.error!r}"
    try:
        # resume() returns before the job thread has started Spark: RUNNING comes later.
        wait_until(lambda: job.status is JobStatus.RUNNING, 120, "the last driver to run")
        wait_until(lambda: caught_up(client, job_id), 120, "the job to commit the whole stream")
    except BaseException:
        print("\n".join(log))
        print(driver.dump_stacks())
        raise
    log.append(f"settled at {time.monotonic() - started:.1f} s, batch {last_committed(job)}")
    seqs = delivered(client, name)
    counts = dict(client.get_map("counts").entry_set())
    return seqs, counts, "\n".join(log)


def delivered(client: sparkjet.Client, name: str) -> list[int]:
    """The seqs of list ``seen`` and of job ``name``'s dead letters (the stage ``checked``).

    Each item is in one or the other: the dead letters are exactly the items
    the stage rejects.
    """
    seen = [entry["seq"] for entry in client.get_list("seen").get_all()]
    letters = client.get_stream(f"{name}.dead-letters")
    found = [letter for p in range(len(letters.end_offsets())) for letter in letters.read(p)]
    wrong = [d for d in found if d["stage"] != "checked" or d["item"]["seq"] % REJECT_EVERY]
    assert not wrong, f"dead letters of items the stage does not reject: {wrong[:3]}"
    assert not [s for s in seen if s % REJECT_EVERY == 0], "a rejected item reached 'seen'"
    # (The source feeds three branches, so the letters cannot say their offsets.)
    assert all(d["job"] == name and d["batch"] is not None for d in found)
    return seen + [d["item"]["seq"] for d in found]


@pytest.mark.slow
def test_exactly_once_survives_sigkilled_drivers(
    store_url: str, drivers: Callable[..., Driver], producers: list[Producer]
) -> None:
    """Drivers on Spark: a kill takes the driver's JVM and Python workers with it, or
    leaves them to notice on their own."""
    seqs, counts, log = run_crash_scenario(
        "EXACTLY_ONCE", StoreLocation(store_url), drivers, producers,
        kills=["committed", "window", "early", "committed"], marker=Path(f"{store_url}.paused"),
        engine="spark",
    )
    assert_exactly_once(seqs, counts, log)
    assert_windows_once(StoreLocation(store_url))
    assert_joined_once(StoreLocation(store_url))
    assert_pairs_once(StoreLocation(store_url))
    assert_enriched_once(StoreLocation(store_url))


def assert_windows_once(location: StoreLocation) -> None:
    """Every complete tumbling window of the driver's windowed stage in list ``windows`` once.

    The windows up to the watermark after the last item: their ends at most
    ``N_ITEMS - 1 - lag``; each holds ``WINDOW`` items.
    """
    from tests.faults.stream_driver import WINDOW, WINDOW_LAG

    client = sparkjet.connect(store=location.connect_overrides())
    due = (N_ITEMS - 1 - WINDOW_LAG) // WINDOW
    windows = client.get_list("windows")
    # The last windows are emitted by a batch without input, after the last data.
    wait_until(lambda: windows.size() >= due, 120, f"{due} windows")
    got = Counter((w.start, w.end, w.result, w.is_early) for w in windows.get_all())
    want = Counter((i * WINDOW, (i + 1) * WINDOW, WINDOW, False) for i in range(due))
    assert got == want, (f"windows not each once: extra {got - want}, missing {want - got}")


def assert_joined_once(location: StoreLocation) -> None:
    """Every item once in list ``joined``, with the label of its key (None past ``LABELLED``)."""
    from tests.faults.stream_driver import LABELLED

    client = sparkjet.connect(store=location.connect_overrides())
    joined = client.get_list("joined")
    wait_until(lambda: joined.size() >= N_ITEMS, 60, f"{N_ITEMS} joined items")
    got = Counter(tuple(pair) for pair in joined.get_all())
    labels = {f"k{i}": f"label-{i}" for i in range(LABELLED)}
    want = Counter((i, labels.get(item(i)["key"])) for i in range(N_ITEMS))
    extra, missing = list((got - want).items())[:5], list((want - got).items())[:5]
    assert got == want, f"the hash join's output is not each item once: {extra=} {missing=}"


def assert_enriched_once(location: StoreLocation) -> None:
    """Every item once in list ``enriched``, with the service's answer ``seq * 3``."""
    client = sparkjet.connect(store=location.connect_overrides())
    enriched = client.get_list("enriched")
    wait_until(lambda: enriched.size() >= N_ITEMS, 60, f"{N_ITEMS} enriched items")
    got = Counter(tuple(pair) for pair in enriched.get_all())
    want = Counter((i, i * 3) for i in range(N_ITEMS))
    extra, missing = list((got - want).items())[:5], list((want - got).items())[:5]
    assert got == want, f"the async enrichment is not each item once: {extra=} {missing=}"


def assert_pairs_once(location: StoreLocation) -> None:
    """The interval join's pairs and outer rows once each, none missing below the watermark.

    Even item ``i`` pairs with ``i + 1``, except where ``i + 1`` ends in 1 (left
    out): there ``(i, None)`` once the watermark passed ``i + 1``. Every row
    seen is once; all those of items well below the last watermark are there.
    """
    from tests.faults.stream_driver import WINDOW_LAG

    client = sparkjet.connect(store=location.connect_overrides())
    settled = N_ITEMS - 2 - WINDOW_LAG - 10

    def expected(i: int) -> tuple[int, int | None]:
        return (i, None) if (i + 1) % 10 == 1 else (i, i + 1)

    want = Counter(expected(i) for i in range(0, settled, 2))
    rows = client.get_list("pairs")
    wait_until(lambda: len(want - Counter(tuple(r) for r in rows.get_all())) == 0, 60,
               "the interval join's rows")
    got = Counter(tuple(r) for r in rows.get_all())
    twice = [row for row, n in got.items() if n > 1]
    wrong = [row for row in got if row != expected(row[0])]
    assert not twice and not wrong, f"interval join rows twice {twice[:5]}, wrong {wrong[:5]}"


def assert_exactly_once(seqs: list[int], counts: dict[str, int], log: str) -> None:
    """Every item once in the list, and the keyed counts equal to the plain-Python oracle."""
    print(log)
    assert Counter(seqs) == Counter(range(N_ITEMS)), (
        f"list 'seen' is not every item exactly once: {describe_multiset(seqs, N_ITEMS)}\n{log}"
    )
    oracle = oracle_counts(N_ITEMS)
    wrong = {k: (counts.get(k), v) for k, v in oracle.items() if counts.get(k) != v}
    assert counts == oracle, f"map 'counts' differs (key: (got, want)): {wrong}\n{log}"


@pytest.mark.slow
@pytest.mark.storage
def test_exactly_once_survives_sigkilled_drivers_on_s3(
    s3_location: StoreLocation, tmp_path: Path, drivers: Callable[..., Driver],
    producers: list[Producer],
) -> None:
    """The store on S3 (moto): the job's driver in one process, the publisher in this one.

    The store is what is tested: the drivers run their micro-batches in process.
    """
    location = s3_location.fresh()
    seqs, counts, log = run_crash_scenario(
        "EXACTLY_ONCE", location, drivers, producers,
        kills=["committed", "window", "committed"], marker=tmp_path / "paused",
        engine="in-process",
    )
    assert_exactly_once(seqs, counts, log)
    assert_windows_once(location)
    assert_joined_once(location)
    assert_pairs_once(location)
    assert_enriched_once(location)


@pytest.mark.slow
@pytest.mark.storage
def test_a_publisher_and_a_job_in_two_processes_on_gcs(
    gcs_location: StoreLocation, tmp_path: Path, drivers: Callable[..., Driver],
    producers: list[Producer],
) -> None:
    """The store on GCS (fake-gcs-server): one driver killed and resumed on the way.

    The store is what is tested: the drivers run their micro-batches in process.
    """
    seqs, counts, log = run_crash_scenario(
        "EXACTLY_ONCE", gcs_location.fresh(), drivers, producers,
        kills=["committed"], marker=tmp_path / "paused", engine="in-process",
    )
    assert_exactly_once(seqs, counts, log)


@pytest.mark.slow
@pytest.mark.storage
def test_a_paused_driver_taken_over_is_fenced_and_stops_itself(
    s3_location: StoreLocation, tmp_path: Path, drivers: Callable[..., Driver],
    producers: list[Producer], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Driver A is SIGSTOPped past the stale time; B resumes the job; A continues with
    SIGCONT, finds itself fenced and exits without writing; no item lost or doubled.

    The take-over is what is tested: the drivers run their micro-batches in
    process, and every process here takes a record unwritten for
    ``STALE_AFTER`` s (not 20) for a dead driver's.
    """
    monkeypatch.setattr(record_module, "STALE_AFTER_SECONDS", STALE_AFTER)
    location = s3_location.fresh()
    seed = int(os.environ.get("SPARKJET_FAULT_SEED", random.randrange(1 << 30)))
    print(f"fault seed {seed} (set SPARKJET_FAULT_SEED to repeat)")
    client = sparkjet.connect(store=location.connect_overrides())
    stream = client.get_stream("events", partitions=2)
    args = driver_args(location, "fenced", "EXACTLY_ONCE", tmp_path / "paused", "in-process",
                       stale_after=STALE_AFTER)
    producer = Producer(stream, N_ITEMS, random.Random(seed), allowance=N_ITEMS // 3,
                        chunk=IN_PROCESS_CHUNK)
    producers.append(producer)
    a = drivers(*args)
    job_id = a.wait_for_line("SUBMITTED", 120).split()[1]
    job = client.get_jet().get_job(job_id)
    assert job is not None
    producer.start()
    wait_until(lambda: last_committed(job) >= 2, 120, "A's first micro-batches", interval=0.05)

    os.killpg(a.proc.pid, signal.SIGSTOP)
    paused_at = time.monotonic()
    try:
        wait_until(lambda: job.status is JobStatus.SUSPENDED, STALE_AFTER + 60, "A to look dead")
        assert a.proc.poll() is None  # stopped, not dead: only its heartbeat went stale
        b = drivers(*args)
        b.wait_for_line("RESUMED", 120)
        producer.allow(N_ITEMS * 2 // 3)
        base = last_committed(job)
        wait_until(lambda: last_committed(job) >= base + 2, 120, "B's micro-batches")
    finally:
        os.killpg(a.proc.pid, signal.SIGCONT)
    print(f"A was stopped for {time.monotonic() - paused_at:.1f} s")
    a.wait_for_line("FENCED", 120)
    assert a.proc.wait(timeout=60) == 4
    assert "was fenced off" in a.stderr_tail() and "at epoch 1" in a.stderr_tail()

    producer.allow(N_ITEMS)
    producer.join(timeout=180)
    assert producer.error is None and not producer.is_alive()
    wait_until(lambda: caught_up(client, job_id), 180, "B to commit the whole stream")
    record = client.get_jet().records.read(job_id) or {}
    assert record["epoch"] == 1 and b.proc.poll() is None
    seqs = delivered(client, "fenced")
    counts = dict(client.get_map("counts").entry_set())
    assert_exactly_once(seqs, counts, f"seed {seed}")


@pytest.mark.slow
def test_at_least_once_survives_sigkilled_drivers(
    store_url: str, drivers: Callable[..., Driver], producers: list[Producer]
) -> None:
    seqs, counts, log = run_crash_scenario(
        "AT_LEAST_ONCE", StoreLocation(store_url), drivers, producers,
        kills=["committed", "window", "committed"], marker=Path(f"{store_url}.paused"),
        engine="in-process",
    )
    print(log)
    present = set(seqs)
    missing = [i for i in range(N_ITEMS) if i not in present]
    assert not missing, f"AT_LEAST_ONCE lost items: {describe_multiset(seqs, N_ITEMS)}\n{log}"
    oracle = oracle_counts(N_ITEMS)
    low = {k: (counts.get(k), v) for k, v in oracle.items() if (counts.get(k) or 0) < v}
    assert not low, f"map 'counts' below the oracle (key: (got, want)): {low}\n{log}"
    # The design replays a batch from its recorded offsets and sinks skip what
    # landed, so AT_LEAST_ONCE is exact too; say so when it is not.
    duplicates = len(seqs) - len(present)
    over = {k: (counts[k], v) for k, v in oracle.items() if counts.get(k, 0) > v}
    print(f"AT_LEAST_ONCE: {duplicates} duplicate items in the list, "
          f"{len(over)} keys counted too high")


@pytest.mark.slow
def test_two_processes_resuming_a_dead_drivers_job_at_once(
    store_url: str, drivers: Callable[..., Driver], producers: list[Producer]
) -> None:
    """Two processes resume the same job after its driver died: one runs it, once.

    Exactly one resume() may win (the other is refused with JobStateError), and
    the output must still be every item exactly once.
    """
    n_items = 20_000
    rng = random.Random(int(os.environ.get("SPARKJET_FAULT_SEED", random.randrange(1 << 30))))
    client = sparkjet.connect(store={"url": store_url})
    stream = client.get_stream("events", partitions=2)
    seen = client.get_list("seen")
    name = "faults-concurrent-resume"
    args = driver_args(StoreLocation(store_url), name, "EXACTLY_ONCE",
                       Path(f"{store_url}.paused"), "in-process")
    producer = Producer(stream, n_items, rng, allowance=n_items // 2, chunk=IN_PROCESS_CHUNK)
    producers.append(producer)
    first = drivers(*args)
    job_id = first.wait_for_line("SUBMITTED", 120).split()[1]
    job = client.get_jet().get_job(job_id)
    assert job is not None
    producer.start()
    wait_until(lambda: last_committed(job) >= 0, 120, "a committed micro-batch", interval=0.05)
    time.sleep(rng.uniform(0.0, 0.8))
    first.kill()
    assert job.status is JobStatus.SUSPENDED
    a, b = drivers(*args), drivers(*args)
    outcomes = [d.wait_for_line(("RESUMED", "REFUSED"), 120).split()[0] for d in (a, b)]
    producer.allow(n_items)
    producer.join(timeout=120)
    assert not producer.is_alive() and producer.error is None, producer.error
    try:
        wait_until(lambda: job.status is JobStatus.RUNNING, 120, "a driver to run the job")
        wait_until(lambda: caught_up(client, job_id), 120, "the job to commit the whole stream")
        wait_settled(seen.size, n_items - len(range(0, n_items, REJECT_EVERY)), 30)
    except BaseException:
        print(a.dump_stacks(), b.dump_stacks(), sep="\n")
        raise
    seqs = delivered(client, name)
    counts = dict(client.get_map("counts").entry_set())
    running = [d for d in (a, b) if d.proc.poll() is None]
    assert Counter(seqs) == Counter(range(n_items)), (
        f"resumes {outcomes}: list 'seen' is not every item exactly once: "
        f"{describe_multiset(seqs, n_items)}"
    )
    assert counts == oracle_counts(n_items), f"resumes {outcomes}: map 'counts' is wrong"
    assert sorted(outcomes) == ["REFUSED", "RESUMED"], (
        f"both processes resumed the job ({outcomes}); {len(running)} still run it"
    )


# --- 3: a sink whose commit fails once -------------------------------------------------


def _committed(job: Job) -> int:
    return int(job.get_metrics().get("lastCommittedBatch", -1))


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before", "after"])
def test_sink_commit_failing_once_suspends_and_resume_replays(
    client: sparkjet.Client, tmp_path: Path, cancel_at_end: list[Job], when: str
) -> None:
    """The sink's commit of batch 2 raises once ("after": once its items landed).

    The job suspends naming the sink's stage; resume() replays batch 2 from its
    recorded offsets and the list ends with every item exactly once.
    """
    flaky_sink.register(client)
    # One partition: each publish_all is one chunk, so it lands in one micro-batch whole.
    stream = client.get_stream("events", partitions=1)
    marker = str(tmp_path / "flaky-failed")
    p = Pipeline.create()
    (
        p.read_from(StreamSource("events")).map(lambda e: e["seq"]).set_name("seqs")
        .write_to(flaky_sink.FlakyListSink("out", marker, fail_batch=2, when=when))
        .set_name("flaky-out")
    )
    job = client.get_jet().submit(p, JobConfig(
        name="flaky", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=100, suspend_on_failure=True,
    ))
    cancel_at_end.append(job)
    out = client.get_list("out")
    sent = 0
    for batch in range(3):  # one publish per micro-batch: batches 0, 1 and 2
        stream.publish_all([{"seq": i} for i in range(sent, sent + 100)])
        sent += 100
        if batch < 2:
            wait_until(lambda b=batch: _committed(job) >= b, 60, f"micro-batch {batch}")
    wait_until(lambda: job.status is JobStatus.SUSPENDED, 60, "the job to suspend")
    assert os.path.exists(marker), "the sink never failed"
    cause = job.get_suspension_cause()
    assert "flaky-out" in cause, cause
    assert "injected commit failure" in cause, cause
    landed = out.get_all()
    if when == "before":
        assert sorted(landed) == list(range(200)), "batch 2 must not land before the resume"
    else:
        assert sorted(landed) == list(range(300))

    stream.publish_all([{"seq": i} for i in range(sent, sent + 100)])  # while suspended
    sent += 100
    job.resume()
    wait_until(lambda: job.status is JobStatus.RUNNING, 30, "the job to run again")
    wait_settled(out.size, sent, 60)
    items = out.get_all()
    assert Counter(items) == Counter(range(sent)), describe_multiset(items, sent)
    assert job.status is JobStatus.RUNNING


@pytest.mark.slow
def test_resume_right_after_the_status_reads_suspended_replays_the_failed_batch(
    client: sparkjet.Client, tmp_path: Path, cancel_at_end: list[Job]
) -> None:
    """A user function fails once; resume() as soon as SUSPENDED shows is accepted.

    The failed batch is replayed from its recorded offsets: every item lands once.
    """
    marker = str(tmp_path / "failed-once")

    def fail_once_on_13(x: int) -> int:
        if x == 13:
            with contextlib.suppress(FileExistsError):
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                raise ValueError("thirteen, once")
        return x

    stream = client.get_stream("events", partitions=2)
    p = Pipeline.create()
    (
        p.read_from(StreamSource("events")).map(fail_once_on_13).set_name("once")
        .write_to(Pipeline.to_list("out"))
    )
    job = client.get_jet().submit(p, JobConfig(
        name="fails-once", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=100, suspend_on_failure=True,
    ))
    cancel_at_end.append(job)
    stream.publish_all(range(10))
    wait_until(lambda: _committed(job) >= 0, 60, "a first good micro-batch")
    stream.publish_all(range(10, 30))
    deadline = time.monotonic() + 60
    while job.status is not JobStatus.SUSPENDED:  # no sleep: act the moment it shows
        assert time.monotonic() < deadline, "the job did not suspend"
    assert "once" in job.get_suspension_cause()
    job.resume()  # must not say "still stopping" once the status reads SUSPENDED
    wait_until(lambda: job.status is JobStatus.RUNNING, 30, "the job to run again")
    wait_settled(client.get_list("out").size, 30, 30)
    items = client.get_list("out").get_all()
    assert Counter(items) == Counter(range(30)), describe_multiset(items, 30)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["list", "stream"])
def test_two_sinks_of_one_job_into_the_same_structure_both_land(
    client: sparkjet.Client, cancel_at_end: list[Job], kind: str
) -> None:
    """Two branches writing one list (or stream): each micro-batch commits both.

    Both sinks commit the same batch id; an idempotence check keyed only by
    job and batch would take the second commit for a replay of the first.
    """
    stream = client.get_stream("events", partitions=2)

    def sink() -> Any:
        return Pipeline.to_list("out") if kind == "list" else Pipeline.to_stream("out")

    p = Pipeline.create()
    events = p.read_from(StreamSource("events"))
    events.map(lambda i: ("a", i)).set_name("a").write_to(sink()).set_name("to-a")
    events.map(lambda i: ("b", i)).set_name("b").write_to(sink()).set_name("to-b")
    job = client.get_jet().submit(p, JobConfig(
        name="two-sinks", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=100,
    ))
    cancel_at_end.append(job)
    stream.publish_all(range(50))
    wait_until(lambda: _committed(job) >= 0, 60, "the first micro-batch")
    stream.publish_all(range(50, 80))
    wait_until(lambda: _committed(job) >= 1, 60, "the second micro-batch")

    def landed() -> list[Any]:
        if kind == "list":
            return client.get_list("out").get_all()
        return client.get_stream("out").read_all()

    wait_settled(lambda: len(landed()), 80, 30)
    got = Counter(landed())
    want = Counter([("a", i) for i in range(80)] + [("b", i) for i in range(80)])
    assert got == want, (
        f"{sum(got.values())} items; branch a: {sum(1 for t, _ in got if t == 'a')}, "
        f"branch b: {sum(1 for t, _ in got if t == 'b')} (80 each expected)"
    )


def test_commit_once_skips_a_batch_that_already_landed(client: sparkjet.Client) -> None:
    """A replayed micro-batch commit (same token) lands once, as a crash after commit needs."""
    log = client.store.list_log("replayed")
    first = log.commit_once("append", [("items", [1, 2])], token="job.b5", writer="job")
    again = log.commit_once("append", [("items", [1, 2])], token="job.b5", writer="job")
    assert first is not None
    assert again is None, "the replayed commit of batch 5 landed a second time"
    assert client.get_list("replayed").get_all() == [1, 2]


@pytest.mark.parametrize("kind", ["list", "map", "stream"])
def test_sink_commit_replayed_for_the_same_batch_lands_once(
    client: sparkjet.Client, kind: str
) -> None:
    """What a driver that died after a sink's commit and before the checkpoint's needs."""
    from sparkjet.plugin import JobContext, TaskContext

    if kind == "stream":
        client.get_stream("out", partitions=2)
    sink = {"list": Pipeline.to_list, "map": Pipeline.to_map, "stream": Pipeline.to_stream}[kind]
    target = sink("out")
    items = [(f"k{i}", i) for i in range(10)]
    for batch in (0, 1, 1):  # batch 1 is committed, then replayed
        context = JobContext(
            job_id="job-1", job_name=None, store=client.store, parallelism=2,
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE, batch_id=batch,
        )
        task = TaskContext("job-1", 0, client.store)
        state = target.prepare(context)
        chunk = items[batch * 5 : batch * 5 + 5]
        messages = [target.write(state, iter(chunk[:3]), task),
                    target.write(state, iter(chunk[3:]), task)]
        target.commit(state, messages, context)
    if kind == "list":
        assert Counter(client.get_list("out").get_all()) == Counter(items)
    elif kind == "map":
        assert dict(client.get_map("out").entry_set()) == dict(items)
        # An upsert replayed is invisible in the map; its log must still hold one record.
        assert len(client.store.map_log("out").sequences()) == 2
    else:
        assert Counter(client.get_stream("out").read_all()) == Counter(items)


# --- 4: bad input ---------------------------------------------------------------------


def test_exactly_once_into_the_logger_is_refused_at_submit(client: sparkjet.Client) -> None:
    p = Pipeline.create()
    p.read_from(StreamSource("events")).write_to(Pipeline.to_logger()).set_name("log-it")
    with pytest.raises(ProcessingGuaranteeError) as info:
        client.get_jet().submit(
            p, JobConfig(processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE)
        )
    message = str(info.value)
    assert "log-it" in message
    assert "logger" in message
    assert "EXACTLY_ONCE" in message
    assert "NONE" in message and "AT_LEAST_ONCE" in message  # what it supports
    assert info.value.stage == "log-it"
    assert len(info.value.offenders) == 1
    assert client.get_jet().get_jobs() == []


def test_publishing_to_a_missing_stream_names_it(client: sparkjet.Client) -> None:
    with pytest.raises(StoreError, match="'nope'"):
        client.get_stream("nope").publish(1)
    with pytest.raises(StoreError, match="'nope'"):
        client.get_stream("nope").publish_all([1, 2])


def _stream_job(client: sparkjet.Client, name: str, suspend_on_failure: bool) -> Job:
    """events -> map 'explode' (raises on 13) -> list 'out'."""

    def explode_on_13(x: int) -> int:  # nested: shipped by value to the executors
        if x == 13:
            raise ValueError("thirteen is unlucky")
        return x

    # One partition: a publish is then one chunk, so 13 and the items published
    # with it fall in one micro-batch (two partitions are written one by one).
    client.get_stream("events", partitions=1)
    p = Pipeline.create()
    (
        p.read_from(StreamSource("events")).map(explode_on_13).set_name("explode")
        .write_to(Pipeline.to_list("out"))
    )
    return client.get_jet().submit(p, JobConfig(
        name=name, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=100, suspend_on_failure=suspend_on_failure,
    ))


def test_resume_of_a_running_job_is_refused(
    client: sparkjet.Client, cancel_at_end: list[Job]
) -> None:
    job = _stream_job(client, "running", suspend_on_failure=False)
    cancel_at_end.append(job)
    wait_until(lambda: job.status is JobStatus.RUNNING, 60, "the job to run")
    with pytest.raises(JobStateError, match="RUNNING"):
        job.resume()
    # Also through a handle from the store, as another process would hold it.
    other = sparkjet.connect(store={"url": str(client.store.url)}).get_jet()
    remote = other.get_job(job.id)
    assert remote is not None
    with pytest.raises(JobStateError, match="RUNNING"):
        remote.resume()
    assert job.status is JobStatus.RUNNING


def _publish_good_then_poison(client: sparkjet.Client, job: Job) -> None:
    stream = client.get_stream("events")
    wait_until(lambda: job.status is JobStatus.RUNNING, 60, "the job to run")
    stream.publish_all(range(10))
    wait_until(lambda: _committed(job) >= 0, 60, "a first good micro-batch")
    wait_until(lambda: client.get_list("out").size() == 10, 30, "the good items")
    stream.publish_all(range(10, 20))  # 13 raises


def test_user_function_failing_mid_stream_fails_the_job(
    client: sparkjet.Client, cancel_at_end: list[Job]
) -> None:
    job = _stream_job(client, "fails", suspend_on_failure=False)
    cancel_at_end.append(job)
    _publish_good_then_poison(client, job)
    with pytest.raises(JobFailedError) as info:
        job.join(timeout=60)
    assert info.value.stage == "explode"
    assert "explode" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError), repr(info.value.__cause__)
    assert "thirteen" in str(info.value.__cause__)
    assert job.status is JobStatus.FAILED
    assert "explode" in (job.get_failure() or "")
    assert sorted(client.get_list("out").get_all()) == list(range(10))


def test_user_function_failing_mid_stream_suspends_the_job(
    client: sparkjet.Client, cancel_at_end: list[Job]
) -> None:
    job = _stream_job(client, "suspends", suspend_on_failure=True)
    cancel_at_end.append(job)
    _publish_good_then_poison(client, job)
    wait_until(lambda: job.status is JobStatus.SUSPENDED, 60, "the job to suspend")
    cause = job.get_suspension_cause()
    assert "explode" in cause, cause
    assert "thirteen is unlucky" in cause, cause
    # The same cause is visible from another process's handle.
    other = sparkjet.connect(store={"url": str(client.store.url)}).get_jet().get_job(job.id)
    assert other is not None
    assert other.status is JobStatus.SUSPENDED
    assert "explode" in other.get_suspension_cause()
    assert sorted(client.get_list("out").get_all()) == list(range(10))
