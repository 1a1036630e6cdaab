"""Issue 24, the command line: upgrades that cannot silently lose or double count.

sparkjet's options after FILE.py are refused (``--`` passes the pipeline's on),
a closed pipe ends a command quietly, ``jet.get_job`` takes a name or an id,
and the upgrade options (``--allow-dropped-state``, ``--allow-changed-state``,
``--rename``, ``--source-start``) reach the JobConfig of ``submit`` and
``check-upgrade``.
"""

from __future__ import annotations

import fcntl
import json
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.cli import main
from sparkjet.job import Job, JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from tests.conftest import wait_until
from tests.test_cli import job_rows, no_spark, wait_for_job, write_config, write_file
from tests.test_cli_edges import cli, one_error_line
from tests.test_cli_results import run
from tests.test_cli_snapshots import exported, stop, write_snapshot

__all__ = ["no_spark"]  # the fixture, used by name

#: A pipeline that writes the ARGS it is given to args.json, then copies a list.
ARGS_PIPELINE = """
    import json

    from sparkjet.pipeline import Pipeline

    def pipeline(args):
        with open("args.json", "w") as f:
            json.dump(args, f)
        p = Pipeline.create()
        p.read_from(Pipeline.from_list("in", [1, 2])).write_to(Pipeline.to_list("out"))
        return p
"""

#: A streaming pipeline with one stateful stage that starts from the v1 snapshot of
#: tests/test_cli_snapshots: ``clicks-per-user`` renamed ``per-user``, ``uniq`` dropped.
V2_RENAMED = """
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import Pipeline, StreamSource

    pipeline = Pipeline.create()
    pipeline.read_from(StreamSource("clicks")).set_name("clicks") \\
        .group_by(lambda x: x % 10).aggregate(counting()).set_name("per-user") \\
        .write_to(Pipeline.to_map("counts"))
"""


@pytest.fixture
def config_file(client: sparkjet.Client) -> Path:
    return write_config(client)


def written_args() -> Any:
    """What the pipeline function of :data:`ARGS_PIPELINE` was given."""
    return json.loads(Path("args.json").read_text(encoding="utf-8"))


# --- 1. sparkjet's options after FILE.py are refused, '--' passes the pipeline's on ---------


@pytest.mark.usefixtures("config_file", "no_spark")
@pytest.mark.parametrize(("after", "named", "before"), [
    (["-s", "snap"], "-s after v1.py is an option of sparkjet submit", "submit -s ... v1.py"),
    (["--snapshot", "snap"], "--snapshot after v1.py", "submit --snapshot ... v1.py"),
    (["--snapshot=snap"], "--snapshot=snap after v1.py", "submit --snapshot=snap ... v1.py"),
    (["-ssnap"], "-ssnap after v1.py", "submit -ssnap ... v1.py"),
    (["x", "-n", "v"], "-n after v1.py", "submit -n ... v1.py"),
    (["--nam", "v"], "--nam (an abbreviation of --name) after v1.py", "submit --nam ... v1.py"),
    (["-g", "exactly_once"], "-g after v1.py", "submit -g ... v1.py"),
    (["--rename", "a=b"], "--rename after v1.py", "submit --rename ... v1.py"),
    (["--allow-dropped-state"], "--allow-dropped-state after v1.py",
     "submit --allow-dropped-state ... v1.py"),
    (["--help"], "--help after v1.py", "submit --help ... v1.py"),
    (["-v"], "-v after v1.py is an option of sparkjet, which goes before the command",
     "sparkjet -v submit ... v1.py"),
    (["--config", "other.toml"], "--config after v1.py is an option of sparkjet",
     "sparkjet --config submit ... v1.py"),
])
def test_submit_refuses_its_options_after_the_file_and_submits_nothing(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client,
    after: list[str], named: str, before: str,
) -> None:
    write_file("v1.py", ARGS_PIPELINE)
    code, out, err = run(capsys, "submit", "-n", "v", "v1.py", *after)
    assert (code, out) == (2, "")
    assert err.startswith("usage: sparkjet submit ")
    line = err.splitlines()[-1]
    assert line.startswith(f"ERROR: {named}")
    assert before in line
    assert f"sparkjet submit v1.py -- {shlex.join(after)}" in line
    assert not Path("args.json").exists()  # the file was not even loaded
    assert client.get_jet().get_jobs() == []


