"""An in-process engine for lifecycle tests: no Spark, no JVM, milliseconds per job.

It implements :class:`sparkjet.core.engine.boundary.Engine` and records what the
services asked of it. The work itself is not done (sources are not read, sinks
are not written): the lifecycle, the control protocol, take-over and the
cluster policy are what these tests are about, and the real Spark engine is
tested end to end elsewhere. The streaming loop, the checkpoint and the store
are the real ones.

Knobs a test turns:

- ``gate``: a cleared event holds every execution in :meth:`run` until it is
  set (or the job is cancelled), to catch a job while it runs;
- ``fail_with``: the next execution raises this exception;
- ``executors``: the ids :meth:`live_executors` reports (None: local mode).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from sparkjet.core.client import Client
from sparkjet.core.config import load_config
from sparkjet.core.engine.boundary import BatchResult, BatchWork, Engine, JobRun, RunHooks
from sparkjet.core.errors import JobFailedError
from sparkjet.core.model import StageCount
from sparkjet.pipeline import Pipeline, StreamSource


@dataclass
class Call:
    """One execution the services asked for, that succeeded."""

    kind: str  # "batch" | "micro_batch"
    job_id: str
    batch: int | None = None
    committed: int | None = None
    source_ranges: dict[str, tuple[Any, Any]] = field(default_factory=dict)


class FakeExecution:
    """One execution on the fake engine: waits at the gate, records the call, calls the hooks."""

    def __init__(
        self, engine: FakeEngine, call: Call, hooks: RunHooks, counts: dict[StageCount, int]
    ) -> None:
        self.engine, self.call, self.hooks = engine, call, hooks
        self.counts = counts

    def run(self) -> BatchResult:
        engine = self.engine
        while not engine.gate.wait(0.01):
            if self.hooks.cancelled():
                raise JobFailedError("cancelled while running on the fake engine")
        with engine.lock:
            failure, engine.fail_with = engine.fail_with, None
            if failure is None:
                engine.calls.append(self.call)  # only executions that succeeded
        if failure is not None:
            raise failure
        if self.hooks.before_commit is not None:
            self.hooks.before_commit()
        return BatchResult(items=dict(self.counts))  # the fake engine keeps no keyed state

    def stage_counts(self) -> dict[StageCount, int]:
        return dict(self.counts)

    def commit(self) -> None:
        """A micro-batch's sinks commit: the fake engine wrote nothing, so nothing lands."""
        self.engine.commits.append(self.call)

    def abort(self) -> None:
        """A micro-batch the loop will not commit (its driver was fenced off)."""
        self.engine.aborts.append(self.call)


class FakeEngine:
    """See the module docstring."""

    in_process = False

    def __init__(self, parallelism: int = 2) -> None:
        self._parallelism = parallelism
        self.lock = threading.Lock()
        self.calls: list[Call] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_with: BaseException | None = None
        self.executors: frozenset[str] | None = None
        self.bound: dict[str, str] = {}  # thread name -> job id
        self.cancelled_jobs: list[str] = []
        #: Micro-batches whose sinks the loop committed, and those it aborted.
        self.commits: list[Call] = []
        self.aborts: list[Call] = []

    def parallelism(self) -> int:
        return self._parallelism

    def version(self) -> str:
        return "fake"

    def live_executors(self) -> frozenset[str] | None:
        return self.executors

    def bind(self, job_id: str, description: str) -> None:
        self.bound[threading.current_thread().name] = job_id

    def cancel(self, job_id: str) -> bool:
        self.cancelled_jobs.append(job_id)
        return True

    def batch(self, job: JobRun, hooks: RunHooks) -> FakeExecution:
        plan = job.plan
        job_id = job.job_context(plan.nodes[0]).job_id
        counts = {StageCount(plan.name(n), "items"): 0 for n in plan.nodes} if job.metrics else {}
        return FakeExecution(self, Call("batch", job_id), hooks, counts)

    def micro_batch(self, job: JobRun, work: BatchWork, hooks: RunHooks) -> FakeExecution:
        job_id = job.job_context(job.plan.nodes[0]).job_id
        # What a source stage "emitted": the items in its planned range.
        counts = {
            StageCount(name, "items"): sum(e - s for s, e in zip(start, end, strict=True))
            for name, (start, end) in work.source_ranges.items()
        } if job.metrics else {}
        call = Call("micro_batch", job_id, work.batch, work.committed, dict(work.source_ranges))
        return FakeExecution(self, call, hooks, counts)

    def micro_batches(self, job_id: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.kind == "micro_batch" and c.job_id == job_id]


#: mypy checks here that the fake engine implements the engine boundary.
_CONFORMS: Engine = FakeEngine()


def stream_pipeline() -> Pipeline:
    """The lifecycle tests' streaming job: stream ``events`` into list ``out``."""
    p = Pipeline.create()
    p.read_from(StreamSource("events")).set_name("events").write_to(Pipeline.to_list("out"))
    return p


class FakeClients:
    """The clients a test module makes on fake engines; :meth:`close` ends what they left."""

    def __init__(self) -> None:
        self.made: list[Client] = []

    def make(self, store_url: str, engine: FakeEngine) -> Client:
        """A client on the store at ``store_url`` whose jobs run on ``engine``."""
        client = Client(load_config({"store": {"url": store_url}}), engine=engine)
        self.made.append(client)
        return client

    def close(self) -> None:
        """Cancel what a failing test left running, so its threads do not hold up the run."""
        while self.made:
            for job_runner in list(self.made.pop().get_jet().runners.all()):
                if not job_runner.done.is_set():
                    job_runner.cancel()
                    job_runner.done.wait(10)
                job_runner.done.set()
