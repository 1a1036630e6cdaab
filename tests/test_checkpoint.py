"""The checkpoint format, pinned: file names and contents a resumed job must still read.

Paths here are written out literally, not built with the module's helpers,
so a change to the format fails these tests (a job checkpointed before the
change would not resume after it).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import cloudpickle
import pytest

from sparkjet.core.errors import StoreError
from sparkjet.core.model import StageCount
from sparkjet.core.state.checkpoint import FORMAT, BatchPlan, Checkpoint, CommitRecord, RestoredFrom
from sparkjet.core.state.files import COMPACT_EVERY, RangeState, StatePaths
from sparkjet.core.state.keygroups import KeyGroupPartition, key_group, stable_hash, task_range
from sparkjet.core.state.versions import StateRange, StateVersion
from sparkjet.core.store.fs import Store
from sparkjet.core.store.naming import encode_name


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(str(tmp_path))  # the checkpoints below live in it


def files(root: str) -> set[str]:
    return {p.relative_to(root).as_posix() for p in Path(root).rglob("*") if p.is_file()}


def test_checkpoint_files_and_contents(store: Store, tmp_path: Path) -> None:
    root = str(tmp_path / "cp")
    cp = Checkpoint(store, root)
    assert cp.meta() is None
    assert cp.last_commit() == -1
    assert cp.planned(0) is None
    assert cp.key_groups(3, ["b", "a"]) == 3
    assert cp.key_groups(8, ["other"]) == 3  # fixed on first use
    plan = {"batch": 0, "starts": {"s": 0}, "ends": {"s": 5}, "time": 1, "tasks": 2}
    assert cp.write_plan(BatchPlan(0, {"s": 0}, {"s": 5}, 1, 2)) == BatchPlan.from_json(plan)
    cp.write_commit(CommitRecord(0, {"s": 5}, 2, 3))
    assert files(root) == {
        "meta.json",
        "offsets/00000000000000000000.json",
        "commits/00000000000000000000.json",
    }
    meta = json.loads((tmp_path / "cp" / "meta.json").read_text())
    assert meta == {"format": 4, "key_groups": 3, "stages": ["a", "b"]}
    assert json.loads((tmp_path / "cp/offsets/00000000000000000000.json").read_text()) == plan
    planned = cp.planned(0)
    assert planned == BatchPlan(0, {"s": 0}, {"s": 5}, 1, 2)
    assert planned.source_ranges() == {"s": (0, 5)}
    assert json.loads((tmp_path / "cp/commits/00000000000000000000.json").read_text()) == {
        "ends": {"s": 5}, "time": 2, "duration_ms": 3}
    assert cp.last_commit() == 0
    assert cp.commit_record(0) == CommitRecord(0, {"s": 5}, 2, 3)
    assert cp.state_root == f"{root}/state"
    assert cp.state(3).root == f"{root}/state"
    assert cp.state(3).key_groups == 3
    cp.delete()
    assert not (tmp_path / "cp").exists()


def test_commit_records_name_state_files_by_stage_and_range(
    store: Store, tmp_path: Path
) -> None:
    """The typed record keeps the JSON of format 4: ``{stage: {"<lo>-<hi>": name}}``."""
    cp = Checkpoint(store, str(tmp_path / "scratch-0a1b2c3d"))
    assert cp.id == "scratch-0a1b2c3d"
    files = {StateRange("count", 0, 2): "a.state", StateRange("count", 2, 4): ""}
    record = CommitRecord(0, {"s": [3]}, 5, 6, files, RestoredFrom("snap", 7, "old-job"))
    assert cp.write_commit(record)
    assert json.loads((tmp_path / "scratch-0a1b2c3d/commits/00000000000000000000.json")
                      .read_text()) == {
        "ends": {"s": [3]}, "time": 5, "duration_ms": 6,
        "state": {"count": {"0-2": "a.state", "2-4": ""}},
        "restored_from": {"snapshot": "snap", "batch": 7, "job_id": "old-job"},
    }
    assert cp.commit_record(0) == record
    assert cp.counted() == {0: files}
    assert not cp.write_commit(CommitRecord(0, {"s": [9]}))  # create-only


def test_at_least_the_last_ten_committed_batches_keep_their_log(
    store: Store, tmp_path: Path
) -> None:
    root = str(tmp_path / "cp")
    cp = Checkpoint(store, root)
    for batch in range(13):
        cp.write_plan(BatchPlan(batch, {}, {}, 0, 1))
        cp.write_commit(CommitRecord(batch, {}))
    kept = sorted(p for p in files(root) if p.startswith("commits/"))
    assert kept == [f"commits/{b:020d}.json" for b in range(1, 13)]  # pruned every 10th batch
    assert cp.last_commit() == 12


def test_reads_a_checkpoint_written_by_hand_in_the_format(store: Store, tmp_path: Path) -> None:
    cp_dir = tmp_path / "old"
    (cp_dir / "commits").mkdir(parents=True)
    (cp_dir / "offsets").mkdir()
    (cp_dir / "meta.json").write_text('{"format": 1, "shards": 2, "stages": ["x"]}')
    (cp_dir / "offsets/00000000000000000004.json").write_text('{"batch": 4, "ends": {"s": 9}}')
    (cp_dir / "commits/00000000000000000003.json").write_text('{"ends": {"s": 7}}')
    shard = cp_dir / "state" / encode_name("stage", "count by key") / "0001"
    shard.mkdir(parents=True)
    state = {"values": {"k": ("k", 5)}, "touched": {"k": 123}}
    (shard / "00000000000000000002-1.state").write_bytes(cloudpickle.dumps(state))
    (shard / "00000000000000000004-1.state").write_bytes(b"left by a failed attempt")

    cp = Checkpoint(store, str(cp_dir))
    assert cp.key_groups(16, ["x"]) == 2  # its shards are its key groups
    assert cp.last_commit() == 3
    assert cp.commit_record(3) == CommitRecord(3, {"s": 7})
    planned = cp.planned(4)
    assert planned == BatchPlan(4, {}, {"s": 9}, 0, None)
    assert planned.state_tasks(2) == 2  # planned before tasks were: one per key group
    paths = cp.state(2)
    assert paths.path("count by key", paths.versions("count by key", 1, 2)[0]) == str(
        shard / "00000000000000000002-1.state")
    assert paths.versions("count by key", 1, 2) == [  # format-1 names carry no size
        StateVersion(2, 1, "00000000000000000002-1.state", True, -1, 1, 2, "0001"),
        StateVersion(4, 1, "00000000000000000004-1.state", True, -1, 1, 2, "0001"),
    ]
    assert paths.versions("count by key", 0, 1) == []
    chain = StatePaths.chain(paths.versions("count by key", 1, 2), 3, 1, 2)
    assert [v.name for v in chain] == ["00000000000000000002-1.state"]
    read, size = paths.read("count by key", 1, 2, committed=3)
    assert (read.values, read.touched) == (state["values"], state["touched"])
    assert size == paths.size("count by key", chain[-1]) == len(cloudpickle.dumps(state))


def test_totals_of_a_pre_typed_commit_record_load_typed_and_are_written_byte_equal(
    store: Store, tmp_path: Path
) -> None:
    # A commit record as sparkjet wrote it when counts were keyed by strings: a
    # stage's items under its name, its dead letters and late items under the name,
    # the unit separator and the kind.
    old = (b'{"ends": {"s": 7}, "time": 5, "duration_ms": 2, "totals": {"s": 7, '
           b'"parse": 6, "parse\\u001fdead": 1, "w": 3, "w\\u001flate": 2}}')
    (tmp_path / "old" / "commits").mkdir(parents=True)
    (tmp_path / "old/commits/00000000000000000003.json").write_bytes(old)
    record = Checkpoint(store, str(tmp_path / "old")).commit_record(3)
    assert record.totals == {
        StageCount("s", "items"): 7, StageCount("parse", "items"): 6,
        StageCount("parse", "dead"): 1, StageCount("w", "items"): 3,
        StageCount("w", "late"): 2,
    }
    again = Checkpoint(store, str(tmp_path / "new"))
    assert again.write_commit(record)
    assert (tmp_path / "new/commits/00000000000000000003.json").read_bytes() == old
    assert again.commit_record(3) == record


def test_totals_of_an_unknown_kind_are_refused_by_name(store: Store, tmp_path: Path) -> None:
    (tmp_path / "cp" / "commits").mkdir(parents=True)
    (tmp_path / "cp/commits/00000000000000000000.json").write_text(
        '{"ends": {}, "totals": {"parse\\u001fgone": 1}}')
    with pytest.raises(StoreError, match=r"00000000000000000000\.json.*parse\\x1fgone"):
        Checkpoint(store, str(tmp_path / "cp")).commit_record(0)


def test_a_format_2_checkpoint_goes_on_in_the_flat_layout_with_fewer_tasks(
    store: Store, tmp_path: Path
) -> None:
    cp_dir = tmp_path / "old"
    stage = cp_dir / "state" / encode_name("stage", "s")
    (cp_dir / "meta.json").parent.mkdir(parents=True)
    (cp_dir / "meta.json").write_text('{"format": 2, "shards": 2, "stages": ["s"]}')
    for shard in (0, 1):  # format 2: a full copy, then a changelog, per shard folder
        keys = [k for k in ("a", "b", "c", "d", "e") if stable_hash(k) % 2 == shard]
        (stage / f"{shard:04d}").mkdir(parents=True)
        full = cloudpickle.dumps({"values": {k: 1 for k in keys}, "touched": {}})
        delta = cloudpickle.dumps({"set": {keys[0]: 2}, "touched": {}, "removed": keys[1:2]})
        for name, data in ((f"{1:020d}-{len(keys)}-{len(full)}.state", full),
                           (f"{2:020d}-{len(keys) - 1}-{len(delta)}.delta", delta)):
            (stage / f"{shard:04d}" / name).write_bytes(data)
    cp = Checkpoint(store, str(cp_dir))
    paths = cp.state(cp.key_groups(128, ["s"]))
    # One task now owns both key groups (old shards): it reads both folders.
    state, _ = paths.read("s", 0, 2, committed=2)
    expected = {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}
    for shard in (0, 1):
        keys = [k for k in expected if stable_hash(k) % 2 == shard]
        expected[keys[0]] = 2
        del expected[keys[1]]
    assert state.values == expected
    # Its next batch writes a full copy of both, in the flat layout.
    after = paths.write("s", 0, 2, 3, state, [], [], paths.versions("s", 0, 2))
    assert [v.name for v in after.chain] == [
        f"{3:020d}-00000-00002-{len(expected)}-{after.chain[0].size}-"
        f"{after.chain[0].attempt}.state"
    ]
    assert len(after.chain[0].attempt) == 8
    assert paths.read("s", 0, 2, committed=3)[0].values == expected
    assert paths.read("s", 1, 2, committed=3)[0].values == {
        k: v for k, v in expected.items() if stable_hash(k) % 2 == 1
    }
    # The shard folders' files are superseded now (sparkjet gc removes them).
    assert {v.folder for v in paths.superseded("s", 3)} == {"0000", "0001"}
    assert len(paths.superseded("s", 3)) == 4


def test_a_checkpoint_of_a_newer_format_is_refused(store: Store, tmp_path: Path) -> None:
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "meta.json").write_text(
        json.dumps({"format": FORMAT + 1, "key_groups": 4, "stages": []})
    )
    with pytest.raises(StoreError, match=rf"has format {FORMAT + 1}; .*up to {FORMAT}"):
        Checkpoint(store, str(tmp_path / "new")).key_groups(128, [])


def test_state_versions_written_and_superseded(store: Store, tmp_path: Path) -> None:
    paths = StatePaths(store, str(tmp_path / "state"), key_groups=1)
    folder = Path(paths.stage_dir("s"))
    assert folder == tmp_path / "state" / encode_name("stage", "s")

    def names() -> list[str]:
        return sorted(p.name for p in folder.iterdir())

    def step(batch: int, committed: int, changes: dict[str, int], drop: list[str]) -> RangeState:
        versions = paths.versions("s")
        state = paths.read_chain("s", 0, 1, StatePaths.chain(versions, committed, 0, 1))
        for key in drop:
            del state.values[key]
        state.values.update({k: (k, v) for k, v in changes.items()})
        return paths.write("s", 0, 1, batch, state, list(changes), drop, versions)

    first = step(1, 0, dict.fromkeys("abcdwxyz", 1), [])  # nothing before: a full copy
    assert [v.name for v in first.chain] == [names()[0]]
    assert names()[0].startswith("00000000000000000001-00000-00001-8-")
    assert names()[0].endswith(".state")
    step(2, 1, {"a": 2}, [])  # one key of eight: a changelog
    step(3, 2, {"e": 1}, ["b"])
    assert [n.rsplit(".", 1)[1] for n in names()] == ["state", "delta", "delta"]
    delta = cloudpickle.loads((folder / names()[2]).read_bytes())
    assert delta == {"set": {"e": ("e", 1)}, "touched": {}, "removed": ["b"]}
    state, _ = paths.read("s", 0, 1, committed=3)
    assert state.values == {"a": ("a", 2), "e": ("e", 1)} | {k: (k, 1) for k in "cdwxyz"}
    assert paths.read("s", 0, 1, committed=2)[0].values["b"] == ("b", 1)

    # Two attempts of batch 4 write a file each, under names of their own; the
    # first holds other state (a non-deterministic function). The batch's commit
    # record names the second: readers take it and pass over the first, which is
    # removed before the record is, never under a reader.
    step(4, 3, {"f": 0}, [])
    second = step(4, 3, {"f": 1}, []).chain[-1]
    assert len(names()) == 5
    assert [n[:35] for n in names()[-2:]] == ["00000000000000000004-00000-00001-9-"] * 2
    counted = paths.with_counted({4: {StateRange("s", 0, 1): second.name}})
    assert [v.name for v in counted.versions("s") if v.batch == 4] == [second.name]
    assert counted.read("s", 0, 1, committed=4)[0].values["f"] == ("f", 1)
    # A record naming no file for the range: neither counts.
    assert not [v for v in paths.with_counted({4: {StateRange("s", 0, 1): ""}}).versions("s")
                if v.batch == 4]
    counted.remove_uncounted({3})  # other batches' files are not touched
    assert len(names()) == 5
    counted.remove_uncounted({4})
    assert len(names()) == 4 and second.name in names()
    assert paths.read("s", 0, 1, committed=4)[0].values["f"] == ("f", 1)

    # A batch that changes at least half the keys writes a full copy. The chain it
    # started from stays (batch 5 may be replayed from it) until a batch after it
    # writes: that one starts from the new copy, so the files before it go.
    step(5, 4, dict.fromkeys("acdef", 9), [])
    assert names()[-1].endswith(".state") and len(names()) == 5
    step(6, 5, {"a": 10}, [])
    assert [n.split("-")[0][-1] for n in names()] == ["5", "6"]
    step(7, 6, {"a": 11}, [])
    assert [n.split("-")[0][-1] for n in names()] == ["5", "6", "7"]
    assert paths.read("s", 0, 1, committed=7)[0].values["a"] == ("a", 11)


def test_a_pinned_batch_keeps_its_files_until_unpinned(store: Store, tmp_path: Path) -> None:
    """A snapshot export reads batch 1's state while batches 2 and 3 each write a full copy."""
    checkpoint = Checkpoint(store, str(tmp_path / "cp"))
    folder = tmp_path / "cp" / "state" / encode_name("stage", "s")

    def step(paths: StatePaths, batch: int) -> None:
        versions = paths.versions("s")
        state = paths.read_chain("s", 0, 1, StatePaths.chain(versions, batch - 1, 0, 1))
        state.values.update({"a": batch, "b": batch})  # every key: a full copy
        paths.write("s", 0, 1, batch, state, ["a", "b"], [], versions)

    def batches() -> list[int]:
        return sorted(int(p.name.split("-")[0]) for p in folder.iterdir())

    paths = checkpoint.state(1)
    step(paths, 1)
    token = checkpoint.pin(1)
    assert json.loads((tmp_path / "cp" / "pins" / f"{token}.json").read_bytes())["batch"] == 1
    assert checkpoint.pinned() == 1
    pinned = paths.with_pin(checkpoint.pinned())
    step(pinned, 2)
    step(pinned, 3)  # would remove batch 1's copy (3 read 2's), but 1 is pinned
    assert batches() == [1, 2, 3]
    assert pinned.with_counted({}).pinned == 1  # the pin survives with_counted
    assert [v.batch for v in pinned.superseded("s", 3)] == [2]  # nor does gc take 1's
    assert [v.batch for v in paths.superseded("s", 3)] == [1, 2]
    assert paths.read_chain("s", 0, 1, StatePaths.chain(paths.versions("s"), 1, 0, 1)
                            ).values == {"a": 1, "b": 1}
    checkpoint.unpin(token)
    assert checkpoint.pinned() == -1
    step(checkpoint.state(1).with_pin(checkpoint.pinned()), 4)  # unpinned: the old go
    assert batches() == [3, 4]
    # A driver starting the job removes the pins of exports that died with theirs.
    kept, stale = checkpoint.pin(4), checkpoint.pin(3)
    checkpoint.clear_pins(keep={kept})
    assert sorted(p.name for p in (tmp_path / "cp" / "pins").iterdir()) == [f"{kept}.json"]
    assert stale != kept and checkpoint.pinned() == 4


