"""The user documentation stays in step with the code (no Spark needed).

Checks that every hook, public name, JobConfig field and configuration key is
documented, that the Python samples in the docs parse and import only names
that exist, and that ``mkdocs build --strict`` succeeds.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import sparkjet
from sparkjet import aggregate, errors, job, pipeline, plugin
from sparkjet.core import config as core_config
from sparkjet.core.host import hookspecs

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"


def read_doc(name: str) -> str:
    path = DOCS / name
    assert path.is_file(), f"docs/{name} is missing"
    return path.read_text(encoding="utf-8")


def all_docs() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md"))}


def sections(text: str, level: int) -> dict[str, str]:
    """Heading text -> body up to the next heading of the same or a higher level."""
    pattern = re.compile(rf"^{'#' * level} (.+?)\s*$", re.M)
    matches = list(pattern.finditer(text))
    out: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = len(text)
        higher = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, match.end())
        if higher is not None:
            end = higher.start()
        if i + 1 < len(matches):
            end = min(end, matches[i + 1].start())
        out[match.group(1)] = text[match.end() : end]
    return out


def normalized(text: str) -> str:
    """Markdown-ish text with reST double backticks as single ones and white space collapsed."""
    return " ".join(text.replace("``", "`").split())


def is_sparkjet_module(name: str | None) -> bool:
    return name == "sparkjet" or (name or "").startswith("sparkjet.")


def hook_specs() -> dict[str, object]:
    marker = f"{hookspecs.PROJECT}_spec"
    return {
        name: fn for name, fn in vars(hookspecs).items()
        if inspect.isfunction(fn) and hasattr(fn, marker)
    }


def python_blocks() -> list[tuple[str, int, str]]:
    """Every fenced ```python block in docs/: (file, line, code)."""
    blocks = []
    for name, text in all_docs().items():
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.M | re.S):
            line = text.count("\n", 0, match.start()) + 2
            blocks.append((name, line, match.group(1)))
    return blocks


# --- hooks ------------------------------------------------------------------------------


def test_hookspecs_are_found() -> None:
    assert "register_sources" in hook_specs()
    assert "on_job_error" in hook_specs()


@pytest.mark.parametrize("hook", sorted(hook_specs()))
def test_every_hook_has_a_section_in_plugins_md(hook: str) -> None:
    text = read_doc("plugins.md")
    heading = f"`{hook}`"
    found = sections(text, 3)
    assert heading in found, (
        f"hook {hook} (src/sparkjet/core/host/hookspecs.py) has no '### `{hook}`' heading "
        "in docs/plugins.md"
    )
    body = found[heading]
    assert re.search(rf"def {hook}\(", body), f"docs/plugins.md: give {hook}'s signature"
    doc = inspect.getdoc(hook_specs()[hook]) or ""
    summary = normalized(doc.split("\n\n")[0]) if doc else ""
    assert summary and summary in normalized(body), (
        f"docs/plugins.md, section {hook}: the hook's summary {summary!r} is missing"
    )
    for param in re.findall(r":param (\w+):", doc):
        assert f"`{param}`" in body, f"docs/plugins.md, section {hook}: parameter {param}"


def test_hook_reference_documents_only_real_hooks() -> None:
    text = read_doc("plugins.md")
    assert "## Hook reference" in text
    reference = text.split("## Hook reference", 1)[1]
    documented = set(re.findall(r"^### `(\w+)`", reference, re.M))
    unknown = documented - set(hook_specs())
    assert not unknown, f"docs/plugins.md documents hooks that do not exist: {sorted(unknown)}"


# --- public names ---------------------------------------------------------------------


PUBLIC_MODULES = [sparkjet, pipeline, job, aggregate, errors, plugin]


@pytest.mark.parametrize("module", PUBLIC_MODULES, ids=lambda m: m.__name__)
def test_every_public_name_is_documented(module: ModuleType) -> None:
    text = "\n".join(all_docs().values())
    missing = [
        name for name in module.__all__
        if not name.startswith("__") and not re.search(rf"\b{re.escape(name)}\b", text)
    ]
    assert not missing, f"{module.__name__}.__all__ names not mentioned in docs/: {missing}"


def test_every_job_config_field_is_in_jobs_md() -> None:
    text = read_doc("jobs.md")
    missing = [
        f.name for f in dataclasses.fields(job.JobConfig) if f"`{f.name}`" not in text
    ]
    assert not missing, f"JobConfig fields missing from docs/jobs.md: {missing}"


@pytest.mark.parametrize("section", sorted(core_config._SCHEMA))
def test_every_config_key_is_in_configuration_md(section: str) -> None:
    text = read_doc("configuration.md")
    found = {h: body for h, body in sections(text, 2).items() if f"`[{section}]`" in h}
    assert found, f"docs/configuration.md has no '## `[{section}]`' section"
    body = "\n".join(found.values())
    missing = [key for key in core_config._SCHEMA[section] if f"`{key}`" not in body]
    assert not missing, (
        f"docs/configuration.md, section [{section}]: keys not documented: {missing}"
    )


def test_environment_variables_are_in_configuration_md() -> None:
    from sparkjet.core.host import manager as core_plugins

    text = read_doc("configuration.md")
    for var in (
        core_config.ENV_CONFIG,
        core_plugins.ENV_DISABLE_AUTOLOAD,
        core_plugins.ENV_BLOCK,
        core_plugins.ENV_TRACE,
        "PYSPARK_PYTHON",
    ):
        assert f"`{var}`" in text, f"environment variable {var} missing from configuration.md"


def test_spark_defaults_are_in_configuration_md() -> None:
    from sparkjet.core.engine.spark.session import DEFAULT_CONF

    text = read_doc("configuration.md")
    for key, value in DEFAULT_CONF.items():
        assert f"`{key}`" in text and f"`{value}`" in text, (
            f"Spark default {key}={value} missing from docs/configuration.md"
        )


# --- code samples -----------------------------------------------------------------------


def test_python_samples_parse() -> None:
    blocks = python_blocks()
    assert blocks
    for name, line, code in blocks:
        try:
            ast.parse(code)
        except SyntaxError as exc:
            pytest.fail(f"docs/{name}, code block at line {line}: {exc}")


def test_python_samples_import_only_existing_names() -> None:
    for name, line, code in python_blocks():
        for node in ast.walk(ast.parse(code)):
            where = f"docs/{name}, code block at line {line}"
            if isinstance(node, ast.ImportFrom) and is_sparkjet_module(node.module):
                assert node.module is not None
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), (
                        f"{where}: {node.module} has no {alias.name}"
                    )
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if is_sparkjet_module(alias.name):
                        importlib.import_module(alias.name)


# --- the site builds --------------------------------------------------------------------


def test_mkdocs_nav_lists_every_page() -> None:
    config = MKDOCS_YML.read_text(encoding="utf-8")
    for page in all_docs():
        assert re.search(rf":\s*{re.escape(page)}\s*$", config, re.M), (
            f"docs/{page} is not in the nav of mkdocs.yml"
        )


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]'); the site was not built")
    if importlib.util.find_spec("pymdownx") is None:
        pytest.fail(
            "mkdocs.yml uses pymdownx.superfences (mermaid diagrams): the docs extra needs "
            "pymdown-extensions>=10.0"
        )
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(MKDOCS_YML), "--site-dir", str(site)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    assert (site / "index.html").is_file()


# --- the architecture page ---------------------------------------------------------------


def test_architecture_names_every_module() -> None:
    import pkgutil

    import sparkjet.core

    text = read_doc("architecture.md")
    top = [m.name for m in pkgutil.iter_modules(sparkjet.__path__)]
    core = [m.name for m in pkgutil.iter_modules(sparkjet.core.__path__)]
    missing = [f"sparkjet.{name}" for name in top if f"sparkjet.{name}" not in text]
    missing += [f"sparkjet.core.{name}" for name in core if f"core.{name}" not in text]
    # Modules of the core's packages: by their dotted name, or in backticks where
    # the page lists a package's modules.
    for package in [m for m in pkgutil.iter_modules(sparkjet.core.__path__) if m.ispkg]:
        path = [str(Path(sparkjet.core.__path__[0]) / package.name)]
        for module in pkgutil.iter_modules(path):
            dotted = f"core.{package.name}.{module.name}"
            if dotted not in text and f"`{module.name}`" not in text:
                missing.append(f"sparkjet.{dotted}")
    assert not missing, f"docs/architecture.md does not place these modules: {missing}"


def test_architecture_page_has_a_diagram() -> None:
    assert "```mermaid\nflowchart" in read_doc("architecture.md")
    assert "pymdownx.superfences" in MKDOCS_YML.read_text(encoding="utf-8")


