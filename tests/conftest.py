"""Shared fixtures: one Spark session per test process, a fresh store per test."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import sparkjet

# Real S3 and GCS servers on 127.0.0.1, and the store conformance suite.
pytest_plugins = ["sparkjet.testing"]

#: Set to ``spark`` to run the tests that are not marked ``spark`` on Spark too (the
#: :func:`client` fixture then is Spark's, adaptive): how CI runs the semantic tests
#: on the oldest Spark. ``connect``: the same, on a Spark Connect server this
#: process starts (``[spark] remote = "local[2]"``), and the tests marked ``spark``
#: run there too.
TEST_ENGINE = os.environ.get("SPARKJET_TEST_ENGINE", "in-process")

_TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.default.parallelism": "2",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "1g",
}

#: Settings for the one session the whole test process shares: a classic one, or
#: with ``SPARKJET_TEST_ENGINE=connect`` a local Spark Connect server's.
#: The Connect server of ``SPARKJET_TEST_ENGINE=connect``: the one that
#: ``tests/connect_server.py`` started for the run, else one in this process.
TEST_REMOTE = os.environ.get("SPARKJET_TEST_REMOTE", "local[2]")
TEST_SPARK: dict[str, Any] = (
    {"remote": TEST_REMOTE, "conf": {}} if TEST_ENGINE == "connect"
    else {"master": "local[2]", "app_name": "sparkjet-tests", "conf": _TEST_CONF}
)


@pytest.fixture(autouse=True)
def _isolated_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's sparkjet.toml or environment switches."""
    for var in (
        "SPARKJET_CONFIG",
        "SPARKJET_BLOCK_PLUGINS",
        "SPARKJET_DISABLE_PLUGIN_AUTOLOAD",
        "SPARKJET_TRACE_HOOKS",
        "SPARKJET_STORE",
        "SPARK_REMOTE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "user-config"))
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)


@pytest.fixture
def installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Callable[..., Path]]:
    """Make "installed" distributions: a ``*.dist-info`` folder (and modules) on sys.path.

    ``installed(dist, {"ep-name": "module"}, modules={"module": "source"})``;
    a dotted module name (``"pkg.hooks"``) is written into its package's
    folder, and a package's ``__init__.py`` is made empty unless ``modules``
    has the package's own source. ``importlib.metadata`` sees exactly what it
    sees of a distribution pip installed, so these are real entry points.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    created: list[str] = []

    def make(
        dist: str,
        entry_points: dict[str, str],
        modules: dict[str, str] | None = None,
        version: str = "1.0",
    ) -> Path:
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n", encoding="utf-8"
        )
        lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
        (info / "entry_points.txt").write_text(f"[sparkjet]\n{lines}", encoding="utf-8")
        sources = dict(modules or {})
        packages = {m.rsplit(".", i)[0] for m in sources for i in range(1, m.count(".") + 1)}
        for module in sorted(packages | set(sources)):
            parts = module.split(".")
            path = (site.joinpath(*parts, "__init__.py") if module in packages
                    else site.joinpath(*parts[:-1], f"{parts[-1]}.py"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(sources.get(module, "")), encoding="utf-8")
            created.append(module)
        importlib.invalidate_caches()
        return info

    yield make
    for module in created:
        sys.modules.pop(module, None)


#: The partitions the in-process engine spreads a run over: the test session's.
TEST_PARALLELISM = 2


@pytest.fixture(params=["driver-reduce", "shuffle-reduce", "in-process"])
def reduce_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test through each way a job's work runs.

    On Spark, keyed stages reduce on the driver or shuffled; ``in-process``:
    the :func:`client` fixture's jobs run on the in-process engine, the very
    same tasks without Spark.
    """
    from sparkjet.core.engine.tasks import passes

    if request.param == "shuffle-reduce":
        monkeypatch.setattr(passes, "DRIVER_REDUCE_LIMIT", -1)
    return str(request.param)


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return str(tmp_path / "store")


@pytest.fixture(params=["spark", "in-process"])
def engine_kind(request: pytest.FixtureRequest) -> str:
    """Run a test on each engine: Spark, and in-process (the :func:`client` fixture's)."""
    return str(request.param)


def _in_process(request: pytest.FixtureRequest) -> bool:
    """Whether the test asked for the in-process engine (``reduce_path``, ``engine_kind``)."""
    return any(
        name in request.fixturenames and request.getfixturevalue(name) == "in-process"
        for name in ("reduce_path", "engine_kind")
    )


