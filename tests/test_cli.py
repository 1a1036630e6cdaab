"""The ``sparkjet`` command, run in-process through ``main()`` (and once across processes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.cli import main
from sparkjet.job import JobConfig, JobStatus
from sparkjet.pipeline import Pipeline

SECRET = "s3cr3t-t0ken-9f27"

#: A pipeline whose map sleeps per item, touching the file named by ARGS[0] when it starts.
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
        f"master = {_toml(config.spark_master)}",
        f"app_name = {_toml(config.spark_app_name)}",
        "[spark.conf]",
        *(f"{_toml(k)} = {_toml(v)}" for k, v in config.spark_conf.items()),
        extra,
    ]
    path = Path("sparkjet.toml")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


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
    from sparkjet.core.runtime import session

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
    for plugin in ("list", "map", "logger"):
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
        assert main(["cancel", "slow", "--timeout", "60"]) == 0
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

        assert main(["cancel", "remote-slow"]) == 0
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
