"""The file source across suspend / resume and SIGKILLed drivers while a file is open (issue 23).

A JSON-lines file read over several micro-batches (``max_bytes_per_batch``)
is *open* in the source's offsets: the position reached is in the
checkpoint. A new driver (after ``suspend``, or a SIGKILL and a new process)
resumes from there and must read the rest of the file: every line exactly
once, with and without ``settle_seconds``, from a local folder and from S3.
The multi-process tests reuse the driver helpers of ``test_stream_faults``
with their own driver script, ``tests/faults/files_driver.py``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

import sparkjet
from sparkjet.contrib import files
from sparkjet.contrib.files import FileSource
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline
from sparkjet.testing import StoreLocation
from tests import test_stream_faults as stream_faults
from tests.conftest import TEST_SPARK, wait_until
from tests.faults.files_driver import SOURCE_NAME

STAGE = f"from-files({SOURCE_NAME})"
#: The open file's lines and the small file that lands after the crash.
LINES = 400
LATER = 10
#: Small micro-batches: the big file (about 9 kB) is open over about 18 of them.
MAX_BYTES = 512


def line(i: int) -> bytes:
    return json.dumps({"id": i, "pad": "x" * (i % 5)}).encode() + b"\n"


def big_file() -> bytes:
    return b"".join(line(i) for i in range(LINES))


def later_file() -> bytes:
    return b"".join(line(i) for i in range(LINES, LINES + LATER))


def committed_offsets(client: sparkjet.Client, job_id: str) -> Any:
    """The file source's offsets at the job's last committed micro-batch (None before one)."""
    from sparkjet.core.state.checkpoint import Checkpoint

    checkpoint = Checkpoint(client.store, client.store.layout.checkpoint(job_id, "checkpoint"))
    last = checkpoint.last_commit()
    return checkpoint.commit_record(last).ends.get(STAGE) if last >= 0 else None


def open_mid_file(client: sparkjet.Client, job_id: str) -> Any:
    """The committed offsets once the big file is open past its first micro-batch."""
    def opened() -> Any:
        offsets = committed_offsets(client, job_id)
        return offsets if offsets and offsets["open"] and offsets["open"][1] > 0 else None

    return wait_until(opened, 180, "a committed micro-batch with the big file open",
                      interval=0.05)


def finished(client: sparkjet.Client, job_id: str) -> Any:
    """The committed offsets once both files are done (nothing open)."""
    def done() -> Any:
        offsets = committed_offsets(client, job_id)
        names = {d[1] for d in offsets["done"]} if offsets else set()
        return offsets if offsets["open"] is None and "later.jsonl" in names else None

    return wait_until(done, 180, "the job to finish both files")


def assert_each_line_once(client: sparkjet.Client, context: str) -> None:
    ids = [r["id"] for r in client.get_list("results").get_all()]
    counts = Counter(ids)
    missing = [i for i in range(LINES + LATER) if i not in counts]
    duplicated = sorted(i for i, c in counts.items() if c > 1)
    assert not missing and not duplicated, (
        f"{len(ids)} lines of {LINES + LATER}: {len(missing)} missing (first {missing[:5]}), "
        f"{len(duplicated)} duplicated (first {duplicated[:5]}); {context}")
    assert ids == list(range(LINES + LATER)), "not in the order of the files and their lines"


# --- suspend and resume, in this process --------------------------------------------------


@pytest.mark.parametrize("settle", [0.0, 0.5])
def test_suspend_and_resume_while_a_file_is_open_reads_every_line_once(
    client: sparkjet.Client, tmp_path: Path, settle: float
) -> None:
    """Resumed in the process that suspended it, the job keeps its source (and the source
    its listing); a new process resuming it is the test below."""
    if "files" not in {info.name for info in client.list_plugins()}:
        client.register_plugin(files, "files")
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "big.jsonl").write_bytes(big_file())
    source = FileSource(str(folder), settle_seconds=settle, poll_seconds=0.05,
                        max_bytes_per_batch=MAX_BYTES, name=SOURCE_NAME)
    p = Pipeline.create()
    p.read_from(source).write_to(Pipeline.to_list("results"))
    job = client.get_jet().submit(p, JobConfig(
        name="files-suspend", snapshot_interval_millis=100,
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE))
    try:
        open_mid_file(client, job.id)
        job.suspend()
        wait_until(lambda: job.status is JobStatus.SUSPENDED, 60, "suspended")
        at_suspend = committed_offsets(client, job.id)
        assert at_suspend["open"] is not None, "the file was finished before the suspend"
        (folder / "later.jsonl").write_bytes(later_file())  # lands while suspended
        job.resume()
        wait_until(lambda: job.status is JobStatus.RUNNING, 60, "resumed")
        end = finished(client, job.id)
        assert_each_line_once(client, f"suspended at {at_suspend['open']}, ended at {end}")
    finally:
        job.cancel()
        wait_until(job.is_terminal, 60, "cancelled")


# --- a SIGKILLed driver and a new process ----------------------------------------------------


@pytest.fixture
def file_drivers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                 ) -> Iterator[Callable[..., stream_faults.Driver]]:
    """Start ``files_driver.py`` processes (test_stream_faults' Driver); all killed at teardown."""
    monkeypatch.setattr(stream_faults, "DRIVER", stream_faults.FAULTS / "files_driver.py")
    log_dir = tmp_path / "drivers"
    log_dir.mkdir()
    started: list[stream_faults.Driver] = []

    def start(*args: str) -> stream_faults.Driver:
        started.append(stream_faults.Driver(list(args), log_dir, len(started) + 1))
        return started[-1]

    yield start
    for driver in started:
        if driver.proc.poll() is None:  # shown with a failing test's captured output
            print(f"--- {driver.out_path.stem} at teardown: {driver.lines()}")
            print(driver.dump_stacks())
        driver.kill()


def stop_while_open_and_resume(
    store_url: str, url: str, options: dict[str, Any], settle: float, how: str,
    put: Callable[[str, bytes], None], file_drivers: Callable[..., stream_faults.Driver],
) -> None:
    """Stop the driver process while the big file is open, land a file, resume in a new one.

    ``how``: ``"kill"`` SIGKILLs the driver mid-run; ``"suspend"`` suspends the job
    (from this process, through the job's control folder) and then ends the idle
    driver, so the job is resumed by a new process, as ``sparkjet resume`` does.
    """
    put("big.jsonl", big_file())
    args = [store_url, "files-faults", url, "--settle", str(settle),
            "--max-bytes", str(MAX_BYTES), "--storage-options", json.dumps(options)]
    first = file_drivers(*args)
    job_id = first.wait_for_line("SUBMITTED", 180).split()[1]
    client = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK)
    job = client.get_jet().get_job(job_id)
    assert job is not None
    open_mid_file(client, job_id)
    if how == "suspend":
        job.suspend()
        wait_until(lambda: job.status is JobStatus.SUSPENDED, 120, "suspended")
    first.kill(whole_group=True)
    stopped = committed_offsets(client, job_id)  # a batch may have committed meanwhile
    if how == "suspend":
        assert stopped["open"] is not None, "the file was finished before the suspend"
    put("later.jsonl", later_file())  # lands while no driver runs
    second = file_drivers(*args)
    second.wait_for_line("RESUMED", 180)
    end = finished(client, job_id)
    assert_each_line_once(client, f"{how} at {stopped['open']}, ended at {end}")


