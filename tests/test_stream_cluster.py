"""A streaming job on a real Spark standalone cluster (127.0.0.1) that loses a worker.

One master for the module; each test starts two workers (1 core each), a
driver process (``tests/cluster/stream_driver.py``) whose application gets one
executor per worker, and a streaming job ``events -> group_by(key) ->
aggregate(counting()) -> map "counts"`` with EXACTLY_ONCE (and a branch hash-joining
each item with a label from a table, upper-casing it by an async service call and
counting per label into map "label_counts"). The test publishes
items from its own process, follows the job through its record in the store
and SIGKILLs a worker (with its executor and the executor's Python processes)
while batches run:

- auto-scaling on: Spark retries the lost tasks on the executor left, the job
  stays RUNNING, a replacement worker joins, and the counts end exact;
- auto-scaling off: the job SUSPENDS with a cause naming the lost executor;
  after a replacement worker joins, ``resume()`` from the test's client (a
  control request to the live driver) continues it and the counts end exact.

Every wait is bounded and every process is killed (by process group) in the
teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.job import Job, JobStatus
from sparkjet.testing import StoreLocation
from tests.cluster.standalone import Proc, StandaloneCluster, descendants
from tests.conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.spark]  # a Spark cluster of worker processes

DRIVER = Path(__file__).parent / "cluster" / "stream_driver.py"
N_KEYS = 13
ROUND = 1500


# --- helpers -----------------------------------------------------------------------




class Feed:
    """Publishes ``{"seq": i, "key": "k<i % N_KEYS>"}`` items and keeps the oracle."""

    def __init__(self, client: sparkjet.Client, stream: str = "events") -> None:
        self.stream = client.get_stream(stream)
        self.published = 0
        self._lock = threading.Lock()

    def publish(self, n: int, **extra: Any) -> list[int]:
        """Publish ``n`` items (round-robin over the partitions); returns their seqs."""
        with self._lock:
            seqs = list(range(self.published, self.published + n))
            self.stream.publish_all([{"seq": i, "key": f"k{i % N_KEYS}", **extra} for i in seqs])
            self.published += n
            return seqs

    def oracle(self) -> dict[str, int]:
        with self._lock:
            return dict(Counter(f"k{i % N_KEYS}" for i in range(self.published)))

    @contextlib.contextmanager
    def background(self, chunk: int = 100, every: float = 0.05) -> Iterator[None]:
        """Publish ``chunk`` items every ``every`` s until the block ends."""
        stop = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                while not stop.wait(every):
                    self.publish(chunk)
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)

        thread = threading.Thread(target=run, name="feed", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(30)
        assert not thread.is_alive(), "the publisher thread hangs"
        if errors:
            raise errors[0]


class Driver:
    """The driver subprocess; its stdout lines are collected by a thread."""

    def __init__(
        self, cluster: StandaloneCluster, store: str, name: str, scaling: bool, *extra: str
    ) -> None:
        argv = [sys.executable, "-u", str(DRIVER), store, cluster.url, name,
                "--auto-scaling", "on" if scaling else "off", "--interval", "300", *extra]
        self.proc: Proc = cluster.track(
            cluster.spawn(f"driver-{name}", argv, cluster.env(), stdout=subprocess.PIPE)
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, name="driver-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.popen.stdout is not None
        for raw in self.proc.popen.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())

    def line(self, prefix: str) -> str | None:
        return next((x for x in reversed(self.lines) if x.startswith(prefix)), None)

    def wait_line(self, prefix: str, timeout: float) -> str:
        def seen() -> str | None:
            if not self.proc.alive() and self.line(prefix) is None:
                pytest.fail(f"the driver exited ({self.proc.popen.returncode}) before {prefix}")
            return self.line(prefix)

        found: str = wait_until(seen, timeout, f"driver line {prefix}")
        return found

    def executors(self) -> int | None:
        """The executor count of the driver's last status line."""
        status = self.line("STATUS")
        if status is None:
            return None
        value = status.split("executors=")[1].split()[0]
        return int(value) if value.isdigit() else None

    def stack_dump(self) -> None:
        if self.proc.alive():
            os.kill(self.proc.pid, signal.SIGUSR1)
            time.sleep(1)

    def report(self) -> str:
        return "--- driver stdout ---\n" + "\n".join(self.lines[-40:])


