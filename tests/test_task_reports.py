"""What tasks report, merged by engine-neutral rules (sparkjet.core.engine.tasks.reports)."""

from __future__ import annotations

import threading

from sparkjet.core.engine.tasks.reports import (
    Counters,
    RangeReport,
    merge_counts,
    merge_dead_letters,
    merge_event_times,
    merge_state_ranges,
)
from sparkjet.core.model import StageCount
from sparkjet.core.state.versions import StateRange


def test_counts_add_up() -> None:
    a, b, c_dead = StageCount("a", "items"), StageCount("b", "items"), StageCount("c", "dead")
    left = {a: 1, b: 2}
    assert merge_counts(left, {b: 3, c_dead: 1, StageCount("b", "late"): 4}) is left
    assert left == {a: 1, b: 5, c_dead: 1, StageCount("b", "late"): 4}


def test_the_highest_event_time_wins() -> None:
    left = {("src", 0): 10, ("src", 1): 30}
    merge_event_times(left, {("src", 0): 20, ("src", 1): 5, ("other", 0): 7})
    assert left == {("src", 0): 20, ("src", 1): 30, ("other", 0): 7}


def test_a_task_run_again_replaces_its_own_letters() -> None:
    left = {("map", 0, 0): {"item": 1}, ("map", 1, 0): {"item": 2}}
    merge_dead_letters(left, {("map", 0, 0): {"item": "again"}})
    assert left == {("map", 0, 0): {"item": "again"}, ("map", 1, 0): {"item": 2}}


def test_of_two_attempts_at_a_range_the_first_by_file_name_wins() -> None:
    key = StateRange("counts", 0, 8)
    left = {key: RangeReport(3, 30, "b")}
    merge_state_ranges(left, {key: RangeReport(4, 40, "a")})
    merge_state_ranges(left, {key: RangeReport(5, 50, "c")})
    assert left == {key: RangeReport(4, 40, "a")}


def test_counters_merge_reports_from_many_threads() -> None:
    counters = Counters()
    key = StateRange("counts", 0, 8)
    stage = StageCount("stage", "items")

    def task(pidx: int) -> None:
        for _ in range(200):
            counters.count({stage: 1})
        counters.event_time({("src", pidx % 2): pidx})
        counters.dead({("map", pidx, 0): {"pidx": pidx}})
        counters.state_range({key: RangeReport(pidx, pidx, f"f{pidx:02}")})

    threads = [threading.Thread(target=task, args=(p,)) for p in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reported = counters.snapshot()
    assert reported.counts == {stage: 1600}
    assert reported.event_times == {("src", 0): 6, ("src", 1): 7}
    assert sorted(reported.dead_letters) == [("map", p, 0) for p in range(8)]
    assert reported.state_ranges == {key: RangeReport(0, 0, "f00")}
    reported.counts[stage] = 0  # a copy
    assert counters.snapshot().counts == {stage: 1600}
    counters.forget_letters()
    assert counters.snapshot().dead_letters == {}


def test_counters_drop_what_they_do_not_collect() -> None:
    counters = Counters(counting=False, timing=False)
    assert not counters.counting
    counters.count({StageCount("stage", "items"): 1})
    counters.event_time({("src", 0): 1})
    assert counters.snapshot().counts == {}
    assert counters.snapshot().event_times == {}
