"""Lists and maps in the store, without Spark."""

from __future__ import annotations

import threading

import pytest

from sparkjet.core.store import Store
from sparkjet.core.structures import IList, IMap
from sparkjet.errors import StoreError


@pytest.fixture(params=["file", "memory"])
def store(request, tmp_path) -> Store:  # type: ignore[no-untyped-def]
    if request.param == "file":
        return Store(str(tmp_path / "store"))
    return Store(f"memory://sparkjet-test-{tmp_path.name}")


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
    assert store.names("lists") == ["a/b"]


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
    client.store.write_bytes(f"{log.log_dir}/00000000000000000001.rec", b"not a pickle")
    with pytest.raises(StoreError) as info:
        client.get_list("l").get_all()
    assert "hunter2" not in str(info.value)
    assert "***" in str(info.value)
