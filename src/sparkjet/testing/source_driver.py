"""The driver process of the source conformance kit's kill test (:mod:`sparkjet.testing.sources`).

    python -m sparkjet.testing.source_driver SPEC

``SPEC`` is a file the kit wrote with cloudpickle: ``{"harness", "store",
"spark", "job_name", "pipeline"}``. The first process submits the pipeline as
an EXACTLY_ONCE job named ``job_name``; a later one finds the job by name and
resumes it (its previous driver was SIGKILLed, so the job reads SUSPENDED and
``resume()`` takes it over). Then it runs the job until it is killed.

Progress goes to stdout, one flushed line each: ``SUBMITTED <id>`` or
``RESUMED <id>``, or ``REFUSED <why>`` (exit status 3) when the job cannot be
resumed; ``REPLAYING <batch>`` each time the job's micro-batch loop finds a
batch planned and not committed (a killed driver's) and replays it with its
recorded offsets (what the loop logs on the ``sparkjet.streaming`` logger);
``PAUSED <batch>`` when the kit's pausing sink holds a batch before its commit
(the spec's pipeline writes through it; see ``_PausingSink``).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

import cloudpickle

#: What the micro-batch loop logs when it replays a planned, uncommitted batch.
_REPLAYING = re.compile(r"replaying micro-batch (\d+)")


class _ReplayReporter(logging.Handler):
    """Prints ``REPLAYING <batch>`` for each replay the loop logs."""

    def emit(self, record: logging.LogRecord) -> None:
        found = _REPLAYING.match(record.getMessage())
        if found:
            print(f"REPLAYING {found.group(1)}", flush=True)


def _report_replays() -> None:
    streaming = logging.getLogger("sparkjet.streaming")
    streaming.addHandler(_ReplayReporter(logging.INFO))
    if streaming.getEffectiveLevel() > logging.INFO:
        streaming.setLevel(logging.INFO)


def main(argv: list[str]) -> int:
    """Submit or resume the job the spec names, then drive it until killed."""
    if len(argv) != 1:
        print("usage: python -m sparkjet.testing.source_driver SPEC", file=sys.stderr)
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spec = cloudpickle.loads(Path(argv[0]).read_bytes())
    _report_replays()

    import sparkjet
    from sparkjet.errors import JobStateError
    from sparkjet.job import JobConfig, ProcessingGuarantee

    client = sparkjet.connect(store=spec["store"], spark=spec["spark"],
                              engine=spec.get("engine", {}))
    spec["harness"].prepare(client)
    jet = client.get_jet()
    job = jet.get_job_by_name(spec["job_name"])
    if job is None or job.is_terminal():
        job = jet.submit(spec["pipeline"], JobConfig(
            name=spec["job_name"], processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_millis=100))
        print(f"SUBMITTED {job.id}", flush=True)
    else:
        try:
            job.resume()
        except JobStateError as exc:
            print(f"REFUSED {exc}", flush=True)
            return 3
        print(f"RESUMED {job.id}", flush=True)
    job.join()
    print("ENDED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
