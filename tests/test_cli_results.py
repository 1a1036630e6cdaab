"""Results, metrics and the store's whereabouts from the command line.

``get map|list|stream``, ``metrics``, ``status`` and ``info``; where the
store is found (``SPARKJET_STORE``, the user's own configuration file, paths
relative to the file) so a command run from another folder sees the same jobs.
"""

from __future__ import annotations

import json
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.cli import main
from sparkjet.job import JobConfig
from sparkjet.pipeline import Pipeline
from tests.test_cli import no_spark, write_config

__all__ = ["no_spark"]  # the fixture, used by name

Point = namedtuple("Point", "x y")


@pytest.fixture
def config_file(client: sparkjet.Client) -> Path:
    return write_config(client)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.usefixtures("config_file", "no_spark")
def test_get_map_shows_entries_one_key_and_json(
    client: sparkjet.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    counts = client.get_map("counts")
    counts.put_all({"a": 1, "b": Point(2, 3), 7: [1, 2], (1, 2): {"n": {4}}})
    code, out, _ = run(capsys, "get", "map", "counts")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["KEY", "VALUE"]
    assert sorted(lines[1:]) == sorted([
        "a       1", 'b       {"x": 2, "y": 3}', "7       [1, 2]", '[1, 2]  {"n": [4]}',
    ])
    assert run(capsys, "get", "map", "counts", "b") == (0, '{"x": 2, "y": 3}\n', "")
    assert run(capsys, "get", "map", "counts", "7")[1] == "[1, 2]\n"  # a key JSON spells
    assert run(capsys, "get", "map", "counts", "[1, 2]")[1] == '{"n": [4]}\n'
    code, out, _ = run(capsys, "get", "map", "counts", "--json")
    assert code == 0
    assert sorted(json.loads(out), key=str) == sorted([
        {"key": "a", "value": 1}, {"key": "b", "value": {"x": 2, "y": 3}},
        {"key": 7, "value": [1, 2]}, {"key": [1, 2], "value": {"n": [4]}},
    ], key=str)
    assert json.loads(run(capsys, "get", "map", "counts", "a", "--json")[1]) == {
        "key": "a", "value": 1}
    code, out, err = run(capsys, "get", "map", "counts", "zz")
    assert (code, out) == (1, "")
    assert err == "ERROR: map 'counts' has no key 'zz'\n"


@pytest.mark.usefixtures("config_file", "no_spark")
def test_get_list_and_its_tail(client: sparkjet.Client, capsys: pytest.CaptureFixture[str]) -> None:
    client.get_list("out").add_all(["x", 2, (3, "y")])
    assert run(capsys, "get", "list", "out") == (0, '0  x\n1  2\n2  [3, "y"]\n', "")
    assert run(capsys, "get", "list", "out", "--tail", "2")[1] == '1  2\n2  [3, "y"]\n'
    code, out, _ = run(capsys, "get", "list", "out", "--tail", "1", "--json")
    assert (code, [json.loads(line) for line in out.splitlines()]) == (
        0, [{"index": 2, "item": [3, "y"]}])
    client.get_list("empty").clear()  # exists, and is empty (a name never written: exit 1)
    assert run(capsys, "get", "list", "empty") == (0, "", "")
    code, _, err = run(capsys, "get", "list", "out", "--tail", "0")
    assert code == 2
    assert "--tail: expected a positive integer, got '0'" in err


@pytest.mark.usefixtures("config_file", "no_spark")
def test_get_stream_from_an_offset_and_one_partition(
    client: sparkjet.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = client.get_stream("events", partitions=2)
    stream._log.publish_all(range(6), partition_of=lambda i: i % 2)  # type: ignore[attr-defined]
    code, out, _ = run(capsys, "get", "stream", "events")
    assert code == 0
    assert out.splitlines() == ["0:0  0", "0:1  2", "0:2  4", "1:0  1", "1:1  3", "1:2  5"]
    assert run(capsys, "get", "stream", "events", "--from", "2")[1] == "0:2  4\n1:2  5\n"
    code, out, _ = run(capsys, "get", "stream", "events", "--partition", "1", "--from", "1",
                       "--json")
    assert [json.loads(line) for line in out.splitlines()] == [
        {"partition": 1, "offset": 1, "item": 3}, {"partition": 1, "offset": 2, "item": 5}]
    assert run(capsys, "get", "stream", "events", "--from", "9") == (0, "", "")
    code, _, err = run(capsys, "get", "stream", "events", "--partition", "2")
    assert (code, err) == (1, "ERROR: stream 'events' has partitions 0 to 1, not 2\n")
    code, _, err = run(capsys, "get", "stream", "nope")
    assert code == 1
    assert err.startswith("ERROR: stream 'nope' does not exist in store '")
    code, _, err = run(capsys, "get", "stream")
    assert (code, err) == (2, "ERROR: 'get stream' needs the stream's NAME\n")
    code, _, err = run(capsys, "get", "stream", "events", "--from", "-1")
    assert code == 2
    assert "expected an offset (0 or more), got '-1'" in err


@pytest.mark.usefixtures("config_file")
def test_metrics_of_a_finished_job_as_a_table_and_as_json(
    client: sparkjet.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("nums")).map(lambda x: x * 2).set_name("double")
     .write_to(Pipeline.to_list("doubled")))
    client.get_list("nums").add_all(range(5))
    job = client.get_jet().submit(p, JobConfig(name="doubler",
                                               store_metrics_after_job_completion=True))
    job.join(timeout=120)
    code, out, _ = run(capsys, "metrics", "doubler", "--json")
    assert code == 0
    metrics: dict[str, Any] = json.loads(out)
    assert metrics["stages"]["double"] == {"receivedCount": 5, "emittedCount": 5}
    assert metrics["executionStartTime"] > 0
    code, out, _ = run(capsys, "metrics", job.id)
    lines = out.splitlines()
    assert lines[0] == f"Job 'doubler' ({job.id}) finished: COMPLETED"
    assert lines[1].startswith("Execution start: 20")
    assert lines[3].startswith("Store requests: ") and "(list " in lines[3]
    assert lines[4:] == [
        "STAGE             receivedCount  emittedCount",
        "double            5              5",
        "from-list(nums)   0              5",
        "to-list(doubled)  5              0",
    ]
    code, _, err = run(capsys, "metrics", "nobody")
    assert (code, err) == (1, "ERROR: no job with id or name 'nobody'\n")


@pytest.mark.usefixtures("no_spark")
def test_info_says_where_the_store_comes_from_and_any_folder_finds_the_same_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run(capsys, "info")
    assert code == 0
    assert "Configuration: none (defaults)\n" in out
    assert "Store: ./.sparkjet (from default)\n" in out
    assert "Jobs: 0 active, 0 in all\n" in out

    # The user's own configuration file, with a path relative to it.
    user = tmp_path / "user-config" / "sparkjet"
    user.mkdir(parents=True)
    (user / "sparkjet.toml").write_text('[store]\nurl = "data/store"\n', encoding="utf-8")
    store = user / "data" / "store"
    sparkjet.connect(store={"url": str(store)}).get_list("seen").add(1)
    for folder in (tmp_path / "a", tmp_path / "b" / "c"):
        folder.mkdir(parents=True)
        monkeypatch.chdir(folder)
        code, out, _ = run(capsys, "info")
        assert f"Configuration: {user / 'sparkjet.toml'}\n" in out
        assert f"Store: {store} (from {user / 'sparkjet.toml'})\n" in out
        assert f"Snapshots: {store}/snapshots (beside the store)\n" in out
        assert run(capsys, "get", "list", "seen")[1] == "0  1\n"

    # SPARKJET_STORE wins over the file; a sparkjet.toml here wins over the user's.
    monkeypatch.setenv("SPARKJET_STORE", str(tmp_path / "elsewhere"))
    assert f"Store: {tmp_path / 'elsewhere'} (from SPARKJET_STORE)\n" in run(capsys, "info")[1]
    monkeypatch.delenv("SPARKJET_STORE")
    Path("sparkjet.toml").write_text('[store]\nurl = "memory://here"\n', encoding="utf-8")
    out = run(capsys, "info")[1]
    here = Path.cwd() / "sparkjet.toml"
    assert f"Configuration: {here}\n" in out
    assert f"Store: memory://here (from {here})\n" in out


def test_the_progress_line_reads_the_streaming_metrics() -> None:
    from sparkjet.cli.follow import progress_line

    assert progress_line("'j' (1)", {"lastCommittedBatch": -1}) == (
        "Job 'j' (1): no micro-batch committed yet")
    line = progress_line("'j' (1)", {
        "lastCommittedBatch": 1234, "inputRate": 1500.4, "processingRate": 98765.0,
        "lastBatchDurationMillis": 120,
        "stages": {
            "from-stream(e)": {"emittedCount": 5, "sourceLag": 12_000},
            "count": {"receivedCount": 5, "snapshotKeys": 1000, "snapshotBytes": 3 * 1024**2},
            "hourly": {"snapshotKeys": 10, "snapshotBytes": 512, "watermark": -2**63,
                       "lateEventsDropped": 0},
            "daily": {"watermark": 1_700_000_000_000, "lateEventsDropped": 7},
        },
    })
    assert line.startswith("Job 'j' (1): batch 1,234, 1,500 in/s, 98,765 processed/s, "
                           "last batch 120 ms, lag 12,000, state 1,010 keys, 3.0 MB, "
                           "hourly watermark none yet, daily watermark 20")
    assert line.endswith(", daily late 7")


PROGRESSING = """
    from sparkjet.pipeline import Pipeline, StreamSource

    pipeline = Pipeline.create()
    (pipeline.read_from(StreamSource("events"))
     .group_by(lambda e: e % 3).aggregate(__import__("sparkjet.aggregate").aggregate.counting())
     .set_name("counts").write_to(Pipeline.to_map("counts")))
"""


@pytest.mark.slow
@pytest.mark.parametrize("terminal", [False, True], ids=["plain", "tty"])
def test_submit_shows_the_streaming_jobs_progress(
    client: sparkjet.Client, config_file: Path, tmp_path: Path, terminal: bool
) -> None:
    """On a terminal rich keeps one line up to date; elsewhere a line every N seconds."""
    import os
    import pty
    import subprocess
    import sys
    import time

    from tests.test_cli import wait_for, write_file

    write_file("progressing.py", PROGRESSING)
    client.get_stream("events", partitions=2).publish_all(range(30))
    argv = [sys.executable, "-m", "sparkjet.cli", "submit", "-n", "prog", "-g", "exactly_once",
            "--snapshot-interval", "200", "--progress-every", "1", "progressing.py"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "COLUMNS": "200", "TERM": "xterm"}
    chunks: list[bytes] = []
    if terminal:
        master, slave = pty.openpty()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave,
                                stderr=subprocess.DEVNULL, env=env)
        os.close(slave)
        os.set_blocking(master, False)

        def seen() -> str:
            try:
                while True:
                    chunks.append(os.read(master, 65536))
            except (BlockingIOError, OSError):
                pass
            return b"".join(chunks).decode("utf-8", "replace")
    else:
        log = tmp_path / "submit.out"
        with log.open("wb") as fh:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh,
                                    stderr=subprocess.DEVNULL, env=env)

        def seen() -> str:
            return log.read_text(encoding="utf-8", errors="replace")
    try:
        wait_for(lambda: "processed/s" in seen() and "state 3 keys" in seen(), 180,
                 "a progress line with the counted keys")
        time.sleep(2.5)
        text = seen()
        lines = [line for line in text.replace("\r", "\n").splitlines() if "processed/s" in line]
        assert lines
        assert all("Job 'prog' (" in line for line in lines)
        if terminal:
            assert "\x1b[" in text  # redrawn in place, not printed line after line
        else:
            assert len(lines) >= 2  # one a second
            assert "\x1b[" not in text
        assert dict(client.get_map("counts").entry_set()) == {0: 10, 1: 10, 2: 10}
    finally:
        job = client.get_jet().get_job_by_name("prog")
        if job is not None and not job.is_terminal():
            job.cancel()
        proc.wait(timeout=60)
        if terminal:
            os.close(master)


