"""Failing well: what a half-done write or a damaged file leaves, and what the error says."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sparkjet
import sparkjet.errors as sparkjet_errors
from sparkjet.core.store.fs import Store
from sparkjet.errors import JobAlreadyExistsError, JobStateError
from sparkjet.job import JobConfig, JobStatus
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.plugin import hookimpl
from tests.conftest import TEST_SPARK, wait_until


def test_publish_all_with_an_unpicklable_item_publishes_nothing_and_names_it(
    client: sparkjet.Client,
) -> None:
    stream = client.get_stream("events", partitions=4)
    stream.publish_all(range(3))
    for _ in range(16):  # the first partition is chosen at random: every place
        items: list[object] = list(range(16))
        items[9] = lambda: None  # a local function: pickle cannot
        with pytest.raises(TypeError, match=r"stream 'events': nothing was published: item 9 "
                           r"\(of type builtins.function\) cannot be pickled"):
            stream.publish_all(items)
        assert stream.size() == 3
    by_key = client.get_stream("keyed", partitions=2)
    with pytest.raises(TypeError, match="item 1 "):
        by_key._log.publish_all([1, lambda: 0, 3], partition_of=lambda x: 0)  # type: ignore[attr-defined]
    assert by_key.size() == 0


def _stream_pipeline() -> Pipeline:
    p = Pipeline.create()
    p.read_from(StreamSource("events")).write_to(Pipeline.to_list("out"))
    return p


@pytest.mark.spark
def test_two_submitters_racing_for_a_name_one_wins(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first submitter's record is slow to land; the second must not take the name too."""
    clients = [sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK) for _ in range(2)]
    clients[0].get_stream("events", partitions=1)
    original = Store.write_bytes
    slowed = threading.Event()

    def slow_first_record(self: Store, path: str, data: bytes) -> None:
        if path.endswith("/job.json") and not slowed.is_set():
            slowed.set()
            time.sleep(1.5)  # the name is taken, the record not written yet
        original(self, path, data)

    monkeypatch.setattr(Store, "write_bytes", slow_first_record)
    outcomes: list[Any] = []

    def submit(client: sparkjet.Client) -> None:
        try:
            outcomes.append(client.get_jet().submit(_stream_pipeline(), JobConfig(name="dup")))
        except JobAlreadyExistsError as exc:
            outcomes.append(exc)

    first = threading.Thread(target=submit, args=(clients[0],))
    first.start()
    assert slowed.wait(60)
    second = threading.Thread(target=submit, args=(clients[1],))
    second.start()
    first.join(60)
    second.join(60)
    jobs = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, JobAlreadyExistsError)]
    assert len(jobs) == 1 and len(refused) == 1, outcomes
    assert "'dup' is already active" in str(refused[0])
    try:
        active = [j for j in clients[1].get_jet().get_jobs()
                  if j.name == "dup" and not j.is_terminal()]
        assert [j.id for j in active] == [jobs[0].id]
        # The loser left nothing behind: one job folder in the store.
        assert len(list((Path(store_url) / "jobs").iterdir())) == 1
    finally:
        jobs[0].cancel()


