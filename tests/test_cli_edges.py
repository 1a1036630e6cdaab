"""The operator's rough edges (issue 23, item 3) and per-stage metrics across a resume.

Out-of-range ``metrics --serve`` addresses, Prometheus metric types, unknown
maps and lists, the suspension cause in the command's own words, errors as
one line (closed pipes, Ctrl-C, a port in use), and per-stage counts that go
on from the checkpoint when another driver takes a job over.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import sparkjet
import sparkjet.errors
from sparkjet.job import Job, JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from tests.conftest import TEST_SPARK, wait_until
from tests.test_cli import no_spark, write_config
from tests.test_cli_results import families, labelled, run
from tests.test_truncated_files import kill_driver

__all__ = ["no_spark"]  # the fixture, used by name

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE


@pytest.fixture
def config_file(client: sparkjet.Client) -> Path:
    return write_config(client)


@contextlib.contextmanager
def _sigint_not_ignored() -> Iterator[None]:
    """SIGINT handled (not ignored) in this process while a child is started in the block.

    A process started with SIGINT ignored (a background job of a
    non-interactive shell is, and CI may run so) passes that on: an ignored
    signal stays ignored across fork and exec, and Python then never turns
    Ctrl-C into KeyboardInterrupt, so a child the test interrupts would just
    go on (CI saw ``metrics --serve`` serve on and ``publish`` read its input
    to the end and publish it). A handled signal is reset to the default by
    exec: the child gets Ctrl-C as a terminal gives it.
    """
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def cli(*argv: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    """The real ``sparkjet`` command in a child process, in this test's folder.

    It runs the sparkjet this test imported (a relative PYTHONPATH would not
    reach it from the test's folder), takes Ctrl-C as from a terminal (see
    :func:`_sigint_not_ignored`), and its faulthandler is on: SIGABRT prints
    where each of its threads is.
    """
    source = str(Path(sparkjet.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": path}
    with _sigint_not_ignored():
        return subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-m", "sparkjet.cli", *argv],
            env=env, **kwargs,
        )


def ignores_sigint(proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``proc`` ignores SIGINT (Linux's /proc: the SigIgn mask)."""
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    raise AssertionError(f"no SigIgn line in /proc/{proc.pid}/status")


def abort_and_show(proc: subprocess.Popen[bytes], why: str, output: Callable[[], str]) -> None:
    """Fail the test with ``why``, ``proc``'s output and, if it still runs, where it is.

    SIGABRT makes its faulthandler (see :func:`cli`) print every thread's stack.
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    pytest.fail(f"{why} (exit status {proc.returncode}); its output:\n{output()}")


def wait_for_output(proc: subprocess.Popen[bytes], log: Path, text: str, timeout: float,
                    what: str) -> str:
    """``proc``'s output (written to ``log``) once it holds ``text``.

    Fails at once if ``proc`` exits first; after ``timeout`` s if it runs on
    without printing it, showing where it is (a command that prints at once on
    a quiet machine; the deadline only catches one that hangs).
    """
    deadline = time.monotonic() + timeout
    while text not in (shown := log.read_text()):
        if proc.poll() is not None:
            abort_and_show(proc, f"the command exited before {what}", log.read_text)
        if time.monotonic() >= deadline:
            abort_and_show(proc, f"no {what} after {timeout:g} s", log.read_text)
        time.sleep(0.1)
    return shown


def interrupt(proc: subprocess.Popen[bytes], output: Callable[[], str],
              timeout: float = 60) -> int:
    """Ctrl-C ``proc`` (in the middle of its work) and return its exit status."""
    assert not ignores_sigint(proc), "the command ignores SIGINT: Ctrl-C cannot reach it"
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        abort_and_show(proc, f"the command went on for {timeout:g} s after SIGINT", output)
        raise  # not reached: abort_and_show fails the test


def one_error_line(err: str) -> str:
    """The one ``ERROR:`` line ``err`` must be (no traceback, nothing else)."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR: "), err
    return lines[0]


# --- 1. metrics --serve: addresses out of range, and JOB with --serve -----------------------


@pytest.mark.usefixtures("config_file", "no_spark")
@pytest.mark.parametrize(("where", "says"), [
    ("99999", "port 99999 is out of range"),
    ("127.0.0.1:65536", "port 65536 is out of range"),
    ("-1", "port -1 is out of range"),
    ("localhost:http", "got 'localhost:http'"),
    ("", "got ''"),
])
def test_metrics_serve_refuses_a_port_out_of_range_saying_what_is_allowed(
    capsys: pytest.CaptureFixture[str], where: str, says: str
) -> None:
    code, out, err = run(capsys, "metrics", f"--serve={where}")
    line = one_error_line(err)
    assert (code, out) == (2, "")
    assert says in line
    assert "PORT a number from 0 to 65535 (0: any free port)" in line


