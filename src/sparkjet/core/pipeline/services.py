"""Calls to outside services: the factory users write, the per-item call, the live services.

Jet's ``mapUsingService`` and ``mapUsingServiceAsync``: a stage calls
``fn(service, item)`` for each item, where the *service* (a client, a
connection pool, a model) is made by a :class:`ServiceFactory`:

- one service object per process, per job and per stage: made on its
  stage's first item in the process (``create_fn()``), kept for every task
  of that job and stage after, and given to ``destroy_fn`` when the job
  ends where the process can tell (see :class:`LiveServices`);
- ``fn(service, item)`` is the output; ``None`` is dropped, as Jet drops a
  null.

This module is the pure part: the factory, the synchronous per-item call
(:class:`ServiceCall`, one more op of a fused pass) and the process's
registry of live services (:data:`SERVICES`), with no engine, thread or store
in it. The asynchronous calls (their event loop, the bounded window of calls
in flight per task), the sweeping of stopped jobs' services on workers and
how a task finds its service are :mod:`sparkjet.core.engine.tasks.services`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["SERVICES", "LiveServices", "ServiceCall", "ServiceFactory", "ServiceKey",
           "release_services"]

log = logging.getLogger(__name__)

#: What a live service is kept by: ``(job id, stage name)``.
ServiceKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class ServiceFactory:
    """How to make a stage's service: Jet's ``ServiceFactories.sharedService(create, destroy)``.

    ``create_fn()`` makes the service (once per process, job and stage, on
    first use); ``destroy_fn(service)``, if given, releases it when the job
    ends. Both travel to Spark's workers, so they must pickle (module
    functions or lambdas; not a live client: make that in ``create_fn``).
    Either may return an awaitable (``aiohttp.ClientSession.close``), which
    is awaited on the process's service event loop.
    """

    create_fn: Callable[[], Any]
    destroy_fn: Callable[[Any], Any] | None = None

    @staticmethod
    def of(create_fn: Callable[[], Any]) -> ServiceFactory:
        """A factory making its service with ``create_fn()``; nothing is called to destroy it."""
        candidate: object = create_fn
        if not callable(candidate):
            from sparkjet.core.errors import PipelineDefinitionError

            raise PipelineDefinitionError(
                f"ServiceFactory.of() takes a function making the service, got {create_fn!r}")
        return ServiceFactory(create_fn)

    def with_destroy(self, destroy_fn: Callable[[Any], Any]) -> ServiceFactory:
        """The same factory, calling ``destroy_fn(service)`` when the service is let go."""
        candidate: object = destroy_fn
        if not callable(candidate):
            from sparkjet.core.errors import PipelineDefinitionError

            raise PipelineDefinitionError(
                f"ServiceFactory.with_destroy() takes a function, got {destroy_fn!r}")
        return ServiceFactory(self.create_fn, destroy_fn)


class ServiceCall:
    """``map_using_service``'s call, one op of a fused pass: ``call(item)`` is what it emits.

    ``service`` gives the stage's live service (made on first use);
    ``fn(service, item)`` is the output, ``None`` emitting nothing.
    """

    __slots__ = ("fn", "service")

    def __init__(self, service: Callable[[], Any], fn: Callable[[Any, Any], Any]) -> None:
        self.service, self.fn = service, fn

    def __call__(self, item: Any) -> tuple[Any, ...]:
        out = self.fn(self.service(), item)
        return () if out is None else (out,)

    def __getstate__(self) -> Any:
        return (self.service, self.fn)

    def __setstate__(self, state: Any) -> None:
        self.service, self.fn = state


@dataclass(slots=True)
class _Live:
    """One live service and how to let it go."""

    service: Any
    #: Calls the factory's ``destroy_fn`` on the service where it must run (None: nothing).
    destroy: Callable[[], None] | None


class LiveServices:
    """The live services of a process, by job and stage: made once, let go with their job.

    :meth:`get` makes a key's service on first use (one maker per key at a
    time, so two tasks of a process never make two) and returns the same
    object after. :meth:`release_job` destroys a job's services: the job's
    runner calls it on the driver when the job's run ends (it completes,
    fails, is cancelled or suspended, or restarts), and the sweeper of
    :mod:`sparkjet.core.engine.tasks.services` calls it on a worker once the
    job's record says it no longer runs. A process forked from one holding
    services drops its copies without destroying them (they are its
    parent's).
    """

    def __init__(self) -> None:
        self._live: dict[ServiceKey, _Live] = {}
        self._lock = threading.Lock()
        self._making: dict[ServiceKey, threading.Lock] = {}
        self._pid = os.getpid()
        #: How many services this process has made, by key (for tests and logs).
        self.made: dict[ServiceKey, int] = {}

    def get(
        self,
        key: ServiceKey,
        make: Callable[[], Any],
        destroy: Callable[[Any], Callable[[], None] | None],
    ) -> Any:
        """``key``'s live service, made with ``make()`` on first use.

        ``destroy(service)`` says how to let the service go (None: nothing to
        call). What ``make`` raises is raised; nothing is kept then.
        """
        live = self._live.get(key)
        if live is not None and self._pid == os.getpid():
            return live.service
        with self._lock:
            self._forked()
            making = self._making.setdefault(key, threading.Lock())
        with making:
            live = self._live.get(key)
            if live is not None:
                return live.service
            service = make()
            with self._lock:
                self._live[key] = _Live(service, destroy(service))
                self.made[key] = self.made.get(key, 0) + 1
            return service

    def release_job(self, job_id: str) -> int:
        """Destroy the job's services in this process; returns how many there were.

        A ``destroy_fn`` that raises is logged, naming the stage: the job's
        outcome stands.
        """
        with self._lock:
            self._forked()
            keys = [key for key in self._live if key[0] == job_id]
            gone = [(key, self._live.pop(key)) for key in keys]
            for key in keys:
                self._making.pop(key, None)
        for (job, stage), live in gone:
            if live.destroy is None:
                continue
            try:
                live.destroy()
            except Exception as exc:
                log.warning("job %s: destroying the service of stage %r failed: %s: %s",
                            job, stage, type(exc).__name__, exc)
        return len(gone)

    def jobs(self) -> set[str]:
        """The ids of the jobs with services live in this process."""
        with self._lock:
            self._forked()
            return {job for job, _ in self._live}

    def _forked(self) -> None:
        """In a forked child, forget the parent's services (under the lock)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._live.clear()
            self._making.clear()
            self.made.clear()


#: This process's live services.
SERVICES = LiveServices()


def release_services(job_id: str) -> int:
    """Destroy the services job ``job_id`` made in this process (its run here has ended)."""
    return SERVICES.release_job(job_id)
