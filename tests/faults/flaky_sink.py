"""A test plugin: a list sink whose commit fails once, at a chosen micro-batch.

``FlakyListSink(name, marker, fail_batch=2, when="before")`` behaves exactly
like the built-in list sink (it subclasses it, so commits stay idempotent per
batch id and it can declare every guarantee) except that the first commit of
micro-batch ``fail_batch`` raises :class:`InjectedCommitFailure`: ``when="before"``
raises before anything lands; ``when="after"`` raises after the list commit
landed, as a driver would that died right after committing. The marker file
makes it fail only once, across processes and resumes.

Register it with :func:`register` (which also ships this module's code to Spark's
workers, which cannot import ``tests.faults``).
"""

from __future__ import annotations

import os
from typing import Any

from sparkjet.pipeline import ListSink
from sparkjet.plugin import ALL_GUARANTEES, JobContext, hookimpl


class InjectedCommitFailure(RuntimeError):
    """The failure the flaky sink injects."""


class FlakyListSink(ListSink):
    """The list sink, failing its commit of one micro-batch once."""

    kind = "flaky-list"
    guarantees = ALL_GUARANTEES

    def __init__(self, name: str, marker: str, fail_batch: int = 2, when: str = "before") -> None:
        super().__init__(name)
        if when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', got {when!r}")
        self.marker = marker
        self.fail_batch = fail_batch
        self.when = when

    def _should_fail(self, context: JobContext) -> bool:
        if context.batch_id != self.fail_batch:
            return False
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False  # failed once already
        os.close(fd)
        return True

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: the list sink's commit, with the injected failure."""
        fail = self._should_fail(context)
        if fail and self.when == "before":
            raise InjectedCommitFailure(f"injected commit failure before batch {context.batch_id}")
        super().commit(state, messages, context)
        if fail:
            raise InjectedCommitFailure(f"injected commit failure after batch {context.batch_id}")


@hookimpl
def register_sinks(register: Any) -> None:
    """Register the flaky list sink."""
    register(FlakyListSink)


def register(client: Any) -> None:
    """Register the plugin on ``client``; its code travels to the workers by value."""
    import sys

    import cloudpickle
    from pyspark import cloudpickle as spark_cloudpickle

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    spark_cloudpickle.register_pickle_by_value(module)
    client.register_plugin(module, "flaky-sink")
