"""Batch, grouped: 5M dicts {"k": i % 1000, "v": i % 7}, group by k, sum v.

- sparkjet: list source -> group_by(k).aggregate(summing(v)) -> list sink
  (output in first-appearance order, committed to the store)
- PySpark RDD: parallelize -> map to (k, v) -> reduceByKey(add) -> collect
- plain Python: one dict loop in this process
"""

from __future__ import annotations

from operator import add

from _harness import connect, measure, parse_args, report

from sparkjet.aggregate import summing
from sparkjet.job import JobConfig
from sparkjet.pipeline import Pipeline


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], 5_000_000)
    client = connect(args.master)
    sc = client.spark.sparkContext
    data = [{"k": i % 1000, "v": i % 7} for i in range(args.n)]
    expected: dict[int, int] = {}
    for d in data:
        expected[d["k"]] = expected.get(d["k"], 0) + d["v"]
    jet = client.get_jet()
    results = client.get_list("sums")
    print(f"{args.n:,} dicts, {len(expected)} keys, on {args.master}, Spark {client.spark.version}")

    def sparkjet_job() -> None:
        results.clear()
        p = Pipeline.create()
        (p.read_from(Pipeline.from_list("events", data))
         .group_by(lambda d: d["k"]).aggregate(summing(lambda d: d["v"]))
         .write_to(Pipeline.to_list("sums")))
        jet.submit(p, JobConfig()).join()

    def rdd() -> dict[int, int]:
        return dict(sc.parallelize(data).map(lambda d: (d["k"], d["v"])).reduceByKey(add).collect())

    def plain() -> dict[int, int]:
        out: dict[int, int] = {}
        for d in data:
            out[d["k"]] = out.get(d["k"], 0) + d["v"]
        return out

    timings = {}
    timings["sparkjet"], _ = measure("sparkjet (job, results in store)", sparkjet_job, args.repeat)
    assert results.get_all() == list(expected.items()), "sparkjet produced a wrong result"
    timings["pyspark rdd reduceByKey"], got = measure("pyspark rdd reduceByKey", rdd, args.repeat)
    assert got == expected
    timings["plain python"], got = measure("plain python dict loop", plain, args.repeat)
    assert got == expected
    report(args.n, timings)


if __name__ == "__main__":
    main()
