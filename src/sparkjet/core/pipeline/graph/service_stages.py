"""The service methods of a stage: ``map_using_service`` and ``map_using_service_async``.

:class:`ServiceMethods` is a base of :class:`~.builder.Stage`: each method
checks what it is given, naming the stage, and adds one
:class:`~.specs.ServiceSpec` (or :class:`~.specs.AsyncServiceSpec`) node
downstream of the stage. What a service is and how long it lives is
:mod:`sparkjet.core.pipeline.services`'; whether the factory pickles is the
planner's to check at submit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Self

from sparkjet.core.errors import PipelineDefinitionError
from sparkjet.core.pipeline.graph.specs import AsyncServiceSpec, ServiceSpec
from sparkjet.core.pipeline.services import ServiceFactory

#: Jet's defaults for ``mapUsingServiceAsync``.
DEFAULT_MAX_CONCURRENT_OPS = 4
DEFAULT_PRESERVE_ORDER = True


class ServiceMethods:
    """``map_using_service`` and ``map_using_service_async``.

    A base of :class:`~.builder.Stage`, which gives the node's ``name``,
    ``_add`` (a node downstream) and ``_wrap`` (a node's handle).
    """

    if TYPE_CHECKING:
        @property
        def name(self) -> str: ...

        def _add(self, spec: Any, *inputs: Any, default_name: str | None = None) -> Any: ...

        def _wrap(self, node: Any) -> Self: ...

    def map_using_service(
        self, service_factory: ServiceFactory, fn: Callable[[Any, Any], Any]
    ) -> Self:
        """Emit ``fn(service, item)`` for each item: Jet's ``mapUsingService``.

        ``service_factory`` (a :class:`ServiceFactory`) makes the service once
        per process, job and stage, on first use; ``fn`` is called with it and
        the item, one call at a time, and its result is the output (``None``
        emits nothing). An exception from ``fn`` goes to the stage's error
        policy (``on_error()``); one from making the service fails the job.
        """
        self._service_args("map_using_service", service_factory, fn)
        return self._wrap(self._add(ServiceSpec(service_factory, fn)))

    def map_using_service_async(
        self,
        service_factory: ServiceFactory,
        fn: Callable[[Any, Any], Awaitable[Any] | Future[Any]],
        *,
        max_concurrent_ops: int = DEFAULT_MAX_CONCURRENT_OPS,
        preserve_order: bool = DEFAULT_PRESERVE_ORDER,
        timeout_ms: int | None = None,
    ) -> Self:
        """Emit the result of ``fn(service, item)``, awaited: Jet's ``mapUsingServiceAsync``.

        ``fn`` returns an awaitable (an ``async def`` function's coroutine) or
        a :class:`concurrent.futures.Future`; it is called on the process's
        service event loop and must not block. At most ``max_concurrent_ops``
        calls are in flight per task; with ``preserve_order`` the outputs
        keep the input's order, else they come as calls finish. A call
        still running after ``timeout_ms`` milliseconds (None: no limit) is
        cancelled and fails with a TimeoutError; failures go to the stage's
        error policy (``on_error()``). A task finishes its calls before it
        ends, so none is in flight when a batch commits.
        """
        method = "map_using_service_async"
        self._service_args(method, service_factory, fn)
        if isinstance(max_concurrent_ops, bool) or not isinstance(max_concurrent_ops, int) \
                or max_concurrent_ops <= 0:
            raise PipelineDefinitionError(
                f"{method}() after stage '{self.name}': max_concurrent_ops must be a positive "
                f"int, got {max_concurrent_ops!r}",
                self.name)
        if not isinstance(preserve_order, bool):
            raise PipelineDefinitionError(
                f"{method}() after stage '{self.name}': preserve_order must be a bool, got "
                f"{preserve_order!r}",
                self.name)
        if timeout_ms is not None and (isinstance(timeout_ms, bool)
                                       or not isinstance(timeout_ms, int) or timeout_ms <= 0):
            raise PipelineDefinitionError(
                f"{method}() after stage '{self.name}': timeout_ms must be a positive int of "
                f"milliseconds or None, got {timeout_ms!r}",
                self.name)
        spec = AsyncServiceSpec(service_factory, fn, max_concurrent_ops=max_concurrent_ops,
                                preserve_order=preserve_order, timeout_ms=timeout_ms)
        return self._wrap(self._add(spec))

    def _service_args(self, method: str, factory: object, fn: object) -> None:
        if not isinstance(factory, ServiceFactory):
            raise PipelineDefinitionError(
                f"{method}() after stage '{self.name}' takes a ServiceFactory "
                f"(ServiceFactory.of(create_fn)), got {factory!r}",
                self.name)
        for label, candidate in (("create_fn", factory.create_fn),
                                 ("destroy_fn", factory.destroy_fn)):
            if candidate is not None and not callable(candidate):
                raise PipelineDefinitionError(
                    f"{method}() after stage '{self.name}': the service factory's {label} "
                    f"must be a function, got {candidate!r}",
                    self.name)
        if not callable(fn):
            raise PipelineDefinitionError(
                f"{method}() after stage '{self.name}' takes a function fn(service, item), "
                f"got {fn!r}",
                self.name)