# --- the command line, jobs and streaming -----------------------------------------------


def cli_commands() -> dict[str, list[str]]:
    """Every ``sparkjet`` subcommand with its long options."""
    import argparse

    from sparkjet.cli import build_parser

    parser = build_parser()
    subparsers = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    )
    return {
        name: [
            opt for action in sub._actions for opt in action.option_strings
            if opt.startswith("--") and opt != "--help"
        ]
        for name, sub in subparsers.choices.items()
    }


def test_cli_commands_are_found() -> None:
    assert {"submit", "cancel", "suspend", "resume", "restart", "publish"} <= set(cli_commands())


@pytest.mark.parametrize("command", sorted(cli_commands()))
def test_every_cli_command_and_option_is_in_cli_md(command: str) -> None:
    text = read_doc("cli.md")
    found = sections(text, 2)
    assert f"`{command}`" in found, f"docs/cli.md has no '## `{command}`' section"
    assert f"sparkjet [--config FILE] [-v] {command}" in text, (
        f"docs/cli.md: the synopsis at the top does not list {command}"
    )
    body = found[f"`{command}`"]
    missing = [opt for opt in cli_commands()[command] if opt not in body]
    assert not missing, f"docs/cli.md, section {command}: options not documented: {missing}"


def test_every_job_method_is_in_jobs_md() -> None:
    from sparkjet.core.jobs import Job

    text = read_doc("jobs.md")
    public = [name for name in vars(Job) if not name.startswith("_") and name != "label"]
    missing = [name for name in public if f"`job.{name}" not in text]
    assert not missing, f"Job members missing from docs/jobs.md (as `job.<name>`): {missing}"


