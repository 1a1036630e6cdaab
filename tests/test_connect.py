"""Spark Connect: settings, the server's checks, shipping code, routes, reports, a JVM-free client.

The tests marked ``connect`` need a Connect server and run in ``nox -s
connect`` (every other run deselects them: a process that made a Connect
session cannot start a classic one). The rest run everywhere: the settings,
an unreachable server, the version rule, the report rows, and the routes
checked against a classic session's own hash partitioning.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import sparkjet
from sparkjet.core.config import load_config
from sparkjet.core.engine.connect import session as connect_session
from sparkjet.core.engine.connect.arrow import murmur3_int, route_values
from sparkjet.core.engine.connect.reports import ConnectReports
from sparkjet.core.engine.tasks.reports import Reported
from sparkjet.core.model import StageCount
from sparkjet.errors import ConfigError
from sparkjet.pipeline import Pipeline
from sparkjet.testing import StoreLocation
from tests import connect_server
from tests.conftest import TEST_REMOTE
from tests.test_stream_faults import (  # noqa: F401 - the fixtures of the crash scenario
    Driver,
    Producer,
    assert_enriched_once,
    assert_exactly_once,
    assert_joined_once,
    assert_pairs_once,
    assert_windows_once,
    drivers,
    producers,
    run_crash_scenario,
)

# --- the settings ---------------------------------------------------------------------


def test_remote_and_master_together_are_refused_naming_both(tmp_path: Path) -> None:
    (tmp_path / "sparkjet.toml").write_text('[spark]\nmaster = "local[2]"\n')
    os.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config(overrides={"spark": {"remote": "sc://spark.example:15002"}})
    message = str(info.value)
    assert "[spark] master = 'local[2]'" in message and "sparkjet.toml" in message
    assert "[spark] remote = 'sc://spark.example:15002' (from connect() arguments)" in message
    with pytest.raises(ConfigError, match="both set"):
        sparkjet.connect(spark={"master": "local[1]", "remote": "sc://h:1"})


def test_spark_remote_in_the_environment_is_the_remote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPARK_REMOTE", "sc://from-env:15002")
    config = load_config()
    assert (config.spark_remote, config.spark_remote_source) == (
        "sc://from-env:15002", "SPARK_REMOTE")
    # The configuration's own remote wins over the environment's.
    config = load_config(overrides={"spark": {"remote": "sc://mine:1"}})
    assert config.spark_remote == "sc://mine:1"


@pytest.mark.parametrize(("url", "expected"), [
    ("sc://spark.example", ("spark.example", 15002)),
    ("sc://10.0.0.5:443/;token=abc;use_ssl=true", ("10.0.0.5", 443)),
    ("sc://[::1]:15003", ("::1", 15003)),
    ("local[2]", None),
])
def test_connect_urls(url: str, expected: tuple[str, int] | None) -> None:
    assert connect_session.server_address(url) == expected


@pytest.mark.parametrize(("url", "problem"), [
    ("http://spark.example:15002", "must be sc://host"),
    ("sc://:15002", "names no host"),
    ("sc://spark.example:port", "port 'port' is not a number"),
])
def test_a_bad_url_is_refused_at_submit_leaving_no_job(
    store_url: str, url: str, problem: str
) -> None:
    client = sparkjet.connect(store={"url": store_url}, spark={"remote": url})
    with pytest.raises(ConfigError, match=problem) as info:
        client.get_jet().submit(_doubler())
    assert f"[spark] remote = {url!r}" in str(info.value)
    assert client.get_jet().get_jobs() == []


def test_an_unreachable_server_is_refused_at_once_leaving_no_job(store_url: str) -> None:
    port = connect_server.free_port()  # nothing listens there
    client = sparkjet.connect(store={"url": store_url},
                              spark={"remote": f"sc://127.0.0.1:{port}"})
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        client.get_jet().submit(_doubler())
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert f"[spark] remote = 'sc://127.0.0.1:{port}'" in message
    assert f"no Spark Connect server answers at 127.0.0.1:{port}" in message
    assert client.get_jet().get_jobs() == []


@pytest.mark.parametrize(("client", "server", "problem"), [
    ("4.2.0", "4.3.0", None),  # pyspark-client's newest against the wheel's server
    ("4.3.0", "4.0.1", None),
    ("4.3.0", "3.5.3", "the server runs Spark 3.5.3; sparkjet needs a Spark 4.x server"),
    ("3.5.3", "4.3.0", "the Spark Connect client here is pyspark 3.5.3"),
    ("4.3.0", "5.0.0", "the server runs Spark 5.0.0"),
])
def test_the_supported_client_and_server_versions(
    client: str, server: str, problem: str | None
) -> None:
    if problem is None:
        connect_session.check_versions(client, server)
    else:
        with pytest.raises(ValueError, match=problem):
            connect_session.check_versions(client, server)


# --- what runs on the workers, without a server ------------------------------------------


def test_report_rows_count_once_however_often_they_are_read() -> None:
    reports = ConnectReports(counts=True, event_times=True, dead_letters=True,
                             state_ranges=False)
    worker: ConnectReports = pickle.loads(pickle.dumps(reports))
    reports.count({StageCount("map", "emitted"): 100})  # held by the driver: not pickled
    assert pickle.loads(pickle.dumps(reports)).snapshot() == Reported()
    worker.count({StageCount("map", "emitted"): 3})
    worker.event_time({("src", 0): 17})
    worker.dead({("map", 0, 0): "letter"})
    drained = worker.drain()
    assert worker.drain() == Reported()  # a drain forgets
    reports.ingest((4, 0), drained)
    reports.ingest((4, 0), drained)  # the same task's row, read again (a shared flow)
    reports.ingest((5, 0), Reported(counts={StageCount("map", "emitted"): 1}))
    assert reports.stage_counts() == {StageCount("map", "emitted"): 104}
    assert reports.snapshot().event_times == {("src", 0): 17}
    assert reports.snapshot().dead_letters == {("map", 0, 0): "letter"}


def test_the_pipelines_own_modules_are_found_in_its_pickle(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "myproject").mkdir()
    (tmp_path / "myproject" / "__init__.py").write_text("")
    (tmp_path / "myproject" / "transforms.py").write_text(
        "import json\n\ndef double(x):\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from myproject.transforms import double  # type: ignore[import-not-found]

    p = Pipeline.create()
    p.read_from(Pipeline.from_list("in", [1])).map(double).map(len).write_to(
        Pipeline.to_list("out"))
    assert connect_session.user_modules(cloudpickle.dumps(p)) == ["myproject"]


@pytest.mark.spark
def test_routes_land_each_partition_in_its_own_spark_partition(client: sparkjet.Client) -> None:
    """The route column's hash partitioning, against Spark's own ``hash`` and repartition."""
    from pyspark.sql import functions as F

    spark = client.spark
    values = [0, 1, -1, 42, 2**31 - 1, -(2**31), 123456789]
    rows = spark.createDataFrame([(v,) for v in values], "v int").select(
        "v", F.hash("v").alias("h")).collect()
    assert {r["v"]: r["h"] for r in rows} == {v: murmur3_int(v) for v in values}
    for n in (1, 2, 3, 7, 16):
        routes = route_values(n)
        frame = spark.createDataFrame([(p, r) for p, r in enumerate(routes)], "p int, route int")
        placed = frame.repartition(n, "route").select(
            "p", F.spark_partition_id().alias("sp")).collect()
        assert {r["p"]: r["sp"] for r in placed} == {p: p for p in range(n)}


def _doubler() -> Pipeline:
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("in", [1, 2, 3])).map(lambda x: x * 2).write_to(
        Pipeline.to_list("out"))
    return p


# --- on a Connect server ----------------------------------------------------------------


def _worker_python(folder: Path, path: Path) -> str:
    """A Python for the server's workers that also imports from ``path`` (before site-packages)."""
    script = folder / "python"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{path}${{PYTHONPATH:+:$PYTHONPATH}}" '
                      f'exec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    return str(script)


