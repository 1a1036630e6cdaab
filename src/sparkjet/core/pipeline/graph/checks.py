"""The checks of what users pass when they build a pipeline: names, times, aggregations.

Each raises :class:`~sparkjet.errors.PipelineDefinitionError` naming what is
wrong (and the stage, where there is one), and returns the checked value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkjet.core.errors import PipelineDefinitionError
from sparkjet.core.pipeline.aggregation import AggregateOperation

_MAX_NAME = 200


def validate_stage_name(name: Any) -> str:
    """``name``, checked: a non-empty string of at most 200 characters, no control characters."""
    if not isinstance(name, str) or not name.strip():
        raise PipelineDefinitionError(f"stage name must be a non-empty string, got {name!r}")
    if name != name.strip():
        raise PipelineDefinitionError(
            f"stage name {name!r} must not start or end with white space"
        )
    if len(name) > _MAX_NAME:
        raise PipelineDefinitionError(
            f"stage name {name[:40]!r}... is {len(name)} characters long (at most {_MAX_NAME})"
        )
    if any(ord(ch) < 32 for ch in name):
        raise PipelineDefinitionError(f"stage name {name!r} must not contain control characters")
    return name


def lag_ms(value: Any) -> int:
    """``allowed_lag_ms``: an int of milliseconds >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PipelineDefinitionError(
            f"allowed_lag_ms must be an int of milliseconds >= 0, got {value!r}")
    return value


def idle_ms(value: Any) -> int:
    """``idle_timeout_ms``: a positive int of milliseconds."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PipelineDefinitionError(
            f"idle_timeout_ms must be a positive int of milliseconds, got {value!r}")
    return value


def ttl_ms(ttl_millis: Any) -> int | None:
    """``ttl_millis``: a positive int, or None (state kept for ever)."""
    if ttl_millis is None:
        return None
    if isinstance(ttl_millis, bool) or not isinstance(ttl_millis, int) or ttl_millis <= 0:
        raise PipelineDefinitionError(f"ttl_millis must be a positive int, got {ttl_millis!r}")
    return ttl_millis


def operation_of(
    after: str,
    operation: AggregateOperation | None,
    accumulator: Callable[[Any, Any], Any] | None,
    initial: Any,
    combiner: Callable[[Any, Any], Any] | None,
    finisher: Callable[[Any], Any] | None,
) -> AggregateOperation:
    """The operation ``aggregate()`` after stage ``after`` was given, or one built of functions."""
    if operation is not None:
        if accumulator is not None:
            raise PipelineDefinitionError(
                f"aggregate() after stage '{after}': pass an AggregateOperation or "
                "accumulator=..., not both",
                after,
            )
        if not isinstance(operation, AggregateOperation):
            raise PipelineDefinitionError(
                f"aggregate() after stage '{after}' takes an AggregateOperation, "
                f"got {operation!r}",
                after,
            )
        return operation
    if accumulator is None or not callable(accumulator):
        raise PipelineDefinitionError(
            f"aggregate() after stage '{after}' needs an AggregateOperation or a callable "
            f"accumulator=, got {accumulator!r}",
            after,
        )
    for label, fn in (("combiner", combiner), ("finisher", finisher)):
        if fn is not None and not callable(fn):
            raise PipelineDefinitionError(
                f"aggregate() after stage '{after}': {label}= must be callable, got {fn!r}", after
            )
    return AggregateOperation.of(accumulator, initial, combiner, finisher)