def test_updatable_config_fields_are_documented() -> None:
    from sparkjet.core.jobs import UPDATABLE_FIELDS

    for page in ("jobs.md", "streaming.md"):
        text = read_doc(page)
        missing = sorted(f for f in UPDATABLE_FIELDS if f"`{f}`" not in text)
        assert not missing, f"docs/{page}: fields update_config() accepts not listed: {missing}"


def test_streaming_metrics_are_in_streaming_md() -> None:
    from sparkjet.core.microbatch.loop import StreamProgress

    text = read_doc("streaming.md")
    keys = [*StreamProgress().as_metrics(), "snapshotKeys", "snapshotBytes"]
    missing = [key for key in keys if f"`{key}`" not in text]
    assert not missing, f"streaming metrics missing from docs/streaming.md: {missing}"


def test_streaming_plugin_api_is_in_plugins_md() -> None:
    text = read_doc("plugins.md")
    for method in ("initial_offsets", "latest_offsets", "plan_range"):
        assert f"`{method}(" in text, f"docs/plugins.md: Source.{method} is not documented"
    context_fields = [f.name for f in dataclasses.fields(plugin.JobContext)]
    properties = [n for n, v in vars(plugin.JobContext).items() if isinstance(v, property)]
    missing = [n for n in [*context_fields, *properties] if f"| `{n}` |" not in text]
    assert not missing, f"docs/plugins.md: JobContext members missing from its table: {missing}"


def test_stream_handle_is_documented() -> None:
    from sparkjet.core.store.structures import IStream

    members = [n for n in vars(IStream) if not n.startswith("_")]
    for page in ("streaming.md", "store.md"):
        text = read_doc(page)
        missing = [n for n in members if f"`{n}" not in text]
        assert not missing, f"docs/{page}: IStream members not documented: {missing}"


def test_checkpoint_layout_matches_the_code() -> None:
    from sparkjet.core.state import checkpoint

    text = read_doc("streaming.md")
    layout = (checkpoint.__doc__ or "").split("::", 1)[1]
    for entry in re.findall(r"^\s+(\S+)", layout, re.M):
        assert entry in text, f"docs/streaming.md: checkpoint entry {entry!r} is not described"
