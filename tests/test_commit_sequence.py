"""A micro-batch's commit sequence, broken between any two of its store requests.

:class:`sparkjet.core.microbatch.commit.BatchCommit` runs each micro-batch's
requests in one order: the write-ahead plan, the state folder's listing, the
state file, the fence, the sink's writer index, its record, its fold check,
its index again, the commit point, then the job's record. Here the driver's
loop fails just before each of them in turn (the request is not sent: the
store holds what the requests before it wrote, as after a crash between the
two), the job suspends, and is resumed: by the same process with what it
keeps in memory, or as a new driver would with nothing kept. The map must
then hold every count exactly once: what the oracle (a plain count) says.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkjet.aggregate import counting
from sparkjet.core.client import Client
from sparkjet.core.config import load_config
from sparkjet.core.engine.inprocess.engine import InProcessEngine
from sparkjet.core.state import cache as state_cache
from sparkjet.core.store import commit_log, stream_log
from sparkjet.core.store.fs import Store
from sparkjet.errors import StoreError
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from tests.test_store_requests import _stop, _wait

#: The steps, in order: the Store method each request goes through and a part
#: of its path (the local store answers a fence check with an existence check).
STEPS = [
    ("plan", "create_exclusive", "/checkpoint/offsets/"),
    ("state listing", "listdir", "/checkpoint/state/"),
    ("state file", "write_bytes", "/checkpoint/state/"),
    ("fence", "file_exists", "/owner-"),
    ("sink index read", "read_bytes", "/writers/"),
    ("sink record", "create_exclusive", "/log/"),
    ("sink fold check", "listdir", "/base"),
    ("sink index write", "write_bytes", "/writers/"),
    ("commit point", "create_exclusive", "/checkpoint/commits/"),
    ("job record", "write_bytes", "/job.json"),
]


class Breaker:
    """Fails the loop's first request through ``method`` to a path holding ``part``, once."""

    def __init__(self, method: str, part: str) -> None:
        self.method, self.part = method, part
        self.armed = False
        self.broke = threading.Event()

    def wrap(self, name: str, original: Any) -> Any:
        def call(store: Store, path: str, *args: Any, **kwargs: Any) -> Any:
            if (self.armed and name == self.method and self.part in path
                    and threading.current_thread().name.startswith("sparkjet-job-")):
                self.armed = False
                self.broke.set()
                raise StoreError(f"injected: the driver stops before {name} {path!r}")
            return original(store, path, *args, **kwargs)
        return call


def _forget_all() -> None:
    """What a new driver process would not have: this process's store and state caches."""
    commit_log._OWN.clear()
    stream_log._CHUNKS.clear()
    stream_log._LISTED.clear()
    state_cache.CACHE.clear()


@pytest.mark.parametrize("kept", [True, False], ids=["same-driver", "new-driver"])
@pytest.mark.parametrize(("step", "method", "part"), STEPS, ids=[s[0] for s in STEPS])
def test_a_batch_broken_before_any_request_of_its_commit_lands_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, method: str, part: str,
    kept: bool,
) -> None:
    breaker = Breaker(method, part)
    for name in {m for _, m, _ in STEPS}:
        monkeypatch.setattr(Store, name, breaker.wrap(name, getattr(Store, name)))
    client = Client(load_config({"store": {"url": str(tmp_path / "store")}}),
                    engine=InProcessEngine(2))
    stream = client.get_stream("clicks", partitions=2)
    pipeline = Pipeline.create()
    (pipeline.read_from(StreamSource("clicks", partitions=2))
     .group_by(lambda click: click["user"]).aggregate(counting()).set_name("per-user")
     .write_to(Pipeline.to_map("per-user")))
    job = client.get_jet().submit(pipeline, JobConfig(
        name="broken", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=10, suspend_on_failure=True))
    published = [{"user": f"user-{n}"} for n in range(20)]
    try:
        stream.publish_all(published)
        counts = client.get_map("per-user")
        _wait(lambda: counts.get("user-19") == 1, 60, "the first micro-batch")
        breaker.armed = True
        stream.publish({"user": "user-1"})
        published.append({"user": "user-1"})
        _wait(breaker.broke.is_set, 60, f"the loop to reach the {step}")
        _wait(lambda: job.status is JobStatus.SUSPENDED, 60, "the job to suspend")
        assert "injected" in job.get_suspension_cause()
        if not kept:
            _forget_all()
        job.resume()
        stream.publish({"user": "user-2"})
        published.append({"user": "user-2"})
        oracle = Counter(item["user"] for item in published)
        _wait(lambda: counts.get("user-2") == 2, 60, "the resumed job to catch up")
        assert dict(counts.entry_set()) == dict(oracle)
        assert job.status is JobStatus.RUNNING
    finally:
        _stop(job)
