"""A streaming-job driver the fault tests start as a subprocess and SIGKILL.

    python stream_driver.py STORE JOB_NAME GUARANTEE [--interval MS] [--pause-at BATCH]
        [--store-options JSON] [--marker PATH] [--engine spark|in-process|connect]
        [--stale-after SECONDS]

The first run submits the job (``events`` stream -> counts per key into map
``counts``, every raw item into list ``seen`` but every 97th, which the stage
``checked`` rejects into the dead-letter stream ``<name>.dead-letters``, and a
count per tumbling window
of event time, the item's ``seq``, into list ``windows``, and each item's
``(seq, label)`` from a hash join against the bounded list ``labels`` into
list ``joined``, a left-outer interval join of even items with the next
odd ones, some left out, into list ``pairs``, and each item's ``(seq, seq *
3)`` from an asynchronous call to a service, 8 in flight, into list
``enriched``); a later run finds the job by
name and resumes it (its previous driver died, so the job reads SUSPENDED and
``resume()`` takes it over). Then it joins until killed.

Progress goes to stdout, one line each, flushed: ``SUBMITTED <id>`` or
``RESUMED <id>`` (or ``REFUSED <why>`` and exit status 3 when ``resume()``
raises JobStateError), ``PAUSED <batch>``, and ``FENCED <epoch>`` (exit status
4) when another process took the job over while this one lived.
``--store-options`` gives the store's fsspec options (an S3 or GCS server's
endpoint and credentials) as JSON. ``--engine in-process`` runs the job's
micro-batches on the in-process engine (``[engine] driver_only``: the same
tasks, state and commits, no JVM) instead of Spark; ``--engine connect`` runs
every one on the Spark Connect server of ``SPARKJET_TEST_REMOTE``, which
outlives the driver. ``--stale-after`` sets how
long a driver's record may go unwritten before others take it for dead
(:data:`sparkjet.core.jobs.record.STALE_AFTER_SECONDS`, 20 s); every process of
a test must use the same. SIGUSR1 dumps every thread's stack to stderr.

``--pause-at BATCH`` injects the worst moment for a crash: the driver stops
for good after micro-batch BATCH's sinks have committed and before its
checkpoint commit is written (the first time only: a marker file, ``--marker``
or next to a local store, remembers it), so the test can SIGKILL it right there and the next
driver must replay a batch that already landed in the sinks.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time

#: Spark settings of the driver (small, like the test session).
SPARK = {
    "master": "local[2]",
    "app_name": "sparkjet-fault-driver",
    "conf": {
        "spark.ui.enabled": "false",
        "spark.default.parallelism": "2",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "512m",
        # The JIT's first tier only: a driver JVM lives seconds before its SIGKILL,
        # and starts in about half the time.
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    },
}


#: The tumbling window of the windowed stage, and its source's allowed lag.
WINDOW = 1000
WINDOW_LAG = 100
#: Items whose seq is a multiple of this fail the "checked" stage: dead letters.
REJECT_EVERY = 97
#: The keys the bounded list ``labels`` gives a label (``k0`` .. ``k49``); the
#: hash join ``labelled`` gives the others None (a left outer join).
LABELLED = 50


def labels() -> list[tuple[str, str]]:
    """The build side of the hash join ``labelled``: list ``labels``."""
    return [(f"k{i}", f"label-{i}") for i in range(LABELLED)]


class Tripler:
    """The async enrichment's service: answers ``seq * 3`` after a millisecond."""

    async def triple(self, event):  # type: ignore[no-untyped-def]
        import asyncio

        await asyncio.sleep(0.001)
        return (event["seq"], event["seq"] * 3)


def check(event):  # type: ignore[no-untyped-def]
    """The "checked" stage: rejects every REJECT_EVERY-th item."""
    if event["seq"] % REJECT_EVERY == 0:
        raise ValueError(f"seq {event['seq']} rejected")
    return event