def test_state_carries_over_to_another_number_of_tasks(store: Store, tmp_path: Path) -> None:
    groups = 8
    paths = StatePaths(store, str(tmp_path / "state"), key_groups=groups)
    keys = [f"k{i}" for i in range(40)]

    def run(batch: int, tasks: int, add: int, only: list[str] = keys) -> dict[str, int]:
        """One batch with ``tasks`` tasks: the keys ``only`` + ``add``; the whole state after."""
        everything: dict[str, int] = {}
        versions = paths.versions("s")
        for task in range(tasks):
            lo, hi = task_range(task, tasks, groups)
            state, _ = paths.read("s", lo, hi, committed=batch - 1)
            assert all(lo <= key_group(k, groups) < hi for k in state.values)
            mine = [k for k in only if KeyGroupPartition(groups, tasks)(k) == task]
            for key in mine:
                state.values[key] = state.values.get(key, 0) + add
            own = all((v.lo, v.hi) == (lo, hi) for v in state.chain)
            if mine or not own:  # as a state task: no file when nothing changed
                paths.write("s", lo, hi, batch, state, mine, [], versions)
            everything |= paths.read("s", lo, hi, committed=batch)[0].values
        return everything

    def kinds(batch: int) -> str:
        return "".join(sorted("F" if v.full else "d" for v in paths.versions("s")
                              if v.batch == batch))

    assert run(1, 2, 1) == dict.fromkeys(keys, 1)
    assert run(2, 2, 1, keys[:4]) == dict.fromkeys(keys, 1) | dict.fromkeys(keys[:4], 2)
    assert kinds(2) == "dd"  # changelogs of the two ranges
    assert run(3, 2, 1, keys[4:]) == dict.fromkeys(keys, 2)
    assert run(4, 3, 10, keys[:1]) == dict.fromkeys(keys, 2) | {"k0": 12}
    assert kinds(4) == "FFF"  # three ranges from the two: full copies, changed or not
    assert run(5, 1, 100) == dict.fromkeys(keys, 102) | {"k0": 112}  # one from the three
    assert run(6, 4, 1000) == dict.fromkeys(keys, 1102) | {"k0": 1112}
    assert run(7, 4, 1, keys[:1]) == dict.fromkeys(keys, 1102) | {"k0": 1113}
    assert kinds(7) == "d"  # only k0's range changed
    # Batch 7's state needs batch 6's full copies and batch 7's changelog only.
    live = {(v.batch, v.lo, v.hi) for v in paths.versions("s")} - {
        (v.batch, v.lo, v.hi) for v in paths.superseded("s", 7)
    }
    k0 = task_range(KeyGroupPartition(groups, 4)("k0"), 4, groups)
    assert live == {(6, *task_range(t, 4, groups)) for t in range(4)} | {(7, *k0)}
    for version in paths.superseded("s", 7):
        store.remove(paths.path("s", version))
    assert run(8, 2, 1) == dict.fromkeys(keys, 1103) | {"k0": 1114}