def test_a_name_held_by_a_submitter_that_died_before_its_record_is_taken(
    client: sparkjet.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkjet.core.jobs import service

    monkeypatch.setattr(service, "NAME_PENDING_SECONDS", 0.5)
    client.get_stream("events", partitions=1)
    # A lock whose job never got a record: its submitter died between the two writes.
    assert client.store.create_exclusive(client.store.layout.name_lock("orphan"), b"dead-job")
    job = client.get_jet().submit(_stream_pipeline(), JobConfig(name="orphan"))
    try:
        assert job.name == "orphan"
    finally:
        job.cancel()


RACING_PIPELINE = """
    import time

    from sparkjet.core.store.fs import Store
    from sparkjet.pipeline import Pipeline, StreamSource

    # Each submitter's first job record is slow to land: the window in which the
    # other submitter finds the name taken and no record for it.
    _write = Store.write_bytes
    _slowed = []

    def _slow_record(self, path, data):
        if path.endswith("/job.json") and not _slowed:
            _slowed.append(path)
            time.sleep(3)
        _write(self, path, data)

    Store.write_bytes = _slow_record

    pipeline = Pipeline.create()
    pipeline.read_from(StreamSource("events")).write_to(Pipeline.to_list("out"))
"""


@pytest.mark.slow
def test_two_cli_processes_racing_for_a_name_one_wins(
    client: sparkjet.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_cli import wait_for, write_config, write_file

    monkeypatch.chdir(tmp_path)
    write_config(client)
    write_file("racing.py", RACING_PIPELINE)
    client.get_stream("events", partitions=1)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for index in range(2):
            err = tmp_path / f"submit-{index}.err"
            with err.open("wb") as err_fh:
                procs.append((subprocess.Popen(
                    [sys.executable, "-m", "sparkjet.cli", "submit", "-n", "dup", "racing.py"],
                    stdout=subprocess.DEVNULL, stderr=err_fh, env=env,
                ), err))
        # The loser exits; the winner runs its streaming job until it is cancelled.
        wait_for(lambda: any(p.poll() is not None for p, _ in procs), 240,
                 "one submitter to be refused")
        loser, loser_err = next((p, e) for p, e in procs if p.poll() is not None)
        assert loser.returncode == 1, loser_err.read_text()
        assert "a job named 'dup' is already active" in loser_err.read_text()
        winner = next(p for p, _ in procs if p is not loser)
        assert winner.poll() is None
        jet = client.get_jet()
        wait_for(lambda: any(j.name == "dup" for j in jet.get_jobs()), 60, "the winner's record")
        active = [j for j in jet.get_jobs() if j.name == "dup" and not j.is_terminal()]
        assert len(active) == 1, active
        assert len(list((Path(client.config.store_url) / "jobs").iterdir())) == 1
        active[0].cancel()
        assert winner.wait(timeout=90) == 1
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


#: The stale time of the skewed-clock tests (20 s by default), their driver beating
#: every 0.5 s: far below the skews, so a judge by the driver's clock would be wrong
#: at once, and 16 beats, so a driver starved of CPU for seconds on a loaded machine
#: is not judged dead (6 s with a beat every 2 s was 3 beats, and flaked).
SKEWED_STALE_AFTER = 8.0

SKEWED_DRIVER = """
    import socket
    import sys
    import time

    from sparkjet.pipeline import Pipeline, StreamSource

    # This driver runs on "another machine" whose clock is off by SKEW seconds.
    SKEW = float(sys.argv[1])
    _time = time.time
    time.time = lambda: _time() + SKEW
    socket.gethostname = lambda: "skewed-host"
    # It beats every 0.5 s, not 2: the tests take 8 s unwritten for dead (16 beats).
    from sparkjet.core.jobs import heartbeat

    heartbeat.HEARTBEAT_SECONDS = 0.5

    pipeline = Pipeline.create()
    pipeline.read_from(StreamSource("events")).write_to(Pipeline.to_list("out"))
"""


def _skewed_driver(
    client: sparkjet.Client, tmp_path: Path, skew_seconds: float
) -> tuple[subprocess.Popen[bytes], Path, Any]:
    """A CLI process driving streaming job 'skewed' with its clock off by ``skew_seconds``.

    Its micro-batches run in process (no JVM starts); every process takes its
    record for a dead driver's after :data:`SKEWED_STALE_AFTER` s unwritten.
    """
    from tests.test_cli import IN_PROCESS, wait_for, write_config, write_file

    write_config(client, IN_PROCESS)
    write_file("skewed.py", SKEWED_DRIVER)
    client.get_stream("events", partitions=1).publish_all(range(5))
    err = tmp_path / "driver.err"
    with err.open("wb") as err_fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sparkjet.cli", "submit", "-n", "skewed", "-g",
             "exactly_once", "--snapshot-interval", "200", "skewed.py", str(skew_seconds)],
            stdout=subprocess.DEVNULL, stderr=err_fh,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )

    def running() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"the driver exited ({proc.returncode}):\n{err.read_text()}")
        return sorted(client.get_list("out").get_all()) == list(range(5))

    wait_for(running, 180, "the skewed driver to process the first items")
    job = client.get_jet().get_job_by_name("skewed")
    assert job is not None
    return proc, err, job