@pytest.mark.usefixtures("config_file", "no_spark")
def test_metrics_serve_names_a_host_that_does_not_resolve_and_a_port_in_use(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "metrics", "--serve", "no-such-host.invalid:0")
    assert code == 2
    assert "cannot listen on host 'no-such-host.invalid': it does not resolve" in (
        one_error_line(err))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run(capsys, "metrics", "--serve", f"127.0.0.1:{port}")
    assert code == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in one_error_line(err)
    code, _, err = run(capsys, "metrics", "nosuchjob", "--serve", "0")
    assert (code, one_error_line(err)) == (1, "ERROR: no job with id or name 'nosuchjob'")


def batch_job(client: sparkjet.Client, name: str) -> Job:
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("nums")).map(lambda x: x).set_name("same") \
        .write_to(Pipeline.to_list(f"{name}-out"))
    job = client.get_jet().submit(p, JobConfig(name=name,
                                               store_metrics_after_job_completion=True))
    job.join(timeout=120)
    return job


def test_metrics_job_serve_serves_only_that_job(
    client: sparkjet.Client, config_file: Path, tmp_path: Path
) -> None:
    client.get_list("nums").add_all(range(3))
    wanted, other = batch_job(client, "wanted"), batch_job(client, "other")
    log = tmp_path / "serve.out"
    with log.open("wb") as fh:
        proc = cli("metrics", "wanted", "--serve", "127.0.0.1:0", stdout=fh,
                   stderr=subprocess.STDOUT)
    try:
        text = wait_for_output(proc, log, "/metrics", 120, "the exporter's address")
        assert f"Serving job 'wanted' ({wanted.id})'s metrics at http://127.0.0.1:" in text
        url = re.search(r"http://\S+/metrics", text)
        assert url is not None
        with urllib.request.urlopen(url.group(0), timeout=60) as answer:
            scraped = answer.read().decode()
        # A completed job is served too: the one asked for, whatever its status.
        assert f'job_id="{wanted.id}",job_name="wanted",status="COMPLETED"' in scraped
        assert other.id not in scraped
        assert families(scraped)["sparkjet_receivedCount"][1][
            ("sparkjet_receivedCount_total", labelled(wanted, stage="same"))] == 3
        # "until interrupted": Ctrl-C is how it stops, and that is no error.
        assert (interrupt(proc, log.read_text), log.read_text()) == (0, text)
    finally:
        if proc.poll() is None:  # the test failed before
            proc.kill()
            proc.wait()


# --- 2. Prometheus types: counters are counters ----------------------------------------------


def test_prometheus_types_follow_jets_semantics_counters_end_in_total(
    client: sparkjet.Client, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("raw", ["1", "x", "3"]))
      .map(int).set_name("parse")
      .write_to(Pipeline.to_list("out")))
    job = client.get_jet().submit(p, JobConfig(
        name="typed", error_policy="dead-letter", store_metrics_after_job_completion=True))
    job.join(timeout=120)
    code, out, _ = run(capsys, "metrics", "typed", "--prometheus")
    assert code == 0
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", out, re.MULTILINE))
    assert types == {
        "sparkjet_status": "gauge",
        "sparkjet_executionStartTime": "gauge",
        "sparkjet_executionCompletionTime": "gauge",
        "sparkjet_receivedCount_total": "counter",
        "sparkjet_emittedCount_total": "counter",
        "sparkjet_deadLetters_total": "counter",
        "sparkjet_storeRequests_total": "counter",
    }
    found = families(out)  # prometheus_client's own parser takes it
    assert {name: kind for name, (kind, _) in found.items()} == {
        "sparkjet_status": "gauge",
        "sparkjet_executionStartTime": "gauge",
        "sparkjet_executionCompletionTime": "gauge",
        "sparkjet_receivedCount": "counter",
        "sparkjet_emittedCount": "counter",
        "sparkjet_deadLetters": "counter",
        "sparkjet_storeRequests": "counter",
    }
    assert found["sparkjet_deadLetters"][1] == {
        ("sparkjet_deadLetters_total", labelled(job, stage="parse")): 1.0}
    # Every sample belongs to the metric its TYPE line announced just before.
    current = None
    for line in out.splitlines():
        if line.startswith("# TYPE "):
            current = line.split()[2]
        elif not line.startswith("# HELP "):
            assert line.split("{")[0] == current, line


