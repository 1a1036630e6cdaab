"""A streaming-job driver on a standalone cluster, started by ``tests/test_stream_cluster.py``.

    python stream_driver.py STORE MASTER_URL JOB_NAME --auto-scaling on|off
        [--guarantee EXACTLY_ONCE] [--interval MS] [--executors N] [--stream NAME]
        [--store-options JSON] [--initial-snapshot NAME]

It connects to ``MASTER_URL`` (2 executors of 1 core), waits until N executors
have registered (the job's executor baseline is the count at its first check),
creates the stream (2 partitions), submits ``stream -> group_by(key_of) ->
aggregate(counting()) -> map "counts"`` and then watches the job until it ends
(the test cancels it, or kills this process).

Progress goes to stdout, one line each, flushed::

    EXECUTORS <n>
    SUBMITTED <job id>
    STATUS <status> executors=<n> committed=<last committed batch>   (on every change)
    ENDED <status> <failure or ->
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time


def spark_settings(master: str) -> dict[str, object]:
    return {
        "master": master,
        "app_name": "sparkjet-cluster-driver",
        "conf": {
            "spark.ui.enabled": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": "768m",
            "spark.executor.memory": "1g",
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            "spark.task.maxFailures": "8",
            "spark.default.parallelism": "2",
            "spark.sql.shuffle.partitions": "2",
        },
    }


def key_of(event: dict[str, object]) -> object:
    """The grouping key; an item with ``pause`` holds its task (on an executor) until the
    file ``release`` exists, ``pause`` seconds at most.

    First it creates ``<mark>/<seq>-<pid>``, so the test knows which executor's
    Python worker runs it, can kill that worker's machine mid-task, and then
    creates ``release`` (the task run again elsewhere goes on at once).
    """
    if "pause" in event:
        with open(os.path.join(str(event["mark"]), f"{event['seq']}-{os.getpid()}"), "w"):
            pass
        deadline = time.monotonic() + float(event["pause"])  # type: ignore[arg-type]
        while not os.path.exists(str(event["release"])) and time.monotonic() < deadline:
            time.sleep(0.05)
    return event["key"]


#: The hash join's build side, list ``labels``: ``k<i>`` -> ``label-<i>``.
LABELS = [(f"k{i}", f"label-{i}") for i in range(100)]


class Upper:
    """The async enrichment's service: a label upper-cased, after a millisecond."""

    async def upper(self, label: str) -> str:
        import asyncio

        await asyncio.sleep(0.001)
        return label.upper()


def build_pipeline(stream: str):  # type: ignore[no-untyped-def]
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import JoinClause, Pipeline, ServiceFactory, StreamSource

    p = Pipeline.create()
    events = p.read_from(StreamSource(stream)).set_name("events")
    events.group_by(key_of).aggregate(counting()).set_name("count-per-key").write_to(
        Pipeline.to_map("counts"))
    # Each item labelled from a table, the label upper-cased by an async service
    # call, then counted per label into map "label_counts".
    table = p.read_from(Pipeline.from_list("labels")).set_name("labels")
    (
        events.hash_join(table, JoinClause.on_keys(lambda e: e["key"], lambda kv: kv[0])
                         .projecting(lambda kv: kv[1]), lambda e, label: label)
        .set_name("labelled")
        .map_using_service_async(ServiceFactory.of(Upper), lambda s, label: s.upper(label),
                                 max_concurrent_ops=8).set_name("upper")
        .group_by(lambda label: label).aggregate(counting()).set_name("count-per-label")
        .write_to(Pipeline.to_map("label_counts"))
    )
    return p


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("master")
    parser.add_argument("name")
    parser.add_argument("--auto-scaling", choices=["on", "off"], required=True)
    parser.add_argument("--guarantee", default="EXACTLY_ONCE")
    parser.add_argument("--interval", type=int, default=300)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--stream", default="events")
    parser.add_argument("--wait-executors", type=float, default=90.0)
    parser.add_argument("--store-options", default="{}", help="the store's fsspec options (JSON)")
    parser.add_argument("--initial-snapshot", default=None, help="start from this snapshot")
    args = parser.parse_args()
    # The test sends SIGUSR1 before it gives up on the driver: every thread's stack to stderr.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    import sparkjet
    from sparkjet.core.engine.spark.session import executor_ids

    def executor_count(sc: object) -> int:
        return len(executor_ids(sc) or ())
    from sparkjet.job import JobConfig, ProcessingGuarantee

    options = json.loads(args.store_options)
    store = {"url": args.store, "options": options} if options else {"url": args.store}
    client = sparkjet.connect(store=store, spark=spark_settings(args.master))
    sc = client.spark.sparkContext
    deadline = time.monotonic() + args.wait_executors
    while (executor_count(sc) or 0) < args.executors:
        if time.monotonic() > deadline:
            print(f"NO-EXECUTORS {executor_count(sc)}", flush=True)
            return 2
        time.sleep(0.2)
    print(f"EXECUTORS {executor_count(sc)}", flush=True)

    client.get_stream(args.stream, partitions=2)
    labels = client.get_list("labels")
    if labels.size() != len(LABELS):
        labels.clear()
        labels.add_all(LABELS)
    config = JobConfig(
        name=args.name,
        processing_guarantee=ProcessingGuarantee[args.guarantee],
        snapshot_interval_millis=args.interval,
        auto_scaling_enabled=args.auto_scaling == "on",
        # The tests are about executors lost mid-task: every batch runs on them,
        # none adaptively on the driver.
        adaptive_micro_batches=False,
    )
    config.initial_snapshot_name = args.initial_snapshot
    job = client.get_jet().submit(build_pipeline(args.stream), config)
    print(f"SUBMITTED {job.id}", flush=True)

    last = None
    while True:
        status = job.status
        now = (status.value, executor_count(sc), job.get_metrics().get("lastCommittedBatch"))
        if now != last:
            print(f"STATUS {now[0]} executors={now[1]} committed={now[2]}", flush=True)
            last = now
        if status.is_terminal():
            break
        time.sleep(0.2)
    failure = job.get_failure() or "-"
    print(f"ENDED {job.status.value} {failure}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
