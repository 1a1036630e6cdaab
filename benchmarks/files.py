"""Reading files: N rows in F JSON-lines (and Parquet) files, counted per key.

- sparkjet batch: FileSource(streaming=False) -> group_by(k).aggregate(counting()) -> list
- sparkjet streaming EXACTLY_ONCE: the same from a streaming FileSource, timed from submit
  until every file was counted (micro-batches of --files-per-batch files)
- PySpark DataFrame: spark.read.json(folder) / spark.read.parquet(folder) .groupBy(k).count()
- plain Python: one loop in this process over the same files (json.loads / pyarrow to_pylist)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from typing import Any

from _harness import connect, measure, report

from sparkjet.aggregate import counting
from sparkjet.contrib import files as files_plugin
from sparkjet.contrib.files import FileSource
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline

KEYS = 100


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000_000, help="rows in all")
    parser.add_argument("--files", type=int, default=100, help="files per format")
    parser.add_argument("--files-per-batch", type=int, default=25,
                        help="max_files_per_batch of the streaming job")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per contender")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    return parser.parse_args()


def write_files(root: str, n: int, count: int) -> tuple[str, str, Counter[int]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl, parquet = os.path.join(root, "jsonl"), os.path.join(root, "parquet")
    os.makedirs(jsonl)
    os.makedirs(parquet)
    expected: Counter[int] = Counter()
    per_file = -(-n // count)
    for f in range(count):
        rows = [{"k": i % KEYS, "v": i, "name": f"item-{i}"}
                for i in range(f * per_file, min(n, (f + 1) * per_file))]
        expected.update(r["k"] for r in rows)
        with open(os.path.join(jsonl, f"part-{f:05d}.jsonl"), "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
        pq.write_table(pa.Table.from_pylist(rows), os.path.join(parquet, f"part-{f:05d}.parquet"))
    return jsonl, parquet, expected


def main() -> None:
    args = parse()
    client = connect(args.master)
    if "files" not in {info.name for info in client.list_plugins()}:
        client.register_plugin(files_plugin, "files")  # before a reinstall declares it
    spark = client.spark
    jet = client.get_jet()
    root = tempfile.mkdtemp(prefix="sparkjet-bench-files-")
    jsonl, parquet, expected = write_files(root, args.n, args.files)
    size = sum(os.path.getsize(os.path.join(jsonl, f)) for f in os.listdir(jsonl))
    print(f"{args.n:,} rows in {args.files} JSON-lines files ({size / 1e6:.1f} MB) and "
          f"{args.files} Parquet files, {KEYS} keys, on {args.master}, Spark {spark.version}")
    results = client.get_list("counts")

    def check(counts: dict[Any, int]) -> int:
        assert counts == dict(expected), "a contender counted wrong"
        return sum(counts.values())

    def sparkjet_batch(folder: str, fmt: str) -> int:
        results.clear()
        p = Pipeline.create()
        (p.read_from(FileSource(folder, format=fmt, streaming=False))
         .group_by(lambda r: r["k"]).aggregate(counting())
         .write_to(Pipeline.to_list("counts")))
        jet.submit(p).join()
        return check(dict(results.get_all()))

    def sparkjet_streaming(folder: str, fmt: str) -> int:
        counts = client.get_map(f"stream-counts-{time.monotonic_ns()}")
        p = Pipeline.create()
        (p.read_from(FileSource(folder, format=fmt, settle_seconds=0, poll_seconds=0.05,
                                max_files_per_batch=args.files_per_batch))
         .group_by(lambda r: r["k"]).aggregate(counting()).write_to(Pipeline.to_map(counts.name)))
        job = jet.submit(p, JobConfig(processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                                      snapshot_interval_millis=1))
        try:
            while sum(v for _, v in counts.entry_set()) < args.n:
                if job.status is JobStatus.FAILED:
                    job.join()
                time.sleep(0.02)
        finally:
            job.cancel()
            while not job.is_terminal():
                time.sleep(0.05)
        return check(dict(counts.entry_set()))

    def pyspark(folder: str, fmt: str) -> int:
        frame = spark.read.json(folder) if fmt == "jsonl" else spark.read.parquet(folder)
        return check({row["k"]: row["count"] for row in frame.groupBy("k").count().collect()})

    def plain(folder: str, fmt: str) -> int:
        import pyarrow.parquet as pq

        counts: Counter[int] = Counter()
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if fmt == "jsonl":
                with open(path, "rb") as fh:
                    counts.update(json.loads(line)["k"] for line in fh)
            else:
                counts.update(r["k"] for r in pq.read_table(path).to_pylist())
        return check(dict(counts))

    try:
        for fmt, folder in (("jsonl", jsonl), ("parquet", parquet)):
            print(f"\n{fmt}:")
            timings = {}
            timings["sparkjet batch"], _ = measure(
                f"sparkjet batch ({fmt})", lambda d=folder, f=fmt: sparkjet_batch(d, f),
                args.repeat)
            timings["sparkjet streaming EXACTLY_ONCE"], _ = measure(
                f"sparkjet streaming ({fmt})", lambda d=folder, f=fmt: sparkjet_streaming(d, f), 1)
            label = "pyspark spark.read." + ("json" if fmt == "jsonl" else "parquet")
            timings[label], _ = measure(label, lambda d=folder, f=fmt: pyspark(d, f), args.repeat)
            timings["plain python"], _ = measure(
                f"plain python ({fmt})", lambda d=folder, f=fmt: plain(d, f), args.repeat)
            report(args.n, timings, subject="sparkjet batch")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