class StatusWatch:
    """Records every status the job's record shows, polled from this process."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.seen: list[JobStatus] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            status = self.job.status
            if not self.seen or self.seen[-1] is not status:
                self.seen.append(status)
            self._stop.wait(0.1)

    def stop(self) -> list[JobStatus]:
        self._stop.set()
        self._thread.join(10)
        return self.seen


def counts(client: sparkjet.Client) -> dict[str, int]:
    return dict(client.get_map("counts").entry_set())


def label_oracle(feed: Feed) -> dict[str, int]:
    """Map ``label_counts``'s oracle: ``k<i>``'s count under ``LABEL-<i>``."""
    return {f"LABEL-{k[1:]}": v for k, v in feed.oracle().items()}


def wait_exact(client: sparkjet.Client, feed: Feed, timeout: float, what: str) -> None:
    """Wait until maps ``counts`` and ``label_counts`` (the hash join and the async
    enrichment's branch) equal their oracles; fail at once on a count above one (a
    duplicate)."""
    oracles = {"counts": feed.oracle(), "label_counts": label_oracle(feed)}

    def exact() -> bool:
        done = True
        for name, oracle in oracles.items():
            now = dict(client.get_map(name).entry_set())
            over = {k: (v, oracle.get(k, 0)) for k, v in now.items() if v > oracle.get(k, 0)}
            if over:
                pytest.fail(f"{what}: map {name!r} above the oracle (got, want): {over}")
            done = done and now == oracle
        return done

    oracle = oracles["counts"]

    total = sum(oracle.values())
    wait_until(exact, timeout, f"{what}: the map to equal the oracle ({total} items)")


def kill_mid_task(
    cluster: StandaloneCluster, victim: Proc, feed: Feed, marks: Path
) -> tuple[int, set[int]]:
    """SIGKILL ``victim`` while its executor runs a task of a micro-batch.

    Returns the seq of the item its task held and the pids that died with it.

    Two items that pause their task (one per stream partition, so both
    executors get one) are published; each creates ``<marks>/<seq>-<pid>``
    first, and the worker dies once one of those pids is its descendant. The
    paused tasks go on once it is dead (a file ``release`` beside ``marks``;
    60 s at most), and the lost task's run elsewhere does not pause.
    """
    marks.mkdir(exist_ok=True)
    release = marks.parent / f"{marks.name}-release"
    feed.publish(2, pause=60.0, mark=str(marks), release=str(release))

    def held() -> int | None:
        mine = set(descendants(victim.pid))
        for mark in marks.iterdir():
            seq, pid = map(int, mark.name.split("-"))
            if pid in mine:
                return seq
        return None

    seq: int = wait_until(held, 60, "a paused task on the victim's executor")
    pids = {victim.pid, *descendants(victim.pid)}
    cluster.kill_worker(victim)
    release.touch()
    return seq, pids


def retried_elsewhere(marks: Path, seq: int, victim_pids: set[int]) -> bool:
    """Whether the paused item ``seq`` ran again in a process outside the killed worker."""
    return any(
        int(m.name.split("-")[1]) not in victim_pids
        for m in marks.glob(f"{seq}-*")
    )


def committed(job: Job) -> int:
    return int(job.get_metrics().get("lastCommittedBatch", -1))


@contextlib.contextmanager
def explained(cluster: StandaloneCluster, driver: Driver | None = None) -> Iterator[None]:
    """On failure print the driver's output, its thread stacks and the cluster's logs."""
    try:
        yield
    except BaseException:
        if driver is not None:
            driver.stack_dump()
            print(driver.report())
        print(cluster.logs())
        raise


def phase(t0: float, what: str) -> None:
    print(f"[{time.monotonic() - t0:6.1f} s] {what}", flush=True)


# --- fixtures ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java: a Spark standalone cluster cannot start")
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start_master()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def cluster(master: StandaloneCluster) -> Iterator[StandaloneCluster]:
    """The module's master with no worker; workers and drivers a test starts die after it."""
    try:
        yield master
    finally:
        master.reset()


