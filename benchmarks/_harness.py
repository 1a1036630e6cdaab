"""Shared harness: one Spark session, timed runs, a ratio table.

Every benchmark runs sparkjet, hand-written PySpark and plain Python on the
same data in the same process, and prints the best of ``--repeat`` runs (after
one warm-up run each) with the ratios against the baselines.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


def parse_args(description: str, default_n: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-n", type=int, default=default_n, help="number of items")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per contender")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    return parser.parse_args()


def connect(master: str) -> Any:
    """A sparkjet client on a temporary store, and its (shared) Spark session."""
    import sparkjet

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    store = tempfile.mkdtemp(prefix="sparkjet-bench-")
    client = sparkjet.connect(
        store={"url": store},
        spark={"master": master, "conf": {"spark.ui.enabled": "false"}},
    )
    client.spark.sparkContext.setLogLevel("ERROR")
    return client


def measure(label: str, fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    result = fn()  # warm-up: JVM JIT, Python workers
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    best = min(times)
    print(f"  {label:<34} best {best:7.3f} s   median {statistics.median(times):7.3f} s",
          flush=True)
    return best, result


def report(n: int, timings: dict[str, float], subject: str = "sparkjet") -> None:
    print()
    print(f"{'contender':<36}{'items/s':>14}{'vs ' + subject:>14}")
    for label, seconds in timings.items():
        ratio = seconds / timings[subject]
        print(f"{label:<36}{n / seconds / 1e6:>11.2f} M/s{ratio:>13.2f}x")
    print(f"\n(ratio = contender time / {subject} time; above 1.00x means {subject} is faster)")


class JsonLinesFolder:
    """A folder Spark's file source reads: a producer writes each JSON-lines file aside,
    then moves it in whole."""

    def __init__(self, prefix: str) -> None:
        self.root = tempfile.mkdtemp(prefix=prefix)
        self.folder = os.path.join(self.root, "in")
        self.staging = os.path.join(self.root, "staging")
        os.makedirs(self.folder)
        os.makedirs(self.staging)
        self.files = 0

    @staticmethod
    def encode(events: list[Any]) -> bytes:
        return "".join(json.dumps(e) + "\n" for e in events).encode()

    def publish(self, payload: bytes) -> None:
        name = f"part-{self.files:06d}.json"
        self.files += 1
        staged = os.path.join(self.staging, name)
        with open(staged, "wb") as f:
            f.write(payload)
        os.rename(staged, os.path.join(self.folder, name))

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
