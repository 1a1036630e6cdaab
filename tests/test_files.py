"""The file source and sink (sparkjet.contrib.files): offsets, caps, formats, markers, errors."""

from __future__ import annotations

import csv
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sparkjet
from sparkjet.contrib import files
from sparkjet.contrib.files import FileSink, FileSource, committed_files, read_committed
from sparkjet.errors import JobFailedError
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline
from sparkjet.plugin import JobContext, TaskContext
from sparkjet.testing import StoreLocation
from tests.conftest import run_pipeline, wait_until

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE


def with_files_plugin(client: sparkjet.Client) -> sparkjet.Client:
    """The plugin is a built-in entry point once installed; register it where it is not yet."""
    if "files" not in {info.name for info in client.list_plugins()}:
        client.register_plugin(files, "files")
    return client


@pytest.fixture
def fclient(client: sparkjet.Client) -> sparkjet.Client:
    return with_files_plugin(client)


def write_jsonl(path: Path, items: list[Any], mtime: float | None = None) -> None:
    path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def contexts(store_url: str, batch: int | None = None) -> tuple[JobContext, TaskContext]:
    store = StoreLocation(store_url).store()
    job = JobContext("job-1", None, store, parallelism=2, batch_id=batch, stage="from-files(in)",
                     checkpoint_id="c1")
    return job, TaskContext("job-1", 0, store)


def read_batch(source: FileSource, start: Any, end: Any, job: JobContext,
               task: TaskContext) -> list[Any]:
    return [item for part in source.plan_range(start, end, job) for item in source.read(part, task)]


# --- the source's offsets, on the driver -------------------------------------------------