def start_job(
    cluster: StandaloneCluster, tmp_path: Path, name: str, scaling: bool, t0: float
) -> tuple[Driver, sparkjet.Client, Job, Proc]:
    """Two workers, the driver with both executors, the job RUNNING; returns a worker to kill."""
    victim = cluster.start_worker()
    cluster.start_worker()
    cluster.wait_workers(2, timeout=60)
    phase(t0, "2 workers registered")
    store = str(tmp_path / "store")
    driver = Driver(cluster, store, name, scaling)
    with explained(cluster, driver):
        driver.wait_line("EXECUTORS", 120)
        driver.wait_line("SUBMITTED", 30)
        phase(t0, "driver has 2 executors; job submitted")
        client = sparkjet.connect(store={"url": store})
        job: Job = wait_until(lambda: client.get_jet().get_job_by_name(name), 10, "the job record")
        wait_until(lambda: job.status is JobStatus.RUNNING, 60, "the job to run")
    return driver, client, job, victim


def finish(job: Job, driver: Driver) -> None:
    """Cancel the job through the store and let the driver exit on its own."""
    job.cancel()
    driver.wait_line("ENDED", 60)
    assert job.is_user_cancelled()


# --- tests -------------------------------------------------------------------------


def test_lost_worker_with_auto_scaling_keeps_job_running(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    driver, client, job, victim = start_job(cluster, tmp_path, "scale-on", True, t0)
    with explained(cluster, driver):
        feed = Feed(client)
        for n in range(2):
            feed.publish(ROUND)
            wait_exact(client, feed, 60, f"round {n + 1}")
        before = wait_until(lambda: committed(job) >= 1 and committed(job), 30, "2 commits")
        phase(t0, f"2 rounds exact, last committed batch {before}")

        watch = StatusWatch(client.get_jet().get_job(job.id) or job)
        marks = tmp_path / "marks"
        with feed.background():
            held, victim_pids = kill_mid_task(cluster, victim, feed, marks)
            phase(t0, f"worker SIGKILLed while its executor held item {held}")
            wait_until(lambda: driver.executors() == 1, 30, "the driver to count 1 executor")
            time.sleep(1.0)
        phase(t0, f"driver sees 1 executor; {feed.published} items published")
        wait_exact(client, feed, 90, "after the worker died (1 executor left)")
        assert retried_elsewhere(marks, held, victim_pids), "the lost task did not run again"
        phase(t0, "exact on 1 executor; the lost task ran again on the other one")

        cluster.start_worker()
        cluster.wait_workers(2, timeout=60)
        wait_until(lambda: driver.executors() == 2, 60, "the replacement executor")
        phase(t0, "replacement worker's executor registered")
        feed.publish(ROUND)
        wait_exact(client, feed, 60, "after the replacement worker joined")
        phase(t0, f"final counts exact ({feed.published} items)")

        seen = watch.stop()
        assert seen == [JobStatus.RUNNING], f"auto-scaling on: the job left RUNNING: {seen}"
        assert committed(job) > before
        assert counts(client) == feed.oracle()
        assert dict(client.get_map("label_counts").entry_set()) == label_oracle(feed)
        finish(job, driver)
        phase(t0, "job cancelled, driver ended")


def test_lost_worker_without_auto_scaling_suspends_then_resumes(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    driver, client, job, victim = start_job(cluster, tmp_path, "scale-off", False, t0)
    with explained(cluster, driver):
        feed = Feed(client)
        for n in range(2):
            feed.publish(ROUND)
            wait_exact(client, feed, 60, f"round {n + 1}")
        before = wait_until(lambda: committed(job) >= 1 and committed(job), 30, "2 commits")
        phase(t0, f"2 rounds exact, last committed batch {before}")

        marks = tmp_path / "marks"
        with feed.background():
            held, victim_pids = kill_mid_task(cluster, victim, feed, marks)
            phase(t0, f"worker SIGKILLed while its executor held item {held}")
            wait_until(lambda: job.status is JobStatus.SUSPENDED, 60, "the job to suspend")
        phase(t0, f"job SUSPENDED; {feed.published} items published")
        cause = job.get_suspension_cause()
        assert "were lost" in cause and "auto-scaling is off" in cause, cause
        assert "1 of 2" in cause, cause
        assert not job.is_terminal()
        # The batch in flight finished (its lost task ran again) before the job stopped.
        assert retried_elsewhere(marks, held, victim_pids), "the lost task did not run again"
        oracle = feed.oracle()
        assert all(v <= oracle.get(k, 0) for k, v in counts(client).items())

        cluster.start_worker()
        cluster.wait_workers(2, timeout=60)
        wait_until(lambda: driver.executors() == 2, 60, "the replacement executor")
        phase(t0, "replacement worker's executor registered")
        assert job.status is JobStatus.SUSPENDED  # nothing resumes it but a request
        job.resume()  # a control request: the live driver runs it
        wait_until(lambda: job.status is JobStatus.RUNNING, 30, "the job to resume")
        phase(t0, "job RUNNING again")
        wait_exact(client, feed, 90, "after resume")
        feed.publish(ROUND)
        wait_exact(client, feed, 60, "a round after resume")
        phase(t0, f"final counts exact ({feed.published} items)")
        assert committed(job) > before
        finish(job, driver)
        phase(t0, "job cancelled, driver ended")


@pytest.mark.storage
def test_a_snapshot_on_s3_carries_state_to_a_smaller_cluster(
    cluster: StandaloneCluster, s3_location: StoreLocation
) -> None:
    """Export a running job's state to S3 (asked from another process), cancel it, start the
    pipeline from the snapshot on one worker instead of two: the counts go on exactly."""
    t0 = time.monotonic()
    location = s3_location.fresh()
    options = ["--store-options", json.dumps(location.options)]
    cluster.start_worker()
    second = cluster.start_worker()
    cluster.wait_workers(2, timeout=60)
    driver = Driver(cluster, location.url, "v1", True, *options)
    with explained(cluster, driver):
        driver.wait_line("SUBMITTED", 150)
        phase(t0, "v1 submitted on 2 executors")
        client = sparkjet.connect(store=location.connect_overrides())
        job: Job = wait_until(lambda: client.get_jet().get_job_by_name("v1"), 10, "v1's record")
        wait_until(lambda: job.status is JobStatus.RUNNING, 60, "v1 to run")
        feed = Feed(client)
        feed.publish(ROUND)
        wait_exact(client, feed, 120, "v1")
        snapshot = job.cancel_and_export_snapshot("v1", timeout=120)
        driver.wait_line("ENDED", 60)
        phase(t0, f"exported at batch {snapshot.manifest.batch_id}; v1 cancelled")
    assert {s.name: s.key_count for s in snapshot.manifest.stages} == {
        "count-per-key": N_KEYS, "count-per-label": N_KEYS}
    feed.publish(ROUND)  # while no job runs: v2 reads it from the snapshot's offsets
    cluster.kill_worker(second)
    wait_until(lambda: cluster.alive_workers() == 1, 150, "the master to see one worker left")
    driver2 = Driver(cluster, location.url, "v2", True, *options, "--executors", "1",
                     "--initial-snapshot", "v1")
    with explained(cluster, driver2):
        driver2.wait_line("SUBMITTED", 150)
        job2: Job = wait_until(lambda: client.get_jet().get_job_by_name("v2"), 10, "v2's record")
        wait_until(lambda: job2.status is JobStatus.RUNNING, 60, "v2 to run")
        feed.publish(ROUND)
        wait_exact(client, feed, 180, "v2 on one worker, from the snapshot")
        phase(t0, "v2 counted on exactly")
        assert job2.get_metrics()["snapshotRestore"]["stages"] == {
            "count-per-key": "restored", "count-per-label": "restored"}
        finish(job2, driver2)
