"""``sparkjet apply`` upgrades a job whose pipeline changed, with its state (issue 24)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.cli import main
from sparkjet.core.jobs.service import JetService
from sparkjet.errors import StoreError
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from tests.test_cli import wait_for, wait_for_job, write_config, write_file

#: v1: per-key counts of a stream, in a map.
V1 = """
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import Pipeline, StreamSource

    pipeline = Pipeline.create()
    pipeline.read_from(StreamSource("clicks")).set_name("clicks") \\
        .group_by(lambda x: x % 3).aggregate(counting()).set_name("per-key") \\
        .write_to(Pipeline.to_map("counts"))
"""

#: v2: a filter before the count; ``per-key`` keeps its state.
V2 = """
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import Pipeline, StreamSource

    pipeline = Pipeline.create()
    pipeline.read_from(StreamSource("clicks")).set_name("clicks") \\
        .filter(lambda x: x >= 0).set_name("non-negative") \\
        .group_by(lambda x: x % 3).aggregate(counting()).set_name("per-key") \\
        .write_to(Pipeline.to_map("counts"))
"""

#: ``per-key`` keeps lists now, not counts: its state cannot be carried.
INCOMPATIBLE = """
    from sparkjet.pipeline import Pipeline, StreamSource

    pipeline = Pipeline.create()
    pipeline.read_from(StreamSource("clicks")).set_name("clicks") \\
        .filter(lambda x: x >= 0).set_name("non-negative") \\
        .group_by(lambda x: x % 3) \\
        .aggregate(accumulator=lambda acc, x: [*acc, x], initial=[]).set_name("per-key") \\
        .write_to(Pipeline.to_map("lists"))
