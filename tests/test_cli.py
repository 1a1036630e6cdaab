"""The ``sparkjet`` command, run in-process through ``main()`` (and once across processes)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.cli import main
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource

SECRET = "s3cr3t-t0ken-9f27"

#: A pipeline whose map sleeps per item, touching the file named by ARGS[0] when it starts:
#: 50 s per partition of 1000 items, so a cancel that waited for a partition's end shows.
SLOW_PIPELINE = """
    import time
    from pathlib import Path

    from sparkjet.pipeline import Pipeline

    def pipeline(args):
        marker = args[0]

        def slow(x):
            Path(marker).touch()
            time.sleep(0.05)
            return x

        p = Pipeline.create()
        p.read_from(Pipeline.from_list("slow-in", range(2000))) \\
            .map(slow) \\
            .write_to(Pipeline.to_list("slow-out"))
        return p
"""


def _toml(value: Any) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def write_config(client: sparkjet.Client, extra: str = "") -> Path:
    """Write ``./sparkjet.toml`` with the store and Spark settings of ``client``."""
    config = client.config
    lines = [
        "[store]",
        f"url = {_toml(config.store_url)}",
        "[spark]",
        *([f"remote = {_toml(config.spark_remote)}"] if config.spark_remote else
          [f"master = {_toml(config.spark_master)}"]),
        f"app_name = {_toml(config.spark_app_name)}",
        "[spark.conf]",
        *(f"{_toml(k)} = {_toml(v)}" for k, v in config.spark_conf.items()),
        extra,
    ]
    path = Path("sparkjet.toml")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


#: ``write_config``'s extra for the commands other processes run: their jobs in
#: process (``[engine] driver_only``), Spark never started.
IN_PROCESS = "[engine]\ndriver_only = true"


def write_file(name: str, source: str) -> Path:
    path = Path(name)
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


@pytest.fixture
def config_file(client: sparkjet.Client) -> Path:
    return write_config(client)


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything asks for the Spark session."""
    from sparkjet.core.engine.spark import session

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("this command must not start Spark")

    monkeypatch.setattr(session, "get_session", refuse)


def job_rows(output: str) -> list[list[str]]:
    """The rows of a ``list-jobs`` table, split into ID, STATUS, TIME, NAME."""
    lines = output.strip().splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["ID", "STATUS", "SUBMISSION TIME", "NAME"]
    return [line.split(None, 3) for line in lines[1:]]


# --- version and usage -------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"sparkjet {sparkjet.__version__} ")
    assert f"pyspark {version('pyspark')}" in out


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "submit" in capsys.readouterr().err


def test_usage_error_is_reported_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cancel"]) == 2
    err = capsys.readouterr().err
    assert "ERROR: the following arguments are required: JOB" in err
    assert "Traceback" not in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "--help"]) == 0
    assert "FILE.py" in capsys.readouterr().out


