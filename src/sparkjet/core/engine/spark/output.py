"""Naming the stage whose output Spark cannot pickle.

Spark pickles what a task yields where the task's RDD ends (a persist, a
collect, a shuffle), outside sparkjet's task code, so an item that cannot be
pickled used to fail the job with a bare ``PicklingError`` naming no stage.
:func:`name_output` gives an RDD an output serializer that, when a batch does
not pickle, finds the item that does not and raises it as the
:class:`~sparkjet.core.pipeline.fusion.StageFailure` of the stage that emitted it;
:func:`partition_by` does the same for a shuffle, and :func:`parallelize` for
items the driver sends. Nothing is added to a batch that pickles.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

from pyspark.serializers import FramedSerializer

from sparkjet.core.engine.tasks.pickling import unpicklable

#: Orders the swaps of a SparkContext's shuffle serializer and its readers (see
#: :func:`partition_by`).
_SHUFFLE_LOCK = threading.Lock()


class StageOutput(FramedSerializer):
    """Spark's own pickle serializer, raising an item it cannot pickle as ``stage``'s failure.

    Reads as the serializer it wraps; equal to any other StageOutput over an
    equal one, so RDDs of different stages still union without re-pickling.
    ``via`` says where the item was found (see :func:`name_output`).
    """

    def __init__(self, stage: str, inner: Any, via: str = "") -> None:
        super().__init__()
        self.stage = stage
        self.inner = inner
        self.via = via

    def dumps(self, obj: Any) -> bytes:
        """``obj`` pickled by the wrapped serializer; StageFailure if it cannot be."""
        try:
            data: bytes = self.inner.dumps(obj)
            return data
        except Exception:
            failure = unpicklable(self.stage, obj, self.inner.dumps, self.via)
            if failure is None:
                raise
            raise failure from None

    def loads(self, obj: bytes, *args: Any, **kwargs: Any) -> Any:
        """``obj`` unpickled by the wrapped serializer."""
        return self.inner.loads(obj, *args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StageOutput) and self.inner == other.inner

    def __hash__(self) -> int:
        return hash((StageOutput, type(self.inner)))

    def __repr__(self) -> str:
        return f"StageOutput({self.stage!r}, {self.inner!r})"


def name_output(rdd: Any, stage: str, via: str = "") -> Any:
    """``rdd``, its items pickled by a serializer naming ``stage`` when one cannot be.

    Takes effect where ``rdd``'s items are pickled: a persist, a collect, or
    a shuffle that does not pipeline further work onto ``rdd``. A serializer
    that batches through another one is wrapped; any other is left as it is.
    ``via``: where such an item was found, for the message (a sink's commit
    message, which may carry the items its input stage emitted).
    """
    batched = rdd._jrdd_deserializer
    inner = getattr(batched, "serializer", None)
    if inner is None or isinstance(inner, StageOutput):
        return rdd
    named = copy.copy(batched)
    named.serializer = StageOutput(stage, inner, via)
    rdd._jrdd_deserializer = named
    return rdd


def partition_by(rdd: Any, partitions: int, partition_fn: Any, stage: str | None) -> Any:
    """``rdd.partitionBy(...)``, an item that cannot be shuffled raised as ``stage``'s failure.

    PySpark's shuffle pickles with the SparkContext's unbatched serializer,
    which it reads when the shuffle is defined: it is swapped for one naming
    ``stage`` for that moment, under a lock that every shuffle and
    :func:`parallelize` of sparkjet's takes, so concurrent jobs name their
    own. ``stage`` None: no swap (items pickled by a named persist before),
    only the lock, so this shuffle does not pick up another job's swap.
    """
    sc = rdd.ctx
    with _SHUFFLE_LOCK:
        original = sc._unbatched_serializer
        if stage is not None:
            sc._unbatched_serializer = StageOutput(stage, original)
        try:
            return rdd.partitionBy(partitions, partition_fn)
        finally:
            sc._unbatched_serializer = original


def parallelize(sc: Any, items: list[Any], slices: int, stage: str) -> Any:
    """``sc.parallelize(items, slices)``; an item that cannot be pickled is ``stage``'s failure.

    Under the lock of :func:`partition_by`: PySpark pickles the items with the
    serializer a concurrent shuffle's definition may have swapped.
    """
    try:
        with _SHUFFLE_LOCK:
            return sc.parallelize(items, slices)
    except Exception:
        failure = unpicklable(stage, items, sc._unbatched_serializer.dumps)
        if failure is None:
            raise
        raise failure from None
