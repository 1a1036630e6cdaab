"""Batch, stateless: 5M ints, map x*2, filter x % 3 == 0, results kept.

- sparkjet: list source -> map -> filter -> list sink (results committed to the store)
- PySpark RDD: parallelize -> map -> filter -> collect (results on the driver)
- PySpark RDD without output: same, ending in count() (a lower bound, not the same work)
- plain Python: one loop in this process
"""

from __future__ import annotations

from _harness import connect, measure, parse_args, report

from sparkjet.job import JobConfig
from sparkjet.pipeline import Pipeline


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], 5_000_000)
    client = connect(args.master)
    sc = client.spark.sparkContext
    data = list(range(args.n))
    expected_len = sum(1 for x in data if (x * 2) % 3 == 0)
    jet = client.get_jet()
    results = client.get_list("results")
    print(f"{args.n:,} ints on {args.master}, Spark {client.spark.version}")

    def sparkjet_job() -> int:
        results.clear()
        p = Pipeline.create()
        (p.read_from(Pipeline.from_list("numbers", data))
         .map(lambda x: x * 2).filter(lambda x: x % 3 == 0)
         .write_to(Pipeline.to_list("results")))
        jet.submit(p, JobConfig(metrics_enabled=True)).join()
        return expected_len

    def rdd_collect() -> int:
        rdd = sc.parallelize(data).map(lambda x: x * 2).filter(lambda x: x % 3 == 0)
        return len(rdd.collect())

    def rdd_count() -> int:
        return int(sc.parallelize(data).map(lambda x: x * 2).filter(lambda x: x % 3 == 0).count())

    def plain() -> int:
        return len([y for y in (x * 2 for x in data) if y % 3 == 0])

    timings = {}
    timings["sparkjet"], _ = measure("sparkjet (job, results in store)", sparkjet_job, args.repeat)
    assert results.size() == expected_len, "sparkjet produced a wrong result"
    timings["pyspark rdd collect"], got = measure(
        "pyspark rdd .collect()", rdd_collect, args.repeat
    )
    assert got == expected_len
    timings["pyspark rdd count (no output)"], got = measure(
        "pyspark rdd .count()", rdd_count, args.repeat
    )
    assert got == expected_len
    timings["plain python"], got = measure("plain python loop", plain, args.repeat)
    assert got == expected_len
    report(args.n, timings)


if __name__ == "__main__":
    main()