# --- 3. get map / get list: unknown is an error, empty is not -------------------------------


@pytest.mark.usefixtures("config_file", "no_spark")
def test_get_map_and_list_report_an_unknown_name_and_show_an_empty_one(
    client: sparkjet.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    store = client.config.store_url
    for kind in ("map", "list"):
        code, out, err = run(capsys, "get", kind, f"nosuch{kind}")
        assert (code, out) == (1, "")
        assert one_error_line(err) == (
            f"ERROR: no {kind} 'nosuch{kind}' in store '{store}' (nothing was ever written to it)")
    client.get_map("emptied").put("k", 1)
    client.get_map("emptied").clear()
    client.get_list("cleared").add(1)
    client.get_list("cleared").clear()
    assert run(capsys, "get", "map", "emptied") == (0, "KEY  VALUE\n", "")
    assert run(capsys, "get", "map", "emptied", "--json") == (0, "[]\n", "")
    assert run(capsys, "get", "list", "cleared") == (0, "", "")
    assert client.get_map("emptied").exists() and not client.get_map("never").exists()
    assert client.get_list("cleared").exists() and not client.get_list("never").exists()


def test_a_batch_job_with_no_output_leaves_an_existing_empty_map(
    client: sparkjet.Client, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = Pipeline.create()
    p.read_from(Pipeline.from_list("none", [])).map(lambda x: (x, x)) \
        .write_to(Pipeline.to_map("pairs"))
    client.get_jet().submit(p).join(timeout=120)
    assert run(capsys, "get", "map", "pairs", "--json") == (0, "[]\n", "")


# --- 4. a damaged map writer index is named, and leaves the map readable ----------------------


@pytest.mark.usefixtures("no_spark")
@pytest.mark.parametrize(("damage", "says"), [
    (b'{"seq": 7}', "it names record 7, which the log does not hold (its records end at 2)"),
    (b'{"seq": 1', "is corrupt or truncated (9 bytes)"),
    (b"", "is corrupt or truncated (0 bytes)"),
])
def test_a_damaged_map_writer_index_is_named_and_commits_nothing(
    client: sparkjet.Client, damage: bytes, says: str
) -> None:
    """What a micro-batch's map sink does on the driver (CommitLogSink.commit -> commit_once)."""
    log = client.store.map_log("m")
    log.commit("put", [("items", [("a", 1)])])
    assert log.commit_once("put", [("items", [("b", 2)])], token="t0", writer="w",
                           producer="p", batch=0) == 2
    index = Path(log.paths.writer_index("w"))
    index.write_bytes(damage)
    with pytest.raises(sparkjet.errors.StoreError) as info:
        log.commit_once("put", [("items", [("c", 3)])], token="t1", writer="w",
                        producer="p", batch=1)
    text = str(info.value)
    assert f"map 'm': writer index {str(index)!r}" in text and says in text
    assert f"in store '{client.config.store_url}'" in text
    assert dict(client.get_map("m").entry_set()) == {"a": 1, "b": 2}  # readable, nothing lost
    assert log.sequences() == [1, 2]


# --- 5. the suspension cause in the command's words ---------------------------------------


def test_the_cli_says_sparkjet_resume_where_the_api_says_resume(
    client: sparkjet.Client, store_url: str, config_file: Path,
    capsys: pytest.CaptureFixture[str], cancel_at_end: list[Job],
) -> None:
    client.get_stream("events", partitions=1).publish_all([1, 2])
    p = Pipeline.create()
    p.read_from(StreamSource("events")).set_name("events").write_to(Pipeline.to_list("out"))
    job = client.get_jet().submit(p, JobConfig(
        name="my job", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=10))
    cancel_at_end.append(job)
    wait_until(lambda: len(client.get_list("out").get_all()) == 2, 300, "the items")
    job.suspend()
    job.wait_for_status(JobStatus.SUSPENDED, timeout=60)
    kill_driver(client, job)

    code, out, _ = run(capsys, "status", "my job")
    assert code == 0
    assert out.splitlines() == [
        f"Job 'my job' ({job.id}) is SUSPENDED (Requested by user; the process that ran it "
        "has exited, continue it with: sparkjet resume 'my job')",
        "Resume it with: sparkjet resume 'my job'",
    ]
    assert "resume()" not in out
    fresh = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK)
    orphan = fresh.get_jet().get_job(job.id)
    assert orphan is not None
    assert orphan.get_suspension_cause().endswith(  # the Python API keeps its own words
        "the process that ran it has exited, resume() continues it here")


# --- 7. one line, never a traceback ----------------------------------------------------------


@pytest.mark.usefixtures("config_file")
def test_a_reader_that_stops_reading_ends_the_command_quietly(client: sparkjet.Client) -> None:
    client.get_list("big").add_all(range(200_000))  # more than a pipe holds
    proc = cli("get", "list", "big", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"0  0\n"
    proc.stdout.close()  # | head -1
    err = proc.stderr.read().decode()
    assert (proc.wait(timeout=60), err) == (141, "")


def wait_reading_stdin(proc: subprocess.Popen[bytes], output: Callable[[], str],
                       timeout: float = 120) -> None:
    """Wait until ``proc``'s main thread is blocked in read(0, ...) (Linux's /proc).

    Fails at once if ``proc`` exits first, and after ``timeout`` s showing where it is.
    """
    syscall = Path(f"/proc/{proc.pid}/syscall")
    deadline = time.monotonic() + timeout
    while not syscall.read_text().startswith("0 0x0 "):
        if proc.poll() is not None:
            abort_and_show(proc, "the command exited before it read stdin", output)
        if time.monotonic() >= deadline:
            abort_and_show(proc, f"the command did not read stdin within {timeout:g} s", output)
        time.sleep(0.05)


@pytest.mark.usefixtures("config_file")
def test_ctrl_c_while_a_command_works_is_one_line_and_publishes_nothing(
    client: sparkjet.Client, tmp_path: Path,
) -> None:
    out, err = tmp_path / "publish.out", tmp_path / "publish.err"

    def output() -> str:
        return f"stdout: {out.read_text()!r}\nstderr:\n{err.read_text()}"

    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = cli("publish", "-p", "1", "events", "-", stdin=subprocess.PIPE,
                   stdout=stdout, stderr=stderr)
    assert proc.stdin is not None
    try:
        proc.stdin.write(b'{"n": 1}\n')
        proc.stdin.flush()
        # Its input stays open: the command has read the line and waits for more
        # (it publishes once its input ends) until Ctrl-C stops it.
        wait_reading_stdin(proc, output)
        status = interrupt(proc, output)
        assert (status, out.read_text(), err.read_text()) == (130, "", "ERROR: interrupted\n")
        assert not client.get_stream("events").exists()
    finally:
        if proc.poll() is None:  # the test failed before
            proc.kill()
            proc.wait()
        proc.stdin.close()


@pytest.mark.usefixtures("no_spark")
def test_representative_errors_are_one_line(
    client: sparkjet.Client, config_file: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cases: list[tuple[list[str], int, str]] = [
        (["status", "nosuchjob"], 1, "no job with id or name 'nosuchjob'"),
        (["apply", "missing.toml"], 2, "missing.toml"),
        (["submit", "missing.py"], 2, "missing.py: no such file"),
        (["publish", "s", "."], 2, "is a directory"),
        (["-c", "missing.toml", "list-jobs"], 2, "missing.toml"),
    ]
    for argv, status, says in cases:
        code, _, err = run(capsys, *argv)
        assert (code, says in one_error_line(err)) == (status, True), (argv, err)
    monkeypatch.setenv("SPARKJET_STORE", "nosuch://x/y")
    code, _, err = run(capsys, "-c", os.devnull, "list-jobs")
    assert code == 1 and "cannot open store 'nosuch://x/y'" in one_error_line(err)


@pytest.mark.usefixtures("config_file", "no_spark")
def test_a_bug_is_one_line_and_its_traceback_is_printed_with_v(
    client: sparkjet.Client, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sparkjet.core.store.structures import IList

    def broken(self: IList) -> list[Any]:
        raise RuntimeError("a bug")

    client.get_list("l").add(1)
    monkeypatch.setattr(IList, "get_all", broken)  # a bug, where the command would meet one
    code, _, err = run(capsys, "get", "list", "l")
    assert (code, one_error_line(err)) == (
        1, "ERROR: unexpected RuntimeError: a bug (-v prints the traceback)")
    code, _, err = run(capsys, "-v", "get", "list", "l")
    assert code == 1 and "Traceback" in err and "raise RuntimeError" in err
    assert err.splitlines()[-1] == "ERROR: unexpected RuntimeError: a bug"


# --- 8. per-stage counts go on from the checkpoint --------------------------------------------


@pytest.mark.spark
def test_per_stage_counts_continue_across_suspend_and_another_driver(
    client: sparkjet.Client, store_url: str, cancel_at_end: list[Job],
) -> None:
    stream = client.get_stream("events", partitions=1)
    stream.publish_all(range(14))  # 0 and 7 are dead letters
    p = Pipeline.create()
    (p.read_from(StreamSource("events")).set_name("events")
      .map(lambda n: 100 // (n % 7)).set_name("divide")   # every seventh is a dead letter
      .write_to(Pipeline.to_list("out")))
    job = client.get_jet().submit(p, JobConfig(
        name="counting", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=10,
        error_policy="dead-letter"))
    cancel_at_end.append(job)
    out = client.get_list("out")

    def divided(view: Job) -> dict[str, int]:
        return dict(view.get_metrics()["stages"]["divide"])

    def counted(view: Job, received: int) -> bool:
        # Not only RUNNING or STARTING: a job reads NOT_RUNNING until its thread
        # starts it (CI saw it there after other tests), SUSPENDED until resumed.
        if view.status.is_terminal():
            pytest.fail(f"job {view.label} is {view.status.value}: {view.get_failure()}")
        return divided(view)["receivedCount"] >= received

    wait_until(lambda: counted(job, 14), 600, "the first items")
    assert divided(job) == {"receivedCount": 14, "emittedCount": 12, "deadLetters": 2}

    # Suspended and resumed here: the counts go on.
    job.suspend()
    job.wait_for_status(JobStatus.SUSPENDED, timeout=120)
    job.resume()
    stream.publish_all(range(14, 21))  # 14 is one
    wait_until(lambda: counted(job, 21), 300, "the counts after the resume")
    assert divided(job) == {"receivedCount": 21, "emittedCount": 18, "deadLetters": 3}

    # Its driver dies; another one takes the job over from the checkpoint: the counts go on.
    job.suspend()
    job.wait_for_status(JobStatus.SUSPENDED, timeout=120)
    kill_driver(client, job)
    fresh = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK)
    orphan = fresh.get_jet().get_job(job.id)
    assert orphan is not None
    cancel_at_end.append(orphan)
    orphan.resume()
    assert orphan.is_driven_here()
    stream.publish_all(range(21, 28))  # 21 is one
    wait_until(lambda: len(out.get_all()) == 24, 300, "the items on the new driver")
    wait_until(lambda: counted(orphan, 28), 60, "the new driver's counts to go on from 21")
    assert divided(orphan) == {"receivedCount": 28, "emittedCount": 24, "deadLetters": 4}
    # Another process reads the same totals from the job's record.
    elsewhere = sparkjet.connect(store={"url": store_url}).get_jet().get_job(job.id)
    assert elsewhere is not None
    wait_until(lambda: divided(elsewhere)["receivedCount"] == 28, 60, "the record's counts")
    assert divided(elsewhere) == {"receivedCount": 28, "emittedCount": 24, "deadLetters": 4}


# --- 6. docs/kafka.md runs twice, and its producer adds clicks -------------------------------


@pytest.mark.slow
def test_the_kafka_page_runs_again_and_its_producer_produces_more(tmp_path: Path) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from tests.kafka_broker import kafka_broker
    from tests.test_snippets import ROOT, RUNNER, file_blocks, reader_env, runnable_blocks

    page = ROOT / "docs" / "kafka.md"
    folder = tmp_path / "reader"
    folder.mkdir()
    for path, code in file_blocks(page).items():
        (folder / path).write_text(code, encoding="utf-8")
    assert "produce_clicks.py" in file_blocks(page)
    program = tmp_path / "blocks.json"
    program.write_text(json.dumps(runnable_blocks(page)), encoding="utf-8")
    with kafka_broker() as bootstrap:
        env = reader_env(KAFKA_BROKERS=bootstrap)
        # The second run meets the topics and the first job's name: it counts 200 clicks.
        for last in ("{'u0': 15, 'u1': 15, 'u2': 14, 'u3': 14, 'u4': 14, 'u5': 14, 'u6': 14}",
                     "{'u0': 30, 'u1': 30, 'u2': 28, 'u3': 28, 'u4': 28, 'u5': 28, 'u6': 28}"):
            run = subprocess.run([sys.executable, "-c", RUNNER, str(program)], cwd=folder,
                                 env=env, capture_output=True, text=True, timeout=420)
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
            assert "TOPIC_ALREADY_EXISTS" not in run.stderr
            assert run.stdout.splitlines()[-1] == last, run.stdout
        produced = subprocess.run([sys.executable, "produce_clicks.py", "50"], cwd=folder,
                                  env=env, capture_output=True, text=True, timeout=120)
        assert produced.returncode == 0, produced.stderr
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check"})
        try:
            ends = [consumer.get_watermark_offsets(TopicPartition("clicks", p), timeout=30)[1]
                    for p in (0, 1)]
        finally:
            consumer.close()
        assert sum(ends) == 250
