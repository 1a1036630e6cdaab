"""A streaming-job driver with Kafka in and Kafka out, which the fault tests SIGKILL.

    python kafka_driver.py STORE JOB_NAME BOOTSTRAP IN_TOPIC OUT_TOPIC
        [--pause-at BATCH] [--marker PATH]

The job reads ``IN_TOPIC`` (JSON ``{"seq": n}``) and writes ``{"seq": n, "twice":
2n}`` to ``OUT_TOPIC`` under EXACTLY_ONCE, through Kafka transactions. The
first run submits it; a later run finds it by name and resumes it. It prints
``SUBMITTED <id>`` or ``RESUMED <id>``, and ``PAUSED <batch>`` with
``--pause-at`` (see stream_driver.py: the driver stops after the batch's sinks
committed and before its checkpoint commit, so the next driver replays a batch
that already landed in Kafka). Its micro-batches run in process (``[engine]
driver_only``): batches this small ran on the driver on Spark too, and no JVM
starts with each driver.
"""

from __future__ import annotations

import argparse
import os
import sys

from tests.faults.stream_driver import SPARK, _install_pause


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("store", "name", "bootstrap", "source", "target"):
        parser.add_argument(name)
    parser.add_argument("--pause-at", type=int, default=None)
    parser.add_argument("--marker", default=None)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    import sparkjet
    from sparkjet.contrib import kafka
    from sparkjet.contrib.kafka import KafkaSink, KafkaSource
    from sparkjet.job import JobConfig, ProcessingGuarantee
    from sparkjet.pipeline import Pipeline

    if args.pause_at is not None:
        _install_pause(args.pause_at, args.marker or f"{args.store}.paused-{args.pause_at}")
    client = sparkjet.connect(store={"url": args.store}, spark=SPARK,
                              engine={"driver_only": True})
    if "kafka" not in {info.name for info in client.list_plugins()}:
        client.register_plugin(kafka, "kafka")
    jet = client.get_jet()
    job = jet.get_job_by_name(args.name)
    if job is None or job.is_terminal():
        p = Pipeline.create()
        (p.read_from(KafkaSource(args.source, args.bootstrap))
         .map(lambda e: {"seq": e["seq"], "twice": 2 * e["seq"]})
         .write_to(KafkaSink(args.target, args.bootstrap, key=lambda e: e["seq"])))
        job = jet.submit(p, JobConfig(name=args.name, snapshot_interval_millis=200,
                                      processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE))
        print(f"SUBMITTED {job.id}", flush=True)
    else:
        job.resume()
        print(f"RESUMED {job.id}", flush=True)
    job.join()
    print("ENDED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