@pytest.mark.usefixtures("config_file", "no_spark")
def test_check_upgrade_refuses_its_options_after_the_file(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client,
) -> None:
    write_file("v2.py", ARGS_PIPELINE)
    write_snapshot(client, "snap", "clicks")
    code, out, err = run(capsys, "check-upgrade", "v2.py", "-s", "snap")
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (
        "ERROR: -s after v2.py is an option of sparkjet check-upgrade, which goes before "
        "v2.py: sparkjet check-upgrade -s ... v2.py; to pass it to the pipeline, put the "
        "pipeline's arguments after '--': sparkjet check-upgrade v2.py -- -s snap"
    )
    for refused in (["--rename", "a=b"], ["--source-start=*=latest"]):
        code, _, err = run(capsys, "check-upgrade", "-s", "snap", "v2.py", *refused)
        assert code == 2
        assert f"ERROR: {refused[0]} after v2.py" in err
    assert not Path("args.json").exists()

    # After '--' anything is the pipeline's; so is what check-upgrade does not know (-n).
    run(capsys, "check-upgrade", "-s", "snap", "v2.py", "--", "-s", "x", "--rename", "a=b")
    assert written_args() == ["-s", "x", "--rename", "a=b"]
    run(capsys, "check-upgrade", "-s", "snap", "v2.py", "-n", "3")
    assert written_args() == ["-n", "3"]


def test_the_reported_command_line_is_refused_by_the_real_command(
    config_file: Path, client: sparkjet.Client
) -> None:
    """``sparkjet submit -n v -g exactly_once v1.py -s snap`` started v1 from scratch."""
    write_file("v1.py", ARGS_PIPELINE)
    proc = cli("submit", "-n", "v", "-g", "exactly_once", "v1.py", "-s", "snap",
               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out) == (2, b"")
    line = err.decode().splitlines()[-1]
    assert line.startswith("ERROR: -s after v1.py is an option of sparkjet submit")
    assert "sparkjet submit v1.py -- -s snap" in line
    assert "Traceback" not in err.decode()
    assert client.get_jet().get_jobs() == []


@pytest.mark.usefixtures("config_file")
@pytest.mark.spark
def test_arguments_after_double_dash_and_plain_arguments_reach_the_pipeline(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client,
) -> None:
    write_file("echo.py", ARGS_PIPELINE)
    # Everything after '--' goes on untouched, sparkjet's options too; the '--' is dropped.
    code, _, err = run(capsys, "submit", "-n", "a", "echo.py", "--", "-s", "snap", "-n",
                         "v", "--rename=x=y", "--", "-v")
    assert code == 0, err
    expected = ["-s", "snap", "-n", "v", "--rename=x=y", "--", "-v"]
    assert written_args() == expected
    job = client.get_jet().get_job("a")
    assert job is not None
    assert job.config.arguments == expected
    assert job.config.initial_snapshot_name is None

    # What sparkjet does not know passes as today, also an option of the pipeline's own;
    # a '--' later on is the pipeline's, and ends the check.
    code, _, err = run(capsys, "submit", "-n", "b", "echo.py", "3", "--scale", "10", "-1",
                         "--", "-s", "x")
    assert code == 0, err
    expected = ["3", "--scale", "10", "-1", "--", "-s", "x"]
    assert written_args() == expected
    job = client.get_jet().get_job("b")
    assert job is not None and job.config.arguments == expected


