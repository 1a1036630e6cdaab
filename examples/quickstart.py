"""The quickstart: double some numbers, keep the big ones, read them back.

Runs on the embedded default: a local Spark session and a store folder
`.sparkjet` in the working directory. No configuration file needed.
"""

from __future__ import annotations

import sparkjet
from sparkjet.aggregate import counting
from sparkjet.job import JobConfig
from sparkjet.pipeline import Pipeline


def main() -> None:
    client = sparkjet.connect()
    jet = client.get_jet()
    client.get_list("results").clear()
    client.get_map("word-counts").clear()

    pipeline = Pipeline.create()
    source = Pipeline.from_list("numbers", [1, 2, 3, 4, 5])
    pipeline.read_from(source).map(lambda x: x * 2).filter(lambda x: x > 4).write_to(
        Pipeline.to_list("results")
    )
    job = jet.submit(pipeline, JobConfig(name="doubler"))
    job.join()
    print("doubler:", job.status.value, client.get_list("results").get_all())

    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "the", "end"]
    counts = Pipeline.create()
    (counts.read_from(Pipeline.from_list("words", words))
     .group_by(lambda w: w).aggregate(counting())
     .write_to(Pipeline.to_map("word-counts")))
    job = jet.submit(counts, JobConfig(name="word-count"))
    job.join()
    top = sorted(client.get_map("word-counts").entry_set(), key=lambda kv: -kv[1])[:3]
    print("word-count:", job.status.value, top)
    for name, stage in job.get_metrics()["stages"].items():
        received, emitted = stage["receivedCount"], stage["emittedCount"]
        print(f"  {name:<24} received {received:>3}  emitted {emitted:>3}")


if __name__ == "__main__":
    main()