@pytest.mark.parametrize(("tasks", "groups"), [(1, 1), (2, 128), (3, 128), (7, 10), (10, 10)])
def test_key_groups_go_to_the_task_whose_range_holds_them(tasks: int, groups: int) -> None:
    ranges = [task_range(t, tasks, groups) for t in range(tasks)]
    assert ranges[0][0] == 0 and ranges[-1][1] == groups
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    partition = KeyGroupPartition(groups, tasks)
    for key in range(500):
        lo, hi = ranges[partition(key)]
        assert lo <= key_group(key, groups) < hi


def test_a_full_copy_at_least_every_compact_every_batches(store: Store, tmp_path: Path) -> None:
    paths = StatePaths(store, str(tmp_path / "state"), key_groups=4)
    kinds = []
    for batch in range(1, 2 * COMPACT_EVERY + 2):
        versions = paths.versions("s", 0, 2)
        state, _ = paths.read("s", 0, 2, committed=batch - 1)
        state.values.setdefault("base", list(range(100)))
        state.values[f"new{batch}"] = batch
        after = paths.write("s", 0, 2, batch, state, [f"new{batch}"], [], versions)
        kinds.append("F" if after.chain[-1].full else "d")
        assert len(after.chain) <= COMPACT_EVERY
    assert "".join(kinds) == "F" + ("d" * (COMPACT_EVERY - 1) + "F") * 2


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (None, 0),
        (1, 1),
        (1.0, 1),
        (True, 1),
        (2.5, 1152921504606846978),
        ("a", 3904355907),
        ("key-7", 3884915279),
        (b"xy", 3560423692),
        (("a", 1), 159160772619840),
        (frozenset({1, "b"}), 1908338680),
        ((None, ("x", b"z")), 129628617599107),
    ],
)
def test_stable_hash_is_pinned(key: object, expected: int) -> None:
    # Keys were assigned to key groups with these values; a change would lose state.
    assert stable_hash(key) == expected
    assert key_group(key, 128) == expected % 128


def test_a_commit_record_notes_where_its_batch_ran_and_older_ones_say_nothing() -> None:
    record = CommitRecord(3, {"s": 7}, 1, 2, engine="local")
    data = record.to_json()
    assert data["engine"] == "local"
    assert CommitRecord.from_json(3, data) == record
    del data["engine"]  # a record written before adaptive micro-batches
    assert CommitRecord.from_json(3, data).engine is None
    assert "engine" not in CommitRecord(3, {"s": 7}).to_json()