@pytest.mark.slow
@pytest.mark.parametrize("settle", [0.0, 0.5])
@pytest.mark.parametrize("how", ["kill", "suspend"])
def test_a_driver_stopped_while_a_file_is_open_is_resumed_by_a_new_one(
    store_url: str, tmp_path: Path, settle: float, how: str,
    file_drivers: Callable[..., stream_faults.Driver],
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()

    def put(name: str, data: bytes) -> None:
        (folder / name).write_bytes(data)

    stop_while_open_and_resume(store_url, str(folder), {}, settle, how, put, file_drivers)


@pytest.mark.slow
@pytest.mark.storage
@pytest.mark.parametrize("settle", [0.0, 0.5])
def test_a_driver_killed_while_an_s3_file_is_open_resumes_its_rest(
    store_url: str, s3_location: StoreLocation, settle: float,
    file_drivers: Callable[..., stream_faults.Driver],
) -> None:
    where = s3_location.fresh()
    options = dict(where.options)
    fs, _ = fsspec.core.url_to_fs(where.url, **options)
    inbox = f"{where.url}/in"

    def put(name: str, data: bytes) -> None:
        fs.pipe(f"{inbox}/{name}", data)

    stop_while_open_and_resume(store_url, inbox, options, settle, "kill", put, file_drivers)
