"""Lists and maps in the store, and where its files lie, without Spark."""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from sparkjet.core.store import commit_log as commit_log_module
from sparkjet.core.store.commit_log import CommitLog, LogCursor
from sparkjet.core.store.fs import Store
from sparkjet.core.store.layout import StoreLayout
from sparkjet.core.store.structures import IList, IMap
from sparkjet.errors import StoreError
from sparkjet.testing.races import race as _race


@pytest.fixture(params=["file", "memory"])
def store(request, tmp_path) -> Store:  # type: ignore[no-untyped-def]
    if request.param == "file":
        return Store(str(tmp_path / "store"))
    return Store(f"memory://sparkjet-test-{tmp_path.name}")


def test_the_layout_spells_the_stores_on_disk_format() -> None:
    """Every path as existing stores have it (docs/store.md): a change here breaks old stores."""
    at = StoreLayout("/s")
    log = at.list_paths("a/b")
    assert log.record(7) == "/s/lists/a%2Fb/log/00000000000000000007.rec"
    assert log.base(100) == "/s/lists/a%2Fb/base/00000000000000000100.pkl"
    assert log.abort_marker("w") == "/s/lists/a%2Fb/data/aborted-w"
    assert log.new_segment("w").startswith("/s/lists/a%2Fb/data/w-")
    assert log.writer_index("j:s") == "/s/lists/a%2Fb/writers/j%3As.json"
    assert at.map_paths("m").folder == "/s/maps/m"
    stream = at.stream_paths("e")
    assert (stream.meta, stream.chunk(1, 42)) == (
        "/s/streams/e/meta.json", "/s/streams/e/p0001/00000000000000000042.chunk")
    assert stream.registration(0, "t") == "/s/streams/e/registry/p0000/t"
    assert stream.pending("w", "t") == "/s/streams/e/writers/w.t.pending"
    assert [at.job_record("j"), at.pipeline("j"), at.owner_claim("j", 3)] == [
        "/s/jobs/j/job.json", "/s/jobs/j/pipeline.pkl", "/s/jobs/j/owner-000003"]
    assert at.checkpoint("j", at.DURABLE_CHECKPOINT) == "/s/jobs/j/checkpoint"
    assert at.control_request("j", "cancel", 5) == (
        "/s/jobs/j/control/00000000000000000005-cancel.req")
    assert at.quarantined("j", "x.req") == "/s/jobs/j/control/quarantine/x.req"
    assert at.name_lock("n") == "/s/job-names/n" and at.new_probe().startswith("/s/_probe/")
    # ... and reads back what listings find.
    assert at.is_checkpoint_folder(at.new_scratch_checkpoint())
    assert not at.is_checkpoint_folder("../other-job")
    assert [at.owner_epoch("owner-000012"), at.owner_epoch("job.json")] == [12, None]
    assert at.control_action("00000000000000000005-cancel.req") == "cancel"
    with pytest.raises(ValueError, match="not named"):
        at.control_action("cancel.req")
    assert [log.record_number("00000000000000000007.rec"), log.record_number("x.rec")] == [7, None]
    assert stream.chunk_start("00000000000000000042.chunk") == 42


def test_list_appends_clear_and_other_handles(store: Store) -> None:
    a, b = IList(store, "l"), IList(store, "l")
    assert a.get_all() == [] and a.size() == 0
    a.add_all([1, 2])
    a.add(3)
    assert b.get_all() == [1, 2, 3]
    b.clear()
    a.add_all(["x"])
    assert a.get_all() == b.get_all() == ["x"]
    assert len(a) == 1 and list(a) == ["x"]


def test_map_put_remove_clear(store: Store) -> None:
    m = IMap(store, "m")
    m.put(1, "one")
    m.put_all({1.0: "uno", (2, 3): [4]})
    assert m.get(1) == "uno" and m.get(True) == "uno"
    assert m.contains_key((2, 3)) and m.size() == 2
    m.remove(1)
    assert m.key_set() == [(2, 3)] and m.values() == [[4]]
    assert IMap(store, "m").entry_set() == [((2, 3), [4])]
    m.clear()
    assert m.size() == 0 and m.get("missing", 7) == 7
    with pytest.raises(StoreError, match=r"key \[1\] is not hashable"):
        m.put([1], "x")


def test_concurrent_appends_lose_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path / "store"))

    def writer(w: int) -> None:
        handle = IList(store, "shared")
        for i in range(25):
            handle.add_all([(w, i)])

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    items = IList(store, "shared").get_all()
    assert sorted(items) == sorted((w, i) for w in range(4) for i in range(25))
    for w in range(4):  # each writer's own order is kept
        assert [i for ww, i in items if ww == w] == list(range(25))


@pytest.mark.parametrize("bad", ["", ".", "..", "a\x00b"])
def test_bad_names_are_refused(store: Store, bad: str) -> None:
    with pytest.raises(StoreError, match="invalid list name"):
        IList(store, bad)