def test_invalid_config_is_an_error_naming_the_file(
    capsys: pytest.CaptureFixture[str], client: sparkjet.Client
) -> None:
    write_config(client, "[jobs]\nretries = 3")
    assert main(["list-jobs"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ERROR: ")
    assert "sparkjet.toml: unknown section [jobs]" in err
    assert "Traceback" not in err


def test_config_option_names_the_configuration_file(
    capsys: pytest.CaptureFixture[str], config_file: Path, tmp_path: Path, no_spark: None
) -> None:
    other = tmp_path / "elsewhere.toml"
    other.write_text('[plugins]\ndisable = ["logger"]\n', encoding="utf-8")
    assert main(["--config", str(other), "plugins"]) == 0
    assert "Blocked plugins: logger " in capsys.readouterr().out
    assert main(["plugins"]) == 0  # ./sparkjet.toml blocks nothing
    assert "Blocked" not in capsys.readouterr().out

    assert main(["--config", "missing.toml", "list-jobs"]) == 2
    assert capsys.readouterr().err.startswith("ERROR: missing.toml: cannot read")


# --- submit ------------------------------------------------------------------------


@pytest.mark.spark
def test_submit_runs_the_pipeline_and_list_jobs_shows_it(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client
) -> None:
    write_file("double.py", """
        from sparkjet.pipeline import Pipeline

        pipeline = Pipeline.create()
        pipeline.read_from(Pipeline.from_list("numbers", [1, 2, 3, 4])) \\
            .map(lambda x: x * 2) \\
            .write_to(Pipeline.to_list("doubled"))
    """)
    assert main(["submit", "-n", "doubler", "double.py"]) == 0
    out = capsys.readouterr().out
    job = client.get_jet().get_job_by_name("doubler")
    assert job is not None
    assert f"Submitted job {job.id}, name: doubler" in out
    assert f"Job 'doubler' ({job.id}) finished: COMPLETED" in out
    assert sorted(client.get_list("doubled").get_all()) == [2, 4, 6, 8]

    assert main(["list-jobs", "-a"]) == 0
    rows = job_rows(capsys.readouterr().out)
    assert [[r[0], r[1], r[3]] for r in rows] == [[job.id, "COMPLETED", "doubler"]]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", rows[0][2])
    expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(job.submission_time / 1000))
    assert rows[0][2] == expected

    assert main(["list-jobs"]) == 0  # active jobs only
    assert job_rows(capsys.readouterr().out) == []


@pytest.mark.spark
def test_submit_passes_args_to_the_pipeline_function(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client
) -> None:
    write_file("scaled.py", """
        import argparse

        from sparkjet.pipeline import Pipeline

        def pipeline(args):
            parser = argparse.ArgumentParser()
            parser.add_argument("--scale", type=int)
            parser.add_argument("numbers", type=int, nargs="+")
            opts = parser.parse_args(args)
            p = Pipeline.create()
            p.read_from(Pipeline.from_list("numbers", opts.numbers)) \\
                .map(lambda x: x * opts.scale) \\
                .write_to(Pipeline.to_list("scaled"))
            return p
    """)
    assert main(["submit", "scaled.py", "--scale", "10", "1", "2", "3"]) == 0
    assert "finished: COMPLETED" in capsys.readouterr().out
    assert sorted(client.get_list("scaled").get_all()) == [10, 20, 30]
    (job,) = client.get_jet().get_jobs()
    assert job.name is None
    assert job.config.arguments == ["--scale", "10", "1", "2", "3"]

    assert main(["list-jobs", "-a"]) == 0
    assert job_rows(capsys.readouterr().out)[0][3] == "N/A"


@pytest.mark.spark
def test_submit_calls_a_pipeline_function_without_parameters(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client
) -> None:
    write_file("noargs.py", """
        from sparkjet.pipeline import Pipeline

        def pipeline():
            p = Pipeline.create()
            p.read_from(Pipeline.from_list("words", ["a", "b"])).write_to(Pipeline.to_list("w"))
            return p
    """)
    assert main(["submit", "-n", "noargs", "noargs.py", "ignored"]) == 0
    assert sorted(client.get_list("w").get_all()) == ["a", "b"]


@pytest.mark.spark
def test_submit_no_adaptive_reaches_the_job_config_and_its_record(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client
) -> None:
    write_file("copy.py", """
        from sparkjet.pipeline import Pipeline

        pipeline = Pipeline.create()
        pipeline.read_from(Pipeline.from_list("few", [1, 2])).write_to(Pipeline.to_list("c"))
    """)
    assert main(["submit", "-n", "spark-only", "--no-adaptive", "copy.py"]) == 0
    assert "finished: COMPLETED" in capsys.readouterr().out
    job = client.get_jet().get_job_by_name("spark-only")
    assert job is not None
    assert job.config.adaptive_micro_batches is False
    other = sparkjet.connect(store={"url": client.config.store_url})  # reads the record
    seen = other.get_jet().get_job(job.id)
    assert seen is not None and seen.config.adaptive_micro_batches is False
    assert JobConfig().adaptive_micro_batches is None  # without the flag: the TOML decides


@pytest.mark.spark
def test_submit_prints_the_logger_sink_on_stderr(
    capsys: pytest.CaptureFixture[str], config_file: Path
) -> None:
    write_file("log.py", """
        from sparkjet.pipeline import Pipeline

        pipeline = Pipeline.create()
        pipeline.read_from(Pipeline.from_list("items", ["alpha", "beta"])) \\
            .map(str.upper) \\
            .write_to(Pipeline.to_logger(lambda s: f"item={s}"))
    """)
    assert main(["submit", "log.py"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"INFO +sparkjet\.sink\.logger: item=ALPHA\n", err)
    assert "item=BETA" in err


@pytest.mark.spark
def test_failed_job_exits_1_and_never_prints_a_secret(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    client: sparkjet.Client,
) -> None:
    monkeypatch.setenv("SPARKJET_TEST_TOKEN", SECRET)
    write_config(client, '[plugins.demo]\ntoken = "${env:SPARKJET_TEST_TOKEN}"')
    write_file("fails.py", f"""
        from sparkjet.pipeline import Pipeline

        def check(x):
            if x == 3:
                raise ValueError("rejected by {SECRET}")
            return x

        pipeline = Pipeline.create()
        pipeline.read_from(Pipeline.from_list("in", [1, 2, 3])) \\
            .map(check).set_name("checker") \\
            .write_to(Pipeline.to_list("never"))
    """)
    assert main(["submit", "-n", "failing", "fails.py"]) == 1
    captured = capsys.readouterr()
    assert "finished: FAILED" in captured.out
    assert "ERROR: stage 'checker' failed: ValueError: rejected by ***" in captured.err
    assert SECRET not in captured.out + captured.err
    assert "Traceback" not in captured.err
    assert client.get_list("never").get_all() == []

    assert main(["list-jobs", "-a"]) == 0
    assert [r[1] for r in job_rows(capsys.readouterr().out)] == ["FAILED"]


@pytest.mark.parametrize(
    ("name", "source", "message"),
    [
        ("nopipe.py", "x = 1\n", "nopipe.py: defines no module-level 'pipeline'"),
        ("three.py", "pipeline = 3\n", "three.py: 'pipeline' is of type int, expected a Pipeline"),
        (
            "raises.py",
            "x = 1\nraise RuntimeError('no database')\n",
            "raises.py: raised RuntimeError: no database while loading (line 2)",
        ),
        (
            "imports.py",
            "import sparkjet_no_such_module\n",
            "imports.py: raised ModuleNotFoundError: No module named 'sparkjet_no_such_module' "
            "while loading (line 1)",
        ),
        ("syntax.py", "def pipeline(:\n", "syntax.py: invalid Python (line 1)"),
        ("exits.py", "import sys\nsys.exit(3)\n", "exits.py: called sys.exit(3) while loading"),
        (
            "returns.py",
            "def pipeline(args):\n    return args\n",
            "returns.py: pipeline(ARGS) returned list [], not a Pipeline",
        ),
        (
            "buggy.py",
            "def pipeline():\n    return 1 / 0\n",
            "buggy.py: pipeline() raised ZeroDivisionError: division by zero (line 2)",
        ),
        (
            "two.py",
            "def pipeline(a, b):\n    pass\n",
            "two.py: pipeline(a, b) must take no parameter or one (the list of ARGS)",
        ),
        (
            "empty.py",
            "from sparkjet.pipeline import Pipeline\npipeline = Pipeline.create()\n",
            "the pipeline is empty",
        ),
        ("data.txt", "pipeline = 1\n", "data.txt: not a Python file (expected a .py file)"),
    ],
)
def test_submit_of_a_bad_file_is_an_error_naming_it(
    capsys: pytest.CaptureFixture[str],
    config_file: Path,
    no_spark: None,
    name: str,
    source: str,
    message: str,
) -> None:
    write_file(name, source)
    assert main(["submit", name]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"ERROR: {message}")
    assert "Traceback" not in captured.err
    assert captured.out == ""


def test_submit_of_a_missing_file(
    capsys: pytest.CaptureFixture[str], config_file: Path, no_spark: None
) -> None:
    assert main(["submit", "missing.py"]) == 2
    assert capsys.readouterr().err == "ERROR: missing.py: no such file\n"


def test_loading_restores_argv_and_path(config_file: Path, no_spark: None) -> None:
    argv, path = list(sys.argv), list(sys.path)
    write_file("nopipe.py", "import sys\nsys.argv.append('x')\n")
    assert main(["submit", "nopipe.py", "a"]) == 2
    assert (sys.argv, sys.path) == (argv, path)


# --- list-jobs, plugins: no Spark ---------------------------------------------------


def test_list_jobs_without_jobs_prints_the_header(
    capsys: pytest.CaptureFixture[str], config_file: Path, no_spark: None
) -> None:
    assert main(["list-jobs", "-a"]) == 0
    assert job_rows(capsys.readouterr().out) == []


def test_plugins_lists_builtins_with_their_guarantees(
    capsys: pytest.CaptureFixture[str], config_file: Path, no_spark: None
) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    rows = {
        tuple(re.split(r"\s{2,}", line.strip()))
        for line in out.splitlines()
        if line.startswith("  ")
    }
    all_three = "NONE, AT_LEAST_ONCE, EXACTLY_ONCE"
    assert ("CATEGORY", "KIND", "CLASS", "GUARANTEES") in rows
    assert ("source", "list", "sparkjet.plugins.lists.ListSource", all_three) in rows
    assert ("sink", "list", "sparkjet.plugins.lists.ListSink", all_three) in rows
    assert ("source", "map", "sparkjet.plugins.maps.MapSource", all_three) in rows
    assert ("sink", "map", "sparkjet.plugins.maps.MapSink", all_three) in rows
    assert ("sink", "logger", "sparkjet.plugins.logger.LoggerSink", "NONE, AT_LEAST_ONCE") in rows
    assert ("source", "stream", "sparkjet.plugins.streams.StreamSource", all_three) in rows
    assert ("sink", "stream", "sparkjet.plugins.streams.StreamSink", all_three) in rows
    for plugin in ("list", "map", "logger", "stream"):
        assert f"\n{plugin} (built-in)\n" in out
    assert "Blocked" not in out


def test_plugins_shows_blocked_plugins(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    config_file: Path,
    no_spark: None,
) -> None:
    monkeypatch.setenv("SPARKJET_BLOCK_PLUGINS", "logger")
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "LoggerSink" not in out
    assert "logger (built-in)" not in out
    assert "Blocked plugins: logger " in out


# --- cancel ------------------------------------------------------------------------


def test_cancel_of_an_unknown_job(
    capsys: pytest.CaptureFixture[str], config_file: Path, no_spark: None
) -> None:
    assert main(["cancel", "ghost"]) == 1
    assert capsys.readouterr().err == "ERROR: no job with id or name 'ghost'\n"


def test_cancel_of_a_completed_job(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client
) -> None:
    pipeline = Pipeline.create()
    pipeline.read_from(Pipeline.from_list("in", [1])).write_to(Pipeline.to_list("out"))
    job = client.get_jet().submit(pipeline, JobConfig(name="done"))
    job.join(timeout=120)
    for ref in (job.id, "done"):
        assert main(["cancel", ref]) == 1
        err = capsys.readouterr().err
        assert err == f"ERROR: cannot cancel job 'done' ({job.id}): it has already COMPLETED\n"


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def test_cancel_of_a_job_running_in_this_process(
    capsys: pytest.CaptureFixture[str],
    config_file: Path,
    client: sparkjet.Client,
    tmp_path: Path,
) -> None:
    marker = tmp_path / "started"
    write_file("slow.py", SLOW_PIPELINE)
    from sparkjet.cli import load_pipeline

    job = client.get_jet().submit(load_pipeline("slow.py", [str(marker)]), JobConfig(name="slow"))
    try:
        wait_for(marker.exists, 120, "the job's first item")
        assert main(["suspend", "slow"]) == 1
        assert capsys.readouterr().err == (
            f"ERROR: cannot suspend job 'slow' ({job.id}): it is a batch job\n"
        )
        # Within 20 s, where a partition of the slow map takes 50: the cancel
        # reaches the next item its task reads, not the partition's end.
        assert main(["cancel", "slow", "--timeout", "20"]) == 0
        out = capsys.readouterr().out
        assert f"Cancelling job 'slow' ({job.id})" in out
        assert f"Job 'slow' ({job.id}) finished: FAILED (cancelled by user)" in out
        assert job.is_user_cancelled()
    finally:
        if not job.is_terminal():
            job.cancel()
            wait_for(job.is_terminal, 60, "the job to stop")
    assert client.get_list("slow-out").get_all() == []


@pytest.mark.slow
def test_cancel_of_a_job_submitted_by_another_process(
    capsys: pytest.CaptureFixture[str],
    config_file: Path,
    client: sparkjet.Client,
    tmp_path: Path,
) -> None:
    marker = tmp_path / "started"
    write_file("slow.py", SLOW_PIPELINE)
    write_config(client, IN_PROCESS)  # the command, not Spark, is tested: no JVM to start
    out_path, err_path = tmp_path / "submit.out", tmp_path / "submit.err"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with out_path.open("wb") as out_fh, err_path.open("wb") as err_fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sparkjet.cli", "submit", "-n", "remote-slow", "slow.py",
             str(marker)],
            stdout=out_fh, stderr=err_fh, env=env,
        )
    try:
        def started() -> bool:
            if proc.poll() is not None:
                pytest.fail(
                    f"submit exited early ({proc.returncode}):\n"
                    f"{out_path.read_text()}\n{err_path.read_text()}"
                )
            return marker.exists()

        wait_for(started, 180, "the submitted job's first item")
        assert main(["list-jobs"]) == 0
        assert [(r[1], r[3]) for r in job_rows(capsys.readouterr().out)] == [
            ("RUNNING", "remote-slow")
        ]

        assert main(["cancel", "remote-slow", "--timeout", "20"]) == 0  # see the test above
        out = capsys.readouterr().out
        assert "Cancelling job 'remote-slow'" in out
        assert "finished: FAILED (cancelled by user)" in out
        assert proc.wait(timeout=60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)

    submit_out, submit_err = out_path.read_text(), err_path.read_text()
    assert "finished: FAILED (cancelled by user)" in submit_out
    assert "ERROR: job 'remote-slow' (" in submit_err
    assert "was cancelled" in submit_err
    assert "Traceback" not in submit_err

    assert main(["list-jobs", "-a"]) == 0
    rows = job_rows(capsys.readouterr().out)
    assert [(r[1], r[3]) for r in rows] == [("FAILED", "remote-slow")]
    job = client.get_jet().get_job(rows[0][0])
    assert job is not None
    assert job.status is JobStatus.FAILED
    assert job.is_user_cancelled()
    assert client.get_list("slow-out").get_all() == []