def test_new_files_are_read_once_in_order_with_at_most_n_per_batch(
    tmp_path: Path, store_url: str
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    base = time.time() - 100
    for i in range(5):
        write_jsonl(folder / f"f{i}.jsonl", [{"f": i, "n": n} for n in range(3)], base + i)
    (folder / "skip.csv").write_text("a\n1\n")  # not matched by the glob
    (folder / ".f9.jsonl").write_text('{"hidden": 1}\n')  # hidden: a writer's temp file
    source = FileSource(str(folder), max_files_per_batch=2, settle_seconds=0, poll_seconds=0)
    job, task = contexts(store_url)
    start = source.initial_offsets(job)
    seen: list[Any] = []
    batches = 0
    while (end := source.latest_offsets(job, start)) != start:
        batch = read_batch(source, start, end, job, task)
        assert len({item["f"] for item in batch}) <= 2
        seen.extend(batch)
        start, batches = end, batches + 1
    assert batches == 3
    assert seen == [{"f": i, "n": n} for i in range(5) for n in range(3)]
    # A new file lands, older than none: it is the only thing the next batch reads.
    write_jsonl(folder / "f5.jsonl", [{"f": 5}], base + 50)
    end = source.latest_offsets(job, start)
    assert read_batch(source, start, end, job, task) == [{"f": 5}]
    assert source.latest_offsets(job, start) == end  # nothing new: no batch
    # The offsets stay bounded: done files older than late_seconds fall under the floor.
    assert len(json.dumps(end)) < 1000


def test_offsets_stay_bounded_as_files_accumulate(tmp_path: Path, store_url: str) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    base = time.time() - 10_000
    source = FileSource(str(folder), settle_seconds=0, poll_seconds=0, late_seconds=5)
    job, task = contexts(store_url)
    start = source.initial_offsets(job)
    for i in range(40):
        write_jsonl(folder / f"f{i:03d}.jsonl", [i], base + 60 * i)
        end = source.latest_offsets(job, start)
        assert read_batch(source, start, end, job, task) == [i]
        start = end
    assert len(start["done"]) == 1  # only the newest file is above the floor
    # A late file, older than the floor by more than late_seconds, is not read.
    write_jsonl(folder / "late.jsonl", ["late"], base)
    assert source.latest_offsets(job, start) == start


def test_a_file_being_written_waits_until_it_settles(tmp_path: Path, store_url: str) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    source = FileSource(str(folder), settle_seconds=0.5, poll_seconds=0)
    job, task = contexts(store_url)
    start = source.initial_offsets(job)
    path = folder / "growing.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        fh.write('{"n": 1}\n{"n"')
        fh.flush()
        assert source.latest_offsets(job, start) == start  # first seen now
        time.sleep(0.3)
        fh.write(': 2}\n')
        fh.flush()
        assert source.latest_offsets(job, start) == start  # it changed: not settled
    time.sleep(0.6)
    end = wait_until(lambda: (e := source.latest_offsets(job, start)) != start and e, timeout=5)
    assert read_batch(source, start, end, job, task) == [{"n": 1}, {"n": 2}]


def test_a_large_json_lines_file_is_read_over_batches_by_position(
    tmp_path: Path, store_url: str
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    items = [{"n": n, "pad": "x" * (n % 7)} for n in range(300)]
    write_jsonl(folder / "big.jsonl", items)
    size = (folder / "big.jsonl").stat().st_size
    source = FileSource(str(folder), settle_seconds=0, poll_seconds=0, max_bytes_per_batch=1000,
                        split_bytes=333)
    job, task = contexts(store_url)
    start = source.initial_offsets(job)
    seen: list[Any] = []
    batches = 0
    while (end := source.latest_offsets(job, start)) != start:
        if end["open"] is not None:
            assert end["open"][:2] == ["big.jsonl", end["batch"][0][2]]  # the position within
        seen.extend(read_batch(source, start, end, job, task))
        start, batches = end, batches + 1
    assert seen == items  # every line once, split at arbitrary bytes
    assert batches == -(-size // 1000)


def drain(source: FileSource, start: Any, job: JobContext, task: TaskContext,
          want: int, timeout: float = 5.0) -> tuple[list[Any], list[Any]]:
    """Micro-batches from ``start`` until ``want`` items were read or ``timeout`` passed.

    Returns the items and each batch's end offsets. No batch may mark a file done
    before its last byte: each file named in ``done`` was read up to its size.
    """
    seen: list[Any] = []
    ends: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(seen) < want and time.monotonic() < deadline:
        end = source.latest_offsets(job, start)
        if end == start:
            time.sleep(0.05)
            continue
        seen.extend(read_batch(source, start, end, job, task))
        ends.append(end)
        start = end
    return seen, ends


@pytest.mark.parametrize("late", [600.0, 0.0])
@pytest.mark.parametrize("settle", [0.0, 0.3])
def test_a_new_driver_reads_the_rest_of_the_open_file(
    tmp_path: Path, store_url: str, settle: float, late: float
) -> None:
    """Issue 23: a fresh source (a new driver after suspend or a crash) given offsets with an
    open file read the file's tail as an empty range and marked the file done (settle > 0:
    its first listing has nothing settled yet). It waits for the file and reads the tail."""
    folder = tmp_path / "in"
    folder.mkdir()
    items = [{"n": n, "pad": "x" * (n % 7)} for n in range(400)]
    write_jsonl(folder / "big.jsonl", items, time.time() - 10)
    size = (folder / "big.jsonl").stat().st_size
    write_jsonl(folder / "later.jsonl", ["later"], time.time() - 5)

    def fresh() -> FileSource:
        return FileSource(str(folder), settle_seconds=settle, poll_seconds=0,
                          max_bytes_per_batch=2048, late_seconds=late)

    job, task = contexts(store_url)
    first = fresh()
    start = first.initial_offsets(job)
    end = wait_until(lambda: (e := first.latest_offsets(job, start)) != start and e, timeout=5)
    assert end["open"][:2] == ["big.jsonl", 2048]
    head = read_batch(first, start, end, job, task)
    again = fresh()  # the next driver: no listing remembered
    if settle:
        assert again.latest_offsets(job, end) == end  # the open file has not settled here yet
    rest, ends = drain(again, end, job, task, want=len(items) + 1 - len(head))
    assert head + rest == [*items, "later"]  # every line once, in order, then the next file
    for offsets in ends:
        assert ["big.jsonl", 2048, 2048] not in offsets["batch"]
        if "big.jsonl" in {d[1] for d in offsets["done"]}:
            assert offsets["open"] is None
    assert ends[-1]["open"] is None
    assert [r[2] for o in ends for r in o["batch"] if r[0] == "big.jsonl"][-1] == size


def open_big_file(folder: Path, store_url: str, **options: Any) -> tuple[Any, Any, Any, Any]:
    """A 400-line ``big.jsonl`` read up to byte 2048 by a first micro-batch.

    Returns that micro-batch's start and end offsets and the (job, task) contexts.
    """
    write_jsonl(folder / "big.jsonl", [{"n": n} for n in range(400)], time.time() - 10)
    source = FileSource(str(folder), settle_seconds=0, poll_seconds=0, max_bytes_per_batch=2048,
                        **options)
    job, task = contexts(store_url)
    start = source.initial_offsets(job)
    end = source.latest_offsets(job, start)
    assert end["open"][:2] == ["big.jsonl", 2048]
    return start, end, job, task


@pytest.mark.parametrize("settle", [0.0, 0.3])
@pytest.mark.parametrize("change", ["deleted", "shrank"])
def test_an_open_file_that_is_gone_or_shrank_is_an_error_naming_stage_file_and_position(
    tmp_path: Path, store_url: str, settle: float, change: str
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    _, end, job, _ = open_big_file(folder, store_url)
    error: type[Exception]
    if change == "deleted":
        (folder / "big.jsonl").unlink()
        error, what = FileNotFoundError, "is gone"
    else:
        write_jsonl(folder / "big.jsonl", [{"n": n} for n in range(10)])
        error, what = ValueError, r"is now \d+ bytes, shorter"
    source = FileSource(str(folder), settle_seconds=settle, poll_seconds=0,
                        max_bytes_per_batch=2048)
    for _ in range(2):  # the same error every time: nothing is skipped
        with pytest.raises(error, match=r"stage 'from-files\(in\)': file big\.jsonl, read up to "
                                        rf"byte 2048, {what}"):
            source.latest_offsets(job, end)


def test_an_open_file_that_grows_is_read_to_its_new_end_once_it_settles(
    tmp_path: Path, store_url: str
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    start, end, job, task = open_big_file(folder, store_url)
    source = FileSource(str(folder), settle_seconds=0.3, poll_seconds=0,
                        max_bytes_per_batch=2048)
    head = read_batch(source, start, end, job, task)
    wait_until(lambda: source.latest_offsets(job, end) != end, timeout=5)  # settled here
    with (folder / "big.jsonl").open("a", encoding="utf-8") as fh:  # a writer appends more
        fh.write("".join(json.dumps({"n": n}) + "\n" for n in range(400, 500)))
    assert source.latest_offsets(job, end) == end  # changed: not settled, not advanced
    rest, ends = drain(source, end, job, task, want=500 - len(head))
    assert [item["n"] for item in head + rest] == list(range(500))
    assert ends[-1]["open"] is None and ends[-1]["done"][-1][1] == "big.jsonl"


def test_a_file_changed_after_it_was_read_is_warned_about_naming_it(
    tmp_path: Path, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", [1], time.time() - 10)
    source = FileSource(str(folder), settle_seconds=0, poll_seconds=0)
    job, task = contexts(store_url)
    start = source.initial_offsets(job)
    end = source.latest_offsets(job, start)
    assert read_batch(source, start, end, job, task) == [1]
    write_jsonl(folder / "a.jsonl", [1, 2], time.time() - 5)  # appended after it was read
    with caplog.at_level("WARNING", logger="sparkjet.contrib.files"):
        assert source.latest_offsets(job, end) == end  # a file is read once
        assert source.latest_offsets(job, end) == end
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings  # once per change, not once per listing
    assert "stage 'from-files(in)': file a.jsonl changed after it was read" in warnings[0]


def test_offset_of_names_each_items_file_and_line_or_row(
    tmp_path: Path, store_url: str
) -> None:
    """What a dead letter shows as its offset: the file, and the line (JSON lines, CSV; 1-based,
    also for a range starting mid-file and after blank lines) or the row (Parquet; 0-based)."""
    folder = tmp_path / "in"
    folder.mkdir()
    lines = [json.dumps({"n": n, "pad": "x" * (n % 5)}) for n in range(60)]
    lines[10:10] = [""]  # a blank line: n >= 10 are on line n + 2
    (folder / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    job, task = contexts(store_url)
    source = FileSource(str(folder), streaming=False, split_bytes=200)
    for descriptor in source.partitions(job):
        items = list(source.read(descriptor, task))
        for index, item in enumerate(items):
            line = item["n"] + (1 if item["n"] < 10 else 2)
            assert source.offset_of(descriptor, index) == {"file": "a.jsonl", "line": line}
    assert len(source.partitions(job)) > 1  # the file was read in several ranges
    with (folder / "a.csv").open("w", newline="", encoding="utf-8") as fh:
        fh.write('k,v\nc,1\n\n"multi\nline",2\nd,3\n')
    csv_source = FileSource(str(folder), format="csv", streaming=False)
    [descriptor] = csv_source.partitions(job)
    assert [row["v"] for row in csv_source.read(descriptor, task)] == ["1", "2", "3"]
    assert [csv_source.offset_of(descriptor, i)["line"] for i in range(3)] == [2, 4, 6]
    pq.write_table(pa.Table.from_pylist([{"n": n} for n in range(10)]), folder / "a.parquet",
                   row_group_size=3)
    pq_source = FileSource(str(folder), format="parquet", streaming=False, split_bytes=1)
    rows = 0
    for descriptor in pq_source.partitions(job):
        for index, item in enumerate(pq_source.read(descriptor, task)):
            assert pq_source.offset_of(descriptor, index) == {"file": "a.parquet",
                                                              "row": item["n"]}
            rows += 1
    assert rows == 10
    assert FileSource(str(folder)).offset_of([["a.jsonl", 0, 10]], 0) is None  # not read here


def test_the_caps_hold_from_wherever_a_batch_starts(
    tmp_path: Path, store_url: str
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    base = time.time() - 100
    for i in range(6):
        write_jsonl(folder / f"f{i}.jsonl", [i], base + i)
    source = FileSource(str(folder), max_files_per_batch=2, settle_seconds=0, poll_seconds=0)
    job, task = contexts(store_url, batch=0)
    start = source.initial_offsets(job)
    end = source.latest_offsets(job, start)
    assert read_batch(source, start, end, job, task) == [0, 1]
    # A new driver (resume): a fresh instance, told where the next batch starts.
    again = FileSource(str(folder), max_files_per_batch=2, settle_seconds=0, poll_seconds=0)
    following = again.latest_offsets(job, end)
    assert read_batch(again, end, following, job, task) == [2, 3]
    # A restart from scratch (NONE: a new checkpoint): capped batches from the start again.
    assert read_batch(again, start, again.latest_offsets(job, start), job, task) == [0, 1]
    # Planning a batch from other offsets than it was listed after is refused.
    with pytest.raises(RuntimeError, match="out of step"):
        again.plan_range(start, following, job)


def test_latest_position_skips_the_files_already_there(tmp_path: Path, store_url: str) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    write_jsonl(folder / "old.jsonl", ["old"], time.time() - 10)
    source = FileSource(str(folder), settle_seconds=0, poll_seconds=0, initial_position="latest")
    job, task = contexts(store_url)
    start = source.initial_offsets(job)
    assert source.latest_offsets(job, start) == start
    write_jsonl(folder / "new.jsonl", ["new"])
    end = source.latest_offsets(job, start)
    assert read_batch(source, start, end, job, task) == ["new"]


def test_a_file_that_disappears_before_it_is_read_is_named(tmp_path: Path, store_url: str) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    write_jsonl(folder / "gone.jsonl", [1])
    source = FileSource(str(folder), settle_seconds=0, poll_seconds=0)
    job, task = contexts(store_url)
    start = source.initial_offsets(job)
    end = source.latest_offsets(job, start)
    parts = source.plan_range(start, end, job)
    (folder / "gone.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match=r"gone\.jsonl was listed but is gone"):
        source.read(parts[0], task)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"format": "xml"}, "format must be one of jsonl, csv, parquet; got 'xml'"),
        ({"glob": "/abs/*.jsonl"}, "glob must be a pattern relative to the folder"),
        ({"glob": "../*.jsonl"}, "glob must be a pattern relative to the folder"),
        ({"max_files_per_batch": 0}, "max_files_per_batch must be >= 1"),
        ({"initial_position": "newest"}, "initial_position must be 'oldest' or 'latest'"),
        ({"settle_seconds": -1}, "settle_seconds must be >= 0"),
    ],
)
def test_bad_source_options_name_the_source(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=r"FileSource\('in'\): " + message.replace("(", r"\(")):
        FileSource("in", **arguments)


def test_bad_sink_format_names_the_sink() -> None:
    with pytest.raises(ValueError, match=r"FileSink\('out'\): format must be one of jsonl, parq"):
        FileSink("out", format="csv")


# --- batch jobs: formats and bad input ----------------------------------------------------


def test_batch_job_reads_every_format(fclient: sparkjet.Client, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", [{"k": "a", "v": 1}, {"k": "b", "v": 2}])
    with (folder / "a.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerows([["k", "v"], ["c", "3"], ["d, with comma", "4"]])
    table = pa.Table.from_pylist([{"k": f"p{i}", "v": i} for i in range(10)])
    pq.write_table(table, folder / "a.parquet", row_group_size=3)
    p = Pipeline.create()
    p.read_from(Pipeline.from_files(str(folder), streaming=False)).write_to(Pipeline.to_list("j"))
    p.read_from(FileSource(str(folder), format="csv", streaming=False)).write_to(
        Pipeline.to_list("c"))
    p.read_from(FileSource(str(folder), format="parquet", streaming=False, split_bytes=50)
                ).write_to(Pipeline.to_list("p"))
    p.read_from(FileSource(str(folder), format="parquet", streaming=False)).write_to(
        Pipeline.to_files(str(tmp_path / "out"), format="parquet"))
    job = run_pipeline(fclient, p)
    assert job.status is JobStatus.COMPLETED
    assert fclient.get_list("j").get_all() == [{"k": "a", "v": 1}, {"k": "b", "v": 2}]
    assert fclient.get_list("c").get_all() == [{"k": "c", "v": "3"},
                                               {"k": "d, with comma", "v": "4"}]
    assert fclient.get_list("p").get_all() == table.to_pylist()  # row groups, in order
    assert read_committed(str(tmp_path / "out"), "parquet") == table.to_pylist()


@pytest.mark.parametrize(
    ("name", "content", "fmt", "message"),
    [
        ("bad.jsonl", '{"a": 1}\n{"a": \n', "jsonl", r"bad\.jsonl line 2: malformed JSON"),
        ("bad.csv", "a,b\n1,2\n3\n", "csv", r"bad\.csv line 3: 1 fields, the header has 2"),
        ("bad.csv", 'a,b\n1,"2\n', "csv", r"bad\.csv line \d+: malformed CSV"),
        ("bad.parquet", "not parquet at all", "parquet", r"bad\.parquet is not a readable Parquet"),
    ],
)
def test_a_malformed_file_fails_the_job_naming_file_and_line(
    fclient: sparkjet.Client, tmp_path: Path, name: str, content: str, fmt: str, message: str
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / name).write_text(content, encoding="utf-8")
    p = Pipeline.create()
    p.read_from(FileSource(str(folder), format=fmt, streaming=False)).write_to(
        Pipeline.to_list("out"))
    with pytest.raises(JobFailedError, match=r"stage 'from-files\(\S*/in\)'") as info:
        fclient.get_jet().submit(p).join(timeout=120)
    chain = []
    error: BaseException | None = info.value
    while error is not None:
        chain.append(str(error))
        error = error.__cause__
    assert any(__import__("re").search(message, text) for text in chain), chain


def test_a_batch_job_on_a_folder_that_does_not_exist_fails_naming_it(
    fclient: sparkjet.Client, tmp_path: Path
) -> None:
    p = Pipeline.create()
    p.read_from(FileSource(str(tmp_path / "typo"), streaming=False)).write_to(
        Pipeline.to_list("out"))
    with pytest.raises(JobFailedError, match=r"stage 'from-files\(\S*/typo\)'") as info:
        fclient.get_jet().submit(p).join(timeout=120)
    assert "typo does not exist" in str(info.value), str(info.value)


def test_a_name_names_the_stages_in_place_of_the_url(tmp_path: Path) -> None:
    p = Pipeline.create()
    source = p.read_from(FileSource(str(tmp_path / "in"), name="orders"))
    sink = source.write_to(FileSink(str(tmp_path / "out"), name="archive"))
    assert (source.name, sink.name) == ("from-files(orders)", "to-files(archive)")
    unnamed = p.read_from(FileSource(str(tmp_path / "in")))
    assert unnamed.name == f"from-files({tmp_path / 'in'})"


# --- the sink ------------------------------------------------------------------------------


def test_sink_commits_a_batch_once_even_when_written_and_committed_twice(
    tmp_path: Path, store_url: str
) -> None:
    out = str(tmp_path / "out")
    sink = FileSink(out)
    job, _ = contexts(store_url, batch=7)
    job = JobContext("job-1", None, job.store, parallelism=2, batch_id=7, stage="to-files(out)",
                     checkpoint_id="c1")

    def run_batch(items: list[Any]) -> None:
        state = sink.prepare(job)
        messages = [sink.write(state, iter(items[i::2]), TaskContext("job-1", i, job.store))
                    for i in range(2)]
        sink.commit(state, messages, job)

    run_batch(list(range(10)))
    assert sorted(read_committed(out)) == list(range(10))
    run_batch(list(range(10)))  # the replay after a driver crash: marker found, its files gone
    sink.commit(sink.prepare(job), [], job)  # a second commit is a no-op
    assert sorted(read_committed(out)) == list(range(10))
    markers = os.listdir(os.path.join(out, "_committed"))
    assert len(markers) == 1 and markers[0].startswith("batch-00000007-")
    record = json.loads(Path(out, "_committed", markers[0]).read_text())
    assert record["items"] == 10 and record["batch_id"] == 7 and len(record["files"]) == 2
    # Files of a batch without a marker (written, not committed) are not there for readers.
    uncommitted = JobContext("job-1", None, job.store, parallelism=2, batch_id=8,
                             stage="to-files(out)", checkpoint_id="c1")
    state = sink.prepare(uncommitted)
    sink.write(state, iter([99]), TaskContext("job-1", 0, job.store))
    assert len(os.listdir(out)) == 4  # the marker folder, 2 committed files, 1 staged
    assert 99 not in read_committed(out) and len(committed_files(out)) == 2
    sink.abort(state, [], uncommitted)
    assert len(os.listdir(out)) == 3


def test_sink_names_an_item_it_cannot_write(tmp_path: Path, store_url: str) -> None:
    _, task = contexts(store_url, batch=0)
    state = {"batch": "b", "attempt": "a1"}
    with pytest.raises(TypeError, match=r"files:.*out: item 1 of partition 0 is not JSON"):
        FileSink(str(tmp_path / "out")).write(state, iter([1, {2}]), task)
    with pytest.raises(TypeError, match=r"Parquet rows must be dicts; item 0 .* is a int"):
        FileSink(str(tmp_path / "out"), "parquet").write(state, iter([1]), task)


# --- streaming jobs -------------------------------------------------------------------------


def test_streaming_exactly_once_across_suspend_and_resume(
    fclient: sparkjet.Client, tmp_path: Path
) -> None:
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    source = FileSource(str(folder), max_files_per_batch=2, settle_seconds=0.2, poll_seconds=0.05)
    p = Pipeline.create()
    doubled = p.read_from(source).map(lambda e: {"id": e["id"], "twice": e["id"] * 2})
    doubled.write_to(Pipeline.to_list("results"))
    doubled.write_to(Pipeline.to_files(str(out)))
    job = fclient.get_jet().submit(p, JobConfig(name="files", processing_guarantee=EXACTLY_ONCE,
                                                snapshot_interval_millis=100))
    wait_until(lambda: job.status is JobStatus.RUNNING, what="the job to run")
    expected: list[int] = []

    def drop(first: int, count: int) -> None:
        for f in range(first, first + count):
            ids = list(range(f * 10, f * 10 + 10))
            write_jsonl(folder / f"f{f:03d}.jsonl", [{"id": i} for i in ids])
            expected.extend(ids)

    def results() -> list[int]:
        return sorted(r["id"] for r in fclient.get_list("results").get_all())

    try:
        drop(0, 5)
        wait_until(lambda: results() == expected, what="the first files")
        # Two files a batch at most: five files take three batches (the sink's output
        # is visible a moment before the batch's commit is counted).
        wait_until(lambda: job.get_metrics()["lastCommittedBatch"] >= 2, what="three batches")
        job.suspend()
        wait_until(lambda: job.status is JobStatus.SUSPENDED, what="suspended")
        drop(5, 3)
        job.resume()
        wait_until(lambda: job.status is JobStatus.RUNNING, what="resumed")
        wait_until(lambda: results() == expected, what="the files dropped while suspended")
        drop(8, 1)
        wait_until(lambda: results() == expected, what="one more file")
        time.sleep(0.5)
        assert Counter(results()) == Counter(expected)  # each once
        wait_until(lambda: sorted(r["id"] for r in read_committed(str(out))) == expected,
                   what="the sink's committed files")
    finally:
        job.cancel()
        wait_until(job.is_terminal, what="cancelled")


@pytest.mark.storage
def test_streaming_from_and_to_s3(fclient: sparkjet.Client, s3_location: StoreLocation) -> None:
    where = s3_location.fresh()
    options = dict(where.options)
    fs, _ = fsspec.core.url_to_fs(where.url, **options)
    inbox, out = f"{where.url}/in", f"{where.url}/out"
    source = FileSource(inbox, storage_options=options, settle_seconds=0, poll_seconds=0.1,
                        max_files_per_batch=2)
    p = Pipeline.create()
    p.read_from(source).write_to(Pipeline.to_files(out, "parquet", storage_options=options))
    job = fclient.get_jet().submit(p, JobConfig(name="s3", processing_guarantee=EXACTLY_ONCE,
                                                snapshot_interval_millis=100))
    try:
        wait_until(lambda: job.status is JobStatus.RUNNING, what="the job to run")
        for f in range(5):
            fs.pipe(f"{inbox}/f{f}.jsonl", b"".join(
                json.dumps({"id": f * 3 + i}).encode() + b"\n" for i in range(3)))
        wait_until(lambda: len(read_committed(out, "parquet", options)) == 15, timeout=300,
                   what="every row in the bucket")
        time.sleep(0.5)
        assert sorted(r["id"] for r in read_committed(out, "parquet", options)) == list(range(15))
        assert job.get_metrics()["lastCommittedBatch"] >= 2
    finally:
        job.cancel()
        wait_until(job.is_terminal, what="cancelled")
