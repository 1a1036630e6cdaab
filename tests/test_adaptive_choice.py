"""Adaptive micro-batches: the pure choice between the driver and Spark (no Spark needed).

``core.engine.adaptive.choose_local`` takes the sources' planned sizes, the job's
state bytes, whether the driver holds any of that state, the ``[engine]``
settings and whether adaptive batches are on for the job.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkjet.core.config import EngineSettings
from sparkjet.core.engine.adaptive import PlannedSize, choose_local, resolve_adaptive, worth_warming
from sparkjet.job import JobConfig

#: Small thresholds, so a table row reads at a glance.
SMALL = EngineSettings(local_max_items=100, local_max_bytes=1000, driver_state_bytes=500,
                       cold_state_bytes=50)


def choose(sizes: Mapping[str, PlannedSize], *, state: int = 0, warm: bool = False,
           on: bool = True, engine: EngineSettings = SMALL) -> tuple[bool, str]:
    return choose_local(sizes, state_bytes=state, driver_holds_state=warm, settings=engine,
                        enabled=on)


@pytest.mark.parametrize(
    ("sizes", "state", "warm", "on", "local", "reason"),
    [
        # small input, known
        ({"a": (12, None)}, 0, False, True, True, "small: 12 items"),
        ({"a": (12, 300), "b": (3, 200)}, 0, False, True, True, "small: 15 items, 500 bytes"),
        ({"a": (0, 0)}, 0, False, True, True, "small: 0 items"),
        ({}, 0, False, True, True, "small: 0 items"),  # no sources (nothing to read)
        # the limits are inclusive
        ({"a": (60, 400), "b": (40, 600)}, 0, False, True, True,
         "small: 100 items, 1000 bytes"),
        # adaptive off
        ({"a": (1, 1)}, 0, False, False, False, "adaptive micro-batches off"),
        # unknown sizes: the first source that cannot say is named
        ({"a": (1, 1), "clicks": None}, 0, False, True, False,
         "size unknown for source 'clicks'"),
        ({"clicks": (None, 10)}, 0, False, True, False, "size unknown for source 'clicks'"),
        ({"x": None, "y": None}, 0, False, True, False, "size unknown for source 'x'"),
        ({"x": (-3, None)}, 0, False, True, False,
         "size unknown for source 'x' (negative: (-3, None))"),
        # too many items, too many bytes (unknown bytes count by items only)
        ({"a": (90, None), "b": (11, None)}, 0, False, True, False, "large: 101 items > 100"),
        ({"a": (9000, 5)}, 0, False, True, False, "large: 9000 items > 100"),
        ({"a": (2, 700), "b": (2, 301)}, 0, False, True, False, "large: 1001 bytes > 1000"),
        ({"a": (2, 900), "b": (2, None)}, 0, False, True, True, "small: 4 items, 900 bytes"),
        # state: the driver's own budget while it holds some, the cold one while it holds none
        ({"a": (1, None)}, 500, True, True, True, "small: 1 items"),
        ({"a": (1, None)}, 501, True, True, False,
         "large state: 501 bytes > 500 (driver_state_bytes)"),
        ({"a": (1, None)}, 50, False, True, True, "small: 1 items"),
        ({"a": (1, None)}, 51, False, True, False,
         "large state: 51 bytes > 50 (cold_state_bytes: the driver holds none of it)"),
        # the first rule that fails is the one given
        ({"a": None}, 10**9, False, False, False, "adaptive micro-batches off"),
        ({"a": (10**6, 10**9)}, 10**9, True, True, False, "large: 1000000 items > 100"),
    ],
)
def test_the_choice_and_its_reason(
    sizes: dict[str, PlannedSize], state: int, warm: bool, on: bool, local: bool, reason: str
) -> None:
    assert choose(sizes, state=state, warm=warm, on=on) == (local, reason)


def test_the_default_thresholds() -> None:
    engine = EngineSettings()
    assert choose({"a": (5000, 4 << 20)}, engine=engine)[0] is True
    assert choose({"a": (5001, None)}, engine=engine) == (False, "large: 5001 items > 5000")
    assert choose({"a": (1, (4 << 20) + 1)}, engine=engine)[0] is False
    assert choose({"a": (1, 1)}, state=256 << 20, warm=True, engine=engine)[0] is True
    assert choose({"a": (1, 1)}, state=(32 << 20) + 1, engine=engine)[0] is False


def test_zero_limits_let_only_empty_batches_run_on_the_driver() -> None:
    zero = EngineSettings(local_max_items=0, local_max_bytes=0, cold_state_bytes=0)
    assert choose({"a": (0, 0)}, engine=zero) == (True, "small: 0 items")
    assert choose({"a": (1, None)}, engine=zero) == (False, "large: 1 items > 0")
    assert choose({"a": (0, 0)}, state=1, engine=zero)[0] is False


def test_a_named_tuple_size_is_a_size() -> None:
    from typing import NamedTuple

    class Size(NamedTuple):  # the shape of contracts.InputSize
        items: int | None
        bytes: int | None

    assert choose({"a": Size(3, 30)}) == (True, "small: 3 items, 30 bytes")
    assert choose({"a": Size(None, 30)}) == (False, "size unknown for source 'a'")


def test_the_job_setting_overrides_the_configuration() -> None:
    on, off = EngineSettings(), EngineSettings(adaptive=False)
    assert resolve_adaptive(None, on) is True
    assert resolve_adaptive(None, off) is False
    assert resolve_adaptive(False, on) is False
    assert resolve_adaptive(True, off) is True
    assert resolve_adaptive(JobConfig().adaptive_micro_batches, off) is False


# --- a property: more input never moves a batch from Spark to the driver -------------------

#: Thresholds small enough that random sizes land on both sides of them, and on them.
TINY = EngineSettings(local_max_items=10, local_max_bytes=20, driver_state_bytes=8,
                      cold_state_bytes=4)
_size = st.one_of(
    st.none(),
    st.tuples(st.one_of(st.none(), st.integers(0, 8)), st.one_of(st.none(), st.integers(0, 12))),
)
_sizes = st.dictionaries(st.sampled_from("abcd"), _size, max_size=4)


@settings(max_examples=300, deadline=None)
@given(sizes=_sizes, state=st.integers(0, 10), warm=st.booleans(),
       source=st.sampled_from("abcde"), more_items=st.integers(0, 6),
       more_bytes=st.one_of(st.none(), st.integers(0, 8)))
def test_adding_items_never_turns_spark_into_local(
    sizes: dict[str, PlannedSize], state: int, warm: bool, source: str, more_items: int,
    more_bytes: int | None,
) -> None:
    before, _ = choose(sizes, state=state, warm=warm, engine=TINY)
    grown = dict(sizes)
    old = grown.get(source, (0, None))
    if old is not None and old[0] is not None:  # a known size grows; a new source adds one
        grown[source] = (old[0] + more_items, None if old[1] is None and more_bytes is None
                         else (old[1] or 0) + (more_bytes or 0))
    after, why = choose(grown, state=state, warm=warm, engine=TINY)
    if not before:
        assert not after, (sizes, grown, why)


def test_a_source_that_cannot_say_its_size_is_unknown_and_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from sparkjet.core.engine.adaptive import ask_sizes

    def broken() -> None:
        raise OSError("listing refused")

    sizes = ask_sizes({"clicks": lambda: (3, None), "orders": broken})
    assert sizes == {"clicks": (3, None), "orders": None}
    assert "source 'orders' could not say how big its read is (OSError: listing refused)" in (
        caplog.text)
    assert choose_local(sizes, state_bytes=0, driver_holds_state=False,
                        settings=EngineSettings(), enabled=True) == (
        False, "size unknown for source 'orders'")


@pytest.mark.parametrize(
    ("sizes", "state", "warm", "worth"),
    [
        # on Spark only because the driver holds none of a state that fits it: warm it
        ({"a": (1, None)}, 51, False, True),
        ({"a": (1, None)}, 500, False, True),
        # the driver holds some already, or the state is small enough to read cold
        ({"a": (1, None)}, 51, True, False),
        ({"a": (1, None)}, 50, False, False),
        ({"a": (1, None)}, 0, False, False),
        # too big for the driver, or the batch itself goes to Spark
        ({"a": (1, None)}, 501, False, False),
        ({"a": (101, None)}, 51, False, False),
        ({"a": (2, 1001)}, 51, False, False),
        ({"a": None}, 51, False, False),
    ],
)
def test_a_state_is_worth_warming_when_it_alone_keeps_a_batch_off_the_driver(
    sizes: Mapping[str, PlannedSize], state: int, warm: bool, worth: bool
) -> None:
    assert worth_warming(sizes, state_bytes=state, driver_holds_state=warm,
                         settings=SMALL) is worth
    if worth:  # the batch goes to Spark now, and would run here were the state warm
        assert not choose(sizes, state=state, warm=False)[0]
        assert choose(sizes, state=state, warm=True)[0]
