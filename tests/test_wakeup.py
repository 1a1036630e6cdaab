"""Waking up on data: the stream log's wait, the source hook, and the loop using them.

Timing is asserted loosely (the suite runs on a loaded 2-core machine): an
append must wake a waiter long before its timeout, and a wait without data
must last its timeout, not much longer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sparkjet.core.host.contracts import PluginStore, Source
from sparkjet.core.microbatch.loop import waits_for_data
from sparkjet.core.store import notify
from sparkjet.core.store.fs import Store
from sparkjet.core.store.stream_log import BACKOFF_FACTOR, REMOTE_POLL_SECONDS, StreamLog
from sparkjet.plugins.lists import ListSource
from sparkjet.plugins.streams import StreamSource

#: A wait that must end on an append is given this long; it must end far sooner.
LONG = 20.0
#: How long "far sooner" is: generous for a loaded machine, tiny beside LONG.
WOKEN_WITHIN = 5.0


def _stream(url: str, partitions: int = 2) -> StreamLog:
    log = StreamLog(Store(url), "events")
    log.create(partitions)
    return log


def _wait_in_thread(log: StreamLog, ends: list[int], timeout: float) -> tuple[
        threading.Thread, list[tuple[bool, float]]]:
    """``log.wait_for_append(ends, timeout)`` on a thread; its (result, seconds) go in the list."""
    out: list[tuple[bool, float]] = []

    def wait() -> None:
        began = time.monotonic()
        said = log.wait_for_append(ends, timeout)
        out.append((said, time.monotonic() - began))

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, out


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_an_append_in_the_process_wakes_a_waiter_long_before_its_timeout(
        kind: str, tmp_path: Path) -> None:
    url = str(tmp_path / "store") if kind == "local" else f"memory://wake-{os.getpid()}-{id(tmp_path)}"
    log = _stream(url)
    ends = log.end_offsets()
    thread, out = _wait_in_thread(log, ends, LONG)
    time.sleep(0.05)  # the waiter is asleep by now (if not, it finds the item listed)
    log.append(1, ["x"])
    thread.join(LONG + 5)
    said, took = out[0]
    assert said is True
    assert took < WOKEN_WITHIN, f"the append woke the waiter only after {took:.2f} s"


def test_a_waiter_without_data_returns_false_at_its_timeout(tmp_path: Path) -> None:
    log = _stream(str(tmp_path / "store"))
    ends = log.end_offsets()
    began = time.monotonic()
    assert log.wait_for_append(ends, 0.2) is False
    took = time.monotonic() - began
    assert 0.2 <= took < 0.2 + 2.0
    assert log.wait_for_append(ends, 0.0) is False


def test_an_append_between_the_listing_and_the_wait_is_not_missed(tmp_path: Path) -> None:
    """Ends listed, then an append, then the wait: it returns True at once."""
    log = _stream(str(tmp_path / "store"))
    ends = log.end_offsets()
    StreamLog(Store(str(tmp_path / "store")), "events").append(0, ["x"])
    began = time.monotonic()
    assert log.wait_for_append(ends, LONG) is True
    assert time.monotonic() - began < WOKEN_WITHIN
    # Ends this process never listed (another reader's): the wait lists once itself.
    assert log.wait_for_append([0, 0], LONG) is True


def test_an_append_that_left_the_folder_mtime_as_it_was_is_found(tmp_path: Path) -> None:
    """A create in the same tick of the kernel's coarse clock leaves the mtime: a listing finds it.

    The tick is made certain by putting the folder's mtime back after an
    append that, as another process's would, wakes nobody here (a batch's
    chunk not yet registered).
    """
    log = _stream(str(tmp_path / "store"), partitions=1)
    folder = log.paths.partition(0)
    log.append(0, ["a"])
    now = time.time_ns() + 5_000_000  # the listing below comes within a tick of it
    os.utime(folder, ns=(now, now))
    ends = log.end_offsets()
    log.append(0, ["b"], "@unregistered")  # a batch's chunk: it wakes nobody until registered
    os.utime(folder, ns=(now, now))
    began = time.monotonic()
    assert log.wait_for_append(ends, LONG) is True
    assert time.monotonic() - began < WOKEN_WITHIN


@pytest.mark.slow
def test_an_append_by_another_process_wakes_a_waiter_on_a_local_store(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    log = _stream(url)
    ends = log.end_offsets()
    publisher = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from sparkjet.core.store.fs import Store; "
         "from sparkjet.core.store.stream_log import StreamLog; "
         "log = StreamLog(Store(sys.argv[1]), 'events'); log.end_offsets(); "
         "sys.stdin.readline(); log.append(0, ['x'])", url],
        stdin=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert log.wait_for_append(ends, 0.05) is False  # nothing yet
        thread, out = _wait_in_thread(log, ends, 120.0)
        assert publisher.stdin is not None
        publisher.stdin.write(b"go\n")
        publisher.stdin.flush()
        appended = time.monotonic()
        assert publisher.wait(120) == 0
        thread.join(125)
        said, _ = out[0]
        assert said is True
        # Woken by the folder's change, not the timeout (the publisher's start is not counted).
        assert time.monotonic() - appended < 60.0
    finally:
        publisher.kill()
        publisher.wait()


def test_a_batch_wakes_waiters_once_its_chunks_are_registered(tmp_path: Path) -> None:
    log = _stream(str(tmp_path / "store"))
    key = log.paths.folder
    before = notify.generation(key)
    ends = log.end_offsets()
    thread, out = _wait_in_thread(log, ends, LONG)
    time.sleep(0.05)
    log.append_batch("writer", "batch-1", [["a"], ["b"]])
    thread.join(LONG + 5)
    assert out[0][0] is True
    assert notify.generation(key) == before + 2  # one wake per partition, after its registration
    assert log.registered(0, "batch-1") == 0 and log.registered(1, "batch-1") == 0


def test_the_notify_waiter_keeps_a_signal_given_before_it_sleeps() -> None:
    key = f"test-{id(object())}"
    with notify.Waiter(key, notify.generation(key)) as waiter:
        notify.signal(key)
        began = time.monotonic()
        assert waiter.wait(LONG) is True
        assert time.monotonic() - began < WOKEN_WITHIN
    with notify.Waiter(key, notify.generation(key)) as waiter:
        assert waiter.wait(0.01) is False


class _Context:
    """What StreamSource.wait_for_data reads of a context: the store."""

    def __init__(self, store: Store) -> None:
        self.store = PluginStore(store)


def test_the_stream_source_waits_on_its_log_and_other_sources_sleep(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    source = StreamSource("events")
    ctx: Any = _Context(store)
    log = _stream(str(tmp_path / "store"))
    ends = log.end_offsets()
    assert waits_for_data(source) and not waits_for_data(ListSource("l"))
    assert source.wait_for_data(ends, 0.05, ctx) is False
    thread = threading.Timer(0.05, lambda: log.append(0, ["x"]))
    thread.start()
    began = time.monotonic()
    assert source.wait_for_data(ends, LONG, ctx) is True
    assert time.monotonic() - began < WOKEN_WITHIN
    thread.join()
    # The default: sleeps its timeout, then says data may be there.
    began = time.monotonic()
    assert Source.wait_for_data(ListSource("l"), None, 0.05, ctx) is True
    assert time.monotonic() - began >= 0.05


def test_a_waiting_stream_log_burns_little_cpu(tmp_path: Path) -> None:
    """Idle for a second: well under a tenth of a core (the stat slices and wake-ups).

    The waiting thread's CPU, not the process's: other threads of the test
    process (a state cache's sweeper collecting the whole heap after an
    earlier test's job ended) are not the wait's cost.
    """
    log = _stream(str(tmp_path / "store"), partitions=4)
    ends = log.end_offsets()
    cpu, wall = time.thread_time(), time.monotonic()
    while time.monotonic() - wall < 1.0:
        assert log.wait_for_append(ends, 0.05) is False
    used = time.thread_time() - cpu
    assert used < 0.25, f"an idle second of waiting used {used:.3f} s of CPU"


@pytest.mark.storage
def test_on_s3_a_wait_returns_true_after_the_poll_interval(tmp_path: Path) -> None:
    from sparkjet import testing

    with testing.moto_s3_server(tmp_path) as location:
        log = StreamLog(location.store(), "events")
        log.create(2)
        # It cannot tell without a listing: True ("may be there") once a poll
        # interval has passed since this caller's last look, whether the caller
        # waits long or in short slices (the loop asking several sources in
        # turn): one listing per interval, not one per slice.
        ends = log.end_offsets()
        began = time.monotonic()
        assert log.wait_for_append(ends, LONG) is True
        told = time.monotonic()
        assert REMOTE_POLL_SECONDS * 0.9 <= told - began < REMOTE_POLL_SECONDS + 2.0
        # Nothing came: the next look is due BACKOFF_FACTOR times later.
        interval = REMOTE_POLL_SECONDS * BACKOFF_FACTOR
        answers = []
        while time.monotonic() - told < interval * 0.7:
            answers.append(log.wait_for_append(ends, 0.005))
        assert answers and not any(answers), f"slices said 'may be there' early: {answers}"
        while not log.wait_for_append(ends, 0.005):
            assert time.monotonic() - told < interval + 2.0
        assert time.monotonic() - told >= interval * 0.9
        # The caller's offsets moved (data came): it looks again after the first interval.
        log.append(1, ["elsewhere"])
        ends = log.end_offsets()
        thread, out = _wait_in_thread(log, ends, LONG)
        log.append(0, ["x"])  # in this process: wakes the waiter at once
        thread.join(LONG + 5)
        assert out[0][0] is True and out[0][1] < REMOTE_POLL_SECONDS + 2.0


def test_an_idle_remote_poll_backs_off_to_its_most_and_starts_over_on_data() -> None:
    """The intervals an object-store waiter looks at, counted, not timed: 4x up to the most."""
    from sparkjet.core.store import stream_log

    settings = stream_log.PollSettings(first=0.001, most=0.01)

    class Remote:
        poll = settings

        class fs:  # stands in for an object store's filesystem
            protocol = ("s3",)

        layout = Store("memory://backoff").layout

    log = StreamLog.__new__(StreamLog)
    log.store, log.name = Remote(), "s"  # type: ignore[assignment]
    log.paths = Remote.layout.stream_paths("s")
    caller = (log.paths.folder, threading.get_ident())
    seen = []
    for ends in ([0], [0], [0], [0], [0], [1], [1]):
        assert log.wait_for_append(ends, 5.0) is True
        seen.append(stream_log._BACKOFF[caller][0])
    # After each look that found nothing the interval grows (0.004, 0.01, most);
    # offsets that moved start it over.
    assert seen == [0.004, 0.01, 0.01, 0.01, 0.01, 0.004, 0.01]