def _batch(client: sparkjet.Client) -> list[Any]:
    """A keyed batch job forced onto the server; its results."""
    from sparkjet import aggregate
    from sparkjet.job import JobConfig

    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("words", ["a", "b", "a"] * 50)).group_by(lambda w: w)
     .aggregate(aggregate.counting()).write_to(Pipeline.to_list("counts")))
    client.get_jet().submit(p, JobConfig(name="counts")).join(timeout=120)
    return sorted(client.get_list("counts").get_all())


@pytest.mark.connect
def test_workers_with_another_sparkjet_get_this_one_shipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server whose workers import an older sparkjet: this one is shipped, results are right.

    The process holds a session to the run's server first, so the job's is a
    second one: a DataFrame the engine keeps must stay its own session's (a
    local checkpoint did not: PySpark binds it to the default session).
    """
    assert sparkjet.connect(spark={"remote": TEST_REMOTE}).spark.version.startswith("4.")
    old = tmp_path / "old"
    (old / "sparkjet").mkdir(parents=True)
    (old / "sparkjet" / "__init__.py").write_text('__version__ = "0.0.1"\n')
    server = connect_server.start(python=_worker_python(tmp_path, old))
    try:
        client = sparkjet.connect(store={"url": str(tmp_path / "store")},
                                  spark={"remote": server.url}, engine={"adaptive": False})
        with caplog.at_level("INFO", logger="sparkjet.connect"):
            assert _batch(client) == [("a", 100), ("b", 50)]
        assert "shipping sparkjet" in caplog.text and "have sparkjet 0.0.1" in caplog.text
    finally:
        server.stop()


@pytest.mark.connect
def test_workers_that_cannot_import_the_shipped_code_are_refused_leaving_no_job(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "broken"
    (broken / "pluggy").mkdir(parents=True)
    (broken / "pluggy" / "__init__.py").write_text(
        'raise ImportError("pluggy is broken on these workers")\n')
    (broken / "sparkjet").mkdir()
    (broken / "sparkjet" / "__init__.py").write_text('__version__ = "0.0.1"\n')
    server = connect_server.start(python=_worker_python(tmp_path, broken))
    try:
        client = sparkjet.connect(store={"url": str(tmp_path / "store")},
                                  spark={"remote": server.url})
        with pytest.raises(ConfigError) as info:
            client.get_jet().submit(_doubler())
        message = str(info.value)
        assert f"[spark] remote = {server.url!r}" in message
        assert "cannot import the sparkjet shipped to them" in message
        assert "pluggy is broken on these workers" in message
        assert client.get_jet().get_jobs() == []
    finally:
        server.stop()


@pytest.mark.connect
def test_a_server_started_as_the_docs_say_runs_batch_and_streaming_jobs_on_spark(
    tmp_path: Path,
) -> None:
    """docs/connect.md's ``start-connect-server.sh --master 'local[2]'``, nothing else set.

    Such a server has no ``spark.default.parallelism``, so the engine asks
    the server for it with a query (an aggregate of ``spark_partition_id()``
    once failed Spark's analysis there, failing every job at its first step).
    A batch job and a streaming job, every batch of both on the server.
    """
    from sparkjet import aggregate
    from sparkjet.core.engine.connect.engine import ConnectEngine
    from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
    from sparkjet.pipeline import StreamSource
    from tests.conftest import wait_until

    server = connect_server.start()  # the docs' recipe: only its address and port are ours
    try:
        client = sparkjet.connect(store={"url": str(tmp_path / "store")},
                                  spark={"remote": server.url}, engine={"adaptive": False})
        assert client.spark.conf.get("spark.default.parallelism", None) is None
        assert ConnectEngine(client.config, client.plugins).parallelism() == 2  # local[2]

        # A batch job: a keyed count, and the processes that ran its map (the server's workers).
        p = Pipeline.create()
        words = p.read_from(Pipeline.from_list("words", ["a", "b", "a"] * 50)).map(
            lambda w: (w, os.getpid()))
        words.map(lambda pair: pair[1]).distinct().write_to(Pipeline.to_list("pids"))
        (words.group_by(lambda pair: pair[0]).aggregate(aggregate.counting())
         .write_to(Pipeline.to_list("counts")))
        client.get_jet().submit(p, JobConfig(name="counts")).join(timeout=300)
        assert sorted(client.get_list("counts").get_all()) == [("a", 100), ("b", 50)]
        pids = client.get_list("pids").get_all()
        assert pids and os.getpid() not in pids

        # A streaming job: its micro-batches on the server (adaptive off), state kept across them.
        stream = client.get_stream("clicks", partitions=2)
        s = Pipeline.create()
        (s.read_from(StreamSource("clicks")).group_by(lambda click: click["user"])
         .aggregate(aggregate.counting()).write_to(Pipeline.to_map("per-user")))
        job = client.get_jet().submit(s, JobConfig(
            name="clicks", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_millis=100))
        try:
            wait_until(lambda: job.status is JobStatus.RUNNING, timeout=120, what="the job to run")
            stream.publish_all([{"user": u} for u in ["ada", "bob", "ada", "cy", "ada"]])
            wait_until(lambda: dict(client.get_map("per-user").entry_set())
                       == {"ada": 3, "bob": 1, "cy": 1}, timeout=120, what="the first counts")
            stream.publish_all([{"user": u} for u in ["bob", "ada", "bob"]])
            wait_until(lambda: dict(client.get_map("per-user").entry_set())
                       == {"ada": 4, "bob": 3, "cy": 1}, timeout=120, what="the counts kept")
            metrics = wait_until(lambda: (m := job.get_metrics())["sparkBatches"] >= 2 and m,
                                 what="the micro-batches on the server to be counted")
            assert metrics["localBatches"] == 0, metrics
            assert job.status is JobStatus.RUNNING
        finally:
            job.cancel()
            wait_until(job.is_terminal, timeout=120, what="the job to end")
    finally:
        server.stop()


@pytest.mark.connect
@pytest.mark.slow  # installs the Connect client into a virtualenv of its own
def test_a_client_with_no_jvm_submits_to_the_server(tmp_path: Path) -> None:
    """``pip install 'sparkjet[connect]'``: no pyspark build, no Java; submit, status, the CLI."""
    if not TEST_REMOTE.startswith("sc://"):
        pytest.fail("run through tests/connect_server.py (nox -s connect): the client needs a "
                    "server of its own process")
    root = Path(__file__).resolve().parent.parent
    venv = tmp_path / "venv"
    found = shutil.which("uv")
    uv = [found] if found else [sys.executable, "-m", "uv"]
    subprocess.run([*uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([*uv, "pip", "install", "-q", "--python", python, f"{root}[connect]"],
                   check=True)
    listed = subprocess.run([*uv, "pip", "list", "--python", python], check=True,
                            capture_output=True, text=True).stdout
    assert "pyspark-client" in listed and "\npyspark " not in listed, listed
    (tmp_path / "sparkjet.toml").write_text(
        f'[store]\nurl = "{tmp_path / "store"}"\n[spark]\nremote = "{TEST_REMOTE}"\n')
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import pathlib
        import pyspark
        import sparkjet
        from sparkjet import aggregate
        from sparkjet.job import JobConfig
        from sparkjet.pipeline import Pipeline

        assert not (pathlib.Path(pyspark.__file__).parent / "jars").exists()
        # ./sparkjet.toml: the server, the store; every batch on the server.
        client = sparkjet.connect(engine={"adaptive": False})
        p = Pipeline.create()
        (p.read_from(Pipeline.from_list("words", ["a", "b", "a"] * 20)).group_by(lambda w: w)
         .aggregate(aggregate.counting()).write_to(Pipeline.to_list("counts")))
        job = client.get_jet().submit(p, JobConfig(name="counts"))
        job.join(timeout=300)
        print(pyspark.__version__, sorted(client.get_list("counts").get_all()),
              job.status.name)
    """))
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_HOME", "PYTHONPATH", "SPARK_CONNECT_MODE_ENABLED",
                        "SPARKJET_TEST_REMOTE", "PYSPARK_PYTHON")}
    # A java that says it was run, first on the PATH: the client must never start one.
    fake = tmp_path / "fake-java"
    fake.mkdir()
    (fake / "java").write_text(f'#!/bin/sh\ntouch "{tmp_path / "java-was-run"}"\nexit 1\n')
    (fake / "java").chmod(0o755)
    env["PATH"] = f"{fake}:{venv / 'bin'}:/usr/bin:/bin"
    env["JAVA_HOME"] = str(tmp_path / "no-java-here")
    run = subprocess.run([python, str(script)], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    version, rest = run.stdout.strip().split(" ", 1)
    assert version.startswith("4."), run.stdout
    assert rest == "[('a', 40), ('b', 20)] COMPLETED", run.stdout
    # The command line in the same environment: a job file submitted (small: the
    # adaptive engine runs it in this process), then listed.
    (tmp_path / "more.py").write_text(textwrap.dedent("""
        from sparkjet.pipeline import Pipeline
        pipeline = Pipeline.create()
        (pipeline.read_from(Pipeline.from_list("n", list(range(10))))
         .map(lambda x: x * x).write_to(Pipeline.to_list("squares")))
    """))
    submitted = subprocess.run([str(venv / "bin" / "sparkjet"), "submit", "-n", "squares",
                                "more.py"], env=env, cwd=tmp_path, capture_output=True,
                               text=True, timeout=300)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    status = subprocess.run([str(venv / "bin" / "sparkjet"), "list-jobs", "-a"], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    assert "counts" in status.stdout and "squares" in status.stdout, status.stdout
    assert not (tmp_path / "java-was-run").exists(), "the client started a JVM"



@pytest.mark.connect
@pytest.mark.slow
def test_exactly_once_survives_sigkilled_clients_while_the_server_runs(
    store_url: str, drivers: Callable[..., Driver], producers: list[Producer]  # noqa: F811
) -> None:
    """Client processes SIGKILLed mid-job (one between its sinks' commit and its checkpoint's),
    each resumed by a new client; every micro-batch ran on the one server, which lived on."""
    seqs, counts, log = run_crash_scenario(
        "EXACTLY_ONCE", StoreLocation(store_url), drivers, producers,
        kills=["committed", "window", "early"], marker=Path(f"{store_url}.paused"),
        engine="connect",
    )
    assert_exactly_once(seqs, counts, log)
    assert_windows_once(StoreLocation(store_url))
    assert_joined_once(StoreLocation(store_url))
    assert_pairs_once(StoreLocation(store_url))
    assert_enriched_once(StoreLocation(store_url))


def test_no_pyspark_or_only_the_connect_client_is_named_at_the_first_job(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pip install sparkjet`` alone, or ``sparkjet[connect]`` with a master: the fix is named."""
    import pyspark.util

    client = sparkjet.connect(store={"url": store_url})
    monkeypatch.setitem(sys.modules, "pyspark.util", None)  # as if pyspark were not installed
    with pytest.raises(ConfigError, match=r"pip install 'sparkjet\[spark\]'"):
        client.get_jet().submit(_doubler())  # refused at submit: no job is left
    assert client.get_jet().get_jobs() == []
    monkeypatch.setitem(sys.modules, "pyspark.util", pyspark.util)
    monkeypatch.setattr(pyspark.util, "is_remote_only", lambda: True)
    other = sparkjet.connect(store={"url": store_url})
    with pytest.raises(ConfigError, match="Spark Connect client only"):
        other.get_jet().submit(_doubler())
    assert other.get_jet().get_jobs() == []


@pytest.mark.connect
def test_a_list_source_larger_than_its_inline_descriptors_keeps_its_order(
    store_url: str,
) -> None:
    """Descriptors that carry data go as a table, each partition's to its own task, in order."""
    from sparkjet.core.engine.connect.datasets import INLINE_DESCRIPTOR_BYTES

    words = [f"word-{n:06d}-" + "x" * 40 for n in range(6_000)]
    assert len(pickle.dumps(words)) > INLINE_DESCRIPTOR_BYTES
    client = sparkjet.connect(store={"url": store_url}, spark={"remote": TEST_REMOTE},
                              engine={"adaptive": False})
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("words", words)).map(str.upper).filter(lambda w: "7" in w)
     .write_to(Pipeline.to_list("out")))
    client.get_jet().submit(p).join(timeout=300)
    assert client.get_list("out").get_all() == [w.upper() for w in words if "7" in w]


def test_a_token_in_the_url_from_the_environment_is_masked_in_the_error(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = connect_server.free_port()  # nothing listens there
    monkeypatch.setenv("SPARK_TOKEN", "s3cr3t-t0ken")
    client = sparkjet.connect(store={"url": store_url}, spark={
        "remote": f"sc://127.0.0.1:{port}/;token=${{env:SPARK_TOKEN}}"})
    with pytest.raises(ConfigError) as info:
        client.get_jet().submit(_doubler())
    assert "s3cr3t-t0ken" not in str(info.value)
    assert f"127.0.0.1:{port}" in str(info.value)