def families(text: str, openmetrics: bool = False) -> dict[str, Any]:
    """The metric families of an exposition, parsed by prometheus_client's own parser.

    Each name maps to its type and its samples as ``{(sample name, labels): value}``.
    """
    if openmetrics:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    else:
        from prometheus_client.parser import text_string_to_metric_families
    return {
        family.name: (family.type, {(s.name, tuple(sorted(s.labels.items()))): s.value
                                    for s in family.samples})
        for family in text_string_to_metric_families(text)
    }


def labelled(job: Any, **more: str) -> tuple[tuple[str, str], ...]:
    """A sample's labels as :func:`families` keys them: the job's, and ``more``."""
    return tuple(sorted({"job_id": job.id, "job_name": job.name, **more}.items()))


@pytest.mark.usefixtures("config_file")
def test_metrics_in_prometheus_text_format(
    client: sparkjet.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("nums")).map(lambda x: x).set_name('say "hi"\\n') \
        .write_to(Pipeline.to_list("same"))
    client.get_list("nums").add_all(range(3))
    job = client.get_jet().submit(p, JobConfig(name="prom",
                                               store_metrics_after_job_completion=True))
    job.join(timeout=120)
    code, out, _ = run(capsys, "metrics", "prom", "--prometheus")
    assert code == 0
    lines = out.splitlines()
    # Counters keep Prometheus's _total in the text format; the rest are gauges.
    assert "# TYPE sparkjet_receivedCount_total counter" in lines
    assert "# TYPE sparkjet_executionStartTime gauge" in lines
    found = families(out)
    assert found["sparkjet_status"] == ("gauge", {
        ("sparkjet_status", labelled(job, status="COMPLETED")): 1.0})
    kind, samples = found["sparkjet_receivedCount"]
    assert kind == "counter"
    # The stage's name, quotes and backslash included, comes back as it was.
    assert samples[("sparkjet_receivedCount_total", labelled(job, stage='say "hi"\\n'))] == 3
    assert found["sparkjet_executionStartTime"][0] == "gauge"
    start = job.get_metrics()["executionStartTime"]
    assert found["sparkjet_executionStartTime"][1] == {
        ("sparkjet_executionStartTime", labelled(job)): start}  # millis, exact
    code, _, err = run(capsys, "metrics", "prom", "--json", "--prometheus")
    assert code == 2
    assert "not allowed with argument" in err
    code, _, err = run(capsys, "metrics")
    assert (code, err) == (2, "ERROR: 'metrics' needs a JOB (or --serve [HOST:]PORT)\n")


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("host", [
    "127.0.0.1",
    pytest.param("[::1]", marks=pytest.mark.skipif(not _ipv6_loopback(),
                                                   reason="this machine has no IPv6 loopback")),
])
def test_a_scrape_gets_the_text_format_or_openmetrics_as_it_asks(
    client: sparkjet.Client, config_file: Path, tmp_path: Path, host: str
) -> None:
    """``metrics JOB --serve``, scraped over HTTP as Prometheus does: the text format
    (0.0.4) by default, OpenMetrics when the Accept header asks for it; the same
    families, types and labels either way; only /metrics; Ctrl-C stops it (exit 0)."""
    import re
    import subprocess
    import urllib.error
    import urllib.request

    from tests.test_cli_edges import cli, interrupt, wait_for_output

    p = Pipeline.create()
    p.read_from(Pipeline.from_list("nums", [1, 2, 3])).map(lambda x: x).set_name("same") \
        .write_to(Pipeline.to_list("out"))
    job = client.get_jet().submit(p, JobConfig(name="scraped",
                                               store_metrics_after_job_completion=True))
    job.join(timeout=120)
    log = tmp_path / "serve.out"
    with log.open("wb") as fh:
        proc = cli("metrics", "scraped", "--serve", f"{host}:0", stdout=fh,
                   stderr=subprocess.STDOUT)
    try:
        text = wait_for_output(proc, log, "/metrics", 120, "the exporter's address")
        url = re.search(r"http://(\S+):([0-9]+)/metrics", text)
        assert url is not None and url.group(1) == host and int(url.group(2)) > 0, text

        def scrape(accept: str | None) -> tuple[str, str]:
            headers = {"Accept": accept} if accept else {}
            request = urllib.request.Request(url.group(0), headers=headers)
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.headers["Content-Type"], answer.read().decode()

        kind, plain = scrape(None)
        assert kind == "text/plain; version=0.0.4; charset=utf-8"
        kind, om = scrape("application/openmetrics-text; version=1.0.0,text/plain;q=0.5")
        assert kind.startswith("application/openmetrics-text; version=1.0.0")
        assert om.endswith("# EOF\n")
        as_text, as_om = families(plain), families(om, openmetrics=True)
        assert as_text == as_om  # the same metrics, typed and labelled alike
        counted = as_om["sparkjet_receivedCount"]
        assert counted == ("counter", {
            ("sparkjet_receivedCount_total", labelled(job, stage=stage)): count
            for stage, count in [("from-list(nums)", 0), ("same", 3), ("to-list(out)", 3)]})
        assert as_om["sparkjet_status"] == ("gauge", {
            ("sparkjet_status", labelled(job, status="COMPLETED")): 1.0})
        assert as_om["sparkjet_storeRequests"][0] == "counter"
        assert {dict(labels)["kind"] for _, labels in as_om["sparkjet_storeRequests"][1]} == {
            "list", "get", "head", "put", "delete"}
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(url.group(0).replace("/metrics", "/other"), timeout=60)
        assert interrupt(proc, log.read_text) == 0
        assert log.read_text() == text  # stopped quietly: no traceback, no scrape logged
    finally:
        if proc.poll() is None:  # the test failed before
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_metrics_served_to_prometheus_from_another_process(
    client: sparkjet.Client, config_file: Path, tmp_path: Path
) -> None:
    import os
    import re
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from tests.test_cli import wait_for

    client.get_stream("events", partitions=1).publish_all(range(4))
    p = Pipeline.create()
    p.read_from(sparkjet.pipeline.StreamSource("events")).set_name("events-in") \
        .write_to(Pipeline.to_list("seen"))
    job = client.get_jet().submit(p, JobConfig(name="served", processing_guarantee="EXACTLY_ONCE",
                                               snapshot_interval_millis=100))
    log = tmp_path / "serve.out"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sparkjet.cli", "metrics", "--serve", "127.0.0.1:0"],
            stdout=fh, stderr=subprocess.STDOUT,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
    try:
        wait_for(lambda: "/metrics" in log.read_text(), 60, "the exporter to listen")
        url = re.search(r"http://\S+/metrics", log.read_text())
        assert url is not None
        wait_for(lambda: len(client.get_list("seen").get_all()) == 4, 120, "the items")

        def scrape() -> str:
            with urllib.request.urlopen(url.group(0), timeout=10) as answer:
                assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                return str(answer.read().decode())

        def received() -> Any:
            samples = families(scrape()).get("sparkjet_receivedCount", ("", {}))[1]
            return samples.get(("sparkjet_receivedCount_total",
                                labelled(job, stage="to-list(seen)")))

        wait_for(lambda: received() == 4, 60, "the committed counts in a scrape")
        found = families(scrape())
        assert found["sparkjet_status"][1] == {
            ("sparkjet_status", labelled(job, status="RUNNING")): 1.0}
        assert found["sparkjet_lastCommittedBatch"][1][
            ("sparkjet_lastCommittedBatch", labelled(job))] >= 0
        # The driver's store requests, by kind, read from the job's record.
        assert found["sparkjet_storeRequests"][1][
            ("sparkjet_storeRequests_total", labelled(job, kind="put"))] >= 1
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(url.group(0).replace("/metrics", "/other"), timeout=10)
        job.cancel()
        wait_for(lambda: "served" not in scrape(), 60, "the ended job to leave the scrape")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if not job.is_terminal():
            job.cancel()


