"""Services on the tasks' side: found or made once per process, called asynchronously, swept.

A service stage's task finds its service through a :class:`ServiceRef` (the
job, the stage and the factory; what travels in the task's closure, never
the service), which makes it on first use in this process and keeps it in
:data:`sparkjet.core.pipeline.services.SERVICES`. Who lets it go:

- on the driver (the in-process engine: a batch job's or a micro-batch's
  work run there), the job's runner, when the job's run ends
  (:func:`~sparkjet.core.pipeline.services.release_services`);
- on a Spark worker (classic or Connect), which never learns that a job
  ended, a daemon thread of the worker process (the *sweeper*) reads the
  record of each job whose services live there every
  :data:`~sparkjet.core.state.cache.SWEEP_SECONDS`
  (:data:`~sparkjet.core.state.cache.REMOTE_SWEEP_SECONDS` on S3 and GCS) and
  destroys the services of a job that no longer runs (completed, failed,
  cancelled, suspended, or its record gone), as the state cache drops its
  ranges. A worker Spark kills takes its services with it, undestroyed.

``map_using_service_async`` runs its calls on one event loop per process
(:func:`service_loop`, a daemon thread): ``fn(service, item)`` is called
there and returns an awaitable (a coroutine) or a
:class:`concurrent.futures.Future`; :class:`AsyncServiceTask` keeps at most
``max_concurrent_ops`` of a task's calls in flight, emits in input order or
as calls finish, and finishes every call before the task returns, so
nothing is in flight when a batch commits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from sparkjet.core.engine.tasks.base import Task
from sparkjet.core.engine.tasks.read import ReadTask
from sparkjet.core.engine.tasks.reports import Reports
from sparkjet.core.host.contracts import FileStore
from sparkjet.core.pipeline.fusion import FusedPass, StageFailure, dead_letter
from sparkjet.core.pipeline.services import SERVICES, ServiceFactory, ServiceKey
from sparkjet.core.state.cache import REMOTE_SWEEP_SECONDS, SWEEP_SECONDS, CacheOwner
from sparkjet.core.store import requests as store_requests
from sparkjet.core.store.fs import Store

__all__ = ["AsyncCalls", "AsyncServiceTask", "ServiceRef", "run_on_loop", "service_loop",
           "sweep"]

log = logging.getLogger(__name__)

#: How long letting a service go may take on the service loop before it is given up.
DESTROY_TIMEOUT_SECONDS = 30.0


# --- the process's service loop ------------------------------------------------------------

_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0


def service_loop() -> asyncio.AbstractEventLoop:
    """The event loop of this process's services, on a daemon thread started on first use."""
    global _loop, _loop_pid
    loop = _loop
    if loop is not None and _loop_pid == os.getpid():
        return loop
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid():  # none yet, or the parent's (forked)
            started = asyncio.new_event_loop()
            threading.Thread(target=started.run_forever, name="sparkjet-services-loop",
                             daemon=True).start()
            _loop, _loop_pid = started, os.getpid()
        return _loop


