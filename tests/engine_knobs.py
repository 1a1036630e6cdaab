"""The real in-process engine for the lifecycle tests, and the knobs they turn.

The jobs of ``test_lifecycle`` and ``test_durable`` run on
:class:`~sparkjet.core.engine.inprocess.engine.InProcessEngine`: their real tasks in
this process, no JVM. Sources are read, sinks written and committed, so
a test of a lifecycle outcome (resumed, restarted, taken over, fenced off)
can check what landed in the sink as well.

What a test needs beyond a plain run, it gets in one of two ways:

- through the pipeline, where the situation is the job's own: :class:`Gate`,
  a stage holding its items until the test opens it (a job caught while it
  runs); :class:`Raises` and :class:`RaisesOnce`, a stage whose function
  fails (a job, or one micro-batch, that fails);
- through :class:`ControlledEngine`, where it is the driver's or the
  cluster's: a thin wrapper whose every execution is the real engine's; it
  reports the executors a test sets (the cluster policy), pauses a
  micro-batch between its work and its commit (a driver paused, then fenced
  off), and notes what it was asked.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sparkjet.core.client import Client
from sparkjet.core.config import load_config
from sparkjet.core.engine.boundary import (
    BatchResult,
    BatchWork,
    Engine,
    Execution,
    JobRun,
    MicroBatch,
    RunHooks,
)
from sparkjet.core.engine.inprocess.engine import InProcessEngine
from sparkjet.core.errors import JobFailedError
from sparkjet.core.model import StageCount
from sparkjet.pipeline import Pipeline, StreamSource
from tests.conftest import TEST_PARALLELISM

#: How long a gate or a paused micro-batch waits for the test to let it go. Far
#: longer than any of the tests' own waits (10 s each), so it only ends a job a
#: failed test left holding.
HOLD_SECONDS = 60.0


# --- knobs in the pipeline ----------------------------------------------------------------

#: Per gate, whether it is open, and whether an item reached it.
_GATES: dict[str, tuple[threading.Event, threading.Event]] = {}


class Gate:
    """A map stage's function holding every item until the test opens the gate (:meth:`open`).

    The job is caught inside its work: RUNNING, its stage mid-call. As any
    user function, it holds a cancel until it returns (the engine asks for
    the cancel before each next item and before the commit). It pickles as
    its gate's name, and the gate lives in this module: the job must run in
    this process, as in-process jobs do.
    """

    def __init__(self) -> None:
        self.name = uuid.uuid4().hex
        _GATES[self.name] = (threading.Event(), threading.Event())

    def __call__(self, item: Any) -> Any:
        opened, reached = _GATES[self.name]
        reached.set()
        if not opened.wait(HOLD_SECONDS):
            raise TimeoutError(f"gate {self.name} was not opened within {HOLD_SECONDS} s")
        return item

    def reached(self) -> bool:
        """Whether an item is at the gate (or went through it)."""
        return _GATES[self.name][1].is_set()

    def open(self) -> None:
        """Let every item through, now and from now on."""
        _GATES[self.name][0].set()


def open_all_gates() -> None:
    """Open every gate and forget them (a test's teardown: no job stays held)."""
    while _GATES:
        _, (opened, _reached) = _GATES.popitem()
        opened.set()


@dataclass(frozen=True)
class Raises:
    """A map stage's function raising ``kind(message)`` for every item."""

    kind: type[Exception]
    message: str

    def __call__(self, item: Any) -> Any:
        raise self.kind(self.message)


@dataclass(frozen=True)
class RaisesOnce:
    """A map stage's function raising ``OSError(message)`` once, while ``armed`` exists.

    The first item to find the file removes it and raises; the items after it
    (the replay of the batch that failed) go through.
    """

    armed: str
    message: str

    def __call__(self, item: Any) -> Any:
        try:
            os.remove(self.armed)
        except FileNotFoundError:
            return item
        raise OSError(self.message)


def stream_pipeline(*stages: tuple[str, Any]) -> Pipeline:
    """The lifecycle tests' streaming job: stream ``events`` into list ``out``.

    ``stages``: ``(name, function)`` map stages between the two.
    """
    p = Pipeline.create()
    flow = p.read_from(StreamSource("events")).set_name("events")
    for name, function in stages:
        flow = flow.map(function).set_name(name)
    flow.write_to(Pipeline.to_list("out"))
    return p


def sink_items(client: Client) -> list[Any]:
    """What the jobs committed to list ``out``, sorted (every copy of an item kept)."""
    return sorted(client.get_list("out").get_all())


# --- knobs on the engine ------------------------------------------------------------------


class ControlledEngine:
    """The real in-process engine, plus what the tests set and read on it.

    Every execution is the :class:`~sparkjet.core.engine.inprocess.engine.InProcessEngine`'s
    (``real``); around it:

    - ``executors``: the ids :meth:`live_executors` reports (None: local mode,
      as the in-process engine's own);
    - ``hold``: cleared, each micro-batch, its work done, waits before the
      loop's commit sequence (the fence check, the sinks' commit) until it is
      set or the job is cancelled: a driver paused between its work and its
      commit. ``holding`` is set once one waits there;
    - ``bound`` and ``cancelled_jobs``: the jobs :meth:`bind` and :meth:`cancel`
      were called for; :meth:`micro_batches`: the work of a job's micro-batches
      that ran to the end here.
    """

    def __init__(self, parallelism: int = TEST_PARALLELISM) -> None:
        self.real = InProcessEngine(parallelism)
        self.executors: frozenset[str] | None = None
        self.hold = threading.Event()
        self.hold.set()
        self.holding = threading.Event()
        self.bound: dict[str, str] = {}  # thread name -> job id
        self.cancelled_jobs: list[str] = []
        self._lock = threading.Lock()
        self._ran: list[tuple[str, BatchWork]] = []

    def parallelism(self) -> int:
        return self.real.parallelism()

    def version(self) -> str:
        return self.real.version()

    def live_executors(self) -> frozenset[str] | None:
        return self.executors

    def bind(self, job_id: str, description: str) -> None:
        self.bound[threading.current_thread().name] = job_id
        self.real.bind(job_id, description)

    def cancel(self, job_id: str) -> bool:
        with self._lock:
            self.cancelled_jobs.append(job_id)
        return self.real.cancel(job_id)

    def batch(self, job: JobRun, hooks: RunHooks) -> Execution:
        return self.real.batch(job, hooks)

    def micro_batch(self, job: JobRun, work: BatchWork, hooks: RunHooks) -> MicroBatch:
        job_id = job.job_context(job.plan.nodes[0]).job_id
        return HeldMicroBatch(self, job_id, work, self.real.micro_batch(job, work, hooks), hooks)

    def micro_batches(self, job_id: str) -> list[BatchWork]:
        """The work of ``job_id``'s micro-batches whose run ended well here, in order."""
        with self._lock:
            return [work for ran, work in self._ran if ran == job_id]

    def ran(self, job_id: str, work: BatchWork) -> None:
        """Note that ``job_id``'s micro-batch ``work`` ran to the end here."""
        with self._lock:
            self._ran.append((job_id, work))


class HeldMicroBatch:
    """A real micro-batch that waits at its engine's ``hold`` once its work is done."""

    def __init__(
        self, engine: ControlledEngine, job_id: str, work: BatchWork, run: MicroBatch,
        hooks: RunHooks,
    ) -> None:
        self.engine, self.job_id, self.work, self.real, self.hooks = (
            engine, job_id, work, run, hooks)
        self.on_driver = run.on_driver

    def run(self) -> BatchResult:
        result = self.real.run()
        engine = self.engine
        engine.ran(self.job_id, self.work)
        if not engine.hold.is_set():
            engine.holding.set()
            deadline = time.monotonic() + HOLD_SECONDS
            while not engine.hold.wait(0.01):
                if self.hooks.cancelled() or time.monotonic() > deadline:
                    self.real.abort()
                    raise JobFailedError(f"micro-batch {self.work.batch} was cancelled, or not "
                                         f"let go within {HOLD_SECONDS} s, while held")
        return result

    def stage_counts(self) -> dict[StageCount, int]:
        return self.real.stage_counts()

    def commit(self) -> None:
        self.real.commit()

    def abort(self) -> None:
        self.real.abort()


#: The engine boundary, as mypy sees it: the controlled engine fits where the client takes one.
_CONFORMS: Engine = ControlledEngine()


# --- clients ------------------------------------------------------------------------------


class Clients:
    """The clients a test module makes; :meth:`close` ends what a test left running."""

    def __init__(self) -> None:
        self.made: list[Client] = []

    def make(
        self, store_url: str, engine: Engine | None = None, **sections: Any
    ) -> Client:
        """A client on the store at ``store_url`` whose jobs run in this process.

        On ``engine`` if given, else on the in-process engine the
        ``[engine] driver_only`` setting picks; ``sections``: more of the
        configuration (``plugins={...}``).
        """
        config: dict[str, Any] = {"store": {"url": store_url}, **sections}
        if engine is None:
            config["engine"] = {"driver_only": True}
        client = Client(load_config(config), engine=engine)
        self.made.append(client)
        return client

    def close(self) -> None:
        """Open the gates and cancel what a failing test left running, so no thread lingers."""
        open_all_gates()
        while self.made:
            for job_runner in list(self.made.pop().get_jet().runners.all()):
                if not job_runner.done.is_set():
                    job_runner.cancel()
                    job_runner.done.wait(10)
                job_runner.done.set()