@pytest.mark.slow
def test_a_driver_whose_clock_is_minutes_ahead_can_be_taken_over_when_it_dies(
    client: sparkjet.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkjet.core.jobs import record
    from tests.test_cli import wait_for

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(record, "STALE_AFTER_SECONDS", SKEWED_STALE_AFTER)
    proc, _, job = _skewed_driver(client, tmp_path, +300.0)
    try:
        assert job.is_driver_alive() and job.status is JobStatus.RUNNING
        proc.kill()
        proc.wait(timeout=30)
        killed = time.monotonic()
        wait_for(lambda: not job.is_driver_alive(), 120, "the dead driver to be seen dead")
        # The stale time after the kill, not the 300 s the driver's clock is ahead.
        assert time.monotonic() - killed < 60
        assert job.status is JobStatus.SUSPENDED
        job.resume()  # continues here
        assert job.is_driven_here()
        client.get_stream("events").publish_all(range(5, 8))
        wait_for(lambda: sorted(client.get_list("out").get_all()) == list(range(8)), 120,
                 "the resumed job to process the rest exactly once")
    finally:
        if proc.poll() is None:
            proc.kill()
        if not job.is_terminal():
            job.cancel()


@pytest.mark.slow
def test_a_live_driver_whose_clock_is_minutes_behind_is_not_taken_for_dead(
    client: sparkjet.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkjet.core.jobs import record

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(record, "STALE_AFTER_SECONDS", SKEWED_STALE_AFTER)
    proc, err, job = _skewed_driver(client, tmp_path, -120.0)
    try:
        deadline = time.monotonic() + SKEWED_STALE_AFTER + 4  # well past the stale time
        while time.monotonic() < deadline:
            assert job.is_driver_alive()
            assert job.status is JobStatus.RUNNING
            time.sleep(0.5)
        with pytest.raises(JobStateError):
            job.resume()  # a running job, driven elsewhere: not taken over
        job.cancel()  # asks the live driver, which answers
        assert proc.wait(timeout=90) == 1, err.read_text()
        assert job.is_user_cancelled()
    finally:
        if proc.poll() is None:
            proc.kill()


class SmallDisk:
    """A store folder on a 16 MB tmpfs that the test fills up and frees again.

    Where tmpfs cannot be mounted (not root), a stand-in raising ENOSPC from
    every store write outside the streams while "full" (publishing still works,
    as it does on the real disk through its reserved page).
    """

    PAGE = 4096

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
        self.root = root
        root.mkdir()
        self.mounted = kind == "tmpfs" and os.geteuid() == 0 and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(root)],
            capture_output=True, check=False,
        ).returncode == 0
        self.full = False
        if not self.mounted:
            self._stand_in(monkeypatch)

    def _stand_in(self, monkeypatch: pytest.MonkeyPatch) -> None:
        disk = self

        def failing(original: Any) -> Any:
            def write(self: Store, path: str, data: bytes) -> Any:
                if disk.full and "/streams/" not in path:
                    raise sparkjet_errors.StoreError(
                        f"cannot write {path!r}: [Errno 28] No space left on device")
                return original(self, path, data)
            return write

        monkeypatch.setattr(Store, "write_bytes", failing(Store.write_bytes))
        monkeypatch.setattr(Store, "create_exclusive", failing(Store.create_exclusive))

    def fill(self, reserve_pages: int) -> None:
        """Fill the disk, leaving ``reserve_pages`` that :meth:`publish` takes."""
        self.full = True
        if not self.mounted:
            return
        (self.root / "reserve").write_bytes(b"r" * self.PAGE * reserve_pages)
        fd = os.open(self.root / "ballast", os.O_WRONLY | os.O_CREAT)
        try:
            with pytest.raises(OSError, match="No space left on device"):  # noqa: PT012
                while True:
                    os.write(fd, b"b" * self.PAGE)
        finally:
            os.close(fd)

    def publish(self, client: sparkjet.Client, items: list[int]) -> None:
        """Publish into the reserved page (a heartbeat may hold it for a moment)."""
        if self.mounted:
            (self.root / "reserve").unlink()
        deadline = time.monotonic() + 10
        while True:
            try:
                client.get_stream("events").publish_all(items)
                return
            except sparkjet_errors.StoreError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def free(self) -> None:
        self.full = False
        if self.mounted:
            (self.root / "ballast").unlink()

    def temp_files(self) -> list[Path]:
        """The temp files in the store now; a folder removed while listed is skipped.

        ``Path.rglob`` fails when a folder it is about to enter goes (a job
        stopping removes its checkpoint folder); ``os.walk`` passes over it.
        """
        return sorted(
            Path(folder) / name
            for folder, _, names in os.walk(self.root)
            for name in names if name.endswith(".tmp")
        )

    def assert_no_temp_file_stays(self, timeout: float = 60) -> None:
        """No write leaves its temp file behind: each one seen now is gone once its write ends.

        A local write puts its data in a temp file beside the target, then
        renames or links it into place (removing it once a full disk refuses
        it), so a listing while the job's threads write (its record, a
        heartbeat every 2 s, the last writes of a job stopping after
        ``cancel()`` returned) catches one for a moment: the race is in the
        listing, not a leak. A temp file is never reused (a new name per
        write), so each name listed must disappear; one that stays is a
        leak, which ``sparkjet gc`` collects only after its grace period.
        """
        seen = self.temp_files()
        wait_until(lambda: not [path for path in seen if path.exists()], timeout,
                   f"the temp files of writes in flight to go: {seen}")

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.root)], check=False)


