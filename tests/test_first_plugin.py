"""docs/first-plugin.md, followed from an empty folder: the plugin it builds passes the kit.

The page's ``pyproject.toml`` block and its ``# <path>.py`` file blocks are
written into an empty ``sparkjet-lines`` folder, its three commands run
there (``pip install -e '.[test]'`` as an install into a folder of its own on
``PYTHONPATH``, which needs no network and leaves this environment alone;
``pytest -rs`` as written), and the kit must pass with exactly the skips the
page shows. Then its "Use it" block runs with the plugin installed and must
print what it says. Slow: a pip install, the kit's jobs and its driver
processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_snippets import (
    ROOT,
    RUNNER,
    blocks,
    documented_commands,
    expected_prints,
    file_blocks,
    reader_env,
    runnable_blocks,
)

PAGE = ROOT / "docs" / "first-plugin.md"


def _env(site: Path) -> dict[str, str]:
    """A reader's shell with the plugin installed (``site``) before what is already there."""
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    return reader_env(PYTHONPATH=os.pathsep.join(paths))


def test_the_page_runs_three_commands() -> None:
    """The commands the page asks for are the ones this test runs the equivalent of."""
    assert documented_commands(PAGE) == [
        ["cd", "sparkjet-lines"], ["pip", "install", "-e", ".[test]"], ["pytest", "-rs"],
    ]


@pytest.mark.slow
def test_an_empty_folder_to_a_passing_kit(tmp_path: Path) -> None:
    """The folder the page builds installs, passes the kit, and runs a job."""
    folder = tmp_path / "sparkjet-lines"
    folder.mkdir()
    (toml,) = [code for _, code in blocks(PAGE, "toml")]
    (folder / "pyproject.toml").write_text(toml, encoding="utf-8")
    files = file_blocks(PAGE)
    assert sorted(files) == ["src/sparkjet_lines/__init__.py", "tests/conftest.py",
                             "tests/test_lines_source.py"]
    for path, code in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(code, encoding="utf-8")

    site = tmp_path / "site-packages"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
         "--disable-pip-version-check", "--no-input", "--quiet", "--target", str(site),
         str(folder)],
        capture_output=True, text=True, timeout=300,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr

    kit = subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider"], cwd=folder,
        env=_env(site), capture_output=True, text=True, timeout=600,
    )
    report = kit.stdout + kit.stderr
    assert kit.returncode == 0, f"the page's plugin fails its kit:\n{report[-6000:]}"
    summary = kit.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, summary
    shown = [
        line.split(": ", 1)[1] for _, code in blocks(PAGE, "text")
        for line in code.splitlines() if line.startswith("SKIPPED")
    ]
    skipped = [
        line.split(": ", 1)[1] for line in kit.stdout.splitlines() if line.startswith("SKIPPED")
    ]
    assert sorted(skipped) == sorted(shown), (
        f"the page shows the skips {shown}, the kit reported {skipped}"
    )

    program = tmp_path / "use-it.json"
    program.write_text(json.dumps(runnable_blocks(PAGE)), encoding="utf-8")
    use = subprocess.run(
        [sys.executable, "-c", RUNNER, str(program)], cwd=tmp_path, env=_env(site),
        capture_output=True, text=True, timeout=300,
    )
    assert use.returncode == 0, use.stdout[-3000:] + use.stderr[-3000:]
    lines = use.stdout.splitlines()
    assert [line for line in expected_prints(PAGE) if line not in lines] == [], use.stdout
