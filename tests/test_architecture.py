"""The import contracts of pyproject.toml hold, and a new import against them fails the build.

``nox -s lint`` runs ``lint-imports`` in CI; these tests show the contracts
are live: the tree keeps them, every module sits in a tier, no two modules
import each other even through imports made only for type checkers, and a
copy of the tree with one forbidden import added (a job service reaching into
the Spark runtime, the CLI reaching into the core, a hook spec naming the job
service for mypy) breaks them, naming the import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "src" / "sparkjet"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(source_root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(source_root)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.mark.slow
def test_the_tree_keeps_its_import_contracts() -> None:
    done = lint_imports(REPO / "src")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "0 broken" in done.stdout


def import_graph() -> grimp.ImportGraph:
    """sparkjet's modules and their imports, those under ``if TYPE_CHECKING:`` included."""
    return grimp.build_graph("sparkjet", exclude_type_checking_imports=False, cache_dir=None)


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    imports = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in imports[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return found


def test_no_two_modules_import_each_other_even_for_type_checkers() -> None:
    # Stricter than the acyclic_siblings contract, which compares packages:
    # here every module counts on its own.
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    assert cycles(graph) == []
    graph.add_import(importer="c", imported="a")
    assert cycles(graph) == [["a", "b", "c"]]


def test_every_module_sits_in_a_tier() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    tiers = next(c for c in contracts["contracts"] if c["name"].startswith("Tiers:"))["layers"]
    placed = [name.strip() for tier in tiers for name in tier.replace("|", ":").split(":")]
    graph = import_graph()
    # The root package is the facade of the facades (`connect`, `Client`,
    # `hookimpl`); `sparkjet.core` is only the folder of the internals.
    assert graph.find_modules_directly_imported_by("sparkjet.core") == set()
    modules = sorted(m for m in graph.modules
                     if m.startswith("sparkjet.") and m != "sparkjet.core")
    unplaced = [m for m in modules
                if not any(m == p or m.startswith(p + ".") for p in placed)]
    assert unplaced == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "crossing", "imported", "contract"),
    [
        ("core/jobs/runner.py", "from sparkjet.core.engine.spark import session",
         "sparkjet.core.engine.spark.session",
         "The services reach the engine only through its boundary"),
        ("cli/commands.py", "from sparkjet.core import store", "sparkjet.core.store",
         "The CLI and the plugins use only the public modules"),
        ("testing/locations.py", "from sparkjet.core import store", "sparkjet.core.store",
         "The test kit uses only the public modules and the plugin API"),
        ("core/state/checkpoint.py", "from sparkjet.core import jobs", "sparkjet.core.jobs",
         "The core, top to bottom"),
        # Inside a wing: the state files naming the checkpoint above them.
        ("core/state/files.py", "from sparkjet.core.state import checkpoint",
         "sparkjet.core.state.checkpoint", "The state wing"),
        # Seen by mypy only, and still a crossing: a hook spec naming the job service.
        ("core/host/hookspecs.py",
         "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
         "    from sparkjet.core.jobs import JetService",
         "sparkjet.core.jobs", "The core, top to bottom"),
        ("core/pipeline/graph/builder.py", "import pyspark", "pyspark",
         "Only the Spark engines (classic and Connect) import pyspark"),
        # The per-partition work runs on any engine: a task module importing Spark is a crossing.
        ("core/engine/tasks/state.py", "import pyspark", "pyspark",
         "Task code is engine-neutral: it imports neither Spark nor an engine"),
        # contrib's plugins register through entry points; the facade finds them there
        ("pipeline.py", "from sparkjet.contrib import files", "sparkjet.contrib.files",
         "The user facade never imports contrib"),
        # Two modules of one tier that name each other for mypy: a cycle.
        ("core/errors.py",
         "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
         "    from sparkjet.core.model import JobStatus",
         ".errors -> .model|.model -> .errors", "No import cycles anywhere in sparkjet"),
    ],
)
def test_a_new_import_against_a_contract_fails(
    tmp_path: Path, module: str, crossing: str, imported: str, contract: str
) -> None:
    copy = tmp_path / "src" / "sparkjet"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    text = target.read_text()
    anchor = "from __future__ import annotations\n"
    assert anchor in text
    target.write_text(text.replace(anchor, f"{anchor}\n{crossing}  # noqa\n", 1))
    done = lint_imports(tmp_path / "src")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert contract in done.stdout.replace("\n", " ")
    assert "BROKEN" in done.stdout
    # The import, or (for a cycle) either edge of it: `a|b` lists the ways it may be named.
    assert any(way in done.stdout.replace("\n", "") for way in imported.split("|"))
