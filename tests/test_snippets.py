"""Every snippet in README.md and docs/*.md runs as written, as a reader would run it.

The rules the pages follow, and what this module checks:

- Every fenced ``python`` block runs. The blocks of one page run in order in
  one fresh interpreter and one namespace, as in a reader's session, so a
  block may use what an earlier block of its page defined. The working
  directory is a fresh folder where the README's first command's job,
  ``examples/quickstart.py``, has run (its store ``.sparkjet`` is there),
  with a copy of ``examples/`` beside it. Whatever jobs a page leaves
  running are cancelled at the end of its run.
- A block whose first line is ``# <path>.py`` (and nothing else) is a file
  the reader saves: it is written to that path, not run.
- A line ``print(...)  # <value>`` whose comment is a Python literal shows what
  it prints: the page's output must contain that line.
- docs/kafka.md's blocks run against a Kafka-protocol broker started here
  (Tansu, as the page starts it) whose address they read from
  ``KAFKA_BROKERS``, as the page says.
- Fragments that are not a whole program are fenced as what they are
  (``text``, ``toml``, ``bash``).
- The ``sparkjet`` commands a reader runs from the README (a batch job, the
  streaming example with publish, suspend, resume, restart and cancel) and
  from the quickstart page run as written; each command run here must appear
  in a ``bash`` block of its page.

Tests that start processes are marked ``slow``. The subprocesses use this
interpreter (``PYSPARK_PYTHON`` too); ``sparkjet`` is ``python -m sparkjet.cli``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from tests.conftest import wait_until
from tests.kafka_broker import kafka_broker

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.M | re.S)
FILE_BLOCK = re.compile(r"#\s*(\S+\.py)\s*$")
PRINT_COMMENT = re.compile(r"^\s*print\(.*\)\s+#\s*(.+?)\s*$")
PAGE_TIMEOUT = 420

#: Runs the blocks of one page (a JSON file: [{"where", "line", "code"}]) in one namespace.
RUNNER = """
import json, sys

blocks = json.load(open(sys.argv[1], encoding="utf-8"))
namespace = {"__name__": "__main__"}
try:
    for block in blocks:
        # Pad with blank lines so that tracebacks give the line in the page.
        code = "\\n" * (block["line"] - 1) + block["code"]
        exec(compile(code, block["where"], "exec"), namespace)
finally:
    # A streaming job keeps its process alive: cancel what the page left running.
    from sparkjet.job import Job

    for value in list(namespace.values()):
        if isinstance(value, Job) and value.is_driven_here() and not value.is_terminal():
            value.cancel()
            try:
                value.join(timeout=60)
            except Exception:
                pass
