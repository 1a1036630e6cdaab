"""Reading a source: one partition descriptor per partition."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from sparkjet.core.engine.tasks.base import Task
from sparkjet.core.engine.tasks.reports import Reports
from sparkjet.core.host.contracts import TaskContext

__all__ = ["ReadTask"]


class ReadTask(Task):
    """Reads one source partition descriptor per partition (Spark's or another engine's)."""

    def __init__(
        self, source: Any, stage: str, context: TaskContext, reports: Reports | None
    ) -> None:
        self.source, self.stage, self.context, self.reports = source, stage, context, reports

    def __call__(self, pidx: int, descriptors: Iterator[Any]) -> Iterator[Any]:
        yield from self.items(pidx, descriptors)

    def items(self, pidx: int, descriptors: Iterable[Any]) -> Iterable[Any]:
        """The partition's items: the source's own list when it returns one."""
        wanted = list(descriptors)
        if len(wanted) == 1:
            with self.attributing():
                items = self.source.read(wanted[0], self._context(pidx))
            if isinstance(items, list | tuple):
                self.count_items(len(items))
                return items
            return self._counted(pidx, [], items)
        return self._counted(pidx, wanted, None)

    def _context(self, pidx: int) -> TaskContext:
        return replace(self.context, partition=pidx)

    def _counted(self, pidx: int, descriptors: list[Any], first: Any) -> Iterator[Any]:
        n = 0
        with self.attributing():
            if first is not None:
                for item in first:
                    n += 1
                    yield item
            for descriptor in descriptors:
                for item in self.source.read(descriptor, self._context(pidx)):
                    n += 1
                    yield item
        self.count_items(n)