# --- publish ------------------------------------------------------------------------


def test_publish_appends_json_lines_to_a_stream(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    config_file: Path,
    client: sparkjet.Client,
    no_spark: None,
) -> None:
    write_file("events.jsonl", """\
        {"k": "a", "v": 1}

        [1, 2.5, null]
        "text"
    """)
    assert main(["publish", "--partitions", "2", "events", "events.jsonl"]) == 0
    assert capsys.readouterr().out == "Published 3 items to stream 'events'\n"
    stream = client.get_stream("events")
    assert stream.partition_count == 2
    assert sorted(map(json.dumps, stream.read_all())) == sorted(
        map(json.dumps, [{"k": "a", "v": 1}, [1, 2.5, None], "text"])
    )

    monkeypatch.setattr(sys, "stdin", io.StringIO('{"k": "b"}\n'))
    assert main(["publish", "events", "-"]) == 0  # exists: no --partitions needed
    assert capsys.readouterr().out == "Published 1 item to stream 'events'\n"
    assert stream.size() == 4

    assert main(["publish", "-p", "3", "events", "events.jsonl"]) == 1
    err = capsys.readouterr().err
    assert err == "ERROR: stream 'events' already exists with 2 partitions, not 3\n"
    assert stream.size() == 4


def test_publish_of_a_bad_line_publishes_nothing(
    capsys: pytest.CaptureFixture[str],
    config_file: Path,
    client: sparkjet.Client,
    no_spark: None,
) -> None:
    write_file("bad.jsonl", """\
        {"ok": 1}
        {"ok": 2}
        {"ok": 3,}
        {"ok": 4}
    """)
    assert main(["publish", "--partitions", "2", "events", "bad.jsonl"]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "ERROR: bad.jsonl: invalid JSON (line 3, column 10): Expecting property name enclosed "
        "in double quotes\n"
    )
    assert captured.out == ""
    assert not client.store.stream_log("events").exists()  # not even created

    client.get_stream("events", partitions=1).publish("before")
    assert main(["publish", "events", "bad.jsonl"]) == 2
    assert client.get_stream("events").read_all() == ["before"]

    assert main(["publish", "events", "missing.jsonl"]) == 2
    assert capsys.readouterr().err.endswith("ERROR: missing.jsonl: no such file\n")
    Path("latin1.jsonl").write_bytes(b'"ok"\n"caf\xe9"\n')
    assert main(["publish", "events", "latin1.jsonl"]) == 2
    assert capsys.readouterr().err == "ERROR: latin1.jsonl: not UTF-8 text (line 2)\n"
    assert client.get_stream("events").read_all() == ["before"]


