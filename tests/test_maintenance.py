"""Garbage collection of the store (``client.collect_garbage()``, ``sparkjet gc``); no Spark."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from sparkjet.cli import main
from sparkjet.core.maintenance.gc import collect_garbage
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords
from tests.conftest import in_process_client

DAY = 24 * 3600.0


def age(path: Path, seconds: float) -> None:
    """Make ``path`` (and, for a folder, everything in it) look ``seconds`` old."""
    then = time.time() - seconds
    for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(item, (then, then))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "store"))


def layout(store: Store) -> dict[str, Path]:
    """A store with garbage of every kind, and what must stay, all two hours old."""
    root = Path(store.root)
    log = store.list_log("l")
    named = log.new_segment_path("w1")
    log.write_segment(named, list(range(3)))
    log.commit("append", [("segment", named)])
    orphan = log.new_segment_path("w2")  # staged by a task whose job died before its commit
    log.write_segment(orphan, [9])
    store.write_bytes(log.paths.abort_marker("w2"), b"")
    records = JobRecords(store)
    at = store.layout
    now_ms = int(time.time() * 1000)
    eight_days_ago = now_ms - int(8 * DAY * 1000)
    records.write({"id": "old-done", "status": "COMPLETED", "completion_time": eight_days_ago})
    records.write({"id": "new-done", "status": "FAILED", "completion_time": now_ms - 60_000})
    records.write({"id": "running", "status": "RUNNING", "completion_time": -1,
                   "checkpoint": "scratch-0000000b"})
    for epoch in (1, 2, 3):
        store.write_bytes(at.owner_claim("running", epoch), b"{}")
    store.write_bytes(f'{at.checkpoint("running", "scratch-0000000a")}/meta.json', b"{}")
    store.write_bytes(f'{at.checkpoint("running", "scratch-0000000b")}/meta.json', b"{}")
    store.write_bytes(at.quarantined("running", "x.req"), b"garbage")
    store.write_bytes(at.probe("create-only-1"), b"1")
    store.write_bytes(at.pipeline("died-submitting"), b"pipeline")  # no record was written
    paths = {
        "named": Path(named), "orphan": Path(orphan),
        "marker": Path(log.paths.abort_marker("w2")),
        "old-done": Path(at.job("old-done")), "new-done": Path(at.job("new-done")),
        "claim1": Path(at.owner_claim("running", 1)),
        "claim2": Path(at.owner_claim("running", 2)),
        "claim3": Path(at.owner_claim("running", 3)),
        "unused": Path(at.checkpoint("running", "scratch-0000000a")),
        "current": Path(at.checkpoint("running", "scratch-0000000b")),
        "quarantined": Path(at.quarantined("running", "x.req")),
        "probe": Path(at.probe("create-only-1")),
        "recordless": Path(at.job("died-submitting")),
    }
    age(root, 2 * 3600)
    return paths


GONE = ["orphan", "marker", "old-done", "claim1", "claim2", "unused", "quarantined", "probe",
        "recordless"]
KEPT = ["named", "new-done", "claim3", "current"]


def test_gc_removes_what_nothing_needs_and_keeps_the_rest(store: Store) -> None:
    paths = layout(store)
    report = collect_garbage(store)
    assert {k: len(v) for k, v in report.removed.items()} == {
        "orphan segments": 1, "abort markers": 1, "ended jobs": 1, "old take-over claims": 2,
        "unused checkpoints": 1, "quarantined control requests": 1, "probe files": 1,
        "job folders without a record": 1,
    }
    assert [name for name in GONE if paths[name].exists()] == []
    assert [name for name in KEPT if not paths[name].exists()] == []
    assert store.list_log("l").live_records()[0].parts == [("segment", str(paths["named"]))]
    assert collect_garbage(store).total == 0  # a second run finds nothing


def test_gc_frees_the_name_an_ended_job_it_removes_still_holds(store: Store) -> None:
    """A driver that could not store its outcome keeps its name; gc frees it with the job."""
    records = JobRecords(store)
    eight_days_ago = int((time.time() - 8 * DAY) * 1000)
    records.write({"id": "old", "name": "nightly", "status": "FAILED",
                   "completion_time": eight_days_ago})
    assert records.claim_name("nightly", "old") is None
    records.write({"id": "other", "name": "hourly", "status": "RUNNING", "completion_time": -1})
    assert records.claim_name("hourly", "other") is None
    assert collect_garbage(store, dry_run=True).removed.keys() == {"ended jobs"}
    assert records.claim_name("nightly", "new") == "old"  # a dry run frees nothing
    collect_garbage(store)
    assert records.claim_name("nightly", "new") is None  # free: no wait for a gone record
    assert records.claim_name("hourly", "new") == "other"  # a live job keeps its name


def test_gc_leaves_young_files_and_dry_runs_remove_nothing(store: Store) -> None:
    paths = layout(store)
    assert collect_garbage(store, grace_seconds=3 * 3600).removed.keys() == {"ended jobs"}
    assert paths["old-done"].exists() is False and paths["orphan"].exists()
    report = collect_garbage(store, dry_run=True)
    assert report.dry_run and report.total == 8
    assert [name for name in GONE if name != "old-done" and not paths[name].exists()] == []
    with pytest.raises(ValueError, match="must not be negative"):
        collect_garbage(store, grace_seconds=-1)


def test_a_corrupt_record_is_left_alone(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    store.write_bytes(store.layout.job_record("broken"), b"{not json")
    age(Path(store.root), 30 * DAY)
    collect_garbage(store)
    assert Path(store.layout.job_record("broken")).exists()
    assert "leaving job folder" in caplog.text and "broken/job.json" in caplog.text


def test_sparkjet_gc_on_the_command_line(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = layout(store)
    config = tmp_path / "gc.toml"
    config.write_text(f"[store]\nurl = {json.dumps(store.url)}\n", encoding="utf-8")
    assert main(["-c", str(config), "gc", "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"^orphan segments +1$", shown, re.M) and "Would remove 9 in all." in shown
    assert str(paths["orphan"]) in shown and paths["orphan"].exists()
    assert main(["-c", str(config), "gc"]) == 0
    assert "Removed 9 in all." in capsys.readouterr().out and not paths["orphan"].exists()
    assert main(["-c", str(config), "gc"]) == 0
    assert capsys.readouterr().out.strip() == "Nothing to remove."
    assert main(["-c", str(config), "gc", "--grace", "-5"]) == 2
    assert "expected 0 or more seconds, got '-5'" in capsys.readouterr().err


def test_the_client_collects_garbage(tmp_path: Path) -> None:
    client = in_process_client(str(tmp_path / "s"))
    paths = layout(client.store)
    assert client.collect_garbage(dry_run=True).total == 9 and paths["orphan"].exists()
    assert client.collect_garbage().total == 9 and not paths["orphan"].exists()


def test_state_files_no_key_group_needs_go(store: Store) -> None:
    """Files of a checkpoint's state written with 2 tasks, then a full copy by 1: the 2 go."""
    from sparkjet.core.state.checkpoint import BatchPlan, Checkpoint, CommitRecord
    from sparkjet.core.state.files import RangeState

    records = JobRecords(store)
    records.write({"id": "j", "status": "RUNNING", "completion_time": -1,
                   "checkpoint": "checkpoint"})
    checkpoint = Checkpoint(store, store.layout.checkpoint("j", "checkpoint"))
    paths = checkpoint.state(checkpoint.key_groups(4, ["s"]))
    for batch, ranges in ((0, [(0, 2), (2, 4)]), (1, [(0, 4)])):
        for lo, hi in ranges:
            paths.write("s", lo, hi, batch, RangeState({f"k{lo}": batch}, {}, []), [], [],
                        paths.versions("s"))
        checkpoint.write_plan(BatchPlan(batch, {}, {}, 0, None))
        checkpoint.write_commit(CommitRecord(batch, {}))
    stage = Path(paths.stage_dir("s"))
    before = sorted(p.name for p in stage.iterdir())
    assert len(before) == 3
    report = collect_garbage(store, grace_seconds=3600)
    assert "superseded state files" not in report.removed  # younger than the grace
    age(stage, 7200)
    pin = checkpoint.pin(0)  # a snapshot export is reading batch 0's state
    report = collect_garbage(store, grace_seconds=3600)
    assert "superseded state files" not in report.removed
    assert sorted(p.name for p in stage.iterdir()) == before
    checkpoint.unpin(pin)
    report = collect_garbage(store, grace_seconds=3600)
    assert sorted(Path(p).name for p in report.removed["superseded state files"]) == before[:2]
    assert sorted(p.name for p in stage.iterdir()) == before[2:]
    assert paths.read("s", 0, 4, committed=1)[0].values == {"k0": 1}


