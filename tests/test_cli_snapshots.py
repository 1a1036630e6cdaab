"""The snapshot commands: save, list, delete, inspect, check-upgrade, copy, and submit -s.

Run through ``main()`` in this process (the CLI's client is not the one driving
the job, so it acts through the job's control folder, as another process
would) and once as real processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.cli import main
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from tests.test_cli import wait_for, wait_for_job, write_config, write_file
from tests.test_snapshots import v1

#: v1 of the clicks pipeline: per-user counts and the distinct clicks.
V1 = """
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import Pipeline, StreamSource

    pipeline = Pipeline.create()
    events = pipeline.read_from(StreamSource("clicks")).set_name("clicks")
    events.group_by(lambda x: x % 10).aggregate(counting()).set_name("clicks-per-user") \\
        .write_to(Pipeline.to_map("counts"))
    events.distinct().set_name("uniq").write_to(Pipeline.to_list("firsts"))
"""

#: v2: a filter, a new stateful stage, ``uniq`` dropped, ``clicks-per-user`` kept.
V2 = """
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import Pipeline, StreamSource

    pipeline = Pipeline.create()
    events = pipeline.read_from(StreamSource("clicks")).set_name("clicks")
    kept = events.filter(lambda x: x >= 0).set_name("non-negative")
    kept.group_by(lambda x: x % 10).aggregate(counting()).set_name("clicks-per-user") \\
        .write_to(Pipeline.to_map("counts"))
    kept.group_by(lambda x: x % 2).aggregate(counting()).set_name("per-parity") \\
        .write_to(Pipeline.to_map("parity"))
"""

#: ``clicks-per-user`` keeps lists now, not counts: refused by Jet's rules.
INCOMPATIBLE = """
    from sparkjet.pipeline import Pipeline, StreamSource

    pipeline = Pipeline.create()
    pipeline.read_from(StreamSource("clicks")).set_name("clicks") \\
        .group_by(lambda x: x % 10) \\
        .aggregate(accumulator=lambda acc, x: [*acc, x], initial=[]) \\
        .set_name("clicks-per-user") \\
        .write_to(Pipeline.to_map("lists"))
"""

LIST_HEADER = "TIME                    SIZE (bytes)    JOB NAME                 SNAPSHOT NAME"
TIME_PATTERN = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}"


@pytest.fixture
def config_file(client: sparkjet.Client) -> Path:
    return write_config(client)


def oracle(values: range, mod: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    for v in values:
        counts[v % mod] = counts.get(v % mod, 0) + 1
    return counts


def start_v1(client: sparkjet.Client, name: str | None = "clicks") -> Any:
    config = JobConfig(name=name, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                       snapshot_interval_millis=100, key_groups=16)
    job = client.get_jet().submit(v1(), config)
    wait_for(lambda: job.status is JobStatus.RUNNING, 120, "v1 to run")
    return job


def stop(job: Any) -> None:
    if job is not None and not job.is_terminal():
        job.cancel()
        wait_for(job.is_terminal, 60, "the job to stop")


def exported(client: sparkjet.Client, name: str, events: range) -> Any:
    """A v1 job that has counted ``events``, its snapshot ``name`` taken, then cancelled."""
    stream = client.get_stream("clicks", partitions=2)
    job = start_v1(client)
    try:
        stream.publish_all(events)
        wait_for(lambda: dict(client.get_map("counts").entry_set()) == oracle(events, 10), 60,
                 "v1's counts")
        return job.export_snapshot(name)
    finally:
        stop(job)


def list_rows(output: str) -> list[tuple[str, str, str, str]]:
    """The rows of ``list-snapshots``, cut at Jet's fixed columns."""
    lines = output.splitlines()
    assert lines[0] == LIST_HEADER
    return [(line[:23].rstrip(), line[24:39].rstrip(), line[40:64].rstrip(), line[65:])
            for line in lines[1:]]