def test_publish_to_a_missing_stream_needs_partitions(
    capsys: pytest.CaptureFixture[str],
    config_file: Path,
    client: sparkjet.Client,
    no_spark: None,
) -> None:
    write_file("one.jsonl", "1\n")
    assert main(["publish", "ghost", "one.jsonl"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ERROR: stream 'ghost' does not exist in store '")
    assert err.endswith("': pass --partitions N to create it\n")
    assert not client.store.stream_log("ghost").exists()

    assert main(["publish", "--partitions", "0", "ghost", "one.jsonl"]) == 2
    assert "expected a positive integer, got '0'" in capsys.readouterr().err


# --- streaming jobs: suspend, resume, restart -------------------------------------------

#: A streaming pipeline: the stream "events", times ten, to the list "tens".
STREAM_PIPELINE = """
    from sparkjet.pipeline import Pipeline, StreamSource

    pipeline = Pipeline.create()
    pipeline.read_from(StreamSource("events")) \\
        .map(lambda x: x * 10).set_name("times-ten") \\
        .write_to(Pipeline.to_list("tens"))
"""


def stream_pipeline() -> Pipeline:
    p = Pipeline.create()
    p.read_from(StreamSource("events")).map(lambda x: x * 10).set_name("times-ten") \
        .write_to(Pipeline.to_list("tens"))
    return p


@pytest.fixture
def control_requests(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every (job id, action) written to a job's control folder in this process."""
    from sparkjet.core.store.job_records import JobRecords

    seen: list[tuple[str, str]] = []
    original = JobRecords.request

    def request(self: JobRecords, job_id: str, action: str, payload: Any = None) -> None:
        seen.append((job_id, action))
        original(self, job_id, action, payload)

    monkeypatch.setattr(JobRecords, "request", request)
    return seen


def stop_job(job: Any) -> None:
    if not job.is_terminal():
        job.cancel()
        wait_for(job.is_terminal, 60, "the job to stop")


def test_suspend_resume_restart_of_a_streaming_job(
    capsys: pytest.CaptureFixture[str],
    config_file: Path,
    client: sparkjet.Client,
    control_requests: list[tuple[str, str]],
) -> None:
    stream = client.get_stream("events", partitions=1)
    tens = client.get_list("tens")
    job = client.get_jet().submit(stream_pipeline(), JobConfig(name="tens"))  # guarantee NONE
    label = f"'tens' ({job.id})"
    try:
        wait_for(lambda: job.status is JobStatus.RUNNING, 120, "the job to run")
        stream.publish_all([1, 2, 3])
        wait_for(lambda: tens.size() == 3, 60, "the first items")
        assert main(["list-jobs"]) == 0
        assert [(r[0], r[1], r[3]) for r in job_rows(capsys.readouterr().out)] == [
            (job.id, "RUNNING", "tens")
        ]

        assert main(["suspend", "tens"]) == 0
        out = capsys.readouterr().out
        assert out == f"Suspending job {label}\nJob {label} is SUSPENDED (Requested by user)\n"
        assert job.status is JobStatus.SUSPENDED
        stream.publish(4)
        time.sleep(0.5)
        assert tens.size() == 3  # nothing runs while suspended
        assert main(["list-jobs"]) == 0
        assert [r[1] for r in job_rows(capsys.readouterr().out)] == ["SUSPENDED"]
        for command, message in (
            ("suspend", "it is SUSPENDED, not RUNNING or STARTING"),
            ("restart", "it is SUSPENDED, not RUNNING"),
        ):
            assert main([command, "tens"]) == 1
            assert capsys.readouterr().err == f"ERROR: cannot {command} job {label}: {message}\n"

        assert main(["resume", job.id]) == 0
        assert capsys.readouterr().out == f"Resuming job {label}\nJob {label} is RUNNING\n"
        wait_for(lambda: tens.size() == 4, 60, "the item published while suspended")
        assert main(["resume", "tens"]) == 1
        assert capsys.readouterr().err == (
            f"ERROR: cannot resume job {label}: it is RUNNING, not SUSPENDED\n"
        )

        assert main(["restart", "tens"]) == 0
        assert capsys.readouterr().out == f"Restarting job {label}\nJob {label} is RUNNING\n"
        # NONE keeps no checkpoint: the restarted job reads the stream from the start again.
        wait_for(lambda: tens.size() == 8, 60, "the replay after the restart")
        assert sorted(tens.get_all()) == [10, 10, 20, 20, 30, 30, 40, 40]
        assert job.status is JobStatus.RUNNING
        # The CLI ran in this process but acted like another one: through the control folder.
        assert control_requests == [
            (job.id, "suspend"), (job.id, "resume"), (job.id, "restart")
        ]
    finally:
        stop_job(job)


def test_suspend_resume_restart_of_an_unknown_or_ended_job(
    capsys: pytest.CaptureFixture[str], config_file: Path, client: sparkjet.Client
) -> None:
    for command in ("suspend", "resume", "restart"):
        assert main([command, "ghost"]) == 1
        assert capsys.readouterr().err == "ERROR: no job with id or name 'ghost'\n"
    pipeline = Pipeline.create()
    pipeline.read_from(Pipeline.from_list("in", [1])).write_to(Pipeline.to_list("out"))
    job = client.get_jet().submit(pipeline, JobConfig(name="done"))
    job.join(timeout=120)
    for command, wanted in (
        ("suspend", "RUNNING or STARTING"), ("resume", "SUSPENDED"), ("restart", "RUNNING")
    ):
        assert main([command, "done"]) == 1
        assert capsys.readouterr().err == (
            f"ERROR: cannot {command} job 'done' ({job.id}): it is COMPLETED, not {wanted}\n"
        )


@pytest.fixture
def sparkjet_logger_kept() -> Iterator[None]:
    """Restore the ``sparkjet`` logger after ``main()`` calls that overlap in threads."""
    logger = logging.getLogger("sparkjet")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    yield
    logger.setLevel(saved[0])
    logger.propagate = saved[1]
    logger.handlers[:] = saved[2]


@pytest.mark.spark
def test_submit_of_a_streaming_pipeline_runs_until_suspended(
    capsys: pytest.CaptureFixture[str],
    config_file: Path,
    client: sparkjet.Client,
    sparkjet_logger_kept: None,
) -> None:
    write_file("tens.py", STREAM_PIPELINE)
    stream = client.get_stream("events", partitions=2)
    stream.publish_all([1, 2, 3])
    result: list[int] = []
    submit = threading.Thread(
        target=lambda: result.append(main([
            "submit", "-n", "fg", "-g", "exactly-once", "--snapshot-interval", "100", "tens.py",
        ])),
        daemon=True,
    )
    submit.start()
    job = None
    try:
        job = wait_for_job(client, "fg", JobStatus.RUNNING)
        assert job.config.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE
        assert job.config.snapshot_interval_millis == 100
        wait_for(lambda: client.get_list("tens").size() == 3, 60, "the first items")
        assert submit.is_alive()  # a streaming job keeps `submit` in the foreground

        assert main(["suspend", "fg"]) == 0
        submit.join(timeout=60)
        assert result == [0]
        lines = capsys.readouterr().out.splitlines()
        label = f"'fg' ({job.id})"
        assert f"Submitted job {job.id}, name: fg" in lines
        assert lines.count(f"Job {label} is SUSPENDED (Requested by user)") == 2  # both print
        assert f"Resume it with: sparkjet resume {job.id}" in lines
        assert sorted(client.get_list("tens").get_all()) == [10, 20, 30]
    finally:
        if job is not None and not job.is_terminal():
            assert main(["cancel", "fg"]) == 0
        submit.join(timeout=60)


@pytest.mark.parametrize(
    ("guarantee", "outcome"),
    [("exactly_once", "suspended"), ("none", "cancelled")],
)
@pytest.mark.spark
def test_interrupted_submit_suspends_a_job_with_a_guarantee_else_cancels(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    config_file: Path,
    client: sparkjet.Client,
    guarantee: str,
    outcome: str,
) -> None:
    import types

    from sparkjet.cli import follow

    write_file("tens.py", STREAM_PIPELINE)
    client.get_stream("events", partitions=1).publish_all([1, 2, 3])
    tens = client.get_list("tens")

    class CtrlC(threading.Event):
        """Ctrl-C, as `submit` waits in the foreground, once the first items are out."""

        def wait(self, timeout: float | None = None) -> bool:
            if tens.size() == 3:
                raise KeyboardInterrupt
            return super().wait(timeout)

    fake = types.SimpleNamespace(
        Event=CtrlC, current_thread=threading.current_thread, main_thread=threading.main_thread
    )
    monkeypatch.setattr(follow, "threading", fake)
    assert main(["submit", "-n", "fg", "-g", guarantee, "--snapshot-interval", "100",
                 "tens.py"]) == 130
    monkeypatch.setattr(follow, "threading", threading)
    captured = capsys.readouterr()
    job = client.get_jet().get_job_by_name("fg")
    assert job is not None
    label = f"'fg' ({job.id})"
    try:
        if outcome == "suspended":
            assert f"ERROR: interrupted: suspending job {label} after its current micro-batch" \
                in captured.err
            assert f"Job {label} is SUSPENDED (Requested by user)\n" in captured.out
            assert f"Resume it with: sparkjet resume {job.id}\n" in captured.out
            assert job.status is JobStatus.SUSPENDED
        else:
            assert f"ERROR: interrupted: cancelling job {label}\n" in captured.err
            assert f"Job {label} finished: FAILED (cancelled by user)\n" in captured.out
            assert job.is_user_cancelled()
    finally:
        stop_job(job)


def wait_for_job(client: sparkjet.Client, name: str, status: JobStatus) -> Any:
    def found() -> Any:
        job = client.get_jet().get_job_by_name(name)
        return job if job is not None and job.status is status else None

    wait_for(found, 120, f"job {name} to be {status.value}")
    return found()


@pytest.mark.slow
def test_interrupted_submit_suspends_and_resume_takes_over_in_another_process(
    capsys: pytest.CaptureFixture[str],
    config_file: Path,
    client: sparkjet.Client,
    tmp_path: Path,
) -> None:
    """submit (process A) -> SIGTERM: suspended -> resume (process B) takes the job over.

    Then ``sparkjet suspend`` from this process suspends it in B, whose resume
    command exits 0, and ``cancel`` ends it (its driver is gone: taken over here).
    """
    write_config(client, IN_PROCESS)  # the commands, not Spark, are tested: no JVM to start
    write_file("counts.py", """
        from sparkjet.aggregate import counting
        from sparkjet.pipeline import Pipeline, StreamSource

        pipeline = Pipeline.create()
        pipeline.read_from(StreamSource("events")) \\
            .group_by(lambda e: e["k"]).aggregate(counting()).set_name("per-key") \\
            .write_to(Pipeline.to_map("counts"))
    """)
    events = [{"k": f"k{i % 7}"} for i in range(300)]
    write_file("first.jsonl", "".join(json.dumps(e) + "\n" for e in events[:200]))
    write_file("second.jsonl", "".join(json.dumps(e) + "\n" for e in events[200:]))
    assert main(["publish", "--partitions", "2", "events", "first.jsonl"]) == 0
    assert capsys.readouterr().out == "Published 200 items to stream 'events'\n"
    counts = client.get_map("counts")

    def oracle(n: int) -> dict[str, int]:
        return dict(Counter(e["k"] for e in events[:n]))

    procs: list[subprocess.Popen[bytes]] = []

    def sparkjet_process(*args: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
        index = len(procs)
        out, err = tmp_path / f"cli-{index}.out", tmp_path / f"cli-{index}.err"
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        with out.open("wb") as out_fh, err.open("wb") as err_fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sparkjet.cli", *args],
                stdout=out_fh, stderr=err_fh, env=env,
            )
        procs.append(proc)
        return proc, out, err

    def counted(n: int, proc: subprocess.Popen[bytes], err: Path) -> Any:
        def check() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"the command exited early ({proc.returncode}):\n{err.read_text()}")
            return dict(counts.entry_set()) == oracle(n)

        return check

    try:
        a, a_out, a_err = sparkjet_process(
            "submit", "-n", "counter", "-g", "exactly_once", "--snapshot-interval", "200",
            "counts.py",
        )
        wait_for(counted(200, a, a_err), 180, "process A to count the first events")
        a.send_signal(signal.SIGTERM)
        assert a.wait(timeout=90) == 130
        assert "ERROR: interrupted: suspending job 'counter'" in a_err.read_text()
        assert "is SUSPENDED (Requested by user)" in a_out.read_text()
        job = client.get_jet().get_job_by_name("counter")
        assert job is not None
        assert job.status is JobStatus.SUSPENDED

        assert main(["list-jobs"]) == 0
        assert [(r[1], r[3]) for r in job_rows(capsys.readouterr().out)] == [
            ("SUSPENDED", "counter")
        ]
        assert main(["publish", "events", "second.jsonl"]) == 0
        capsys.readouterr()

        b, b_out, b_err = sparkjet_process("resume", "counter")
        wait_for(counted(300, b, b_err), 180, "process B to count the rest")
        assert f"Resuming job 'counter' ({job.id}) in this process: the process that ran it " \
            "is gone\n" in b_out.read_text()
        assert f"Job 'counter' ({job.id}) is RUNNING" in b_out.read_text()

        assert main(["suspend", "counter"]) == 0
        # "... (Requested by user; the process that ran it has exited)" if B was quicker
        assert "is SUSPENDED (Requested by user" in capsys.readouterr().out
        assert b.wait(timeout=90) == 0, b_err.read_text()
        assert f"Resume it with: sparkjet resume {job.id}" in b_out.read_text()
        assert dict(counts.entry_set()) == oracle(300)  # every event counted exactly once

        assert main(["cancel", "counter"]) == 0
        assert "finished: FAILED (cancelled by user)" in capsys.readouterr().out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