def test_the_client_collects_what_killed_snapshot_exports_left(tmp_path: Path) -> None:
    from sparkjet.core.state.snapshots import snapshot_folder

    client = in_process_client(str(tmp_path / "s"))
    backend = client.snapshots.backend
    started = int((time.time() - 7200) * 1000)  # two hours ago: past the grace
    killed = f"{snapshot_folder('v1')}/{started:015d}-{'0' * 16}"
    backend.write_bytes(f"{killed}/state/half.state", b"half an export")
    young = f"{snapshot_folder('v2')}/{int(time.time() * 1000):015d}-{'1' * 16}"
    backend.write_bytes(f"{young}/state/half.state", b"an export still running")
    report = client.collect_garbage()
    assert report.removed["snapshot export attempts"] == [killed]
    assert not backend.exists(f"{killed}/state/half.state")
    assert backend.exists(f"{young}/state/half.state")


def test_listing_times_read_alike_on_every_backend(tmp_path: Path) -> None:
    """gc, retention and the file source read a file's age through one function.

    Each backend puts the time under its own key and type: local folders a float
    ``mtime``, memory a ``created`` datetime, s3fs an aware ``LastModified``,
    gcsfs an ISO ``updated`` string. A time without a zone is UTC (fsspec's
    backends stamp in UTC), whatever the machine's zone.
    """
    import datetime

    import fsspec

    from sparkjet.plugin import file_modified

    written = tmp_path / "f"
    written.write_bytes(b"x")
    os.utime(written, (1_700_000_000.5, 1_700_000_000.5))
    local = fsspec.filesystem("file").info(str(written))
    assert file_modified(local) == 1_700_000_000.5
    memory = fsspec.filesystem("memory")
    memory.pipe("/listing-times/f", b"x")
    assert abs(file_modified(memory.info("/listing-times/f")) - time.time()) < 60  # type: ignore[operator]
    then = datetime.datetime(2026, 11, 25, 10, 0, tzinfo=datetime.UTC)
    expected = then.timestamp()
    assert file_modified({"LastModified": then}) == expected
    assert file_modified({"LastModified": then.replace(tzinfo=None)}) == expected
    assert file_modified({"updated": "2026-11-25T10:00:00.000Z"}) == expected
    assert file_modified({"updated": "2026-11-25T11:00:00+01:00"}) == expected
    assert file_modified({"size": 1, "updated": "not a time"}) is None
    assert file_modified({"size": 1}) is None
