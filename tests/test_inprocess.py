"""The in-process engine: Spark's tasks and partitioning in the driver, without a JVM.

The semantic suites run on both engines (the ``reduce_path`` and
``engine_kind`` fixtures of conftest.py); these tests cover what is the
in-process engine's own: no Spark at all, pickling where Spark pickles,
cancellation between items (a task's own reads of its source too).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.core.engine.inprocess.datasets import LocalData, LocalDatasets
from sparkjet.core.engine.tasks.read import ReadTask
from sparkjet.core.errors import JobFailedError
from sparkjet.core.host.contracts import TaskContext
from sparkjet.core.pipeline.fusion import StageFailure, decode_failure
from sparkjet.pipeline import Pipeline
from tests.conftest import run_pipeline

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_a_job_runs_without_importing_pyspark(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys
        from sparkjet import aggregate
        from sparkjet.core.client import Client
        from sparkjet.core.config import load_config
        from sparkjet.core.engine.inprocess.engine import InProcessEngine
        from sparkjet.pipeline import Pipeline

        client = Client(load_config({{"store": {{"url": {str(tmp_path / "store")!r}}}}}),
                        engine=InProcessEngine(2))
        p = Pipeline.create()
        (p.read_from(Pipeline.from_list("in", list(range(10))))
          .group_by(lambda x: x % 3).aggregate(aggregate.counting())
          .write_to(Pipeline.to_list("out")))
        client.get_jet().submit(p).join(timeout=60)
        print(client.get_list("out").get_all())
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j")))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    out, modules = done.stdout.strip().splitlines()[-2:]
    assert out == "[(0, 4), (1, 3), (2, 3)]"
    assert modules == "[]"


@pytest.mark.usefixtures("engine_kind")
def test_each_consumer_of_a_shared_flow_gets_its_own_items(client: sparkjet.Client) -> None:
    # On Spark the shared flow is persisted and each consumer unpickles its own
    # copy; in process, a branch that mutates its items must not change the other's.
    def mark(item: dict[str, Any]) -> dict[str, Any]:
        item["seen"] = True
        return item

    p = Pipeline.create()
    base = p.read_from(Pipeline.from_list("in", [{"n": i} for i in range(4)])).map(dict)
    base.map(mark).write_to(Pipeline.to_list("marked"))
    base.write_to(Pipeline.to_list("plain"))
    run_pipeline(client, p)
    assert client.get_list("plain").get_all() == [{"n": i} for i in range(4)]
    assert client.get_list("marked").get_all() == [{"n": i, "seen": True} for i in range(4)]


def _message(failure: StageFailure) -> str:
    """The user-facing message of ``failure``, as the driver decodes it."""
    decoded = decode_failure(str(failure))
    assert decoded is not None
    return str(decoded[1])


def _pass_through(pidx: int, items: Iterator[Any]) -> Iterator[Any]:
    yield from items


def test_an_item_that_cannot_be_shuffled_names_the_stage_that_emitted_it() -> None:
    data = LocalDatasets(2, lambda: False)
    mapped = data.map_partitions(LocalData([[("k", threading.Lock())]]), _pass_through, "keyed")
    with pytest.raises(StageFailure) as caught:
        data.shuffle_to_tasks(mapped, 2, 8, "keyed")
    assert caught.value.stage == "keyed"
    assert "item of type _thread.lock cannot be pickled" in _message(caught.value)


def test_a_sink_message_that_cannot_be_pickled_names_the_input_and_the_sink() -> None:
    data = LocalDatasets(1, lambda: False)
    written = data.map_partitions(LocalData([[threading.Lock()]]), _pass_through, "upper",
                                  via="in the commit message of sink stage 'out'")
    with pytest.raises(StageFailure) as caught:
        data.collect(written)
    assert caught.value.stage == "upper"
    assert "(in the commit message of sink stage 'out')" in _message(caught.value)


class _HoldsALock:
    stage = "locked"

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, pidx: int, items: Iterator[Any]) -> Iterator[Any]:
        yield from items


def test_a_task_spark_could_not_ship_fails_here_too_naming_its_stage() -> None:
    data = LocalDatasets(1, lambda: False, check_tasks=True)
    with pytest.raises(JobFailedError, match=r"stage 'locked': its functions cannot be pickled"):
        data.map_partitions(LocalData([[1]]), _HoldsALock(), "locked")
    # The engine checks a plan's first run only: later runs skip the cost.
    unchecked = LocalDatasets(1, lambda: False, check_tasks=False)
    assert unchecked.map_partitions(LocalData([[1]]), _HoldsALock(), None).partitions() == [[1]]


def test_a_cancelled_run_stops_at_the_next_item() -> None:
    """A cancel reaches a partition mid-way, at the next item its task takes
    (a user function blocking in a call holds it until that call returns)."""
    seen: list[int] = []
    cancel = threading.Event()

    def task(pidx: int, items: Iterator[Any]) -> Iterator[Any]:
        for item in items:
            seen.append(item)
            cancel.set()  # the job is cancelled while its task handles ``item``
            yield item

    data = LocalDatasets(3, cancel.is_set, check_tasks=False)
    with pytest.raises(JobFailedError, match="cancelled"):
        data.map_partitions(LocalData([[1, 2, 3], [4]]), task, None)
    assert seen == [1]


class _Numbers:
    """A source whose descriptor ``n`` reads as ``0..n-1``; the job is cancelled as one is read."""

    def __init__(self, cancel: threading.Event) -> None:
        self.cancel = cancel
        self.read_items: list[int] = []

    def read(self, descriptor: int, context: Any) -> Iterator[int]:
        for item in range(descriptor):
            self.read_items.append(item)
            self.cancel.set()
            yield item


class _ReadsItsSource:
    """A task reading its source itself, as a fused pass does: it is handed descriptors."""

    def __init__(self, reader: ReadTask) -> None:
        self.reader = reader

    def __call__(self, pidx: int, descriptors: Iterator[Any]) -> Iterator[Any]:
        yield from self.reader.items(pidx, descriptors)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-read", "read-task"])
def test_a_cancel_reaches_a_task_reading_its_source_at_the_next_item(fused: bool) -> None:
    """The items a task reads from its source are asked about, not only the
    descriptor it is handed (a slow map over a source's partition held a
    cancel until the whole partition was done)."""
    cancel = threading.Event()
    source = _Numbers(cancel)
    reader = ReadTask(source, "numbers", TaskContext("job-1", 0, None), None)
    task = _ReadsItsSource(reader) if fused else reader
    data = LocalDatasets(2, cancel.is_set, check_tasks=False)
    with pytest.raises(JobFailedError, match="cancelled"):
        data.map_partitions(LocalData([[3], [3]]), task, None)
    assert source.read_items == [0]


def test_a_shuffle_sends_each_key_to_its_key_groups_task_as_spark_does() -> None:
    from sparkjet.core.state.keygroups import KeyGroupPartition

    records = [(key, 1) for key in ["a", "b", "c", 1, 2, 3, (4, 5)]]
    data = LocalDatasets(3, lambda: False)
    shuffled = data.shuffle_to_tasks(LocalData([records[:3], records[3:]], "s"), 3, 16, "s")
    to_task = KeyGroupPartition(16, 3)
    # each task gets its keys' records, in map partitions' order
    assert shuffled.partitions() == [
        [r for r in records if to_task(r[0]) == task] for task in range(3)
    ]
