"""The logger sink: logs every item on the driver (Jet's ``Sinks.logger()``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from sparkjet.plugin import AT_LEAST_ONCE_AT_MOST, JobContext, Sink, TaskContext, hookimpl

log = logging.getLogger("sparkjet.sink.logger")


class LoggerSink(Sink):
    """Logs ``to_string(item)`` at INFO on the ``sparkjet.sink.logger`` logger.

    Batch jobs log when the job commits, in order, on the driver. A log cannot
    take back a line, so the sink supports AT_LEAST_ONCE at most.
    """

    kind = "logger"
    guarantees = AT_LEAST_ONCE_AT_MOST

    def __init__(self, to_string: Callable[[Any], str] = str) -> None:
        super().__init__("logger")
        self.to_string = to_string

    def describe(self) -> str:
        """Just ``logger``: the stage is named ``to-logger``."""
        return "logger"

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        """Runs on an executor: format this partition's items."""
        return [self.to_string(item) for item in items]

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: log every line, in order."""
        for lines in messages:
            for line in lines:
                log.info("%s", line)


@hookimpl
def register_sinks(register: Any) -> None:
    """Register the logger sink."""
    register(LoggerSink)
