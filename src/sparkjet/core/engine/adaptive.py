"""Adaptive micro-batches: whether a micro-batch runs on the driver or on Spark.

A pure decision, taken from what is known before the batch runs: the input
size each source planned (items and bytes, each possibly unknown), the
bytes of keyed state the job holds, whether the driver holds any of it
loaded already, and the ``[engine]`` settings
(:class:`~sparkjet.core.config.EngineSettings`). It imports no engine and no
Spark: the loop asks, then hands the batch to the engine chosen.

Local only when every rule says so, checked in this order (the first that
fails is the reason given):

1. adaptive micro-batches are on (:func:`resolve_adaptive`);
2. every source's size is known: a size, with its item count, is given;
3. the items of all sources add up to at most ``local_max_items``;
4. their known bytes add up to at most ``local_max_bytes`` (a source that
   knows its items but not its bytes counts for its items only);
5. the job's state is at most ``driver_state_bytes`` while the driver holds
   some of it loaded, at most ``cold_state_bytes`` while it holds none (the
   driver would first read all of it from the checkpoint).

The reason is a short line for logs and metrics: ``"small: 12 items"``,
``"large: 9000 items > 5000"``, ``"size unknown for source 'clicks'"``.

A batch that goes to Spark only because the driver holds none of a state
that fits ``driver_state_bytes`` (rule 5's second half) is the case
:func:`worth_warming` names: the loop then loads the state into the driver
in the background (:mod:`sparkjet.core.state.warming`), so the next small
batches find it there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from sparkjet.core.config import EngineSettings

log = logging.getLogger("sparkjet.adaptive")

#: One source's planned input: ``(items, bytes)``, either unknown (None), or
#: None when the source cannot say at all. ``contracts.InputSize`` is such a pair.
PlannedSize = tuple[int | None, int | None] | None


def ask_sizes(askers: Mapping[str, Callable[[], PlannedSize]]) -> dict[str, PlannedSize]:
    """Each source's planned size, by stage name: a source that raises is unknown.

    ``askers`` call the source's ``range_size`` (a micro-batch) or
    ``estimated_size`` (a batch job). A failure is logged naming the source
    and taken as None, so the work runs on Spark rather than fail here.
    """
    sizes: dict[str, PlannedSize] = {}
    for name, ask in askers.items():
        try:
            sizes[name] = ask()
        except Exception as exc:
            log.warning("source %r could not say how big its read is (%s: %s); the work "
                        "runs on Spark", name, type(exc).__name__, exc)
            sizes[name] = None
    return sizes


def resolve_adaptive(job: bool | None, settings: EngineSettings) -> bool:
    """Whether adaptive micro-batches are on for a job.

    ``job`` is its ``JobConfig.adaptive_micro_batches``: None follows the
    configuration's ``[engine] adaptive``, a bool overrides it.
    """
    return settings.adaptive if job is None else job


def choose_local(
    sizes: Mapping[str, PlannedSize],
    *,
    state_bytes: int,
    driver_holds_state: bool,
    settings: EngineSettings,
    enabled: bool,
) -> tuple[bool, str]:
    """Whether a micro-batch runs on the driver, and why (see the module's rules).

    ``sizes``: each source stage's planned input, by stage name, in the order
    the reason should look at them. ``state_bytes``: the bytes of keyed state
    the job holds (0 for a stateless job). ``driver_holds_state``: whether
    the driver process has some of the job's state loaded already.
    ``enabled``: :func:`resolve_adaptive`'s answer. A negative count is taken
    as unknown.
    """
    if not enabled:
        return False, "adaptive micro-batches off"
    items = 0
    known_bytes = 0
    for source, size in sizes.items():
        count, nbytes = size if size is not None else (None, None)
        if count is None:
            return False, f"size unknown for source {source!r}"
        if count < 0 or (nbytes is not None and nbytes < 0):
            return False, f"size unknown for source {source!r} (negative: {size!r})"
        items += count
        known_bytes += nbytes or 0
    if items > settings.local_max_items:
        return False, f"large: {items} items > {settings.local_max_items}"
    if known_bytes > settings.local_max_bytes:
        return False, f"large: {known_bytes} bytes > {settings.local_max_bytes}"
    if driver_holds_state:
        if state_bytes > settings.driver_state_bytes:
            return False, (f"large state: {state_bytes} bytes > "
                           f"{settings.driver_state_bytes} (driver_state_bytes)")
    elif state_bytes > settings.cold_state_bytes:
        return False, (f"large state: {state_bytes} bytes > {settings.cold_state_bytes} "
                       f"(cold_state_bytes: the driver holds none of it)")
    shown = f"small: {items} items"
    if known_bytes:
        shown += f", {known_bytes} bytes"
    return True, shown


def worth_warming(
    sizes: Mapping[str, PlannedSize],
    *,
    state_bytes: int,
    driver_holds_state: bool,
    settings: EngineSettings,
) -> bool:
    """Whether to load the job's state into the driver in the background.

    True when this batch goes to Spark only because the driver holds none of
    the state and it is over ``cold_state_bytes`` (a read on the loop would
    hold the batch up), while it fits ``driver_state_bytes``: the batch
    would run on the driver if the state were loaded there. Asked with the
    same arguments as :func:`choose_local` (adaptive micro-batches on).
    """
    if driver_holds_state or state_bytes <= settings.cold_state_bytes:
        return False
    local, _ = choose_local(sizes, state_bytes=state_bytes, driver_holds_state=True,
                            settings=settings, enabled=True)
    return local
