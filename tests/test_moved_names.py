"""Modules that moved stay readable in pickles: what the store holds names where they were.

The core's modules were rearranged into packages (``sparkjet.core.state``,
``engine``, ``pipeline``, ``host`` ...; ``MOVED_MODULES`` lists every move).
What an earlier release stored names classes at their old modules: a
streaming job's pipeline (a cloudpickle of its nodes and specs), keyed state
in a checkpoint or a snapshot, the items of a list, a map or a stream (a
``WindowResult``, a dead letter). Every pickle the store reads back goes
through :func:`sparkjet.core.store.naming.loads`, which finds such a class
at its new module.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from pathlib import Path
from types import ModuleType
from typing import Any

import cloudpickle
import pytest

from sparkjet.core.store import commit_records, commit_segments
from sparkjet.core.store.fs import Store
from sparkjet.core.store.naming import MOVED_MODULES, loads, moved_module
from sparkjet.core.store.structures import IList


def _global(module: str, name: str) -> bytes:
    """A pickle of one GLOBAL opcode: what a pickle holds for a class it names."""
    return f"c{module}\n{name}\n.".encode()


def _defined_here(module: ModuleType) -> tuple[str, Any] | None:
    """A class or function ``module`` defines itself (not one it imports), if any."""
    for name, value in sorted(vars(module).items()):
        if (inspect.isclass(value) or inspect.isfunction(value)) and \
                value.__module__ == module.__name__ and not name.startswith("_"):
            return name, value
    return None


def _modules_under(name: str) -> list[ModuleType]:
    module = importlib.import_module(name)
    found = [module]
    if hasattr(module, "__path__"):
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{name}."):
            found.append(importlib.import_module(info.name))
    return found


@pytest.mark.parametrize(("old", "new"), MOVED_MODULES, ids=[old for old, _ in MOVED_MODULES])
def test_a_pickle_naming_a_moved_module_loads(old: str, new: str) -> None:
    checked = 0
    for module in _modules_under(f"sparkjet.core.{new}"):
        defined = _defined_here(module)
        if defined is None:
            continue
        name, value = defined
        # The module's old dotted name: the old module itself, or a module inside the old package.
        old_name = f"sparkjet.core.{old}" + module.__name__[len(f"sparkjet.core.{new}"):]
        assert moved_module(old_name) == module.__name__
        assert loads(_global(old_name, name)) is value
        assert loads(_global(module.__name__, name)) is value  # today's pickles too
        checked += 1
    assert checked, f"nothing in sparkjet.core.{new} to pickle by name"


def test_a_module_that_never_existed_is_still_an_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        loads(_global("sparkjet.core.no_such_module", "Thing"))
    with pytest.raises(AttributeError):
        loads(_global("sparkjet.core.state.checkpoint", "NoSuchClass"))
    assert moved_module("sparkjet.core.no_such_module") is None
    assert moved_module("sparkjet.core.state.checkpoint") is None  # a new name is not moved again


def test_a_pipeline_stored_by_an_earlier_release_loads() -> None:
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import Pipeline
    from sparkjet.plugins.lists import ListSink, ListSource

    pipeline = Pipeline.create()
    pipeline.read_from(ListSource("in")).map(str).group_by(len).aggregate(counting()).write_to(
        ListSink("out")
    )
    # Protocol 2 names a class with the GLOBAL opcode, ``c<module>\n<name>\n``: rewritten
    # to the old modules, the pickle is what a job stored before the moves (and, with
    # ``sparkjet.core.pipeline.graph`` alone, before the graph module became a package).
    new = cloudpickle.dumps(pipeline, protocol=2)
    assert b"csparkjet.core.pipeline.graph.builder\nTransform\n" in new
    before_moves = new.replace(b"csparkjet.core.pipeline.", b"csparkjet.core.")
    before_graph_package = before_moves.replace(
        b"csparkjet.core.graph.builder\n", b"csparkjet.core.graph\n"
    ).replace(b"csparkjet.core.graph.specs\n", b"csparkjet.core.graph\n")
    for old in (before_moves, before_graph_package):
        assert b"csparkjet.core.pipeline." not in old
        with pytest.raises(ModuleNotFoundError):
            pickle.loads(old)  # what a plain unpickler makes of it
        copy = loads(old)
        assert [node.name for node in copy.transforms] == [
            node.name for node in pipeline.transforms
        ]
        assert [node.spec.op for node in copy.transforms] == [
            node.spec.op for node in pipeline.transforms
        ]


def test_a_list_of_window_results_written_by_an_earlier_release_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkjet.core.pipeline.windows import WindowResult

    root = tmp_path / "store"
    for writer in (commit_records, commit_segments):  # GLOBAL opcodes, rewritable
        monkeypatch.setattr(writer, "PICKLE_PROTOCOL", 2)
    written = [WindowResult(0, 10, 3), WindowResult(10, 20, 4)]
    for item in written:
        IList(Store(str(root)), "results").add(item)
    rewritten = 0
    for path in root.rglob("*"):
        if path.is_file() and b"csparkjet.core.pipeline.windows\n" in path.read_bytes():
            path.write_bytes(path.read_bytes().replace(
                b"csparkjet.core.pipeline.windows\n", b"csparkjet.core.windows\n"))
            rewritten += 1
    assert rewritten, "the list's files name no WindowResult"
    assert list(IList(Store(str(root)), "results")) == written
