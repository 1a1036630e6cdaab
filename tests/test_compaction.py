"""Compaction off the critical path: chains folded into full copies by a child process."""

from __future__ import annotations

import io
import time
from pathlib import Path

import cloudpickle
import pytest

from sparkjet.core.state import compaction
from sparkjet.core.state.files import COMPACT_EVERY, COMPACT_LIMIT, StatePaths
from sparkjet.core.state.versions import StateVersion
from sparkjet.core.store.fs import Store


@pytest.fixture
def paths(tmp_path: Path) -> StatePaths:
    return StatePaths(Store(str(tmp_path)), str(tmp_path / "state"), key_groups=4)


def run_batches(paths: StatePaths, first: int, last: int, background: bool = True) -> list[str]:
    """Batches ``first..last`` each set one new key of range [0, 2); the kinds written."""
    kinds = []
    for batch in range(first, last + 1):
        versions = paths.versions("s", 0, 2)
        state, _ = paths.read("s", 0, 2, committed=batch - 1)
        state.values.setdefault("base", list(range(100)))
        state.values[f"new{batch}"] = batch
        after = paths.write("s", 0, 2, batch, state, [f"new{batch}"], [], versions,
                            background=background)
        kinds.append("F" if after.chain[-1].full else "d")
    return kinds


def expected(last: int) -> dict[str, object]:
    return {"base": list(range(100))} | {f"new{b}": b for b in range(1, last + 1)}


def test_with_background_compaction_the_task_writes_changelogs_up_to_the_limit(
    paths: StatePaths,
) -> None:
    kinds = run_batches(paths, 1, COMPACT_LIMIT + 1)
    assert "".join(kinds) == "F" + "d" * (COMPACT_LIMIT - 1) + "F"


def test_compact_folds_the_committed_chain_into_one_full_copy(paths: StatePaths) -> None:
    run_batches(paths, 1, COMPACT_EVERY + 2)
    committed = COMPACT_EVERY + 1  # batch COMPACT_EVERY + 2 is not committed yet
    before = paths.chain(paths.versions("s"), committed, 0, 2)
    written = paths.compact("s", 0, 2, committed)
    assert written is not None and written.full and written.batch == committed
    assert written.keys == len(expected(committed))
    # A reader as of the committed batch takes the copy alone; as of the next, plus its changelog.
    assert paths.chain(paths.versions("s"), committed, 0, 2) == [written]
    state, _ = paths.read("s", 0, 2, committed)
    assert state.values == expected(committed)
    state, _ = paths.read("s", 0, 2, committed + 1)
    assert state.values == expected(committed + 1)
    assert StatePaths.newer_files(before, [written]) == []
    # Nothing was removed; the range's next write removes what the copy replaces.
    assert set(before) <= set(paths.versions("s"))
    run_batches(paths, committed + 2, committed + 2)
    left = paths.versions("s")
    assert min(v.batch for v in left) == committed
    assert paths.read("s", 0, 2, committed + 2)[0].values == expected(committed + 2)
    # Nothing more to fold right after a compaction: a single full copy stays as it is.
    assert paths.compact("s", 0, 2, committed) is None


def test_kept_state_is_caught_up_only_along_the_listed_chain() -> None:
    def v(batch: int, full: bool, name: str = "", lo: int = 0, hi: int = 2) -> StateVersion:
        return StateVersion(batch, 1, name or f"{batch}{'F' if full else 'd'}", full, 9, lo, hi)

    newer = StatePaths.newer_files
    kept = [v(1, True), v(2, False), v(3, False), v(4, False)]
    assert newer(kept, kept) == []
    assert newer(kept, [*kept, v(5, False), v(6, False)]) == [v(5, False), v(6, False)]
    assert newer(kept, [v(3, True), v(4, False)]) == []  # compacted from a prefix
    assert newer(kept, [v(4, True)]) == []
    assert newer(kept, [v(3, True), v(4, False), v(5, False)]) == [v(5, False)]
    assert newer(kept, [v(4, True), v(5, False)]) == [v(5, False)]
    assert newer(kept, [v(3, True)]) is None  # batch 4's changelog missing
    assert newer(kept, [v(2, True), v(4, False)]) is None  # batch 3 missing
    assert newer(kept, [v(3, True), v(4, False, "other attempt")]) is None
    assert newer(kept, [v(3, True, lo=0, hi=1), v(4, False)]) is None
    assert newer(kept, [v(5, True)]) is None  # a full copy kept never reached
    assert newer(kept, [*kept, v(5, True)]) is None
    assert newer(kept, [v(3, False), v(4, False)]) is None
    assert newer(kept, []) is None
    assert newer(kept[:2], kept[1:]) is None


