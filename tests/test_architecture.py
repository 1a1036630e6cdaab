"""The import contracts of pyproject.toml hold, and a new import against them fails the build.

``nox -s lint`` runs ``lint-imports`` in CI; these tests show the contracts
are live: the tree keeps them, and a copy of it with one forbidden import
added (a job service reaching into the Spark runtime, the CLI reaching into
the core) breaks them, naming the import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "src" / "sparkjet"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(source_root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(source_root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.mark.slow
def test_the_tree_keeps_its_import_contracts() -> None:
    done = lint_imports(REPO / "src")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "0 broken" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "crossing", "contract"),
    [
        ("core/jobs/runner.py", "from sparkjet.core.runtime import session",
         "The services reach the engine only through its boundary"),
        ("cli/commands.py", "from sparkjet.core import store",
         "The CLI and the plugins use only the public modules"),
        ("core/store/fs.py", "from sparkjet.core import jobs",
         "Layers: CLI > public facades"),
    ],
)
def test_a_new_import_against_a_contract_fails(
    tmp_path: Path, module: str, crossing: str, contract: str
) -> None:
    copy = tmp_path / "src" / "sparkjet"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    text = target.read_text()
    anchor = "from __future__ import annotations\n"
    target.write_text(text.replace(anchor, f"{anchor}\n{crossing}  # noqa\n", 1))
    done = lint_imports(tmp_path / "src")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert contract in done.stdout
    assert "BROKEN" in done.stdout
    imported = crossing.split()[1] + "." + crossing.split()[3]
    assert imported in done.stdout.replace("\n", "")
