"""The store conformance suite, :class:`StoreConformance`: what every store location must do.

Create-only writes, a retried create recognised by reading it back, listings
and reads that see another client's writes at once, concurrent committers,
folds and publishers that neither lose nor duplicate, listings with sizes
and dates, and modification times on the store's clock. It drives the store
as plugins see it (:func:`sparkjet.plugin.open_store`): its files, a
:class:`~sparkjet.plugin.FileStore`, and the logs of its lists and streams.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from sparkjet.plugin import CommitLogAccess, LogRecord
from sparkjet.testing.locations import StoreLocation
from sparkjet.testing.races import race


def _items(log: CommitLogAccess, record: LogRecord) -> list[Any]:
    """The items ``record`` carries, in order: inline, or in segment files."""
    items: list[Any] = []
    for kind, value in record.parts:
        items.extend(value if kind == "items" else log.read_segment(value))
    return items


class StoreConformance:
    """What every store location must do; subclass it with a ``location`` fixture."""

    @pytest.fixture
    def location(self) -> StoreLocation:
        """The location under test: override it (a fresh folder per test)."""
        raise NotImplementedError("give the StoreConformance subclass a 'location' fixture")

    def test_creates_are_create_only(self, location: StoreLocation) -> None:
        """A second create of a path is refused and leaves the first content."""
        store = location.store().files
        assert store.conditional_writes, f"{location.url} does not enforce create-only writes"
        path = store.path("once", "file")
        assert store.create_exclusive(path, b"first") is True
        assert store.create_exclusive(path, b"second") is False
        assert store.read_bytes(path) == b"first"

    def test_a_retried_create_is_recognised_by_its_content(self, location: StoreLocation) -> None:
        """A create whose first attempt landed counts as the caller's, a rival's does not."""
        store = location.store().files
        path = store.path("retried", "file")
        store.write_bytes(path, b"payload-7d1c")  # the attempt whose answer was lost
        assert store.create_exclusive(path, b"payload-7d1c") is True
        assert store.create_exclusive(path, b"another writer's") is False

    def test_another_clients_writes_are_seen_at_once(self, location: StoreLocation) -> None:
        """Listings, existence and reads never come from a stale cache."""
        mine, theirs = location.store().files, location.store(separate_client=True).files
        folder = mine.path("shared")
        mine.write_bytes(f"{folder}/a", b"a")
        assert mine.listdir(folder) == ["a"]
        assert theirs.listdir(folder) == ["a"]
        assert mine.read_bytes(f"{folder}/a") == b"a"  # cached listing and size now
        theirs.write_bytes(f"{folder}/b", b"b")
        theirs.write_bytes(f"{folder}/a", b"a, longer now")
        assert mine.listdir(folder) == ["a", "b"]
        assert mine.exists(f"{folder}/b")
        assert mine.read_bytes(f"{folder}/b") == b"b"
        assert mine.read_bytes(f"{folder}/a") == b"a, longer now"
        assert mine.size(f"{folder}/a") == len(b"a, longer now")
        theirs.remove(f"{folder}/b")
        assert not mine.exists(f"{folder}/b")
        assert mine.listdir(folder) == ["a"]

    def test_concurrent_committers_neither_lose_nor_duplicate(
        self, location: StoreLocation
    ) -> None:
        """Writers with clients of their own race for record numbers; each commit lands once."""
        numbers: list[int] = []

        def commit(writer: int) -> None:
            log = location.store(separate_client=True).list_log("raced")
            for i in range(4):
                numbers.append(log.commit("append", [("items", [(writer, i)])], writer="client"))

        race(commit, 4)
        assert sorted(numbers) == list(range(1, 17))  # a number each, none skipped
        log = location.store().list_log("raced")
        records = log.live_records()
        assert len(records) == 16  # the log holds those 16 records, no other
        items = sorted(item for r in records for item in _items(log, r))
        assert items == sorted((w, i) for w in range(4) for i in range(4))

    def test_concurrent_committers_and_folds_neither_lose_nor_duplicate(
        self, location: StoreLocation
    ) -> None:
        """Committers fold the log as they go (after each commit), racing readers and each other.

        Each writer also commits its micro-batches twice, as a driver fenced
        off but not yet aware would: every reader sees each batch once.
        """
        folds: list[int] = []
        seen: list[list[Any]] = []

        def commit(writer: int) -> None:
            log = location.store(separate_client=True).list_log("folded")
            for batch in range(4):
                for _ in range(2):
                    log.commit("append", [("items", [(writer, batch)])],
                               writer=f"w{writer}.b{batch}", producer=f"w{writer}", batch=batch)
                    folded = log.fold()
                    if folded is not None:
                        folds.append(folded)
                reader = location.store(separate_client=True).list_log("folded")
                seen.append([i for r in reader.live_records() for i in _items(reader, r)])

        race(commit, 4)
        log = location.store().list_log("folded")
        items = [item for r in log.live_records() for item in _items(log, r)]
        assert sorted(items) == sorted((w, b) for w in range(4) for b in range(4))
        assert folds, "the log was never folded"
        for view in seen:  # no reader ever saw a batch twice or out of its writer's order
            for writer in range(4):
                batches = [b for w, b in view if w == writer]
                assert batches == sorted(set(batches)), view

    def test_concurrent_publishers_take_consecutive_offsets(
        self, location: StoreLocation
    ) -> None:
        """Publishers with clients of their own append to one partition; nothing is lost."""
        root = location.store()
        root.stream_log("raced").create(1)

        def publish(writer: int) -> None:
            stream = location.store(separate_client=True).stream_log("raced")
            for i in range(3):
                stream.append(0, [(writer, i, "same payload")])

        race(publish, 4)
        stream = root.stream_log("raced")
        assert stream.end_offsets() == [12]
        items = stream.read(0, 0, 12)
        assert sorted(items) == sorted((w, i, "same payload") for w in range(4) for i in range(3))
        for writer in range(4):  # each publisher's own items stay in its order
            assert [i for w, i, _ in items if w == writer] == [0, 1, 2]

    def test_a_listing_sizes_and_dates_files(self, location: StoreLocation) -> None:
        """``entries`` gives in one listing what ``size`` and ``modified`` give file by file."""
        store = location.store().files
        store.write_bytes(store.path("listed", "a"), b"abc")
        store.write_bytes(store.path("listed", "b"), b"")
        found = store.entries(store.path("listed"))
        assert sorted(found) == ["a", "b"]
        for name, size in (("a", 3), ("b", 0)):
            path = store.path("listed", name)
            assert found[name].size == size == store.size(path)
            assert found[name].modified is not None
            assert found[name].modified == pytest.approx(store.modified(path), abs=1e-3)
        assert store.entries(store.path("absent")) == {}

    def test_the_stores_clock_dates_writes(self, location: StoreLocation) -> None:
        """Modification times and the store's clock agree: a driver's liveness rests on them.

        A record written ``age`` seconds ago must read as about that old on the
        store's clock, whatever this machine's clock says.
        """
        store = location.store().files
        path = store.path("clock", "record")
        store.write_bytes(path, b"1")
        files = set(store.find(store.root))
        now = store.now()
        written = store.modified(path)
        no_times = f"{location.url} keeps no modification times: liveness falls back to clocks"
        assert now is not None, no_times
        assert written is not None, no_times
        assert -2.0 <= now - written <= 5.0, (now, written)  # S3 stamps whole seconds
        time.sleep(1.1)
        store.write_bytes(path, b"2")
        rewritten = store.modified(path)
        assert rewritten is not None
        assert rewritten > written
        later = store.now()
        assert later is not None
        assert later - now >= 1.0
        with pytest.raises(FileNotFoundError):
            store.modified(store.path("clock", "absent"))
        left = sorted(set(store.find(store.root)) - files)
        assert left == [], f"the store's clock left its probe files behind: {left}"