def test_catch_up_applies_only_the_newer_changelogs(paths: StatePaths) -> None:
    run_batches(paths, 1, 3)
    kept, _ = paths.read("s", 0, 2, committed=3)
    run_batches(paths, 4, 6)  # "another worker" ran batches 4 to 6
    listed = paths.chain(paths.versions("s"), 6, 0, 2)
    caught = paths.catch_up("s", 0, 2, kept, listed)
    assert caught is not None and caught.values == expected(6) and caught.chain == listed
    assert paths.catch_up("s", 0, 2, paths.read("s", 0, 2, 6)[0], listed[:2]) is None


def test_a_child_process_compacts_and_one_range_runs_one_child(paths: StatePaths) -> None:
    run_batches(paths, 1, COMPACT_EVERY + 1)
    assert compaction.shared(paths)
    assert compaction.due(paths.chain(paths.versions("s"), COMPACT_EVERY + 1, 0, 2))
    assert compaction.start(paths, "s", 0, 2, COMPACT_EVERY + 1)
    assert not compaction.start(paths, "s", 0, 2, COMPACT_EVERY + 1)  # already under way
    deadline = time.monotonic() + 60
    while compaction.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert compaction.running() == 0
    chain = paths.chain(paths.versions("s"), COMPACT_EVERY + 1, 0, 2)
    assert [(v.batch, v.full) for v in chain] == [(COMPACT_EVERY + 1, True)]
    assert paths.read("s", 0, 2, COMPACT_EVERY + 1)[0].values == expected(COMPACT_EVERY + 1)


def test_a_failed_compaction_names_the_stage_and_file_and_changes_nothing(
    paths: StatePaths, capsys: pytest.CaptureFixture[str]
) -> None:
    run_batches(paths, 1, COMPACT_EVERY + 1)
    versions = paths.versions("s")
    damaged = versions[3]
    truncated = paths.store.read_bytes(paths.path("s", damaged))[:10]
    paths.store.write_bytes(paths.path("s", damaged), truncated)
    request = cloudpickle.dumps((paths, "s", 0, 2, COMPACT_EVERY + 1))
    assert compaction.main(io.BytesIO(request)) == 1
    err = capsys.readouterr().err
    assert "compaction of stage 's' key groups [0, 2)" in err and damaged.name in err
    assert paths.versions("s") == versions  # no full copy written, nothing removed


def test_a_store_other_processes_cannot_see_compacts_inline() -> None:
    paths = StatePaths(Store("memory://sparkjet-compaction-test"), "/cp/state", key_groups=4)
    assert not compaction.shared(paths)