@pytest.fixture(params=["tmpfs", "stand-in"])
def small_disk(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SmallDisk]:
    """A real full disk where tmpfs can be mounted (root), and the stand-in everywhere."""
    disk = SmallDisk(tmp_path / "disk", monkeypatch, request.param)
    try:
        yield disk
    finally:
        disk.unmount()


def _filling_job(
    disk: SmallDisk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **config: Any
) -> tuple[sparkjet.Client, Any]:
    """A client in another 'process' (service) and the handle of the job its store fills under.

    The job has processed items 0-4; items 5-9 are published into the last free
    page, so the job's next write finds the disk full.
    """
    from sparkjet.core.jobs import record
    from tests.test_cli import write_config

    monkeypatch.setattr(record, "STALE_AFTER_SECONDS", 6.0)
    monkeypatch.chdir(tmp_path)
    url = str(disk.root / "store")
    driver, other = (sparkjet.connect(store={"url": url}, spark=TEST_SPARK) for _ in range(2))
    write_config(driver)
    driver.get_stream("events", partitions=1).publish_all(list(range(5)))
    job = driver.get_jet().submit(_stream_pipeline(), JobConfig(
        name="filled", processing_guarantee="EXACTLY_ONCE", snapshot_interval_millis=100,
        **config,
    ))
    out = driver.get_list("out")
    wait_until(lambda: sorted(out.get_all()) == list(range(5)), 120, "the first items")
    disk.fill(reserve_pages=1)
    disk.publish(driver, list(range(5, 10)))
    return other, job