"""


# --- reading the pages ----------------------------------------------------------------------


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(page: Path, language: str) -> list[tuple[int, str]]:
    """The fenced blocks of ``language`` in ``page``: (line of the first code line, code)."""
    text = page.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start()) + 2, m.group(2))
        for m in FENCE.finditer(text) if m.group(1) == language
    ]


def file_block_path(code: str) -> str | None:
    """``path`` if the block is a file to save (its first line is ``# <path>.py``)."""
    match = FILE_BLOCK.fullmatch(code.splitlines()[0]) if code.strip() else None
    return match.group(1) if match else None


def runnable_blocks(page: Path) -> list[dict[str, Any]]:
    return [
        {"where": page_id(page), "line": line, "code": code}
        for line, code in blocks(page, "python") if file_block_path(code) is None
    ]


def file_blocks(page: Path) -> dict[str, str]:
    out = {}
    for _, code in blocks(page, "python"):
        path = file_block_path(code)
        if path is not None:
            out[path] = code
    return out


def expected_prints(page: Path) -> list[str]:
    """The output lines that ``print(...)  # <literal>`` lines of runnable blocks promise."""
    expected = []
    for block in runnable_blocks(page):
        for line in block["code"].splitlines():
            match = PRINT_COMMENT.match(line)
            if match is None:
                continue
            try:
                ast.literal_eval(match.group(1))
            except (ValueError, SyntaxError):
                continue
            expected.append(match.group(1))
    return expected


def documented_commands(page: Path) -> list[list[str]]:
    """Every command line of the page's ``bash`` blocks, split as the shell would."""
    commands = []
    for _, code in blocks(page, "bash"):
        for line in code.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


# --- running ----------------------------------------------------------------------------------


def reader_env(**extra: str) -> dict[str, str]:
    """The environment of a reader's shell: no sparkjet switches; Spark workers run this Python."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKJET_")}
    env.update(PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1", **extra)
    return env


def argv(words: list[str]) -> list[str]:
    """A documented command as this test runs it: ``sparkjet`` and ``python`` are this Python."""
    if words[0] == "sparkjet":
        return [sys.executable, "-m", "sparkjet.cli", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    raise AssertionError(f"not a command this test runs: {words}")


class Reader:
    """A folder where a reader runs the documented commands of some pages."""

    def __init__(self, folder: Path, pages: list[Path]) -> None:
        self.folder = folder
        self.commands = [c for page in pages for c in documented_commands(page)]
        self.pages = ", ".join(page_id(p) for p in pages)
        self.procs: list[subprocess.Popen[bytes]] = []

    def words(self, command: str) -> list[str]:
        words = shlex.split(command)
        assert words in self.commands, f"{self.pages}: no bash block runs `{command}`"
        return words

    def run(self, command: str, status: int = 0, timeout: float = 300) -> tuple[str, str]:
        run = subprocess.run(
            argv(self.words(command)), cwd=self.folder, env=reader_env(),
            capture_output=True, text=True, timeout=timeout,
        )
        assert run.returncode == status, (
            f"`{command}` exited {run.returncode}, not {status}:\n"
            f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        )
        return run.stdout, run.stderr

    def start(self, command: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
        """Start a command that stays in the foreground (another terminal)."""
        index = len(self.procs)
        out, err = self.folder / f".terminal-{index}.out", self.folder / f".terminal-{index}.err"
        with out.open("wb") as out_fh, err.open("wb") as err_fh:
            proc = subprocess.Popen(
                argv(self.words(command)), cwd=self.folder, env=reader_env(),
                stdout=out_fh, stderr=err_fh,
            )
        self.procs.append(proc)
        return proc, out, err

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def running(proc: subprocess.Popen[bytes], err: Path) -> None:
    if proc.poll() is not None:
        pytest.fail(f"the command exited early ({proc.returncode}):\n{err.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def after_quickstart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where `python examples/quickstart.py` ran (the README's first command)."""
    folder = tmp_path_factory.mktemp("quickstart")
    shutil.copytree(ROOT / "examples", folder / "examples")
    run = subprocess.run(
        [sys.executable, "examples/quickstart.py"], cwd=folder, env=reader_env(),
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "doubler: COMPLETED [6, 8, 10]" in run.stdout
    return folder


@pytest.fixture
def reader_folder(after_quickstart: Path, tmp_path: Path) -> Path:
    """A fresh copy of the folder where the quickstart ran."""
    folder = tmp_path / "reader"
    shutil.copytree(after_quickstart, folder)
    return folder


def store(folder: Path) -> sparkjet.Client:
    """A client on the default store of ``folder`` (for reading lists and maps; no Spark)."""
    return sparkjet.connect(store={"url": str(folder / ".sparkjet")})


# --- fast checks: the pages follow the rules --------------------------------------------------


def test_readme_python_blocks_parse() -> None:
    for line, code in blocks(ROOT / "README.md", "python"):
        try:
            ast.parse(code)
        except SyntaxError as exc:
            pytest.fail(f"README.md, block at line {line}: {exc}")


def test_quickstart_is_the_readme_first_command() -> None:
    first = documented_commands(ROOT / "README.md")[0]
    assert first[-2:] == [".venv/bin/python", "examples/quickstart.py"], first


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "docs" / "streaming.md"], ids=page_id)
def test_the_clicks_pipeline_shown_is_the_example(page: Path) -> None:
    example = (ROOT / "examples" / "clicks.py").read_text(encoding="utf-8")
    marker = 'StreamSource("clicks", partitions=2)'
    shown = [code for _, code in blocks(page, "python") if marker in code]
    assert shown, f"{page_id(page)} does not show the pipeline of examples/clicks.py"
    for code in shown:
        body = "\n".join(ln for ln in code.splitlines() if not ln.startswith("# examples/"))
        assert body.strip() in example, f"{page_id(page)}: the pipeline differs from clicks.py"


