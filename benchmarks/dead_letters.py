"""Dead letters: what a stage's on_error("dead-letter") costs, in a batch job of 2M strings.

Each contender parses strings to ints (int(s) * 2) and keeps the results;
``--bad-every`` makes every N-th string unparsable.

- sparkjet fail policy: the stage with the default policy, on clean input
  (the reference: what the job costs without dead letters);
- sparkjet dead-letter: the same stage with on_error("dead-letter"), on clean
  input (the cost of the guard alone);
- sparkjet dead-letter, bad input: every N-th item a dead letter (items,
  errors and tracebacks to the driver, appended to the dead-letter stream);
- PySpark RDD by hand: map to tagged (ok, value) pairs, cache, collect the
  good and the bad (the usual hand-written dead-letter pattern), bad input;
- plain Python: a loop with try/except in this process, bad input.
"""

from __future__ import annotations

import argparse

from _harness import connect, measure, report

from sparkjet.job import JobConfig
from sparkjet.pipeline import Pipeline


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2_000_000, help="number of items")
    parser.add_argument("--bad-every", type=int, default=1000, help="every N-th item is bad")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per contender")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    return parser.parse_args()


def parse(text: str) -> int:
    return int(text) * 2


def tagged(text: str) -> tuple[bool, object]:
    try:
        return True, int(text) * 2
    except ValueError as exc:
        return False, (text, repr(exc))


def main() -> None:
    args = parse_args()
    client = connect(args.master)
    sc = client.spark.sparkContext
    clean = [str(i) for i in range(args.n)]
    dirty = [f"bad-{i}" if i % args.bad_every == 0 else str(i) for i in range(args.n)]
    n_bad = len(range(0, args.n, args.bad_every))
    jet = client.get_jet()
    results = client.get_list("results")
    print(f"{args.n:,} strings on {args.master}, Spark {client.spark.version}; "
          f"bad input: every {args.bad_every:,}th ({n_bad:,} items)")
    runs = iter(range(1_000_000))

    def sparkjet_job(data: list[str], policy: str) -> int:
        results.clear()
        p = Pipeline.create()
        (p.read_from(Pipeline.from_list("strings", data))
         .map(parse).set_name("parse").on_error(policy)
         .write_to(Pipeline.to_list("results")))
        stream = f"letters-{next(runs)}"
        job = jet.submit(p, JobConfig(dead_letter_stream=stream))
        job.join()
        letters = client.get_stream(stream)
        written = letters.end_offsets()[0] if letters.exists() else 0
        return results.size() + written

    def rdd_by_hand() -> int:
        pairs = sc.parallelize(dirty).map(tagged).cache()
        good = pairs.filter(lambda p: p[0]).map(lambda p: p[1]).collect()
        bad = pairs.filter(lambda p: not p[0]).map(lambda p: p[1]).collect()
        pairs.unpersist()
        return len(good) + len(bad)

    def plain() -> int:
        good, bad = [], []
        for text in dirty:
            try:
                good.append(int(text) * 2)
            except ValueError as exc:
                bad.append((text, repr(exc)))
        return len(good) + len(bad)

    timings = {}
    timings["sparkjet fail policy"], got = measure(
        "sparkjet, policy fail, clean input", lambda: sparkjet_job(clean, "fail"), args.repeat)
    assert got == args.n
    timings["sparkjet dead-letter"], got = measure(
        "sparkjet, dead-letter, clean input", lambda: sparkjet_job(clean, "dead-letter"),
        args.repeat)
    assert got == args.n
    timings["sparkjet dead-letter, bad input"], got = measure(
        "sparkjet, dead-letter, bad input", lambda: sparkjet_job(dirty, "dead-letter"),
        args.repeat)
    assert got == args.n, f"results + letters = {got}, not {args.n}"
    timings["pyspark rdd by hand, bad input"], got = measure(
        "pyspark rdd tag/cache/collect twice", rdd_by_hand, args.repeat)
    assert got == args.n
    timings["plain python, bad input"], got = measure(
        "plain python try/except", plain, args.repeat)
    assert got == args.n
    report(args.n, timings, subject="sparkjet fail policy")
    by_hand = timings["pyspark rdd by hand, bad input"]
    ours = timings["sparkjet dead-letter, bad input"]
    print(f"\nvs the hand-written PySpark pattern: {by_hand / ours:.2f}x "
          "(above 1.00x: sparkjet's dead letters are faster)")


if __name__ == "__main__":
    main()
