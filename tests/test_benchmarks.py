"""The benchmark scripts still run: each one, tiny, in its own process.

Benchmarks are scripts, not timed tests; nothing here judges a figure. It
checks that every script runs to its table against the code as it is (a
renamed field once broke ``state_scaling.py`` unnoticed) and that each
contender it measures produced a result that its own checks accepted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

RUNS = {
    "batch_stateless": (["-n", "5000", "--repeat", "1"], ["sparkjet", "vs "]),
    "batch_grouped": (["-n", "5000", "--repeat", "1"], ["sparkjet", "vs "]),
    "stream_rolling": (
        ["-n", "5000", "--keys", "50", "--chunks", "2", "--latency-seconds", "1",
         "--probe-every-ms", "250", "--probe-size", "10", "--s3"],
        ["sparkjet", "native", "S3", "targets:"],
    ),
    "commit_log": (["--commits", "150", "--s3"], ["folded", "never folded", "plain Python"]),
    "memory_store": (
        ["--files", "200", "--folders", "10", "--listings", "20", "--creates", "50",
         "--rounds", "1"],
        ["fsspec", "thread-safe", "create-only"],
    ),
    "snapshot": (
        ["--sizes-mb", "1", "--s3", "--live-mb", "1", "--live-seconds", "3", "-n", "20000",
         "--repeat", "1", "--migrate-keys", "20000"],
        ["fsspec copy", "export:", "restore: both", "longest gap during the export",
         "a snapshot every 1,000 ms", "migrate-snapshot: identity fn",
         "migrate-snapshot: rename only"],
    ),
    "windows": (
        ["-n", "3000", "--auctions", "20", "--rate", "1000", "--latency-seconds", "3",
         "--queries", "sliding"],
        ["sparkjet EXACTLY_ONCE", "native structured streaming", "vs native"],
    ),
    "dead_letters": (
        ["-n", "5000", "--bad-every", "100", "--repeat", "1"],
        ["sparkjet dead-letter, bad input", "pyspark rdd by hand", "plain python",
         "vs the hand-written"],
    ),
    # --toy: 20,000 events against a 2,000-row table, batch and stream.
    "joins": (
        ["--toy"],
        ["sparkjet driver_only", "spark sql broadcast join", "spark sql, inputs cached",
         "sparkjet EXACTLY_ONCE", "native structured streaming", "checked: each sink",
         "goals:"],
    ),
    # --toy: 5,000 events per input, the inner join alone, no warm-up (Structured
    # Streaming's first micro-batch takes seconds by itself): about 20-30 s.
    "interval_join": (
        ["--toy"],
        ["sparkjet EXACTLY_ONCE", "native structured streaming", "vs native",
         "after the closing watermark 1 keys", "checked: each contender's pairs", "goal:"],
    ),
    "kafka": (
        ["-n", "2000", "--keys", "20", "--chunks", "2", "--sink-rounds", "3"],
        ["sparkjet Kafka EXACTLY_ONCE", "plain confluent-kafka loop", "sparkjet stream", "vs it",
         "sparkjet KafkaSink AT_LEAST_ONCE", "plain long-lived producer"],
    ),
    # Three contenders on fresh topics, 2 s at 200/s after a 1 s warm-up each.
    "kafka_latency": (
        ["--quick"],
        ["plain confluent-kafka loop", "sparkjet EXACTLY_ONCE", "sparkjet AT_LEAST_ONCE",
         "checked: every key's count matches", "vs plain", "targets"],
    ),
    # The local store only: the S3 path is stream_rolling's (--s3), and each store
    # adds a job per contender and query.
    "latency": (
        ["--rates", "100", "--seconds", "0.5", "--warmup-seconds", "0.3", "--stores", "local"],
        ["sparkjet (adaptive)", "sparkjet (Spark engine)", "native structured streaming",
         "on the driver", "p99/target",
         "targets at 100 events/s: local"],
    ),
    "engines": (
        ["--sizes", "100,2000", "--repeat", "1", "--keys", "20"],
        ["spark/driver", "driver/python", "checked: each job's counts match"],
    ),
    # In process only (no --spark, no --http): 200 calls of 5 ms per run.
    "services": (
        ["-n", "200", "--sync-n", "40"],
        ["max_concurrent_ops 16", "plain asyncio", "sparkjet map_using_service",
         "plain python loop", "checked: every contender", "goals:"],
    ),
    "liveness": (["--checks", "20", "--s3"], ["heartbeat vs", "store's clock", "vs heartbeat"]),
    "files": (
        ["-n", "2000", "--files", "6", "--files-per-batch", "2", "--repeat", "1"],
        ["sparkjet batch", "sparkjet streaming EXACTLY_ONCE", "spark.read.json",
         "spark.read.parquet", "plain python"],
    ),
    "state_scaling": (
        ["--sizes", "100,2000", "--probes", "2", "--increment", "20",
         "--cached-sizes", "100,2000", "--trivial-runs", "3"],
        ["sparkjet", "native", "vs smallest", "targets:", "while held", "target: trivial"],
    ),
    # Both sides at toy sizes: a classic session, then a Connect server the script
    # starts (tests/connect_server.py) and a Connect session in a process of its own.
    "connect": (
        ["--quick", "-n", "5000", "--stream-n", "5000", "--keys", "50", "--chunks", "2",
         "--probes", "5", "--repeat", "1"],
        ["=== classic", "=== connect", "W3 rolling count", "latency p50, adaptive on",
         "connect/classic", "targets:"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("script", [
    # connect.py needs the Connect client's dependencies (pyspark[connect]): it runs
    # in nox's connect session, which installs them (other runs deselect it).
    pytest.param(name, marks=pytest.mark.connect) if name == "connect" else name
    for name in sorted(RUNS)
])
def test_benchmark_runs_to_its_table(script: str, tmp_path: Path) -> None:
    """The script exits 0 and prints its ratio table with every contender."""
    arguments, expected = RUNS[script]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, f"{script}.py", *arguments],
        cwd=BENCHMARKS, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    for text in expected:
        assert text in done.stdout, f"{script} printed no {text!r}:\n{done.stdout}"
    # It printed ratios, and measured something (at these sizes timings may tie, and
    # plain Python may round to 0.00x, so no particular ratio is required).
    ratios = [float(r) for r in re.findall(r"(\d+\.\d+)x", done.stdout)]
    assert len(ratios) >= 2, done.stdout
    measured = [float(t) for t in re.findall(r"\b(\d+\.\d+)\b(?!x)", done.stdout)]
    assert any(t > 0 for t in measured), done.stdout
