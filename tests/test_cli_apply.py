"""``sparkjet apply FILE.toml`` and ``sparkjet get jobs|snapshots``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

import sparkjet
from sparkjet.cli import main
from sparkjet.job import JobStatus
from tests.test_cli import STREAM_PIPELINE, wait_for, wait_for_job, write_config, write_file

BATCH_PIPELINE = """
    from sparkjet.pipeline import Pipeline

    pipeline = Pipeline.create()
    pipeline.read_from(Pipeline.from_list("numbers", [1, 2, 3])) \\
        .map(lambda x: x * 2) \\
        .write_to(Pipeline.to_list("doubled"))
"""

STREAM_JOB = """
[[job]]
name = "tens"
pipeline = "pipelines/tens.py"
state = "{state}"
processing_guarantee = "exactly_once"
snapshot_interval_millis = 100
"""


def test_apply_submits_exports_once_and_suspends(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client, tmp_path: Path
) -> None:
    write_config(client)
    Path("pipelines").mkdir()
    write_file("pipelines/tens.py", STREAM_PIPELINE)
    jobs = Path("jobs.toml")
    jobs.write_text(STREAM_JOB.format(state="running"), encoding="utf-8")
    stream = client.get_stream("events", partitions=1)
    stream.publish_all([1, 2, 3])
    out_file, err_file = tmp_path / "apply.out", tmp_path / "apply.err"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with out_file.open("wb") as out_fh, err_file.open("wb") as err_fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sparkjet.cli", "apply", str(jobs)],
            stdout=out_fh, stderr=err_fh, env=env,
        )
    try:
        job = wait_for_job(client, "tens", JobStatus.RUNNING)
        wait_for(lambda: client.get_list("tens").size() == 3, 120, "the first items")
        assert proc.poll() is None  # a streaming job keeps apply in the foreground

        assert main(["apply", str(jobs)]) == 0
        assert capsys.readouterr().out == "Nothing to change.\n"

        jobs.write_text(
            STREAM_JOB.format(state="running")
            + '[[snapshot]]\nname = "before-upgrade"\njob = "tens"\n',
            encoding="utf-8",
        )
        assert main(["apply", str(jobs)]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"Exported snapshot 'before-upgrade' of job 'tens' ({job.id})")
        assert main(["apply", str(jobs)]) == 0  # exactly once
        assert capsys.readouterr().out == "Nothing to change.\n"
        assert main(["get", "snapshots"]) == 0
        rows = capsys.readouterr().out.splitlines()
        assert rows[0].split()[:2] == ["TIME", "SIZE"]
        assert [r.split()[-2:] for r in rows[1:]] == [["tens", "before-upgrade"]]

        jobs.write_text(STREAM_JOB.format(state="suspended"), encoding="utf-8")
        assert main(["apply", str(jobs)]) == 0
        label = f"'tens' ({job.id})"
        assert capsys.readouterr().out == (
            f"Suspending job {label}\nJob {label} is SUSPENDED (Requested by user)\n"
        )
        assert proc.wait(timeout=120) == 0  # the foreground apply ends with its job
        lines = out_file.read_text().splitlines()
        assert lines[0] == f"Submitted job {job.id}, name: tens"
        assert f"Resume it with: sparkjet resume {job.id}" in lines
        assert main(["apply", str(jobs)]) == 0
        assert capsys.readouterr().out == "Nothing to change.\n"
        assert main(["get", "jobs"]) == 0
        rows = capsys.readouterr().out.splitlines()[1:]
        assert [r.split()[:2] for r in rows] == [[job.id, "SUSPENDED"]]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        found = client.get_jet().get_job_by_name("tens")
        if found is not None and not found.is_terminal():
            found.cancel()
            wait_for(found.is_terminal, 60, "the job to stop")


@pytest.mark.spark
def test_apply_reads_a_pipeline_url_and_refuses_a_snapshot_of_a_completed_job(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client
) -> None:
    write_config(client)
    fs = fsspec.filesystem("memory")
    fs.pipe("/apply-test/double.py", write_file("double.py", BATCH_PIPELINE).read_bytes())
    Path("double.py").unlink()
    jobs = Path("jobs.toml")
    jobs.write_text(
        '[[job]]\nname = "doubler"\npipeline = "memory://apply-test/double.py"\n',
        encoding="utf-8",
    )
    try:
        assert main(["apply", str(jobs)]) == 0  # a batch job: in the foreground until done
        out = capsys.readouterr().out
        job = client.get_jet().get_job_by_name("doubler")
        assert job is not None
        assert out.splitlines() == [
            f"Submitted job {job.id}, name: doubler",
            f"Job 'doubler' ({job.id}) finished: COMPLETED",
        ]
        assert sorted(client.get_list("doubled").get_all()) == [2, 4, 6]

        # A snapshot of a batch job that COMPLETED: Jet's rule, the rest still applied.
        with jobs.open("a", encoding="utf-8") as fh:
            fh.write('[[snapshot]]\nname = "late"\njob = "doubler"\n')
            fh.write('[[snapshot]]\nname = "ghost"\njob = "nobody"\n')
        assert main(["apply", str(jobs)]) == 1
        captured = capsys.readouterr()
        # (other tests' jobs may still log to stderr in this process: only ERROR lines count)
        err = [line for line in captured.err.splitlines() if line.startswith("ERROR:")]
        assert len(err) == 2, captured.err
        # Jet's rule: only a RUNNING or SUSPENDED (streaming) job exports a snapshot.
        # One wording for both refusals (34df36b): only the reason differs.
        assert err[0].startswith("ERROR: snapshot 'late': cannot export a snapshot of job "
                                 "'doubler'"), err[0]
        # The apply submits 'doubler' again (its last run ended) and exports before it
        # joins it: refused for the new run's status (NOT_RUNNING, STARTING or COMPLETED
        # by then) or, once it runs, as a batch job.
        assert re.search(r"it is (NOT_RUNNING|STARTING|COMPLETED), not RUNNING or SUSPENDED$"
                         r"|it is a batch job$", err[0]), err[0]
        assert err[1] == (
            "ERROR: snapshot 'ghost': jobs.toml: [[snapshot]] 'ghost': job: no job named 'nobody'"
        )
        assert client.get_jet().find_snapshot("late") is None
    finally:
        fs.rm("/apply-test", recursive=True)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[[job]]\nname = "a"\npipeline = "p.py"\ncolour = "red"\n',
         "jobs.toml: [[job]] #1: unknown key 'colour' (expected one of: name, pipeline, "),
        ('[[job]]\nname = "a"\npipeline = "missing.py"\n',
         "jobs.toml: [[job]] 'a': pipeline: no such file: missing.py"),
        ('[[job]]\nname = "a"\npipeline = "p.py"\nstate = "paused"\n',
         "jobs.toml: [[job]] 'a': state: expected 'running' or 'suspended', got 'paused'"),
        ('[[job]]\nname = "a"\npipeline = "p.py"\nerror_policy = "skip"\n',
         "jobs.toml: [[job]] 'a': error_policy: expected 'fail' or 'dead-letter', got 'skip'"),
        ('[[job]]\nname = "a"\npipeline = "p.py"\nadaptive_micro_batches = "no"\n',
         "jobs.toml: [[job]] 'a': adaptive_micro_batches: expected a bool, got 'no'"),
        ('[[job]]\nname = "a"\npipeline = "p.py"\n[[job]]\nname = "a"\npipeline = "p.py"\n',
         "jobs.toml: [[job]] 'a': name: duplicate job name 'a'"),
        ('[[job]]\npipeline = "p.py"\n', "jobs.toml: [[job]] #1: missing key 'name'"),
        ('[[snapshot]]\nname = "s"\njob = "a"\ncancel = true\n',
         "jobs.toml: [[snapshot]] #1: unknown key 'cancel' (expected one of: name, job, "
         "cancel_job)"),
        ('[[jobs]]\nname = "a"\n',
         "jobs.toml: unknown table 'jobs' (expected [[job]] or [[snapshot]])"),
        ("[[job]\n", "jobs.toml: invalid TOML: "),
    ],
)
def test_apply_refuses_bad_input_naming_file_table_and_key(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client, toml: str, message: str
) -> None:
    write_config(client)
    write_file("p.py", BATCH_PIPELINE)
    Path("jobs.toml").write_text(toml, encoding="utf-8")
    assert main(["apply", "jobs.toml"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"ERROR: {message}")
    assert client.get_jet().get_jobs() == []


def test_apply_adaptive_micro_batches_reaches_the_job_config() -> None:
    from sparkjet.cli.apply import _config, parse

    write_file("p.py", BATCH_PIPELINE)
    jobs = Path("jobs.toml")
    jobs.write_text('[[job]]\nname = "a"\npipeline = "p.py"\nadaptive_micro_batches = false\n'
                    '[[job]]\nname = "b"\npipeline = "p.py"\nadaptive_micro_batches = true\n'
                    '[[job]]\nname = "c"\npipeline = "p.py"\n', encoding="utf-8")
    specs, _ = parse(jobs)
    assert [s.adaptive_micro_batches for s in specs] == [False, True, None]
    assert [_config(s).adaptive_micro_batches for s in specs] == [False, True, None]


def test_apply_credentials_name_a_buckets_table(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client
) -> None:
    write_config(client, '[buckets.team]\nendpoint_url = "${env:APPLY_TEST_UNSET}"\n')
    Path("jobs.toml").write_text(
        '[[job]]\nname = "a"\npipeline = "s3://bucket/p.py"\ncredentials = "other"\n'
        '[[job]]\nname = "b"\npipeline = "s3://bucket/p.py"\ncredentials = "team"\n',
        encoding="utf-8",
    )
    assert main(["apply", "jobs.toml"]) == 2
    err = capsys.readouterr().err.splitlines()
    config = Path("sparkjet.toml").resolve()
    assert err == [
        f"ERROR: jobs.toml: [[job]] 'a': credentials: {config}: no table "
        "[buckets.other] (known: [buckets.team])",
        f"ERROR: jobs.toml: [[job]] 'b': credentials: {config}: [buckets.team]"
        ".endpoint_url refers to environment variable APPLY_TEST_UNSET, which is not set",
    ]