def on_spark(request: pytest.FixtureRequest) -> bool:
    """Whether the test's jobs run on Spark: it is marked ``spark``, or CI asked for it."""
    return (TEST_ENGINE in ("spark", "connect")
            or request.node.get_closest_marker("spark") is not None)


def in_process_client(store_url: str) -> sparkjet.Client:
    """A client on ``store_url`` whose jobs all run in this process (``driver_only``): no JVM."""
    return sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK,
                            engine={"driver_only": True})


def _spark_asked(request: pytest.FixtureRequest) -> bool:
    """Whether the test may use Spark: marked ``spark``, or run on a Spark parameter."""
    if on_spark(request):
        return True
    params = getattr(request.node, "callspec", None)
    asked = params.params if params is not None else {}
    return any(asked.get(name) not in (None, "in-process") for name in ("reduce_path",
                                                                        "engine_kind"))


@pytest.fixture(autouse=True)
def _spark_only_where_marked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
) -> Iterator[None]:
    """Fail a test that starts or uses the Spark session without saying it needs Spark.

    So the tests that need a JVM are the ones marked ``spark`` (or run on a
    Spark parameter), and ``-m "not spark"`` runs the rest without one.
    """
    if _spark_asked(request):
        yield
        return
    from sparkjet.core.engine.spark import session

    used: list[str] = []
    real = session.get_session

    def noted(*args: Any, **kwargs: Any) -> Any:
        used.append("get_session")
        return real(*args, **kwargs)

    monkeypatch.setattr(session, "get_session", noted)
    yield
    if used:
        pytest.fail("this test uses the Spark session but is not marked spark: mark it "
                    "@pytest.mark.spark (it needs a JVM), or run its jobs in process",
                    pytrace=False)


@pytest.fixture
def client(store_url: str, request: pytest.FixtureRequest) -> sparkjet.Client:
    """A client on a fresh store: its jobs run on the in-process engine, no JVM.

    A test marked ``spark`` (or every test, with ``SPARKJET_TEST_ENGINE=spark``)
    gets Spark's, the process-wide test session: small micro-batches on the
    driver (adaptive, the default), large ones on Spark. Where the test runs
    through :func:`reduce_path` or :func:`engine_kind`, its jobs run on the
    one engine asked for: the in-process engine, or Spark with adaptive
    micro-batches off.
    """
    if _in_process(request):
        return in_process_client(store_url)
    if any(name in request.fixturenames for name in ("reduce_path", "engine_kind")):
        # Spark's paths: every batch on Spark, none adaptively on the driver.
        return sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK,
                                engine={"adaptive": False})
    if on_spark(request):
        return sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK)
    return in_process_client(store_url)


@pytest.fixture
def jet(client: sparkjet.Client):  # type: ignore[no-untyped-def]
    return client.get_jet()


def wait_until(
    predicate: Callable[[], Any], timeout: float = 60, what: str = "condition",
    interval: float = 0.1,
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def run_pipeline(client: sparkjet.Client, pipeline, name: str | None = None):  # type: ignore[no-untyped-def]
    """Submit and join; returns the job."""
    from sparkjet.job import JobConfig

    job = client.get_jet().submit(pipeline, JobConfig(name=name))
    job.join(timeout=120)
    return job


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests marked ``connect`` unless the run is on Spark Connect (nox's connect).

    A process that made a Connect session cannot start a classic one (PySpark
    switches the whole process to Connect), so they run in the connect
    session's processes only; the run's summary counts them as deselected.
    """
    if TEST_ENGINE == "connect":
        return
    kept = [item for item in items if item.get_closest_marker("connect") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", __import__("sys").executable)
    # Tests start `python -m sparkjet.cli` (and Spark's Python workers) in their own
    # folders: a relative PYTHONPATH (PYTHONPATH=src) would not reach the code under
    # test from there, and the children would import another installed sparkjet.
    if os.environ.get("PYTHONPATH"):
        os.environ["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(entry) for entry in os.environ["PYTHONPATH"].split(os.pathsep)
            if entry)


@pytest.fixture
def cancel_at_end() -> Iterator[list[Any]]:
    """Jobs to cancel at teardown, whatever the test left them doing.

    A live streaming job's thread would keep pytest alive; the test has its
    own verdict, so this is best effort.
    """
    jobs: list[Any] = []
    yield jobs
    for job in jobs:
        with contextlib.suppress(Exception):
            if not job.is_terminal():
                job.cancel()
        with contextlib.suppress(Exception):
            job.join(timeout=60)


def cancel_job(job: Any) -> None:
    """Cancel ``job`` unless it ended, and wait until it has (a test's cleanup)."""
    from sparkjet.errors import JobCancelledError

    if not job.is_terminal():
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(timeout=60)