def test_clicks_data_is_json_lines() -> None:
    lines = (ROOT / "examples" / "clicks.jsonl").read_text(encoding="utf-8").splitlines()
    clicks = [json.loads(line) for line in lines]
    users = {c["user"]: sum(1 for d in clicks if d["user"] == c["user"]) for c in clicks}
    assert users == {"ada": 5, "bob": 3, "cy": 2}  # what the README and streaming.md show


# --- slow: every python block of every page runs ----------------------------------------------


def plugin_distribution(page: Path, folder: Path) -> Path:
    """Build and install the page's example distribution, as its reader does with `pip install .`.

    The distribution is the page's ``pyproject.toml`` block (the one declaring
    the ``sparkjet`` entry point) and its ``# src/...`` file blocks. Installed
    into a folder of its own, which goes on ``PYTHONPATH``.
    """
    dist = folder.parent / "example-distribution"
    toml = next(code for _, code in blocks(page, "toml") if "entry-points.sparkjet" in code)
    (dist).mkdir()
    (dist / "pyproject.toml").write_text(toml, encoding="utf-8")
    for path, code in file_blocks(page).items():
        target = dist / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(code, encoding="utf-8")
    site = folder.parent / "site-packages"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
         "--disable-pip-version-check", "--no-input", "--quiet", "--target", str(site), str(dist)],
        capture_output=True, text=True, timeout=300,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return site


