"""A streaming-job driver reading a folder with the file source, which the fault tests SIGKILL.

    python files_driver.py STORE JOB_NAME URL [--settle SECONDS] [--max-bytes N]
        [--storage-options JSON]

The job reads the JSON-lines files at ``URL`` (a local folder or an ``s3://``
prefix; ``--storage-options`` gives fsspec its endpoint and credentials as
JSON) with :class:`~sparkjet.contrib.files.FileSource` named ``inbox`` (stage
``from-files(inbox)``), at most ``--max-bytes`` bytes per micro-batch (so a
file stays open over several micro-batches), and appends every item to the
list ``results`` under EXACTLY_ONCE. The store is local. The first run submits
it; a later run finds it by name and resumes it (its previous driver died, so
the job reads SUSPENDED). It prints ``SUBMITTED <id>`` or ``RESUMED <id>``,
then joins until killed.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys

from tests.faults.stream_driver import SPARK

#: The source's name: its stage is ``from-files(inbox)``.
SOURCE_NAME = "inbox"


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("store", "name", "url"):
        parser.add_argument(name)
    parser.add_argument("--settle", type=float, default=0.0)
    parser.add_argument("--max-bytes", type=int, default=512)
    parser.add_argument("--storage-options", default="{}")
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's stack dump
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    import sparkjet
    from sparkjet.contrib import files
    from sparkjet.contrib.files import FileSource
    from sparkjet.job import JobConfig, ProcessingGuarantee
    from sparkjet.pipeline import Pipeline

    client = sparkjet.connect(store={"url": args.store}, spark=SPARK)
    if "files" not in {info.name for info in client.list_plugins()}:
        client.register_plugin(files, "files")
    jet = client.get_jet()
    job = jet.get_job_by_name(args.name)
    if job is None or job.is_terminal():
        p = Pipeline.create()
        source = FileSource(args.url, settle_seconds=args.settle, poll_seconds=0.05,
                            max_bytes_per_batch=args.max_bytes, name=SOURCE_NAME,
                            storage_options=json.loads(args.storage_options))
        p.read_from(source).write_to(Pipeline.to_list("results"))
        job = jet.submit(p, JobConfig(name=args.name, snapshot_interval_millis=100,
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