def test_source_lag_counts_what_numeric_offsets_have_unread() -> None:
    from sparkjet.core.microbatch.loop import source_lag

    assert source_lag(3, 10) == 7
    assert source_lag([0, 5], [4, 5, 2]) == 6  # a new partition counts from 0
    assert source_lag({"t/0": 1}, {"t/0": 3, "t/1": 2}) == 4
    assert source_lag([5], [3]) == 0  # never negative
    assert source_lag(None, 4) is None
    assert source_lag([0], ["a"]) is None
    assert source_lag("x", "y") is None
    assert source_lag(0, True) is None


@pytest.mark.usefixtures("config_file")
def test_another_terminal_sees_a_sources_lag_rise_and_fall(
    client: sparkjet.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import wait_until

    client.get_stream("events", partitions=1).publish_all(range(3))
    p = Pipeline.create()
    p.read_from(sparkjet.pipeline.StreamSource("events")).write_to(Pipeline.to_list("seen"))
    job = client.get_jet().submit(p, JobConfig(name="lagging", processing_guarantee="EXACTLY_ONCE",
                                               snapshot_interval_millis=3000))
    source = "from-stream(events)"

    def lag() -> Any:
        assert main(["metrics", "lagging", "--json"]) == 0
        stage = json.loads(capsys.readouterr().out).get("stages", {}).get(source, {})
        return stage.get("sourceLag")

    try:
        wait_until(lambda: len(client.get_list("seen").get_all()) == 3, 120, "the first items")
        wait_until(lambda: lag() == 0, 30, "no lag once the items are read")
        client.get_stream("events").publish_all(range(3, 10))
        wait_until(lambda: lag() == 7, 30, "the 7 new items seen unread")
        wait_until(lambda: lag() == 0, 30, "the lag gone once they are read")
        assert sorted(client.get_list("seen").get_all()) == list(range(10))
    finally:
        job.cancel()


def test_the_exporter_answers_503_naming_the_failure_when_the_jobs_cannot_be_read() -> None:
    """A scrape while the store fails is a 503 saying why, secrets masked (the
    exporter serves on); a path other than /metrics is a 404."""
    from wsgiref.util import setup_testing_defaults

    from sparkjet.cli.prometheus import metrics_app, registry

    def unreadable() -> list[Any]:
        raise OSError("s3://key:hunter2@bucket/store: connection refused")

    app = metrics_app(registry(unreadable), lambda text: text.replace("hunter2", "***"))
    answers: list[str] = []

    def scrape(path: str) -> str:
        environ: dict[str, Any] = {"PATH_INFO": path}
        setup_testing_defaults(environ)
        body = b"".join(app(environ, lambda status, headers: answers.append(status)))
        return body.decode()

    assert scrape("/metrics") == ("cannot read the jobs: OSError: s3://key:***@bucket/store: "
                                  "connection refused\n")
    assert scrape("/") == "only /metrics is served\n"
    assert answers == ["503 Service Unavailable", "404 Not Found"]