def run_on_loop(fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
    """``fn(*args)`` called on the service loop, awaited there if it returns an awaitable.

    Blocks the calling thread (never the loop's own) until it is done.
    """
    return asyncio.run_coroutine_threadsafe(_awaiting(fn, *args), service_loop()).result(timeout)


async def _awaiting(fn: Callable[..., Any], *args: Any) -> Any:
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


# --- finding a stage's service -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServiceRef:
    """How a task finds its stage's service: ``ref()`` is it, made on first use in the process."""

    files: FileStore
    job_id: str
    stage: str
    factory: ServiceFactory
    #: Made (and destroyed) on the service loop: an async stage's, so an asyncio
    #: client binds to the loop its calls run on.
    on_loop: bool = False
    #: Swept once the job stops (a worker's); False: the job's runner lets it go (the driver's).
    swept: bool = True

    @property
    def key(self) -> ServiceKey:
        """What the service is kept by in this process: the job and the stage."""
        return (self.job_id, self.stage)

    def __call__(self) -> Any:
        return SERVICES.get((self.job_id, self.stage), self._make, self._destroyer)

    def _make(self) -> Any:
        create = self.factory.create_fn
        try:
            if self.on_loop:
                service = run_on_loop(create)
            else:
                service = create()
                if inspect.isawaitable(service):
                    service = run_on_loop(_identity_of, service)
        except Exception as exc:
            exc.add_note(f"raised making the service of stage {self.stage!r} (its "
                         "ServiceFactory's create_fn)")
            raise StageFailure(self.stage, exc) from None
        if self.swept:
            _watch(self.files, self.job_id)
        log.debug("job %s: stage %r made its service in process %d", self.job_id, self.stage,
                  os.getpid())
        return service

    def _destroyer(self, service: Any) -> Callable[[], None] | None:
        destroy = self.factory.destroy_fn
        if destroy is None:
            return None
        on_loop = self.on_loop

        def let_go() -> None:
            if on_loop:
                run_on_loop(destroy, service, timeout=DESTROY_TIMEOUT_SECONDS)
                return
            result = destroy(service)
            if inspect.isawaitable(result):
                run_on_loop(_identity_of, result, timeout=DESTROY_TIMEOUT_SECONDS)

        return let_go


def _identity_of(value: Any) -> Any:
    return value


# --- the sweeper: a worker's services of stopped jobs --------------------------------------

_watch_lock = threading.Lock()
_watched: dict[str, CacheOwner] = {}
_asked: dict[str, float] = {}
_sweeper: threading.Thread | None = None
_sweeper_pid = 0


def _watch(files: FileStore, job_id: str) -> None:
    """Sweep ``job_id``'s services here once its record says it stopped."""
    global _sweeper, _sweeper_pid
    with _watch_lock:
        if _sweeper_pid != os.getpid():  # a forked copy: the parent's thread is not here
            _sweeper, _sweeper_pid = None, os.getpid()
            _watched.clear()
        _watched[job_id] = CacheOwner(cast(Store, files), job_id, 0)
        if _sweeper is None or not _sweeper.is_alive():
            _sweeper = threading.Thread(target=_sweep_loop, name="sparkjet-services-sweeper",
                                        daemon=True)
            _sweeper.start()


def sweep() -> list[str]:
    """Destroy the services of the watched jobs no longer running; returns their ids."""
    live = SERVICES.jobs()
    with _watch_lock:
        owners = {job: owner for job, owner in _watched.items() if job in live}
        for job in set(_watched) - live:  # let go by the runner (or never made here)
            del _watched[job]
    stopped = []
    now = time.monotonic()
    for job, owner in owners.items():
        remote = bool(getattr(owner.store, "object_store", False))
        if remote and now - _asked.get(job, float("-inf")) < REMOTE_SWEEP_SECONDS:
            continue
        _asked[job] = now
        with store_requests.working_for(job):
            if owner.running() is False:
                stopped.append(job)
    for job in stopped:
        gone = SERVICES.release_job(job)
        with _watch_lock:
            _watched.pop(job, None)
        _asked.pop(job, None)
        log.debug("destroyed %d service(s) of job %s: it no longer runs", gone, job)
    return stopped


def _sweep_loop() -> None:
    global _sweeper
    while True:
        time.sleep(SWEEP_SECONDS)
        try:
            sweep()
        except Exception:  # tried again at the next sweep
            log.exception("the services' sweep failed")
        with _watch_lock:
            if not _watched:
                _sweeper = None
                return


# --- the asynchronous calls of a task ------------------------------------------------------


async def _call(fn: Callable[[Any, Any], Any], service: Any, item: Any,
                timeout_ms: int | None) -> Any:
    """One call, on the service loop: ``fn(service, item)`` awaited, within ``timeout_ms``."""
    result = fn(service, item)
    if isinstance(result, concurrent.futures.Future):
        result = asyncio.wrap_future(result)
    elif not inspect.isawaitable(result):
        raise TypeError(
            "map_using_service_async()'s function must return an awaitable (call an async "
            "def function) or a concurrent.futures.Future, got "
            f"{type(result).__name__}: {result!r:.100}")
    if timeout_ms is None:
        return await result
    deadline = asyncio.timeout(timeout_ms / 1000)
    try:
        async with deadline:
            return await result
    except TimeoutError:
        if not deadline.expired():
            raise  # the user's own
        raise TimeoutError(
            f"the call took longer than timeout_ms={timeout_ms} and was cancelled") from None


def _user_traceback(exc: BaseException) -> str:
    """``exc``'s traceback from the user's function on (past the loop's and :func:`_call`'s)."""
    start = tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is _call.__code__:
            start = tb.tb_next
            break
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, start))


_UNMADE = object()


@dataclass(slots=True)
class _InFlight:
    future: concurrent.futures.Future[Any]
    item: Any
    #: The item's timestamp (paired flows), else None.
    t: Any
    #: The item's position in the task's input (for its dead letter).
    index: int


class _Counted:
    """An iterator counting what was taken from it: the input item an output came from."""

    __slots__ = ("_it", "taken")

    def __init__(self, items: Iterator[Any]) -> None:
        self._it, self.taken = items, 0

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        item = next(self._it)
        self.taken += 1
        return item


