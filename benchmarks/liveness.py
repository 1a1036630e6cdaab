"""What judging a driver's liveness by the store's clock costs an observer.

Another process asks a job's status (``job.status``, ``sparkjet list-jobs``):
it reads the job's record and judges whether its driver lives. The rule that
trusted the machines' clocks compared the heartbeat time in the record with
the observer's ``time.time()``; the rule now compares the store's modification
time of the record with the store's own clock (one stat more per check, and
a probe file written, stat-ed and removed once a minute per process). Both
are measured in the same process on a local folder and, with ``--s3``, on
moto's S3 server on 127.0.0.1; the probe is measured on its own, since a
check that needs one pays it.

Printed: the median time of a status check with each rule, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sparkjet.core.jobs.record import STALE_AFTER_SECONDS, JobRecord, driver_alive, read_record
from sparkjet.core.model import JobStatus
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", type=int, default=300, help="status checks per rule")
    parser.add_argument("--s3", action="store_true", help="also on moto's S3 server")
    return parser.parse_args()


def clock_rule(records: JobRecords, job_id: str) -> bool:
    """A status check now: read the record, judge it by the store's clock."""
    record = read_record(records, job_id)
    assert record is not None
    return driver_alive(records, record)


def heartbeat_rule(records: JobRecords, job_id: str) -> bool:
    """A status check as it was: read the record, compare its heartbeat with this clock."""
    record = read_record(records, job_id)
    assert record is not None
    return time.time() - record.heartbeat <= STALE_AFTER_SECONDS


def median_ms(check: Callable[[], bool], n: int) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        if not check():
            raise SystemExit("a live driver was judged dead")
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def measure(label: str, store: Store, args: argparse.Namespace) -> None:
    records = JobRecords(store)
    job_id = "ab12-cd34-ef56-7890"
    # A driver elsewhere (another host: no pid to look up) that has just written.
    records.write(JobRecord(id=job_id, status=JobStatus.RUNNING, heartbeat=time.time(),
                            driver=None).to_json())
    store.now()  # the first check of a process probes; measured apart below
    heartbeat = median_ms(lambda: heartbeat_rule(records, job_id), args.checks)
    clock = median_ms(lambda: clock_rule(records, job_id), args.checks)
    probes = []
    for _ in range(max(5, args.checks // 20)):
        store._clock = None  # force the once-a-minute probe
        started = time.perf_counter()
        store.now()
        probes.append(time.perf_counter() - started)
    probe = statistics.median(probes) * 1000
    print(f"\n{label}: {args.checks} status checks of a job driven elsewhere")
    print(f"  heartbeat vs this machine's clock (before): {heartbeat:8.3f} ms a check")
    print(f"  record's age by the store's clock (now):    {clock:8.3f} ms a check")
    print(f"  the store-clock probe, once a minute:       {probe:8.3f} ms")
    print(f"  store's clock vs heartbeat rule: {clock / heartbeat:.2f}x a check")


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        measure("local folder", Store(f"{workdir}/store"), args)
        if args.s3:
            from sparkjet.testing import moto_s3_server

            with moto_s3_server(Path(workdir)) as location:
                measure("S3 (moto on 127.0.0.1)", location.fresh().store(), args)


if __name__ == "__main__":
    main()