def test_names_with_slashes_are_encoded(store: Store) -> None:
    IList(store, "a/b").add_all([1])
    assert IList(store, "a/b").get_all() == [1]
    assert store.list_names() == ["a/b"]


def test_missing_segment_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path / "store"))
    log = store.list_log("l")
    parts = log.stage(list(range(20_000)), "job")
    log.commit("append", parts)
    store.remove(parts[0][1])
    with pytest.raises(StoreError, match=r"list 'l': segment .* is missing"):
        IList(store, "l").get_all()


def test_store_errors_and_repr_mask_secrets(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pickle

    import sparkjet

    monkeypatch.setenv("SJ_SECRET_DIR", "hunter2-secret")
    (tmp_path / "cwd" / "sparkjet.toml").write_text(
        f'[store]\nurl = "{tmp_path}/${{env:SJ_SECRET_DIR}}/store"\n'
    )
    client = sparkjet.connect()
    assert "hunter2" not in repr(client.store)
    assert "hunter2" not in repr(pickle.loads(pickle.dumps(client.store)))
    log = client.store.list_log("l")
    client.store.write_bytes(log.paths.record(1), b"not a pickle")
    with pytest.raises(StoreError) as info:
        client.get_list("l").get_all()
    assert "hunter2" not in str(info.value)
    assert "***" in str(info.value)


# --- folding commit logs, and micro-batch commits landing once ----------------------


def _items(log: CommitLog) -> list[Any]:
    return [item for record in log.live_records() for item in log.payload(record)]


def test_a_long_lived_list_is_folded_and_read_from_its_base(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commit_log_module, "FOLD_EVERY", 20)
    early = IList(store, "l")
    log = store.list_log("l")
    for i in range(55):
        if i == 30:
            log.commit("clear")
        log.commit("append", [("items", [i])])
        if i == 10:
            assert early.get_all() == list(range(11))  # a reader from before the folds
    assert log.bases() == [40]  # 56 records: folded at 20 and 40, the older base removed
    assert log.sequences() == list(range(41, 57))  # the records the base replaces are gone
    assert early.get_all() == IList(store, "l").get_all() == list(range(30, 55))
    reads: list[str] = []
    original = Store.read_bytes
    monkeypatch.setattr(Store, "read_bytes", lambda s, p: reads.append(p) or original(s, p))
    assert _items(log) == list(range(30, 55))
    assert len(reads) == 1 + 16  # one base and the records after it, not the whole history


def test_a_folded_map_keeps_puts_and_removes(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit_log_module, "FOLD_EVERY", 7)
    m, oracle = IMap(store, "m"), {}
    for i in range(40):
        key = i % 9
        if i % 5 == 4:
            m.remove(key)
            oracle.pop(key, None)
        else:
            m.put(key, i)
            oracle[key] = i
    assert store.map_log("m").bases()
    assert m.entry_set() == IMap(store, "m").entry_set() == list(oracle.items())


def test_a_reader_overtaken_by_a_fold_starts_again_from_the_base(store: Store) -> None:
    log = store.list_log("l")
    for i in range(10):
        log.commit("append", [("items", [i])])
    cursor = LogCursor()
    reading = log.read(cursor)
    first = next(reading)  # the records are listed; then a fold removes them
    assert log.fold() == 10
    log.commit("append", [("items", [10])])
    rest = list(reading)
    assert first.seq == 1 and rest[0].op == "clear"  # record 2 is gone: from the base
    items: list[Any] = []
    for record in [first, *rest]:
        items = [] if record.op == "clear" else [*items, *log.payload(record)]
    assert items == list(range(11)) and cursor.seq == 11
    assert log.fold() == 11 and log.fold() is None  # nothing new to fold


def test_a_commit_never_takes_a_number_a_fold_freed(store: Store) -> None:
    log = store.list_log("l")
    for i in range(5):
        log.commit("append", [("items", [i])])
    assert log.fold() == 5
    # A writer whose hint is from before the fold (numbers 1-5 are free again).
    assert log.commit("append", [("items", [5])], after=2) == 6
    assert _items(log) == list(range(6))


def test_a_batch_committed_twice_by_racing_drivers_is_seen_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commit_log_module, "FOLD_EVERY", 6)
    log = store.list_log("sink")
    reader = IList(store, "sink")
    for batch in range(4):
        assert log.commit_once("append", [("items", [f"b{batch}"])], token=f"p.b{batch}",
                               writer="w", producer="p", batch=batch)
    assert reader.get_all() == ["b0", "b1", "b2", "b3"]
    # A fenced driver that checked before the new one committed batch 3, and
    # commits it late anyway; and one from before batch 1.
    log.commit("append", [("items", ["b3 again"])], writer="p.b3", producer="p", batch=3)
    log.commit("append", [("items", ["b1 again"])], writer="p.b1", producer="p", batch=1)
    log.commit("append", [("items", ["client"])])  # other writers are not affected
    assert reader.get_all() == IList(store, "sink").get_all() == ["b0", "b1", "b2", "b3", "client"]
    for batch in range(4, 8):  # folds on the way: the producer's last batch is in the base
        log.commit_once("append", [("items", [f"b{batch}"])], token=f"p.b{batch}",
                        writer="w", producer="p", batch=batch)
    assert log.bases()
    log.commit("append", [("items", ["b5 again"])], writer="p.b5", producer="p", batch=5)
    # A replay whose writer index is gone finds its batch in the base.
    store.remove(log.paths.writers, recursive=True)
    assert log.commit_once("append", [("items", ["b4"])], token="p.b4", writer="w",
                           producer="p", batch=4) is None
    expected = ["b0", "b1", "b2", "b3", "client", "b4", "b5", "b6", "b7"]
    assert reader.get_all() == IList(store, "sink").get_all() == expected