# --- 2. a reader that stops reading ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("config_file")
def test_list_jobs_into_a_pipe_closed_early_ends_quietly(
    client: sparkjet.Client, store_url: str,
) -> None:
    """``sparkjet list-jobs -a | head -1``, with more jobs than the pipe holds."""
    pipeline = Pipeline.create()
    pipeline.read_from(Pipeline.from_list("in", [1])).write_to(Pipeline.to_list("out"))
    seed = client.get_jet().submit(pipeline, JobConfig(name="seed"))
    seed.join(timeout=120)
    # Copies of the real job's record under new ids: 400 rows, more than the 4 KiB pipe below.
    record = json.loads((Path(store_url) / "jobs" / seed.id / "job.json").read_text())
    for n in range(400):
        job_id = f"{n:04x}-0000-0000-0000"
        folder = Path(store_url) / "jobs" / job_id
        folder.mkdir(parents=True)
        copy = {**record, "id": job_id, "name": f"copy-{n}",
                "submission_time": record["submission_time"] - n - 1}
        (folder / "job.json").write_text(json.dumps(copy), encoding="utf-8")

    proc = cli("list-jobs", "-a", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    fcntl.fcntl(proc.stdout.fileno(), 1031, 4096)  # F_SETPIPE_SZ: one page
    assert proc.stdout.readline().split() == [b"ID", b"STATUS", b"SUBMISSION", b"TIME", b"NAME"]
    proc.stdout.close()  # | head -1, while the command still has rows to write
    err = proc.stderr.read().decode()
    assert (proc.wait(timeout=60), err) == (141, "")

    # Read to the end, the same command lists every job.
    done = cli("list-jobs", "-a", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err_bytes = done.communicate(timeout=60)
    assert (done.returncode, err_bytes) == (0, b"")
    assert len(job_rows(out.decode())) == 401


# --- 3. jet.get_job(name_or_id) ----------------------------------------------------------


def batch_job(client: sparkjet.Client, name: str | None) -> Job:
    pipeline = Pipeline.create()
    pipeline.read_from(Pipeline.from_list("in", [1])).write_to(Pipeline.to_list("out"))
    job = client.get_jet().submit(pipeline, JobConfig(name=name))
    job.join(timeout=120)
    return job


def test_get_job_takes_an_id_or_a_name(client: sparkjet.Client, store_url: str) -> None:
    jet = client.get_jet()
    first = batch_job(client, "nightly")
    second = batch_job(client, "nightly")
    assert jet.get_job("ghost") is None

    # By name, no job of it active: the one submitted last.
    found = jet.get_job("nightly")
    assert found is not None and found.id == second.id
    by_id = jet.get_job(first.id)
    assert by_id is not None and by_id.id == first.id

    # An id wins over a name: a job named like another job's id.
    impostor = batch_job(client, first.id)
    by_id = jet.get_job(first.id)
    assert by_id is not None and by_id.id == first.id
    named = jet.get_job_by_name(first.id)
    assert named is not None and named.id == impostor.id

    # Another process (no runner here) finds them through the store alike.
    other = sparkjet.connect(store={"url": store_url})
    found = other.get_jet().get_job("nightly")
    assert found is not None and found.id == second.id


def test_get_job_by_a_name_shared_by_a_finished_and_a_running_job(
    client: sparkjet.Client, cancel_at_end: list[Job],
) -> None:
    jet = client.get_jet()
    finished = batch_job(client, "shared")
    assert finished.status is JobStatus.COMPLETED
    client.get_stream("events", partitions=1).publish_all([1, 2])
    p = Pipeline.create()
    p.read_from(StreamSource("events")).map(lambda x: x * 10).write_to(Pipeline.to_list("tens"))
    running = jet.submit(p, JobConfig(name="shared"))
    cancel_at_end.append(running)
    wait_until(lambda: running.status is JobStatus.RUNNING, 120, "the streaming job to run")

    found = jet.get_job("shared")
    assert found is not None and found.id == running.id  # the active one
    found = jet.get_job(finished.id)
    assert found is not None and found.id == finished.id  # the other by its id

    running.cancel()
    wait_until(running.is_terminal, 60, "the cancel")
    found = jet.get_job("shared")
    assert found is not None and found.id == running.id  # none active: the newest
    again = batch_job(client, "shared")
    found = jet.get_job("shared")
    assert found is not None and found.id == again.id


# --- 4. the upgrade options --------------------------------------------------------------


@pytest.mark.usefixtures("config_file", "no_spark")
@pytest.mark.parametrize(("options", "says"), [
    (["--rename", "foo"], "argument --rename: expected OLD=NEW"),
    (["--rename", "=new"], "got '=new'"),
    (["--rename", "old="], "got 'old='"),
    (["--source-start", "s=middle"], "argument --source-start: expected STAGE=initial or "
     "STAGE=latest"),
    (["--source-start", "clicks"], "got 'clicks'"),
    (["--source-start", "=latest"], "got '=latest'"),
    (["--rename", "a=b", "--rename", "a=c"], "argument --rename: 'a' is given twice (a=b and "
     "a=c)"),
    (["--rename", "a=b", "--rename", "c=b"], "argument --rename: 'b' is the new name of both "
     "'a' and 'c'"),
    (["--source-start", "*=latest", "--source-start", "*=initial"],
     "argument --source-start: '*' is given twice"),
])
@pytest.mark.parametrize("command", ["submit", "check-upgrade"])
def test_bad_upgrade_options_are_refused_naming_the_value(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client,
    command: str, options: list[str], says: str,
) -> None:
    write_file("v2.py", ARGS_PIPELINE)
    write_snapshot(client, "snap", "clicks")
    code, out, err = run(capsys, command, "-s", "snap", *options, "v2.py")
    assert (code, out) == (2, "")
    assert err.startswith(f"usage: sparkjet {command} ")
    assert says in err.splitlines()[-1]
    assert not Path("args.json").exists()
    assert client.get_jet().get_jobs() == []


@pytest.mark.usefixtures("config_file", "no_spark")
def test_submit_refuses_upgrade_options_without_a_snapshot(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client,
) -> None:
    write_file("v2.py", ARGS_PIPELINE)
    code, out, err = run(capsys, "submit", "--allow-changed-state", "--source-start",
                         "*=latest", "v2.py")
    assert (code, out) == (2, "")
    assert one_error_line(err) == (
        "ERROR: submit: --allow-changed-state, --source-start only apply when the job starts "
        "from a snapshot: add -s SNAPSHOT (or leave them out)"
    )
    assert not Path("args.json").exists()
    assert client.get_jet().get_jobs() == []


@pytest.mark.usefixtures("config_file")
@pytest.mark.spark
def test_submit_puts_the_upgrade_options_in_the_job_config(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client, cancel_at_end: list[Job],
) -> None:
    exported(client, "v1-snap", range(40))
    write_file("v2.py", V2_RENAMED)
    result: list[int] = []
    argv = [
        "submit", "-n", "v2", "-g", "exactly_once", "--snapshot-interval", "100",
        "-s", "v1-snap", "--allow-dropped-state", "--allow-changed-state",
        "--rename", "clicks-per-user=per-user", "--source-start", "*=latest",
        "--source-start", "clicks=initial", "v2.py",
    ]
    submit = threading.Thread(target=lambda: result.append(main(argv)), daemon=True)
    submit.start()
    job = None
    try:
        job = wait_for_job(client, "v2", JobStatus.RUNNING)
        cancel_at_end.append(job)
        for seen in (job, client.get_jet().get_job(job.id)):  # this process; the record
            assert seen is not None
            config = seen.config
            assert config.initial_snapshot_name == "v1-snap"
            assert config.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE
            assert config.allow_dropped_state is True
            assert config.allow_changed_state is True
            assert config.stage_renames == {"clicks-per-user": "per-user"}
            assert config.source_starts == {"*": "latest", "clicks": "initial"}
            assert config.arguments == []
    finally:
        stop(job)
        submit.join(timeout=60)
    assert not submit.is_alive()
    record = client.get_jet().get_job("v2")
    assert record is not None
    assert record.config.stage_renames == {"clicks-per-user": "per-user"}


@pytest.mark.usefixtures("config_file", "no_spark")
def test_check_upgrade_passes_the_upgrade_options_in_a_job_config(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sparkjet.core.jobs.service import JetService

    write_snapshot(client, "snap", "clicks")
    write_file("v2.py", V2_RENAMED)
    given: list[JobConfig | None] = []
    real = JetService.check_upgrade

    def spy(self: JetService, pipeline: Any, snapshot: str,
            config: JobConfig | None = None) -> Any:
        given.append(config)
        return real(self, pipeline, snapshot, config=config)

    monkeypatch.setattr(JetService, "check_upgrade", spy)
    _, out, err = run(capsys, "check-upgrade", "-s", "snap", "--allow-dropped-state",
                         "--allow-changed-state", "--rename", "clicks-per-user=per-user",
                         "--source-start", "clicks=latest", "v2.py")
    assert "Traceback" not in err
    assert "Snapshot 'snap'" in out
    (config,) = given
    assert config is not None
    assert config.allow_dropped_state is True
    assert config.allow_changed_state is True
    assert config.stage_renames == {"clicks-per-user": "per-user"}
    assert config.source_starts == {"clicks": "latest"}

    given.clear()
    run(capsys, "check-upgrade", "-s", "snap", "v2.py")
    (config,) = given
    assert config is None or (  # no option given: JobConfig's defaults
        not config.allow_dropped_state and not config.allow_changed_state
        and config.stage_renames == {} and config.source_starts == {}
    )