"""

JOB = """
[[job]]
name = "counter"
pipeline = "counts.py"
processing_guarantee = "exactly_once"
snapshot_interval_millis = 100
"""


def _counts(client: sparkjet.Client) -> dict[Any, Any]:
    return dict(client.get_map("counts").entry_set())


def _expected(items: list[int]) -> dict[int, int]:
    return dict(Counter(x % 3 for x in items))


def _stop(client: sparkjet.Client, *procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for job in client.get_jet().get_jobs():
        if job.name == "counter" and not job.is_terminal():
            job.cancel()
            wait_for(job.is_terminal, 60, "the job to stop")


def _apply_in_background(jobs: Path, log: Path) -> subprocess.Popen[bytes]:
    """``sparkjet apply`` in its own process: it drives the jobs it starts.

    Its stdout goes to ``log``, its stderr (Spark's and sparkjet's logging) beside it.
    """
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with log.open("wb") as out, log.with_suffix(".err").open("wb") as err:
        return subprocess.Popen([sys.executable, "-m", "sparkjet.cli", "apply", str(jobs)],
                                stdout=out, stderr=err, env=env)


@pytest.mark.slow  # two apply processes, each with its Spark session: about two minutes
def test_apply_upgrades_a_changed_pipeline_from_the_old_jobs_state_counting_each_item_once(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client, tmp_path: Path
) -> None:
    write_config(client)
    write_file("counts.py", V1)
    jobs = Path("jobs.toml")
    jobs.write_text(JOB, encoding="utf-8")
    stream = client.get_stream("clicks", partitions=1)
    published = list(range(30))
    stream.publish_all(published)
    first = _apply_in_background(jobs, tmp_path / "first.out")
    second: subprocess.Popen[bytes] | None = None
    try:
        old = wait_for_job(client, "counter", JobStatus.RUNNING)
        wait_for(lambda: _counts(client) == _expected(published), 120, "the first counts")

        assert main(["apply", str(jobs)]) == 0  # the same pipeline: nothing to do
        assert capsys.readouterr().out == "Nothing to change.\n"

        # Items keep arriving while the job is upgraded: none may be lost or counted
        # twice by the old and the new job.
        stop = threading.Event()

        def publish() -> None:
            while not stop.is_set() and len(published) < 200:
                batch = list(range(len(published), len(published) + 5))
                stream.publish_all(batch)
                published.extend(batch)
                time.sleep(0.05)

        publisher = threading.Thread(target=publish)
        publisher.start()
        try:
            write_file("counts.py", V2)
            second = _apply_in_background(jobs, tmp_path / "second.out")

            def upgraded() -> Any:
                job = client.get_jet().get_job_by_name("counter")
                ok = job is not None and job.id != old.id and job.status is JobStatus.RUNNING
                return job if ok else None

            wait_for(upgraded, 180, "the upgraded job")
        finally:
            stop.set()
            publisher.join()
        new = upgraded()
        first.wait(timeout=120)  # the old job's apply ends with it
        assert old.is_terminal() and old.is_user_cancelled()
        fingerprint = client.get_jet().pipeline_fingerprint(_load("counts.py"))
        snapshot = f"counter-upgrade-{fingerprint[:8]}"
        assert new.config.initial_snapshot_name == snapshot
        restore = new.get_metrics()["snapshotRestore"]
        assert (restore["snapshot"], restore["stages"]) == (snapshot, {"per-key": "restored"})

        stream.publish_all([1000, 1001, 1002])
        published.extend([1000, 1001, 1002])
        wait_for(lambda: _counts(client) == _expected(published), 120,
                 f"the counts of {len(published)} items")
        time.sleep(1)  # nothing more arrives: each item counted once
        assert _counts(client) == _expected(published)

        lines = (tmp_path / "second.out").read_text().splitlines()
        assert lines[0].startswith(f"Upgrading job 'counter' ({old.id}): its pipeline changed "
                                   "(fingerprint ")
        assert lines[1].startswith(f"  1. Exported snapshot '{snapshot}' (batch ")
        assert lines[2] == f"  2. Checked counts.py against snapshot " \
                           f"'{snapshot}': accepted"
        assert lines[3].split() == ["STAGE", "KIND", "STATUS", "KEYS", "REFUSED", "/", "NOTE"]
        assert ["per-key", "state", "restored", "3"] in [line.split() for line in lines]
        step3 = [line for line in lines if line.startswith("  3. ")]
        assert step3 and step3[0].endswith(f"and cancelled job 'counter' ({old.id})")
        assert f"  4. Submitted job {new.id}, name: counter, from snapshot '{snapshot}'" in lines

        assert main(["apply", str(jobs)]) == 0  # upgraded once: nothing more to do
        assert capsys.readouterr().out == "Nothing to change.\n"
    finally:
        _stop(client, first, *([second] if second is not None else []))


def _load(file: str) -> Any:
    from sparkjet.cli.loading import load_pipeline

    return load_pipeline(file, [])


@pytest.mark.slow  # a streaming job, two snapshot exports and a check: about a minute
def test_a_refused_upgrade_changes_nothing_and_exits_2(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client
) -> None:
    write_config(client)
    write_file("counts.py", V1)
    jobs = Path("jobs.toml")
    jobs.write_text(JOB, encoding="utf-8")
    stream = client.get_stream("clicks", partitions=1)
    stream.publish_all(list(range(9)))
    # A job apply did not submit: recorded as running the file's pipeline.
    job = client.get_jet().submit(_load("counts.py"), JobConfig(name="counter"))
    try:
        wait_for(lambda: _counts(client) == {0: 3, 1: 3, 2: 3}, 120, "the first counts")
        assert main(["apply", str(jobs)]) == 0
        fingerprint = client.get_jet().pipeline_fingerprint(_load("counts.py"))
        assert capsys.readouterr().out == (
            f"Recorded job 'counter' ({job.id}) as running counts.py "
            f"(fingerprint {fingerprint}): apply did not submit it; a change to the pipeline "
            "upgrades it from now on\n"
        )
        assert main(["apply", str(jobs)]) == 0
        assert capsys.readouterr().out == "Nothing to change.\n"

        write_file("counts.py", INCOMPATIBLE)
        assert main(["apply", str(jobs)]) == 2
        captured = capsys.readouterr()
        new_fingerprint = client.get_jet().pipeline_fingerprint(_load("counts.py"))
        snapshot = f"counter-upgrade-{new_fingerprint[:8]}"
        lines = captured.out.splitlines()
        assert lines[2].endswith(f"against snapshot '{snapshot}': refused")
        row = next(line.split() for line in lines if line.split()[:1] == ["per-key"])
        assert row[:4] == ["per-key", "state", "incompatible", "3"]
        err = [line for line in captured.err.splitlines() if line.startswith("ERROR:")]
        assert err == [
            f"ERROR: jobs.toml: [[job]] 'counter': pipeline: cannot upgrade job 'counter' "
            f"({job.id}): 'per-key': {_refusal_text(client, snapshot)}. Nothing changed: the "
            f"job goes on running the previous pipeline (snapshot '{snapshot}' stays; "
            f"'sparkjet delete-snapshot {snapshot}' removes it)"
        ]
        assert job.status is JobStatus.RUNNING
        assert client.get_jet().get_job_by_name("counter").id == job.id  # type: ignore[union-attr]
        stream.publish_all([9, 10, 11])
        wait_for(lambda: _counts(client) == {0: 4, 1: 4, 2: 4}, 120, "the old job's counts")
        assert client.get_map("lists").size() == 0
        assert client.get_jet().find_snapshot(snapshot) is not None
    finally:
        job.cancel()
        wait_for(job.is_terminal, 60, "the job to stop")


def _refusal_text(client: sparkjet.Client, snapshot: str) -> str:
    rows = client.get_jet().check_upgrade(_load("counts.py"), snapshot)
    refusal = str(getattr(rows[0], "refusal", "") or "")
    return refusal or "incompatible: the state's type changed"


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("allow_dropped_state = 1\n", "allow_dropped_state: expected a bool, got 1"),
        ('allow_changed_state = "yes"\n', "allow_changed_state: expected a bool, got 'yes'"),
        ('renames = "a=b"\n', "renames: expected a dict, got 'a=b'"),
        ("[job.renames]\nold = 3\n", "renames.old: expected the stage's new name (a string), "
                                     "got 3"),
        ('[job.renames]\nold = ""\n', "renames.old: expected the stage's new name (a string), "
                                      "got ''"),
        ('[job.renames]\na = "c"\nb = "c"\n',
         "renames: stage 'c' is the new name of more than one stage"),
        ('[job.source_starts]\nclicks = "earliest"\n',
         "source_starts.clicks: expected 'initial' or 'latest', got 'earliest'"),
        ("[job.source_starts]\nclicks = true\n",
         "source_starts.clicks: expected 'initial' or 'latest', got True"),
    ],
)
def test_apply_refuses_bad_upgrade_options_naming_file_job_and_key(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client, keys: str, message: str
) -> None:
    write_config(client)
    write_file("counts.py", V1)
    Path("jobs.toml").write_text(JOB + keys, encoding="utf-8")
    assert main(["apply", "jobs.toml"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"ERROR: jobs.toml: [[job]] 'counter': {message}\n")
    assert client.get_jet().get_jobs() == []


def test_apply_passes_the_upgrade_options_to_the_jobs_config(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client
) -> None:
    from sparkjet.cli.apply import _config, parse

    write_file("counts.py", V1)
    Path("jobs.toml").write_text(
        JOB + 'allow_dropped_state = true\nallow_changed_state = true\n'
        '[job.renames]\nold = "per-key"\n[job.source_starts]\n"*" = "latest"\n',
        encoding="utf-8",
    )
    (spec,), _ = parse(Path("jobs.toml"))
    config = _config(spec, "snap")
    assert (config.allow_dropped_state, config.allow_changed_state, config.stage_renames,
            config.source_starts, config.initial_snapshot_name) == (
        True, True, {"old": "per-key"}, {"*": "latest"}, "snap")


#: v2 with a logger sink too: check-upgrade accepts it, EXACTLY_ONCE refuses it at submit.
V2_LOGGED = """
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import Pipeline, StreamSource

    pipeline = Pipeline.create()
    counts = pipeline.read_from(StreamSource("clicks")).set_name("clicks") \\
        .filter(lambda x: x >= 0).set_name("non-negative") \\
        .group_by(lambda x: x % 3).aggregate(counting()).set_name("per-key")
    counts.write_to(Pipeline.to_map("counts"))
    counts.write_to(Pipeline.to_logger())