def run_page(
    page: Path, folder: Path, expected: list[str] | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run the page's python blocks in ``folder``; check they print what they promise.

    ``expected``: the lines to look for instead of the ``print(...)  # <literal>``
    comments' (a block run again, when the page says it prints something else then).
    """
    for path, code in file_blocks(page).items():
        if not path.startswith("src/"):
            (folder / path).parent.mkdir(parents=True, exist_ok=True)  # tests/test_x.py too
            (folder / path).write_text(code, encoding="utf-8")
    program = folder.parent / "blocks.json"
    program.write_text(json.dumps(runnable_blocks(page)), encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-c", RUNNER, str(program)], cwd=folder, env=reader_env(**env),
        capture_output=True, text=True, timeout=PAGE_TIMEOUT,
    )
    assert run.returncode == 0, (
        f"{page_id(page)}: a python block failed:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    )
    lines = run.stdout.splitlines()
    promised = expected_prints(page) if expected is None else expected
    missing = [line for line in promised if line not in lines]
    assert not missing, f"{page_id(page)}: printed\n{run.stdout}\nbut not {missing}"
    return run


INDEX = ROOT / "docs" / "index.md"
WALKTHROUGH = ROOT / "docs" / "walkthrough.md"
FIRST_PLUGIN = ROOT / "docs" / "first-plugin.md"
#: The quickstart page runs in test_index_page_submit_from_the_command_line, before its
#: commands; the walkthrough's block runs in test_walkthrough, after its commands; the
#: first plugin's in tests/test_first_plugin.py, once the plugin it builds is installed.
PAGES_WITH_CODE = [page for page in PAGES if runnable_blocks(page)
                   and page not in (INDEX, WALKTHROUGH, FIRST_PLUGIN)]


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=page_id)
def test_python_blocks_run(page: Path, reader_folder: Path) -> None:
    env = {}
    if page.name == "plugins.md":
        env["PYTHONPATH"] = str(plugin_distribution(page, reader_folder))
    if page.name == "kafka.md":  # the page's broker: Tansu as the page starts it, on a free port
        with kafka_broker() as bootstrap:
            run_page(page, reader_folder, KAFKA_BROKERS=bootstrap)
        return
    run_page(page, reader_folder, **env)
    if page.name == "plugins.md":  # the users' job of the complete example wrote one file
        (committed,) = (reader_folder / "out" / "squares").glob("*.jsonl")
        lines = committed.read_text().splitlines()
        assert [json.loads(line) for line in lines] == [
            {"n": n, "square": n * n} for n in range(10)
        ]
    if page.name == "README.md":
        assert store(reader_folder).get_list("results").get_all() == [6, 8, 10]


# --- slow: the commands of the quickstart page and of the README ---------------------------


@pytest.mark.slow
def test_index_page_submit_from_the_command_line(reader_folder: Path) -> None:
    page = INDEX
    run_page(page, reader_folder)  # saves doubler.py; the quickstart block leaves [6, 8, 10]
    reader = Reader(reader_folder, [page])
    out, _ = reader.run("sparkjet submit -n doubler doubler.py")
    assert re.search(r"Job 'doubler' \(\S+\) finished: COMPLETED", out), out
    out, _ = reader.run("sparkjet list-jobs -a")
    assert [row.split()[1] for row in out.splitlines()[1:] if row.endswith("doubler")] == [
        "COMPLETED", "COMPLETED"  # this one and the quickstart's (the page's has no name)
    ], out
    assert store(reader_folder).get_list("results").get_all() == [6, 8, 10, 6, 8, 10]


def wait_for_counts(folder: Path, expected: dict[str, int], procs: Iterator[Any]) -> None:
    counts = store(folder).get_map("clicks-per-user")
    checks = list(procs)

    def done() -> bool:
        for proc, err in checks:
            running(proc, err)
        return dict(counts.entry_set()) == expected

    wait_until(done, 180, f"the map clicks-per-user to be {expected}", interval=0.25)


@pytest.mark.slow
def test_readme_commands_and_the_streaming_example(reader_folder: Path) -> None:
    """The README's commands, and the clicks example as README and streaming.md tell it."""
    readme = Reader(reader_folder, [ROOT / "README.md"])
    out, err = readme.run(
        'sparkjet submit -n word-count examples/word_count.py "to be or not to be"'
    )
    assert re.search(r"finished: COMPLETED", out), out
    assert "sparkjet.sink.logger: to: 2" in err and "sparkjet.sink.logger: be: 2" in err, err
    out, _ = readme.run("sparkjet list-jobs -a")
    assert re.search(r"COMPLETED\s+\S+\s+word-count$", out, re.M), out
    out, _ = readme.run("sparkjet plugins")
    assert "sparkjet.plugins.streams.StreamSource" in out, out

    for pages in ([ROOT / "README.md"], [ROOT / "docs" / "streaming.md"]):
        reader = Reader(reader_folder, pages)
        for command in STREAMING_EXAMPLE:  # every command is in both pages
            reader.words(command)
    reader = readme
    try:
        submit, submit_out, submit_err = reader.start(STREAMING_EXAMPLE[0])
        out, _ = reader.run(STREAMING_EXAMPLE[1])
        assert out == "Published 10 items to stream 'clicks'\n"
        wait_for_counts(reader_folder, {"ada": 5, "bob": 3, "cy": 2}, [(submit, submit_err)])
        out, _ = reader.run(STREAMING_EXAMPLE[2])
        assert out.splitlines() == ["ada: 5", "bob: 3", "cy: 2"]

        out, _ = reader.run(STREAMING_EXAMPLE[3])  # suspend: terminal 1's submit exits 0
        assert re.search(r"Job 'clicks' \(\S+\) is SUSPENDED \(Requested by user", out), out
        assert submit.wait(timeout=90) == 0, submit_err.read_text()[-3000:]
        assert "Resume it with: sparkjet resume" in submit_out.read_text()

        resume, resume_out, resume_err = reader.start(STREAMING_EXAMPLE[4])
        wait_until(
            lambda: running(resume, resume_err) or "is RUNNING" in resume_out.read_text(),
            180, "resume to run the job",
        )
        out, _ = reader.run(STREAMING_EXAMPLE[5])
        assert out == "Published 10 items to stream 'clicks'\n"
        wait_for_counts(reader_folder, {"ada": 10, "bob": 6, "cy": 4}, [(resume, resume_err)])
        out, _ = reader.run(STREAMING_EXAMPLE[2])
        assert out.splitlines() == ["ada: 10", "bob: 6", "cy: 4"]

        out, _ = reader.run(STREAMING_EXAMPLE[6])  # restart
        assert re.search(r"Job 'clicks' \(\S+\) is RUNNING", out), out
        time.sleep(0.5)
        running(resume, resume_err)
        out, _ = reader.run(STREAMING_EXAMPLE[7])  # cancel: terminal 2's resume exits 1
        assert "finished: FAILED (cancelled by user)" in out, out
        assert resume.wait(timeout=90) == 1, resume_err.read_text()[-3000:]
        # Every click counted once, across the suspension and the restart.
        assert dict(store(reader_folder).get_map("clicks-per-user").entry_set()) == {
            "ada": 10, "bob": 6, "cy": 4
        }
    finally:
        reader.stop_all()


#: The clicks example, in the order the README and streaming.md run it.
STREAMING_EXAMPLE = [
    "sparkjet submit -n clicks -g exactly_once --snapshot-interval 1000 examples/clicks.py",
    "sparkjet publish --partitions 2 clicks examples/clicks.jsonl",
    "python examples/clicks.py",
    "sparkjet suspend clicks",
    "sparkjet resume clicks",
    "sparkjet publish clicks examples/clicks.jsonl",
    "sparkjet restart clicks",
    "sparkjet cancel clicks",
]


# --- the walkthrough: files in, results out, a SIGKILL in between ------------------------------


def test_the_walkthrough_shows_the_orders_pipeline() -> None:
    example = (ROOT / "examples" / "orders.py").read_text(encoding="utf-8")
    [(_, shown)] = [(line, code) for line, code in blocks(WALKTHROUGH, "text")
                    if "FileSource" in code]
    for line in shown.strip().splitlines():
        assert line.strip() in example, f"walkthrough.md: not in examples/orders.py: {line}"


def shell(reader: Reader, command: str) -> None:
    """The page's ``mkdir -p``, ``cp`` and ``mv`` lines, done here (once the page has them)."""
    words = reader.words(command)
    if words[:2] == ["mkdir", "-p"]:
        (reader.folder / words[2]).mkdir(parents=True, exist_ok=True)
    elif words[0] == "cp":
        shutil.copyfile(reader.folder / words[1], reader.folder / words[2])
    elif words[0] == "mv":
        (reader.folder / words[1]).rename(reader.folder / words[2] / Path(words[1]).name)
    else:  # pragma: no cover - test bug
        raise AssertionError(command)


@pytest.mark.slow
def test_walkthrough(reader_folder: Path) -> None:
    """docs/walkthrough.md as a reader follows it, the kill -9 included."""
    reader = Reader(reader_folder, [WALKTHROUGH])
    spend = store(reader_folder).get_map("spend")
    try:
        submit, _, submit_err = reader.start(
            "sparkjet submit -n orders -g exactly_once --snapshot-interval 1000 "
            "examples/orders.py")
        shell(reader, "mkdir -p inbox")
        shell(reader, "cp examples/orders.jsonl inbox/orders-1.jsonl")
        first = {"ada": 60, "bob": 20, "cy": 40}

        def summed(expected: dict[str, int], proc: Any, err: Path) -> None:
            def done() -> bool:
                running(proc, err)
                return dict(spend.entry_set()) == expected
            wait_until(done, 180, f"the map spend to be {expected}", interval=0.25)

        summed(first, submit, submit_err)
        out, _ = reader.run("sparkjet get map spend")
        assert out.splitlines() == ["KEY  VALUE", "ada  60", "bob  20", "cy   40"], out
        out, _ = reader.run("sparkjet status orders")
        assert re.match(r"Job 'orders' \(\S+\) is RUNNING", out), out
        out, _ = reader.run("sparkjet metrics orders")
        assert re.search(r"^check\s+7\s+6\s+1\b", out, re.M), out  # received, emitted, dead
        out, _ = reader.run("sparkjet get stream orders.dead-letters")
        assert out.startswith("0:0  ") and "twelve" in out and len(out.splitlines()) == 1, out

        submit.send_signal(signal.SIGKILL)  # kill -9
        submit.wait(timeout=30)
        out, _ = reader.run("sparkjet status orders")
        assert re.match(r"Job 'orders' \(\S+\) is SUSPENDED \(the driver process", out), out
        assert "Resume it with: sparkjet resume orders" in out, out
        shell(reader, "cp examples/orders.jsonl inbox/orders-2.jsonl")
        resume, resume_out, resume_err = reader.start("sparkjet resume orders")
        wait_until(lambda: running(resume, resume_err) or "is RUNNING" in resume_out.read_text(),
                   180, "resume to run the job")
        summed({k: 2 * v for k, v in first.items()}, resume, resume_err)
        out, _ = reader.run("sparkjet get map spend --json")
        assert json.loads(out) == [{"key": "ada", "value": 120}, {"key": "bob", "value": 40},
                                   {"key": "cy", "value": 80}], out
        out, _ = reader.run("sparkjet get stream orders.dead-letters --json")
        letters = [json.loads(line)["item"] for line in out.splitlines()]
        assert [(d["item"]["order"], d["stage"]) for d in letters] == [(5, "check")] * 2, out
        assert len({d["batch"] for d in letters}) == 2, out  # one per file's micro-batch
        assert [d["offset"] for d in letters] == [  # where each bad order is
            {"file": "orders-1.jsonl", "line": 5}, {"file": "orders-2.jsonl", "line": 5}], out
        out, _ = reader.run("sparkjet cancel orders")
        assert "finished: FAILED (cancelled by user)" in out, out
        assert resume.wait(timeout=90) == 1, resume_err.read_text()[-3000:]
    finally:
        reader.stop_all()
    run_page(WALKTHROUGH, reader_folder)  # fixes the two letters: prints 2
    assert (reader_folder / "replayed.jsonl").read_text().count('"amount": 12') == 2
    shell(reader, "mv replayed.jsonl inbox/")
    out, _ = reader.run("sparkjet trim orders.dead-letters --keep-items 0")
    assert out.splitlines() == [
        "partition 0: removed offsets 0 to 1 (2 items); starts at 2",
        "Removed 2 items of stream 'orders.dead-letters' (keep 0 items).",
    ], out
    # "A second run finds no letters and prints 0": nothing is replayed twice.
    run_page(WALKTHROUGH, reader_folder, expected=["0"])
    assert (reader_folder / "replayed.jsonl").read_text() == ""
    out, err = reader.run("sparkjet get stream orders.dead-letters")
    assert (out, err) == ("", "stream 'orders.dead-letters' partition 0: offsets 0 to 1 were "
                              "trimmed (2 items); reading from 2\n"), (out, err)


def test_the_walkthrough_says_how_to_make_the_virtualenv_it_activates() -> None:
    """The README's setup command and extra, with the extra the page needs, then activation."""
    [readme] = [words for words in documented_commands(ROOT / "README.md")
                if words[:4] == ["python3", "-m", "venv", ".venv"] and "-e" in words]
    setup = readme[:readme.index("-e") + 1]  # python3 -m venv .venv && .venv/bin/pip install -e
    page = documented_commands(WALKTHROUGH)
    assert [".", ".venv/bin/activate"] in page, "walkthrough.md: no `. .venv/bin/activate`"
    made = [words for words in page if words[:len(setup)] == setup]
    assert made, f"walkthrough.md: no bash line starting {' '.join(setup)!r} (the README's)"
    assert made[0][len(setup)] == ".[spark,files]", made[0]  # the README's extra, and files