@pytest.fixture
def eager_thread_switches() -> Any:
    """Switch threads every microsecond, so that a race has many chances to show."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_a_listing_races_deletes_in_the_memory_store(tmp_path: Path) -> None:
    """fsspec's memory filesystem tears a listing when a file goes mid-way; ours lists at once.

    A fold deletes the records it folded while readers list the folder, as
    the committers in the storage conformance race do.
    """
    store = Store(f"memory://sparkjet-test-{tmp_path.name}")
    folder = store.path("race")
    names = [f"{i:04d}.pkl" for i in range(200)]
    done = threading.Event()
    listed: list[int] = []

    def work(n: int) -> None:
        if n == 0:
            while not done.is_set():
                for name in names:
                    store.write_bytes(f"{folder}/{name}", b"x")
                for name in names:
                    store.remove(f"{folder}/{name}")
            return
        try:
            for _ in range(3000):
                seen = store.listdir(folder)
                assert set(seen) <= set(names)
                listed.append(len(seen))
                with contextlib.suppress(FileNotFoundError):
                    assert {p.rsplit("/", 1)[-1] for p in store.find(folder)} <= set(names)
        finally:
            done.set()

    _race(work, 2)
    assert sum(listed) > 0


def test_a_create_only_write_to_the_memory_store_has_one_winner(
    tmp_path: Path, eager_thread_switches: None
) -> None:
    """Threads creating the same files: each file is created once, by one of them."""
    store = Store(f"memory://sparkjet-test-{tmp_path.name}")
    assert store.conditional_writes
    paths = [store.path("race", f"{i:04d}") for i in range(500)]
    won: list[tuple[str, int]] = []

    def create(writer: int) -> None:
        for path in paths:
            if store.create_exclusive(path, f"writer {writer}".encode()):
                won.append((path, writer))

    _race(create, 4)
    assert sorted(p for p, _ in won) == paths
    assert all(store.read_bytes(p) == f"writer {w}".encode() for p, w in won)


def test_a_folder_deleted_by_two_threads_at_once_is_gone(
    tmp_path: Path, eager_thread_switches: None
) -> None:
    """Two exporters retiring one attempt, or gc beside a job: no error, nothing left.

    Each delete, when it returns, has left nothing of the tree, whichever
    thread removed which file.
    """
    store = Store(f"memory://sparkjet-test-{tmp_path.name}")

    def remove(tree: str) -> None:
        store.remove(tree, recursive=True)
        assert store.listdir(tree) == [], f"{tree} still holds files after its delete"

    for round_ in range(30):
        tree = store.path("trees", f"t{round_}")
        for i in range(40):
            store.write_bytes(f"{tree}/a/{i}", b"x")
            store.write_bytes(f"{tree}/b/c/{i}", b"y")
        store.fs.makedirs(f"{tree}/empty", exist_ok=True)
        _race(lambda _, tree=tree: remove(tree), 2)
        assert not store.exists(tree)


def test_a_create_only_write_whose_folder_is_removed_right_after_it_landed_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer export retires the attempt the moment its manifest lands: the create still won.

    On a local disk the manifest is linked from a temp file beside it; a
    snapshot superseded at once has its folder, temp file included, removed
    before the temp file's own cleanup (a CI run failed the concurrent
    export test on it with FileNotFoundError).
    """
    import os
    import shutil

    store = Store(str(tmp_path / "store"))
    folder = store.path("snapshots", "attempt")
    link = os.link

    def link_then_retire(src: str, dst: str) -> None:
        link(src, dst)
        shutil.rmtree(folder)

    monkeypatch.setattr(os, "link", link_then_retire)
    assert store.create_exclusive(f"{folder}/MANIFEST.json", b"manifest")
    assert not store.exists(folder)