@dataclass(frozen=True, slots=True)
class AsyncCalls:
    """A stage's asynchronous calls over one task's items, at most ``limit`` in flight."""

    stage: str
    service: ServiceRef
    fn: Callable[[Any, Any], Any]
    limit: int
    ordered: bool
    timeout_ms: int | None
    #: The stage's error policy is dead-letter: a failed call's item is set aside.
    dead: bool

    def run(self, items: Iterator[Any], state: dict[str, Any], counted: _Counted | None,
            paired: bool) -> Iterator[Any]:
        """The outputs for ``items`` (``(t, item)`` pairs with ``paired``): in order or as done.

        A call that fails or times out raises the stage's StageFailure, or
        with ``dead`` leaves a dead letter in ``state["dead"]``. Calls still
        in flight when this stops early are cancelled.
        """
        service: Any = _UNMADE
        loop = service_loop()
        fn, timeout_ms, limit = self.fn, self.timeout_ms, self.limit
        window: deque[_InFlight] = deque()
        try:
            for entry in items:
                if service is _UNMADE:  # on the first item: an empty partition makes none
                    service = self.service()
                t, item = entry if paired else (None, entry)
                index = counted.taken - 1 if counted is not None else -1
                future = asyncio.run_coroutine_threadsafe(_call(fn, service, item, timeout_ms),
                                                          loop)
                window.append(_InFlight(future, item, t, index))
                if self.ordered:
                    # In input order: the oldest call goes first; the done and the
                    # waiting together take at most ``limit`` places.
                    while window and (len(window) >= limit or window[0].future.done()):
                        yield from self._settled(window.popleft(), state, paired)
                elif len(window) >= limit:
                    yield from self._settle_done(window, state, paired, wait=True)
            while window:
                if self.ordered:
                    yield from self._settled(window.popleft(), state, paired)
                else:
                    yield from self._settle_done(window, state, paired, wait=True)
        finally:
            for call in window:
                call.future.cancel()

    def _settle_done(self, window: deque[_InFlight], state: dict[str, Any], paired: bool,
                     wait: bool) -> Iterator[Any]:
        """The outputs of the calls done (with ``wait``: once one is), as they finished."""
        if wait:
            concurrent.futures.wait([c.future for c in window],
                                    return_when=concurrent.futures.FIRST_COMPLETED)
        done = [c for c in window if c.future.done()]
        for call in done:
            window.remove(call)
        for call in done:
            yield from self._settled(call, state, paired)

    def _settled(self, call: _InFlight, state: dict[str, Any], paired: bool) -> Iterator[Any]:
        """The output of one call (waiting for it), or its failure by the stage's policy."""
        try:
            exc = call.future.exception()
        except concurrent.futures.CancelledError:
            exc = RuntimeError("the call was cancelled before it finished")
        if exc is None:
            out = call.future.result()
            if out is not None:
                yield (call.t, out) if paired else out
            return
        if not self.dead or not isinstance(exc, Exception):
            raise StageFailure(self.stage, exc) from None
        letter = dead_letter(self.stage, call.item, exc, call.index)
        letter["traceback"] = _user_traceback(exc)
        state.setdefault("dead", []).append(letter)


class AsyncServiceTask(Task):
    """``map_using_service_async`` over one partition: the pass feeding it, then its calls.

    The fused pass of the stateless stages before it runs first (reading
    the source itself, as a :class:`~.passes.PassTask`); its items go to
    :class:`AsyncCalls`. Items with timestamps stay ``(t, item)`` pairs, so
    a window downstream windows their event time.
    """

    fused: FusedPass

    def __init__(self, fused: FusedPass, calls: AsyncCalls, reports: Reports | None,
                 reader: ReadTask | None = None) -> None:
        self.fused, self.calls, self.stage = fused, calls, calls.stage
        self.reports, self.reader = reports, reader

    def __call__(self, pidx: int, items: Iterator[Any]) -> Iterator[Any]:
        fused = self.fused
        counts: dict[str, int] = {}
        state: dict[str, Any] = {"pidx": pidx}
        descriptors = None
        emitted = 0
        with self.attributing():
            if self.reader is not None:
                descriptors = list(items)
                items = iter(self.reader.items(pidx, descriptors))
            counted = _Counted(items) if self.calls.dead else None
            source: Iterator[Any] = counted if counted is not None else items
            if fused.ops or fused.stamp is not None:
                source = fused.run(source, counts, state)
            for out in self.calls.run(source, state, counted, fused.stamp is not None):
                emitted += 1
                yield out
        self.count_pass(counts)
        self.count_items(emitted)
        self.report_time(pidx, state)
        self.report_dead(pidx, state, descriptors)
