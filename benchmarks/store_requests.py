"""Store requests of an idle streaming job and of one one-event micro-batch, by kind.

A keyed count reading a stream of 2 partitions into a map, EXACTLY_ONCE, on
the in-process engine, against a local folder, moto's S3 server and
fake-gcs-server on 127.0.0.1 (each reached through a counting proxy, so the
server's own count is shown beside the job's counters).

    python benchmarks/store_requests.py [--idle SECONDS] [--log]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sparkjet import testing
from sparkjet.aggregate import counting
from sparkjet.core.client import Client
from sparkjet.core.config import load_config
from sparkjet.core.engine.inprocess.engine import InProcessEngine
from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource

# The counting proxy lives with the tests, in the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
_proxy = importlib.import_module("tests.request_proxy")
CountingProxy = _proxy.CountingProxy
through_proxy = _proxy.counting


def _job_counts(job: Any) -> Counter[str]:
    metrics = job.get_metrics()
    return Counter(metrics.get("storeRequests", {}).get("byKind", {}))


def measure(location: testing.StoreLocation, proxy: CountingProxy | None, idle: float,
            show_log: bool) -> dict[str, Any]:
    """The idle requests per second, and the requests of one one-event micro-batch."""
    config = load_config({"store": location.connect_overrides()})
    client = Client(config, engine=InProcessEngine(2))
    client.get_stream("clicks", partitions=2)
    pipeline = Pipeline.create()
    (pipeline.read_from(StreamSource("clicks", partitions=2))
     .group_by(lambda c: c["user"]).aggregate(counting())
     .write_to(Pipeline.to_map("counts")))
    job = client.get_jet().submit(pipeline, JobConfig(
        name="requests", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=100))
    counts = client.get_map("counts")
    stream = client.get_stream("clicks")

    def committed() -> int:
        return int(job.get_metrics().get("lastCommittedBatch", -1))

    try:
        # Warm up: one batch, then let it settle into idling.
        stream.publish({"user": "warm"})
        deadline = time.monotonic() + 60
        while committed() < 0:
            assert time.monotonic() < deadline, "no first batch"
            time.sleep(0.05)
        time.sleep(3.0)
        server0 = proxy.snapshot() if proxy else Counter()
        job0 = _job_counts(job)
        idle_from = len(proxy.log) if proxy else 0
        began = time.monotonic()
        time.sleep(idle)
        span = time.monotonic() - began
        server_idle = (proxy.snapshot() - server0) if proxy else Counter()
        if show_log and proxy:
            for (kind, method, url), n in Counter(
                    (k, m, _shape(u)) for k, m, u in proxy.log[idle_from:]).most_common():
                print(f"    idle: {n} x {kind} {method} {url}")
        job_idle = _job_counts(job) - job0
        # One event: from the publish to the commit, nothing else runs in the job.
        before = committed()
        server1 = proxy.snapshot() if proxy else Counter()
        log_from = len(proxy.log) if proxy else 0
        job1 = _job_counts(job)
        stream.publish({"user": "one"})
        publish_server = (proxy.snapshot() - server1) if proxy else Counter()
        deadline = time.monotonic() + 60
        while committed() <= before:
            assert time.monotonic() < deadline, "the event was not committed"
            time.sleep(0.01)
        job_batch = _job_counts(job) - job1
        server_batch = (proxy.snapshot() - server1 - publish_server) if proxy else Counter()
        if show_log and proxy:
            for entry in proxy.log[log_from:]:
                print("   ", *entry)
        assert counts.get("one") == 1
        # The loop's own tally of the batch: its look, plan, state, fence, sink, commit point.
        tally = int(job.get_metrics()["lastBatchStoreRequests"])
        return {"idle_seconds": span, "job_idle": job_idle, "server_idle": server_idle,
                "job_batch": job_batch, "server_batch": server_batch, "tally": tally}
    finally:
        job.cancel()
        with contextlib.suppress(Exception):
            job.join(timeout=60)


@contextlib.contextmanager
def _locations(workdir: Path) -> Iterator[list[tuple[str, testing.StoreLocation,
                                                     CountingProxy | None]]]:
    with contextlib.ExitStack() as stack:
        out: list[tuple[str, testing.StoreLocation, CountingProxy | None]] = [
            ("local", testing.StoreLocation(str(workdir / "local")), None)]
        s3 = stack.enter_context(testing.moto_s3_server(workdir))
        s3_proxied, s3_proxy = stack.enter_context(through_proxy(s3))
        out.append(("s3", s3_proxied.fresh(), s3_proxy))
        gcs = stack.enter_context(testing.fake_gcs_server(workdir))
        gcs_proxied, gcs_proxy = stack.enter_context(through_proxy(gcs))
        out.append(("gcs", gcs_proxied.fresh(), gcs_proxy))
        yield out


def _shape(url: str) -> str:
    """A URL with its numbers and ids blanked, so the idle loop's requests group."""
    return re.sub(r"[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}|[0-9a-f]{12}|\d{6,}", "#", url)


def _shown(counts: Counter[str], per: float = 1.0) -> str:
    total = sum(counts.values())
    kinds = " ".join(f"{k}={v / per:.2f}" if per != 1.0 else f"{k}={v}"
                     for k, v in sorted(counts.items()))
    return f"{total / per:.2f} ({kinds})" if per != 1.0 else f"{total} ({kinds})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idling measured")
    parser.add_argument("--log", action="store_true", help="print the batch's server requests")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, _locations(Path(tmp)) as locations:
        for name, location, proxy in locations:
            result = measure(location, proxy, args.idle, args.log)
            span = result["idle_seconds"]
            print(f"{name}: idle per second: job {_shown(result['job_idle'], span)}"
                  + (f", server {_shown(result['server_idle'], span)}" if proxy else ""))
            print(f"{name}: one-event micro-batch: {result['tally']} (the loop's tally, "
                  f"budget 12); from the publish to the commit: job "
                  f"{_shown(result['job_batch'])}"
                  + (f", server {_shown(result['server_batch'])}" if proxy else ""))


if __name__ == "__main__":
    main()