def flip_a_byte(client: sparkjet.Client, name: str, stage: str) -> str:
    """Flip a byte of ``stage``'s first state file through the backend; returns its path."""
    snapshot = client.snapshots.get(name)
    entry = snapshot.manifest.stage(stage).files[0]
    path = snapshot.path(entry.path)
    backend = client.snapshots.backend
    data = bytearray(backend.read_bytes(path))
    data[len(data) // 2] ^= 0xFF
    backend.write_bytes(path, bytes(data))
    return entry.path


def local_time(millis: int) -> str:
    moment = datetime.fromtimestamp(millis // 1000)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{millis % 1000:03d}"


# --- save, list, inspect, check-upgrade, submit -s: the whole upgrade ----------------------


@pytest.mark.spark
def test_save_list_inspect_check_and_submit_from_a_snapshot(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client
) -> None:
    stream = client.get_stream("clicks", partitions=2)
    counts = client.get_map("counts")
    job = start_v1(client)
    label = f"'clicks' ({job.id})"
    try:
        stream.publish_all(range(300))
        wait_for(lambda: dict(counts.entry_set()) == oracle(range(300), 10), 60, "v1's counts")

        assert main(["save-snapshot", "clicks", "v1"]) == 0  # the job keeps running
        snapshot = client.get_jet().get_snapshot("v1")
        batch = snapshot.manifest.batch_id
        assert capsys.readouterr().out == (
            f"Saving snapshot 'v1' of job {label}\n"
            f"Exported snapshot 'v1': batch {batch}, 2 stateful stages, "
            f"{snapshot.payload_size:,} bytes\n"
        )
        assert job.status is JobStatus.RUNNING
        assert snapshot.job_id == job.id

        assert main(["list-snapshots"]) == 0
        rows = list_rows(capsys.readouterr().out)
        assert rows == [(local_time(snapshot.creation_time), f"{snapshot.payload_size:,}",
                         "clicks", "v1")]
        assert re.fullmatch(TIME_PATTERN, rows[0][0])
        assert snapshot.payload_size >= 1000 and "," in rows[0][1]

        assert main(["inspect-snapshot", "v1"]) == 0
        lines = capsys.readouterr().out.splitlines()
        fields = {
            line.split(":", 1)[0]: line.split(":", 1)[1].strip()
            for line in lines if re.match(r"^[A-Z][a-z ]+:", line)
        }
        assert fields["Snapshot"] == "'v1'"
        assert fields["Job"] == label
        assert fields["Batch"] == str(batch)
        assert fields["Created"] == local_time(snapshot.creation_time)
        files = len(snapshot.manifest.all_files())
        assert fields["Size"] == f"{snapshot.payload_size:,} bytes in {files} files"
        assert fields["Format"] == "version 1"
        assert fields["Signed"] == "no"
        assert fields["Versions"].startswith(f"sparkjet {sparkjet.__version__}, Spark ")
        assert fields["Pipeline"] == f"fingerprint {snapshot.manifest.pipeline_fingerprint}"
        assert fields["Sources"].startswith("clicks: ")
        header = next(i for i, line in enumerate(lines) if line.startswith("STAGE"))
        assert re.split(r"\s{2,}", lines[header]) == [
            "STAGE", "KIND", "KEYS", "BYTES", "KEY GROUPS", "FILES", "SIGNATURE"]
        stages = {line.split()[0]: line.split(None, 6) for line in lines[header + 1:] if line}
        per_user = snapshot.manifest.stage("clicks-per-user")
        assert stages["clicks-per-user"][1:6] == [
            per_user.kind, "10", f"{per_user.bytes:,}", "16", str(len(per_user.files))]
        assert json.loads(stages["clicks-per-user"][6]) == per_user.state_signature
        assert stages["uniq"][2] == "300"

        assert main(["inspect-snapshot", "--verify", "v1"]) == 0
        assert capsys.readouterr().out.endswith(
            f"Verified: {files} files, every size and sha256 as the manifest says\n")

        stream.publish_all(range(300, 400))
        wait_for(lambda: dict(counts.entry_set()) == oracle(range(400), 10), 60, "more counts")
        # Jet overwrites by name; -C cancels the job once the snapshot is out.
        assert main(["save-snapshot", "-C", "clicks", "v1"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"Saving snapshot 'v1' of job {label} and cancelling the job\n")
        assert out.endswith(f"Job {label} finished: FAILED (cancelled by user)\n")
        assert job.is_user_cancelled()
        replaced = client.get_jet().get_snapshot("v1")
        assert replaced.manifest.stage("uniq").key_count == 400

        assert main(["save-snapshot", "clicks", "too-late"]) == 1
        captured = capsys.readouterr()
        assert captured.err == (f"ERROR: cannot export a snapshot of job {label}: it is "
                                "FAILED, not RUNNING or SUSPENDED\n")
        assert captured.out == ""
        assert client.get_jet().find_snapshot("too-late") is None
    finally:
        stop(job)

    write_file("v2.py", V2)
    # v2 has no 'uniq': its state would be lost, so the dry run refuses.
    assert main(["check-upgrade", "-s", "v1", "v2.py"]) == 2
    captured = capsys.readouterr()
    assert "  'uniq' dropped: the snapshot holds 400 keys of state of stage 'uniq'" in (
        captured.out)
    assert captured.err == ("ERROR: v2.py cannot start from snapshot 'v1': 1 row refused "
                            "('uniq'); see above (2 restored, 1 new, 1 dropped)\n")
    # After FILE.py it is not taken for a pipeline argument: refused, naming it.
    assert main(["check-upgrade", "-s", "v1", "v2.py", "--allow-dropped-state"]) == 2
    assert "--allow-dropped-state" in capsys.readouterr().err
    assert main(["check-upgrade", "--allow-dropped-state", "-s", "v1", "v2.py"]) == 0
    out = capsys.readouterr().out.splitlines()
    batch = replaced.manifest.batch_id
    assert out[0] == f"Snapshot 'v1' of job {label}, batch {batch}, with v2.py:"
    assert re.split(r"\s{2,}", out[1]) == [
        "STAGE", "KIND", "STATUS", "KEYS", "IN THE SNAPSHOT", "IN THE PIPELINE"]
    rows = {line.split()[0]: line.split()[1:4] for line in out[2:6]}
    assert rows == {"clicks-per-user": ["state", "restored", "10"],
                    "per-parity": ["state", "new", "0"], "clicks": ["source", "restored", "-"],
                    "uniq": ["state", "dropped", "400"]}
    assert "  'uniq' dropped: its 400 keys of state are left behind (allow_dropped_state)" in out
    assert out[-1] == ("Compatible: 2 restored, 1 new, 1 dropped; every file of the snapshot "
                       "checked.")
    assert client.get_jet().get_job_by_name("clicks-v2") is None  # nothing submitted

    # Published while no job ran: the upgraded job reads it from the snapshot's offsets.
    stream.publish_all(range(400, 450))
    result: list[int] = []
    submit = threading.Thread(
        target=lambda: result.append(main([
            "submit", "-s", "v1", "-n", "clicks-v2", "-g", "exactly_once",
            "--snapshot-interval", "100", "--allow-dropped-state", "v2.py",
        ])),
        daemon=True,
    )
    submit.start()
    job2 = None
    try:
        job2 = wait_for_job(client, "clicks-v2", JobStatus.RUNNING)
        assert job2.config.initial_snapshot_name == "v1"
        stream.publish_all(range(450, 500))
        wait_for(lambda: dict(counts.entry_set()) == oracle(range(500), 10), 60,
                 "clicks-per-user going on from its restored counts")
        wait_for(lambda: dict(client.get_map("parity").entry_set()) == oracle(
            range(400, 500), 2), 60, "the new stage, started empty at the cut")
        assert main(["suspend", "clicks-v2"]) == 0
        submit.join(timeout=60)
        assert result == [0]
        out = capsys.readouterr().out
        assert (f"Starting from snapshot 'v1' (batch {replaced.manifest.batch_id}): "
                "clicks-per-user restored, per-parity new, uniq dropped; sources: clicks "
                "restored\n") in out
    finally:
        if job2 is not None and not job2.is_terminal():
            assert main(["cancel", "clicks-v2"]) == 0
        submit.join(timeout=60)


# --- list-snapshots: Jet's layout ---------------------------------------------------------


def write_snapshot(
    client: sparkjet.Client, name: str, job_name: str | None, signature: Any = None,
    data: bytes = b"x" * 1234, creation_time: int | None = None,
) -> Any:
    """A snapshot written straight to the store: one stage, ``clicks-per-user``."""
    from sparkjet.core.state.snapshots import ManifestFields, StageFields

    fields = ManifestFields(
        job_id="0a1b-2c3d-4e5f-6789", job_name=job_name, sparkjet_version="0.0.0",
        spark_version="4.0.0", pipeline_fingerprint="feedfacecafebeef", batch_id=7,
        sources={"clicks": {"0": 5}},
        stages=[StageFields(
            "clicks-per-user", "aggregate",
            signature or {"op": "aggregate", "accumulator": "list", "combiner": False},
            3, 16, ["state/per-user.state"],
        )],
        creation_time=creation_time,
    )
    client.snapshots.write(name, fields, [("state/per-user.state", data)])
    return client.snapshots.get(name)


def test_list_snapshots_trims_job_names_as_jet_unless_full(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client,
    no_spark: None,
) -> None:
    assert main(["list-snapshots"]) == 0
    assert capsys.readouterr().out == LIST_HEADER + "\n"

    long_name = "a-job-name-longer-than-twenty-four-characters"
    write_snapshot(client, "b-long", long_name, creation_time=1_700_000_000_007)
    write_snapshot(client, "a-unnamed", None, data=b"y" * 1_234_567)
    write_snapshot(client, "c-short", "clicks")
    assert main(["list-snapshots"]) == 0
    rows = list_rows(capsys.readouterr().out)
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("1,234,567", "0a1b-2c3d-4e5f-6789", "a-unnamed"),  # by name; no job name: its id
        ("1,234", "a-job-name-longer-than-*", "b-long"),
        ("1,234", "clicks", "c-short"),
    ]
    assert rows[1][0] == local_time(1_700_000_000_007)
    assert all(re.fullmatch(TIME_PATTERN, r[0]) for r in rows)

    assert main(["list-snapshots", "-F"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[2:] == [long_name, "b-long"]
    assert main(["list-snapshots", "--full-job-name"]) == 0
    assert capsys.readouterr().out.splitlines() == lines


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything asks for the Spark session."""
    from sparkjet.core.engine.spark import session

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("this command must not start Spark")

    monkeypatch.setattr(session, "get_session", refuse)


# --- delete-snapshot ------------------------------------------------------------------------


def test_delete_snapshot(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client,
    no_spark: None,
) -> None:
    write_snapshot(client, "old", "clicks")
    write_snapshot(client, "kept", "clicks")
    assert main(["delete-snapshot", "old"]) == 0
    assert capsys.readouterr().out == "Deleted snapshot 'old'\n"
    assert [s.name for s in client.get_jet().list_snapshots()] == ["kept"]
    assert main(["delete-snapshot", "old"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ERROR: no snapshot named 'old' in snapshot backend 'local' at ")
    # A snapshot whose state file is corrupt is deleted all the same.
    flip_a_byte(client, "kept", "clicks-per-user")
    assert main(["delete-snapshot", "kept"]) == 0
    assert client.get_jet().list_snapshots() == []


# --- errors: unknown snapshot or job, incompatible upgrade, corrupt file --------------------


def test_unknown_snapshot_or_job(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client,
    no_spark: None,
) -> None:
    write_file("v2.py", V2)
    for argv in (
        ["inspect-snapshot", "ghost"],
        ["check-upgrade", "-s", "ghost", "v2.py"],
        ["copy-snapshot", "ghost", "--to", str(Path("elsewhere").resolve())],
        ["submit", "-s", "ghost", "v2.py"],
    ):
        assert main(argv) == 1, argv
        captured = capsys.readouterr()
        assert captured.err.startswith("ERROR: no snapshot named 'ghost' in snapshot backend "
                                       "'local' at "), argv
        assert "Traceback" not in captured.err
    assert client.get_jet().get_jobs() == []  # submit -s submitted nothing
    assert not Path("elsewhere").exists() or not any(Path("elsewhere").iterdir())

    assert main(["save-snapshot", "ghost", "v1"]) == 1
    assert capsys.readouterr().err == "ERROR: no job with id or name 'ghost'\n"
    assert main(["save-snapshot", "ghost"]) == 2  # NAME missing
    assert "the following arguments are required: NAME" in capsys.readouterr().err
    assert main(["check-upgrade", "v2.py"]) == 2  # -s is required
    assert "the following arguments are required: -s/--snapshot" in capsys.readouterr().err
    assert main(["check-upgrade", "-s", "ghost", "missing.py"]) == 2
    assert capsys.readouterr().err == "ERROR: missing.py: no such file\n"


def test_incompatible_upgrade_is_refused_with_the_stage_named(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client,
    no_spark: None,
) -> None:
    # The snapshot's clicks-per-user kept ints (counting), the new pipeline keeps lists.
    write_file("v2.py", V2)
    write_file("lists.py", INCOMPATIBLE)
    write_snapshot(client, "counted", "clicks",
                   signature={"op": "aggregate", "accumulator": "int", "combiner": True})
    assert main(["check-upgrade", "-s", "counted", "lists.py"]) == 2
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    row = next(line for line in lines if line.startswith("clicks-per-user"))
    assert row.split()[1:5] == ["state", "incompatible", "(refused)", "3"]
    assert "aggregate(int)" in row and "aggregate(list)" in row
    assert any(line.startswith("  'clicks-per-user' incompatible: stage 'clicks-per-user' "
                               "keeps state {") for line in lines), lines
    assert captured.err.startswith(
        "ERROR: lists.py cannot start from snapshot 'counted': ")
    assert "'clicks-per-user'" in captured.err
    assert captured.err.count("\n") == 1

    # submit -s refuses it the same way, before any job exists.
    assert main(["submit", "-s", "counted", "lists.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ERROR: ") and "clicks-per-user" in err
    assert client.get_jet().get_jobs() == []


@pytest.mark.spark
def test_corrupt_state_file_is_named(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client,
    tmp_path: Path,
) -> None:
    write_file("v2.py", V2)
    exported(client, "v1", range(40))
    assert main(["inspect-snapshot", "--verify", "v1"]) == 0
    capsys.readouterr()
    relpath = flip_a_byte(client, "v1", "clicks-per-user")
    message = f"ERROR: snapshot 'v1': file '{relpath}' does not match its checksum"

    assert main(["inspect-snapshot", "v1"]) == 0  # the manifest alone is sound
    capsys.readouterr()
    target = tmp_path / "copies"
    for argv in (
        ["inspect-snapshot", "--verify", "v1"],
        ["check-upgrade", "-s", "v1", "v2.py"],
        ["submit", "-s", "v1", "--allow-dropped-state", "v2.py"],  # v2 has no 'uniq'
        ["copy-snapshot", "v1", "--to", str(target)],
    ):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith(message), (argv, err)
    assert [job.name for job in client.get_jet().get_jobs()] == ["clicks"]  # v1's only
    assert main(["list-snapshots"]) == 0  # its manifest is intact: still listed
    assert [r[3] for r in list_rows(capsys.readouterr().out)] == ["v1"]
    copies = client.snapshot_store_at(str(target))
    assert copies.list() == []  # a failed copy leaves the target as it was


# --- copy-snapshot -------------------------------------------------------------------------


def test_copy_snapshot_between_backends(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client,
    tmp_path: Path, no_spark: None,
) -> None:
    original = write_snapshot(client, "v1", "clicks", creation_time=1_700_000_000_000)
    target = tmp_path / "archive"
    assert main(["copy-snapshot", "v1", "--to", str(target)]) == 0
    assert capsys.readouterr().out == (
        f"Copied snapshot 'v1' to 'v1' in snapshot backend 'local' at {target}: 1 file, "
        "1,234 bytes, every sha256 checked after writing\n"
    )
    copy = client.snapshot_store_at(str(target)).get("v1")
    copy.verify()
    assert (copy.creation_time, copy.job_name, copy.payload_size) == (
        original.creation_time, "clicks", original.payload_size)
    assert copy.read_file("state/per-user.state") == b"x" * 1234

    assert main(["copy-snapshot", "v1", "--to", f"file://{target}", "--as", "v1-archived"]) == 0
    capsys.readouterr()
    assert [s.name for s in client.snapshot_store_at(str(target)).list()] == [
        "v1", "v1-archived"]

    assert main(["copy-snapshot", "v1", "--to", "memory://sparkjet-cli-test/snaps",
                 "--as", "in-memory"]) == 0
    assert "in snapshot backend 'memory' at memory://sparkjet-cli-test/snaps" in \
        capsys.readouterr().out
    memory = client.snapshot_store_at("memory://sparkjet-cli-test/snaps")
    memory.get("in-memory").verify()
    memory.delete("in-memory")

    # Into the configured store itself: only under another name.
    configured = client.snapshots.backend.url
    assert main(["copy-snapshot", "v1", "--to", configured]) == 2
    assert "give the copy another name with --as" in capsys.readouterr().err
    assert main(["copy-snapshot", "v1", "--to", configured, "--as", "v1-copy"]) == 0
    capsys.readouterr()
    assert [s.name for s in client.get_jet().list_snapshots()] == ["v1", "v1-copy"]


def test_copy_snapshot_to_a_bad_url_or_with_bad_options(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, config_file: Path,
    client: sparkjet.Client, tmp_path: Path, no_spark: None,
) -> None:
    write_snapshot(client, "v1", "clicks")
    assert main(["copy-snapshot", "v1", "--to", "ftp://example.com/snaps"]) == 2
    assert capsys.readouterr().err == (
        "ERROR: copy-snapshot --to ftp://example.com/snaps: no built-in snapshot backend for "
        "'ftp://example.com/snaps': use a local path, file://, memory://, s3:// or gs://, or "
        "name the backend kind\n"
    )
    assert main(["copy-snapshot", "v1", "--to", str(tmp_path), "--to-backend", "nfs"]) == 2
    assert capsys.readouterr().err == (
        "ERROR: copy-snapshot --to-backend: no snapshot backend of kind 'nfs' is registered "
        "(known: gcs, local, memory, s3); is its plugin installed and not blocked?\n")

    # A path below a regular file cannot hold snapshots.
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder", encoding="utf-8")
    assert main(["copy-snapshot", "v1", "--to", str(blocker / "snaps")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ERROR: ") and "snapshot backend 'local'" in err
    assert "Traceback" not in err

    assert main(["copy-snapshot", "v1", "--to", str(tmp_path / "x"), "-o", "no_such=1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ERROR: copy-snapshot --to {tmp_path / 'x'}: ")
    assert "unknown option 'no_such' in --to-option" in err
    assert main(["copy-snapshot", "v1", "--to", str(tmp_path / "x"), "-o", "oops"]) == 2
    assert "expected KEY=VALUE, got 'oops'" in capsys.readouterr().err

    # Secrets from the environment: resolved, and never printed.
    monkeypatch.setenv("CLI_TEST_SECRET", "hunter2-secret-value")
    assert main(["copy-snapshot", "v1", "--to", str(tmp_path / "y"),
                 "--to-option", "password=${env:CLI_TEST_SECRET}"]) == 1
    err = capsys.readouterr().err
    assert "hunter2-secret-value" not in err
    assert main(["copy-snapshot", "v1", "--to", str(tmp_path / "y"),
                 "--to-option", "password=${env:CLI_TEST_UNSET}"]) == 2
    assert "CLI_TEST_UNSET, which is not set" in capsys.readouterr().err


# --- across processes ----------------------------------------------------------------------


@pytest.mark.slow
def test_save_snapshot_of_a_job_driven_by_another_process(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client,
    tmp_path: Path,
) -> None:
    """``submit`` in process A; ``save-snapshot`` and ``list-snapshots`` in processes B, C."""
    write_file("v1.py", V1)
    stream = client.get_stream("clicks", partitions=2)
    stream.publish_all(range(120))
    counts = client.get_map("counts")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sparkjet.cli", *args], capture_output=True, text=True,
            env=env, timeout=300, check=False,
        )

    a_out, a_err = tmp_path / "a.out", tmp_path / "a.err"
    with a_out.open("wb") as out_fh, a_err.open("wb") as err_fh:
        a = subprocess.Popen(
            [sys.executable, "-m", "sparkjet.cli", "submit", "-n", "remote-clicks", "-g",
             "exactly_once", "--snapshot-interval", "200", "v1.py"],
            stdout=out_fh, stderr=err_fh, env=env,
        )
    try:
        def counted() -> bool:
            if a.poll() is not None:
                pytest.fail(f"submit exited early ({a.returncode}):\n{a_err.read_text()}")
            return dict(counts.entry_set()) == oracle(range(120), 10)

        wait_for(counted, 240, "process A to count the events")
        job = client.get_jet().get_job_by_name("remote-clicks")
        assert job is not None
        label = f"'remote-clicks' ({job.id})"

        saved = cli("save-snapshot", "-C", "remote-clicks", "from-a")
        assert saved.returncode == 0, saved.stderr
        assert saved.stdout.splitlines()[0] == (
            f"Saving snapshot 'from-a' of job {label} and cancelling the job")
        assert saved.stdout.splitlines()[-1] == (
            f"Job {label} finished: FAILED (cancelled by user)")
        assert a.wait(timeout=90) == 1  # A's job was cancelled
        assert "finished: FAILED (cancelled by user)" in a_out.read_text()
    finally:
        if a.poll() is None:
            a.kill()
            a.wait(timeout=30)

    listed = cli("list-snapshots")
    assert listed.returncode == 0, listed.stderr
    rows = list_rows(listed.stdout)
    snapshot = client.get_jet().get_snapshot("from-a")
    assert rows == [(local_time(snapshot.creation_time), f"{snapshot.payload_size:,}",
                     "remote-clicks", "from-a")]
    assert snapshot.read_state("clicks-per-user") == oracle(range(120), 10)
    assert snapshot.job_id == job.id

    again = cli("save-snapshot", "remote-clicks", "too-late")
    assert again.returncode == 1
    assert again.stderr == (f"ERROR: cannot export a snapshot of job {label}: it is FAILED, "
                            "not RUNNING or SUSPENDED\n")
