"""The checkpoint format, pinned: file names and contents a resumed job must still read.

Paths here are written out literally, not built with the module's helpers,
so a change to the format fails these tests (a job checkpointed before the
change would not resume after it).
"""

from __future__ import annotations

import json
from pathlib import Path

import cloudpickle
import pytest

from sparkjet.core.checkpoint import (
    COMPACT_EVERY,
    Checkpoint,
    ShardState,
    StablePartition,
    StatePaths,
    StateVersion,
    stable_hash,
)
from sparkjet.core.store import Store, encode_name


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
    assert cp.shards(3, ["b", "a"]) == 3
    assert cp.shards(8, ["other"]) == 3  # fixed on first use
    plan = {"batch": 0, "starts": {"s": 0}, "ends": {"s": 5}, "time": 1}
    cp.write_plan(0, plan)
    cp.write_commit(0, {"ends": {"s": 5}, "time": 2, "duration_ms": 3})
    assert files(root) == {
        "meta.json",
        "offsets/00000000000000000000.json",
        "commits/00000000000000000000.json",
    }
    meta = json.loads((tmp_path / "cp" / "meta.json").read_text())
    assert meta == {"format": 2, "shards": 3, "stages": ["a", "b"]}
    assert json.loads((tmp_path / "cp/offsets/00000000000000000000.json").read_text()) == plan
    assert cp.planned(0) == plan
    assert cp.last_commit() == 0
    assert cp.commit_record(0)["ends"] == {"s": 5}
    assert cp.state_root == f"{root}/state"
    assert cp.state().root == f"{root}/state"
    cp.delete()
    assert not (tmp_path / "cp").exists()


def test_only_the_last_ten_committed_batches_keep_their_log(store: Store, tmp_path: Path) -> None:
    root = str(tmp_path / "cp")
    cp = Checkpoint(store, root)
    for batch in range(13):
        cp.write_plan(batch, {"batch": batch})
        cp.write_commit(batch, {"ends": {}})
    kept = sorted(p for p in files(root) if p.startswith("commits/"))
    assert kept == [f"commits/{b:020d}.json" for b in range(3, 13)]
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
    assert cp.shards(16, ["x"]) == 2
    assert cp.last_commit() == 3
    assert cp.commit_record(3) == {"ends": {"s": 7}}
    assert cp.planned(4) == {"batch": 4, "ends": {"s": 9}}
    paths = cp.state()
    assert paths.shard_dir("count by key", 1) == str(shard)
    assert paths.versions("count by key", 1) == [  # format-1 names carry no size
        StateVersion(2, 1, "00000000000000000002-1.state", True, -1),
        StateVersion(4, 1, "00000000000000000004-1.state", True, -1),
    ]
    usable = paths.usable("count by key", 1, committed=3)
    assert usable == [StateVersion(2, 1, "00000000000000000002-1.state")]
    values, touched, size = paths.read("count by key", 1, usable[-1])
    assert (values, touched) == (state["values"], state["touched"])
    assert size == paths.size("count by key", 1, usable[-1])


def test_state_versions_written_and_superseded(store: Store, tmp_path: Path) -> None:
    paths = StatePaths(store, str(tmp_path / "state"))
    shard = Path(paths.shard_dir("s", 0))
    assert shard == tmp_path / "state" / encode_name("stage", "s") / "0000"

    def names() -> list[str]:
        return sorted(p.name for p in shard.iterdir())

    def step(batch: int, committed: int, changes: dict[str, int], drop: list[str]) -> ShardState:
        versions = paths.versions("s", 0)
        state = paths.read_chain("s", 0, StatePaths.chain(versions, committed))
        for key in drop:
            del state.values[key]
        state.values.update({k: (k, v) for k, v in changes.items()})
        return paths.write("s", 0, batch, state, list(changes), drop, versions)

    first = step(1, 0, dict.fromkeys("abcdwxyz", 1), [])  # nothing before: a full copy
    assert [v.name for v in first.chain] == [names()[0]]
    assert names()[0].startswith("00000000000000000001-8-") and names()[0].endswith(".state")
    step(2, 1, {"a": 2}, [])  # one key of eight: a changelog
    step(3, 2, {"e": 1}, ["b"])
    assert [n.rsplit(".", 1)[1] for n in names()] == ["state", "delta", "delta"]
    delta = cloudpickle.loads((shard / names()[2]).read_bytes())
    assert delta == {"set": {"e": ("e", 1)}, "touched": {}, "removed": ["b"]}
    state = paths.read_chain("s", 0, paths.usable("s", 0, committed=3))
    assert state.values == {"a": ("a", 2), "e": ("e", 1)} | {k: (k, 1) for k in "cdwxyz"}
    assert paths.read_chain("s", 0, paths.usable("s", 0, committed=2)).values["b"] == ("b", 1)

    # A failed attempt of batch 4 left a file; its replay (another key count) replaces it.
    step(4, 3, {"f": 1, "g": 1, "h": 1, "i": 1, "j": 1}, [])
    failed = names()[-1]
    step(4, 3, {"f": 1}, [])
    assert failed not in names() and names()[-1].startswith("00000000000000000004-9-")

    # A batch that changes at least half the keys writes a full copy. The chain it
    # started from stays (batch 5 may be replayed from it) until a batch after it
    # writes: that one starts from the new copy, so the files before it go.
    step(5, 4, dict.fromkeys("acdef", 9), [])
    assert names()[-1].endswith(".state") and len(names()) == 5
    step(6, 5, {"a": 10}, [])
    assert [n.split("-")[0][-1] for n in names()] == ["5", "6"]
    step(7, 6, {"a": 11}, [])
    assert [n.split("-")[0][-1] for n in names()] == ["5", "6", "7"]
    assert paths.read_chain("s", 0, paths.usable("s", 0, committed=7)).values["a"] == ("a", 11)


def test_a_full_copy_at_least_every_compact_every_batches(store: Store, tmp_path: Path) -> None:
    paths = StatePaths(store, str(tmp_path / "state"))
    kinds = []
    for batch in range(1, 2 * COMPACT_EVERY + 2):
        versions = paths.versions("s", 0)
        state = paths.read_chain("s", 0, StatePaths.chain(versions, batch - 1))
        state.values.setdefault("base", list(range(100)))
        state.values[f"new{batch}"] = batch
        after = paths.write("s", 0, batch, state, [f"new{batch}"], [], versions)
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
    # Keys were assigned to shards with these values; a change would lose state.
    assert stable_hash(key) == expected
    assert StablePartition()(key) == expected
