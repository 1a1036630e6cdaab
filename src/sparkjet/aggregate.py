"""Aggregate operations for ``aggregate()`` and ``group_by(...).aggregate()``.

An :class:`AggregateOperation` has four functions, as in Jet:

- ``create()`` makes a fresh accumulator (once per key, per partition);
- ``accumulate(acc, item)`` folds one item in and returns the accumulator
  (it may return a new object or the mutated one);
- ``combine(left, right)`` merges two accumulators, ``left`` holding earlier
  items; ``None`` means the operation cannot be split, so all items of a key
  are brought together before accumulating (slower, but order-exact);
- ``finish(acc)`` turns the accumulator into the emitted result.

All four run on Spark executors and are shipped with cloudpickle.
"""

from __future__ import annotations

from sparkjet.core.pipeline.aggregation import (
    AggregateOperation,
    averaging,
    counting,
    max_by,
    min_by,
    summing,
    to_list,
    to_set,
)

__all__ = [
    "AggregateOperation",
    "averaging",
    "counting",
    "max_by",
    "min_by",
    "summing",
    "to_list",
    "to_set",
]