@pytest.mark.slow
@pytest.mark.spark
def test_a_store_that_fills_up_while_the_job_suspends_on_failure_leaves_it_resumable(
    small_disk: SmallDisk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sparkjet.cli import main

    other, job = _filling_job(small_disk, tmp_path, monkeypatch, suspend_on_failure=True)
    out = other.get_list("out")
    try:
        # The driver keeps what it could not write: here the job is SUSPENDED, with the cause.
        wait_until(lambda: job.status is JobStatus.SUSPENDED, 60, "the driver to suspend")
        assert "No space left on device" in job.get_suspension_cause()
        # Elsewhere the driver stops being seen: its record is not written any more.
        seen = other.get_jet().get_job(job.id)
        assert seen is not None
        wait_until(lambda: seen.status is JobStatus.SUSPENDED, 60, "others to see it stopped")
        assert "the driver process running the job died" in seen.get_suspension_cause()
        small_disk.assert_no_temp_file_stays()  # failed writes took their temp files along

        small_disk.free()
        # Once the store takes writes again, the driver's record says why, to everyone.
        wait_until(lambda: "No space left on device" in seen.get_suspension_cause(), 30,
                   "the cause to reach the store")
        capsys.readouterr()
        assert main(["status", "filled"]) == 0
        shown = capsys.readouterr().out
        assert f"Job 'filled' ({job.id}) is SUSPENDED (" in shown
        assert "No space left on device" in shown
        seen.resume()
        wait_until(lambda: sorted(out.get_all()) == list(range(10)), 120,
                   "the resumed job to finish the items exactly once")
        assert job.status is JobStatus.RUNNING
    finally:
        if not job.is_terminal():
            job.cancel()
    small_disk.assert_no_temp_file_stays()


@pytest.mark.slow
@pytest.mark.spark
def test_a_store_that_fills_up_while_the_job_fails_ends_it_failed_for_everyone(
    small_disk: SmallDisk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sparkjet.cli import main

    other, job = _filling_job(small_disk, tmp_path, monkeypatch)
    with pytest.raises(sparkjet_errors.JobFailedError, match="No space left on device"):
        job.join(timeout=60)  # returns at once here, though the store took nothing
    assert job.status is JobStatus.FAILED
    seen = other.get_jet().get_job(job.id)
    assert seen is not None
    # Unwritten, the record still says RUNNING: others see a dead driver, not a live job.
    wait_until(lambda: seen.status is JobStatus.SUSPENDED, 60, "others to see it stopped")
    small_disk.free()
    wait_until(lambda: seen.status is JobStatus.FAILED, 30, "the failure to reach the store")
    with pytest.raises(sparkjet_errors.JobFailedError, match="No space left on device"):
        seen.join(timeout=10)
    capsys.readouterr()
    assert main(["status", "filled"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == f"Job 'filled' ({job.id}) finished: FAILED"
    assert shown[1].startswith("Failure: job 'filled'")
    assert "No space left on device" in shown[1]
    # Its name is free again.
    again = other.get_jet().submit(_stream_pipeline(), JobConfig(name="filled"))
    again.cancel()
    small_disk.assert_no_temp_file_stays()


def test_a_local_write_that_fails_takes_its_temp_file_along(
    client: sparkjet.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the full-disk tests above promise, without their race (see assert_no_temp_file_stays).

    The disk fills while the data is written (the temp file exists, its write
    fails), or the target cannot be replaced: the write raises StoreError and
    removes its temp file, for a whole-file write and a create-only one.
    """
    import errno

    from sparkjet.core.store import fs_writes

    class FullDisk:
        """A temp file created, as on a full disk, whose data does not fit."""

        def __init__(self, path: str, mode: str) -> None:
            assert mode == "wb"
            self.handle = open(path, mode)  # noqa: SIM115

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    folder = Path(client.store.layout.job("ab12-cd34-ef56-7890"))
    monkeypatch.setattr(fs_writes, "open", FullDisk, raising=False)  # fs_writes.py's open only
    with pytest.raises(sparkjet_errors.StoreError, match="No space left on device"):
        client.store.write_bytes(str(folder / "job.json"), b"{}")
    with pytest.raises(sparkjet_errors.StoreError, match="No space left on device"):
        client.store.create_exclusive(str(folder / "name.lock"), b"{}")
    assert os.listdir(folder) == []
    monkeypatch.undo()
    (folder / "job.json").mkdir()  # a target that cannot be replaced
    (folder / "job.json" / "x").write_bytes(b"")
    with pytest.raises(sparkjet_errors.StoreError, match="cannot write"):
        client.store.write_bytes(str(folder / "job.json"), b"{}")
    assert os.listdir(folder) == ["job.json"]


def test_gc_collects_temp_files_a_killed_writer_left(client: sparkjet.Client) -> None:
    store = client.store
    client.get_list("kept").add(1)
    folder = Path(store.layout.job("ab12-cd34-ef56-7890"))
    folder.mkdir(parents=True)
    old = folder / f"job.json.{'a' * 32}.tmp"
    young = folder / f"job.json.{'b' * 32}.tmp"
    lookalike = folder / "notes.tmp"  # not one of ours
    for path in (old, young, lookalike):
        path.write_bytes(b"half a reco")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    os.utime(lookalike, (time.time() - 7200, time.time() - 7200))
    report = client.collect_garbage(dry_run=True)
    assert report.removed.get("temp files of unfinished writes") == [str(old)]
    assert old.exists()
    client.collect_garbage()
    assert not old.exists()
    assert young.exists()
    assert lookalike.exists()
    assert client.get_list("kept").get_all() == [1]


def test_a_job_whose_failure_handling_fails_still_ends_failed_for_everyone(
    client: sparkjet.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug while a job fails (here its final metrics raise) still ends it FAILED.

    ``join`` raises naming both errors, listeners and plugins hear FAILED, the
    store holds it with the stage, and the name is free for the next submit.
    """
    from sparkjet.core.jobs.outcome import Tally

    def broken_metrics(self: Tally) -> dict[str, Any]:
        raise RuntimeError("metrics broke")

    monkeypatch.setattr(Tally, "metrics", broken_metrics)

    def boom(x: int) -> int:
        raise ValueError(f"bad item {x}")

    p = Pipeline.create()
    p.read_from(Pipeline.from_list("ff-in", [1])).map(boom).set_name("boom") \
        .write_to(Pipeline.to_list("ff-out"))
    heard: list[JobStatus] = []

    class Listener:
        @hookimpl
        def on_job_status_changed(self, job: Any, old_status: Any, new_status: Any) -> None:
            heard.append(new_status)

    client.register_plugin(Listener(), "double-fault-listener")
    job = client.get_jet().submit(
        p, JobConfig(name="double-fault", store_metrics_after_job_completion=True))
    with pytest.raises(sparkjet_errors.JobFailedError) as caught:
        job.join(timeout=120)
    assert "bad item 1" in str(caught.value) and "metrics broke" in str(caught.value)
    assert caught.value.stage == "boom"
    assert heard[-1] is JobStatus.FAILED
    monkeypatch.undo()
    other = sparkjet.connect(store={"url": client.store.url}, spark=TEST_SPARK)
    seen = other.get_jet().get_job(job.id)  # from the store, not this process
    assert seen is not None and seen.status is JobStatus.FAILED
    assert "metrics broke" in (seen.get_failure() or "")
    plain = Pipeline.create()
    plain.read_from(Pipeline.from_list("ff-in", [1])).write_to(Pipeline.to_list("ff-out"))
    again = client.get_jet().submit(plain, JobConfig(name="double-fault"))
    again.join(timeout=120)
    assert client.get_list("ff-out").get_all() == [1]


def test_a_submit_that_fails_part_way_leaves_no_files(
    client: sparkjet.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store error after the pipeline is written (taking the name, here) removes the pipeline.

    gc would never know those files: a job folder without a record (it also
    collects such folders after the grace, for a submitter that was killed).
    """
    from sparkjet.core.store.job_records import JobRecords

    def store_down(self: JobRecords, name: str, job_id: str) -> str | None:
        raise sparkjet_errors.StoreError(f"cannot create the lock of name {name!r}: store down")

    before = set(client.store.listdir(client.store.layout.jobs))
    monkeypatch.setattr(JobRecords, "claim_name", store_down)
    with pytest.raises(sparkjet_errors.StoreError, match="store down"):
        client.get_jet().submit(_stream_pipeline(), JobConfig(name="half-submitted"))
    assert set(client.store.listdir(client.store.layout.jobs)) == before


def test_the_heartbeat_outlives_a_failure_to_gather_its_progress(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher keeps beating (and taking control requests) when building the progress fails.

    A watcher thread that died would leave the job judged dead after the
    stale limit and taken over while this driver runs on.
    """
    from sparkjet.core.client import Client
    from sparkjet.core.config import load_config
    from sparkjet.core.engine.inprocess.engine import InProcessEngine
    from sparkjet.core.jobs.stream_run import StreamRun

    original = StreamRun.progress_change
    calls: list[int] = []

    def fails_once(self: StreamRun) -> Any:
        if threading.current_thread().name.startswith("sparkjet-watch-"):  # the heartbeat's
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("progress could not be gathered")
        return original(self)

    monkeypatch.setattr(StreamRun, "progress_change", fails_once)
    client = Client(load_config({"store": {"url": store_url}, "spark": TEST_SPARK}),
                    engine=InProcessEngine(2))
    client.get_stream("events", partitions=1).publish(1)
    job = client.get_jet().submit(_stream_pipeline(), JobConfig(name="beats"))
    try:
        wait_until(lambda: client.get_list("out").size() == 1, what="the first micro-batch")
        wait_until(lambda: len(calls) >= 2, what="a heartbeat after the one that failed")
        assert job.status is JobStatus.RUNNING
    finally:
        job.cancel()
        with pytest.raises(sparkjet_errors.JobCancelledError):
            job.join(timeout=60)