@pytest.mark.parametrize("other_as_of", [COMPACT_EVERY, COMPACT_EVERY + 2])
def test_a_compaction_whose_changelogs_are_pruned_under_it_skips_quietly(
    paths: StatePaths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture, other_as_of: int,
) -> None:
    """Two compactions of one range from two processes (the driver's and a Spark worker's).

    Each process runs one compaction per range at a time, but not two processes:
    the first lists the chain as of batch 11 and reads its full copy; meanwhile
    the other folds the chain as of ``other_as_of``, and batch 13's task, reading
    that copy, removes the files it replaces (:meth:`StatePaths.write`): the first
    then finds a changelog gone (``FileNotFoundError`` on a ``.delta``).
    """
    run_batches(paths, 1, COMPACT_EVERY + 2)  # batch 1 a full copy, 2 to 12 changelogs
    committed = COMPACT_EVERY + 1
    load = StatePaths._load
    raced: list[StateVersion] = []

    def racing_load(self: StatePaths, stage: str, version: StateVersion) -> object:
        data = load(self, stage, version)
        if not raced:  # after the first file: the other compaction, then the next batch
            raced.append(version)
            other = self.compact("s", 0, 2, other_as_of)
            assert other is not None and other.batch == other_as_of
            run_batches(self, COMPACT_EVERY + 3, COMPACT_EVERY + 3)
        return data

    monkeypatch.setattr(StatePaths, "_load", racing_load)
    caplog.set_level("DEBUG", logger="sparkjet")
    request = cloudpickle.dumps((paths, "s", 0, 2, committed))
    assert compaction.main(io.BytesIO(request)) == 0
    assert raced and raced[0].full
    assert capsys.readouterr().err == ""  # not a failure: the chain was superseded
    assert any("superseded" in r.getMessage() and r.levelname == "DEBUG"
               for r in caplog.records if r.name.startswith("sparkjet"))
    # It wrote nothing; the state is the other's copy and the changelogs after it.
    last = COMPACT_EVERY + 3
    chain = paths.chain(paths.versions("s"), last, 0, 2)
    assert [(v.batch, v.full) for v in chain] == [(other_as_of, True)] + [
        (b, False) for b in range(other_as_of + 1, last + 1)]
    assert [v for v in paths.versions("s") if v.full] == chain[:1]
    assert paths.read("s", 0, 2, last)[0].values == expected(last)


def test_a_changelog_gone_with_no_later_full_copy_is_still_a_failure(
    paths: StatePaths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    run_batches(paths, 1, COMPACT_EVERY + 1)
    versions = paths.versions("s")
    lost = versions[3]
    load = StatePaths._load

    def losing_load(self: StatePaths, stage: str, version: StateVersion) -> object:
        if version == versions[1]:  # no write removed it: state is missing
            self.store.remove(self.path(stage, lost))
        return load(self, stage, version)

    monkeypatch.setattr(StatePaths, "_load", losing_load)
    request = cloudpickle.dumps((paths, "s", 0, 2, COMPACT_EVERY + 1))
    assert compaction.main(io.BytesIO(request)) == 1
    err = capsys.readouterr().err
    assert "compaction of stage 's' key groups [0, 2)" in err
    assert "FileNotFoundError" in err and lost.name in err
    assert [v for v in paths.versions("s") if v.full] == versions[:1]


def test_a_chain_a_later_full_copy_replaces_is_not_folded(paths: StatePaths) -> None:
    """A copy as of batch 12 when batch 13's full copy stands would never be read.

    Nor is it read from files the writes after that copy are removing: here a
    changelog that updated a key, not added one, is gone, which the key counts
    would not show.
    """
    run_batches(paths, 1, 4)
    state, _ = paths.read("s", 0, 2, committed=4)
    state.values["base"] = "updated"
    paths.write("s", 0, 2, 5, state, ["base"], [], paths.versions("s"), background=True)
    run_batches(paths, 6, COMPACT_EVERY + 2)
    assert paths.read("s", 0, 2, COMPACT_EVERY + 2)[0].values["base"] == "updated"
    run_batches(paths, COMPACT_EVERY + 3, COMPACT_EVERY + 3, background=False)  # a full copy
    full = paths.versions("s")[-1]
    assert full.full and full.batch == COMPACT_EVERY + 3
    fifth = next(v for v in paths.versions("s") if v.batch == 5)
    paths.store.remove(paths.path("s", fifth))
    before = paths.versions("s")
    assert paths.compact("s", 0, 2, COMPACT_EVERY + 2) is None
    assert paths.versions("s") == before


def test_a_pinned_chain_is_folded_though_a_later_full_copy_stands(paths: StatePaths) -> None:
    """A snapshot export of batch 12 (pinned: its files stay) has its chain folded all the same."""
    run_batches(paths, 1, COMPACT_EVERY + 2)
    run_batches(paths, COMPACT_EVERY + 3, COMPACT_EVERY + 3, background=False)  # a full copy
    assert paths.compact("s", 0, 2, COMPACT_EVERY + 2) is None
    written = paths.with_pin(COMPACT_EVERY + 2).compact("s", 0, 2, COMPACT_EVERY + 2)
    assert written is not None and written.full and written.batch == COMPACT_EVERY + 2
    assert paths.read("s", 0, 2, COMPACT_EVERY + 2)[0].values == expected(COMPACT_EVERY + 2)