def build_pipeline():  # type: ignore[no-untyped-def]
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import (
        JoinClause,
        Pipeline,
        ServiceFactory,
        StreamSource,
        WindowDefinition,
    )

    p = Pipeline.create()
    # Event time is the sequence number: each window of 1000 holds 1000 items.
    events = (p.read_from(StreamSource("events")).set_name("events")
              .with_timestamps(lambda e: e["seq"], allowed_lag_ms=WINDOW_LAG))
    (
        events.group_by(lambda e: e["key"]).aggregate(counting())
        .set_name("count-per-key").write_to(Pipeline.to_map("counts"))
    )
    # Every REJECT_EVERY-th item fails "checked": a dead letter, in the job's dead-letter stream.
    (
        events.map(check).set_name("checked").on_error("dead-letter")
        .map(lambda e: e).set_name("raw").write_to(Pipeline.to_list("seen"))
    )
    (
        events.window(WindowDefinition.tumbling(WINDOW)).aggregate(counting())
        .set_name("count-per-window").write_to(Pipeline.to_list("windows"))
    )
    # A left-outer interval join of the even items with the odd ones a step later,
    # keyed by seq // 2; odd items whose seq ends in 1 are left out, so their even
    # partners become outer rows once the watermark passes them.
    evens = events.filter(lambda e: e["seq"] % 2 == 0).set_name("evens")
    odds = events.filter(lambda e: e["seq"] % 2 == 1 and e["seq"] % 10 != 1).set_name("odds")
    (
        evens.group_by(lambda e: e["seq"] // 2)
        .interval_join(odds.group_by(lambda e: e["seq"] // 2), 0, 1,
                       lambda even, odd: (even["seq"], None if odd is None else odd["seq"]),
                       how="left")
        .set_name("paired").write_to(Pipeline.to_list("pairs"))
    )
    # Each item labelled from a bounded table, read when the job starts or resumes.
    table = p.read_from(Pipeline.from_list("labels")).set_name("labels")
    (
        events.hash_join(table, JoinClause.on_keys(lambda e: e["key"], lambda kv: kv[0])
                         .projecting(lambda kv: kv[1]), lambda e, label: (e["seq"], label))
        .set_name("labelled").write_to(Pipeline.to_list("joined"))
    )
    # Each item enriched by an asynchronous service call, up to 8 in flight per task.
    (
        events.map_using_service_async(ServiceFactory.of(Tripler),
                                       lambda service, e: service.triple(e),
                                       max_concurrent_ops=8)
        .set_name("tripled").write_to(Pipeline.to_list("enriched"))
    )
    return p


def _install_pause(batch: int, marker: str) -> None:
    """Block the loop between the sinks' commits and the checkpoint commit of ``batch``."""
    from sparkjet.core.state import checkpoint

    original = checkpoint.Checkpoint.write_commit

    def write_commit(self, record, *args, **kwargs):  # type: ignore[no-untyped-def]
        b = record.batch
        if b >= batch and not os.path.exists(marker):
            with open(marker, "w") as fh:
                fh.write(str(b))
            print(f"PAUSED {b}", flush=True)
            while True:  # wait for SIGKILL
                time.sleep(1)
        return original(self, record, *args, **kwargs)

    checkpoint.Checkpoint.write_commit = write_commit


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("name")
    parser.add_argument("guarantee", choices=["EXACTLY_ONCE", "AT_LEAST_ONCE"])
    parser.add_argument("--interval", type=int, default=200)
    parser.add_argument("--pause-at", type=int, default=None)
    parser.add_argument("--store-options", default="{}")
    parser.add_argument("--marker", default=None)
    parser.add_argument("--engine", choices=["spark", "in-process", "connect"], default="spark")
    parser.add_argument("--stale-after", type=float, default=None)
    args = parser.parse_args()
    # The test sends SIGUSR1 before it gives up on a driver: every thread's stack to stderr.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    import sparkjet
    from sparkjet.errors import JobFencedError, JobStateError
    from sparkjet.job import JobConfig, ProcessingGuarantee

    if args.stale_after is not None:
        from sparkjet.core.jobs import record

        record.STALE_AFTER_SECONDS = args.stale_after
    if args.pause_at is not None:
        _install_pause(args.pause_at, args.marker or f"{args.store}.paused-{args.pause_at}")
    options = json.loads(args.store_options)
    store = {"url": args.store, "options": options} if options else {"url": args.store}
    engine: dict[str, bool] = {"driver_only": args.engine == "in-process"}
    spark: dict[str, object] = SPARK
    if args.engine == "connect":
        # The Connect server of the test run (it outlives this driver); every
        # micro-batch runs there, none in this process.
        spark = {"remote": os.environ["SPARKJET_TEST_REMOTE"]}
        engine = {"adaptive": False}
    client = sparkjet.connect(store=store, spark=spark, engine=engine)
    jet = client.get_jet()
    job = jet.get_job_by_name(args.name)
    if job is None or job.is_terminal():
        if not client.get_list("labels").size():
            client.get_list("labels").add_all(labels())
        job = jet.submit(build_pipeline(), JobConfig(
            name=args.name,
            processing_guarantee=ProcessingGuarantee[args.guarantee],
            snapshot_interval_millis=args.interval,
        ))
        print(f"SUBMITTED {job.id}", flush=True)
    else:
        try:
            job.resume()
        except JobStateError as exc:  # e.g. another process resumed it first
            print(f"REFUSED {exc}", flush=True)
            return 3
        print(f"RESUMED {job.id}", flush=True)
    try:
        job.join()
    except JobFencedError as exc:
        print(f"FENCED {exc.epoch}", flush=True)
        print(exc, file=sys.stderr, flush=True)
        return 4
    print("ENDED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