"""


@pytest.mark.slow  # a streaming job, an upgrade and another apply process: over a minute
def test_an_upgrade_whose_submit_fails_starts_from_its_snapshot_on_the_next_apply(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client, tmp_path: Path
) -> None:
    write_config(client)
    write_file("counts.py", V1)
    jobs = Path("jobs.toml")
    jobs.write_text(JOB, encoding="utf-8")
    stream = client.get_stream("clicks", partitions=1)
    stream.publish_all(list(range(9)))
    config = JobConfig(name="counter", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                       snapshot_interval_millis=100)
    old = client.get_jet().submit(_load("counts.py"), config)
    proc: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: _counts(client) == {0: 3, 1: 3, 2: 3}, 120, "the first counts")
        assert main(["apply", str(jobs)]) == 0  # recorded as the applied pipeline
        capsys.readouterr()

        # A sink the job's guarantee refuses: refused at the check, nothing changes.
        write_file("counts.py", V2_LOGGED)
        assert main(["apply", str(jobs)]) == 2
        assert "to-logger" in capsys.readouterr().err
        assert old.status is JobStatus.RUNNING

        # The new job's submit fails once the old one is cancelled (the store went away
        # for a moment, say): the state is in the snapshot, and the error says so.
        write_file("counts.py", V2)
        fingerprint = client.get_jet().pipeline_fingerprint(_load("counts.py"))
        snapshot = f"counter-upgrade-{fingerprint[:8]}"

        def unreachable(*args: object, **kwargs: object) -> None:
            raise StoreError("store 'x': cannot write (the network is down)")

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(JetService, "submit", unreachable)
            assert main(["apply", str(jobs)]) == 1
        captured = capsys.readouterr()
        assert f"  3. Exported snapshot '{snapshot}' again" in captured.out
        err = [line for line in captured.err.splitlines() if line.startswith("ERROR:")]
        assert len(err) == 1 and err[0].startswith(
            f"ERROR: jobs.toml: [[job]] 'counter': pipeline: job 'counter' ({old.id}) is "
            f"cancelled and its state is in snapshot '{snapshot}', but the new pipeline did "
            "not start: "), err
        assert old.is_terminal()

        stream.publish_all([9, 10, 11])  # while no job runs: counted by the next one
        proc = _apply_in_background(jobs, tmp_path / "apply.out")
        new = wait_for_job(client, "counter", JobStatus.RUNNING)
        assert new.id != old.id
        assert new.config.initial_snapshot_name == snapshot
        wait_for(lambda: _counts(client) == {0: 4, 1: 4, 2: 4}, 120, "the counts going on")
        lines = (tmp_path / "apply.out").read_text().splitlines()
        assert lines[:2] == [
            f"Job 'counter' ({old.id}) was cancelled by an upgrade that did not finish: its "
            f"state is in snapshot '{snapshot}'",
            f"Submitted job {new.id}, name: counter, from snapshot '{snapshot}'",
        ]
    finally:
        _stop(client, *([proc] if proc is not None else []))


@pytest.mark.slow  # a streaming job suspended, upgraded and resumed: about a minute
@pytest.mark.spark
def test_a_suspended_job_is_upgraded_and_stays_suspended(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client
) -> None:
    write_config(client)
    write_file("counts.py", V1)
    jobs = Path("jobs.toml")
    jobs.write_text(JOB + 'state = "suspended"\n', encoding="utf-8")
    stream = client.get_stream("clicks", partitions=1)
    stream.publish_all(list(range(9)))
    config = JobConfig(name="counter", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                       snapshot_interval_millis=100)
    old = client.get_jet().submit(_load("counts.py"), config)
    new = None
    try:
        wait_for(lambda: _counts(client) == {0: 3, 1: 3, 2: 3}, 120, "the first counts")
        assert main(["apply", str(jobs)]) == 0  # recorded, and suspended as declared
        assert old.status is JobStatus.SUSPENDED
        capsys.readouterr()

        # Resuming would run the old code: the declared pipeline replaces it, suspended.
        write_file("counts.py", V2)
        assert main(["apply", str(jobs)]) == 0
        out = capsys.readouterr().out
        new = client.get_jet().get_job_by_name("counter")
        assert new is not None and new.id != old.id
        assert old.is_terminal()
        fingerprint = client.get_jet().pipeline_fingerprint(_load("counts.py"))
        snapshot = f"counter-upgrade-{fingerprint[:8]}"
        assert f"  4. Submitted job {new.id}, name: counter, from snapshot '{snapshot}'" in out
        assert new.status is JobStatus.SUSPENDED
        stream.publish_all([9, 10, 11])
        new.resume()
        wait_for(lambda: _counts(client) == {0: 4, 1: 4, 2: 4}, 120, "the counts going on")
    finally:
        for job in (old, new):
            if job is not None and not job.is_terminal():
                job.cancel()
                wait_for(job.is_terminal, 60, "the job to stop")
