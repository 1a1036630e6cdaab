"""Sessions: tests across Spark versions, lint, typecheck, docs.

    nox -s "tests(spark-4.3)"        # the test suite on the newest Spark
    nox -s tests                     # on 4.0, 4.1, 4.2 and 4.3
    nox -s lint typecheck docs
    nox -s "tests(spark-4.3)" -- -m "not slow"   # skip the multi-process tests
    nox -s connect                   # the engine tests on a Spark Connect server
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = ["lint", "typecheck", "docs", "tests(spark-4.3)"]

PYTHON = "3.11"
SPARK_VERSIONS = ["4.0", "4.1", "4.2", "4.3"]

#: The tests of what runs on Spark: batch and streaming semantics, keyed state,
#: windows, hash joins, dead letters, checkpoints, compaction, snapshots and upgrades, the job
#: lifecycle, the state workers keep loaded, the adaptive choice. CI runs them on
#: the oldest Spark, and on a Spark Connect server.
ENGINE_TESTS = [
    "tests/test_batch_semantics.py", "tests/test_streaming.py", "tests/test_keyed.py",
    "tests/test_windows.py", "tests/test_window_semantics.py", "tests/test_dead_letters.py",
    "tests/test_peek.py", "tests/test_checkpoint.py", "tests/test_compaction.py",
    "tests/test_snapshots.py", "tests/test_jobs.py", "tests/test_lifecycle.py",
    "tests/test_upgrade_rules.py", "tests/test_state_cache.py", "tests/test_inprocess.py",
    "tests/test_adaptive.py", "tests/test_joins.py", "tests/test_cogroup.py",
    "tests/test_interval_join.py", "tests/test_services.py",
]


@nox.session(python=PYTHON)
@nox.parametrize("spark", [nox.param(v, id=f"spark-{v}") for v in SPARK_VERSIONS])
def tests(session: nox.Session, spark: str) -> None:
    """Run pytest against one pyspark minor version."""
    session.install(f"pyspark=={spark}.*", "-e", ".[test,docs]")
    session.run("python", "-c", "import pyspark; print('pyspark', pyspark.__version__)")
    # Two worker processes (pytest-xdist), each with its own Spark session: the
    # multi-process fault, storage and CLI tests mostly wait on other
    # processes, so two run in the time of one on a 2-core machine; a worker
    # that finishes early takes tests from the other (worksteal). `-n 0` in
    # the session's arguments runs them in this process. The slowest tests are
    # listed at the end, so a run that grew slow says where.
    session.run("pytest", "-n", "2", "--dist", "worksteal", "--durations=20", *session.posargs)


@nox.session(python=PYTHON)
@nox.parametrize("spark", [nox.param(v, id=f"spark-{v}") for v in SPARK_VERSIONS])
def engine(session: nox.Session, spark: str) -> None:
    """The fast engine tests (:data:`ENGINE_TESTS`) with every job on Spark, on one pyspark version.

    The suite's client fixture runs jobs in process unless a test is marked
    spark; here every one runs on Spark (``SPARKJET_TEST_ENGINE=spark``), so each
    semantic test runs on both engines. Arguments replace the selection.
    """
    session.install(f"pyspark=={spark}.*", "-e", ".[test]")
    session.run("python", "-c", "import pyspark; print('pyspark', pyspark.__version__)")
    selection = session.posargs or ["-m", "not slow and not storage", *ENGINE_TESTS]
    session.run("pytest", "-n", "2", "--dist", "worksteal", "--durations=10", *selection,
                env={"SPARKJET_TEST_ENGINE": "spark"})


@nox.session(python=PYTHON)
def connect(session: nox.Session) -> None:
    """The engine tests, the conformance kits and the Connect tests on a Spark Connect server.

    ``tests/connect_server.py`` starts one server (the pyspark wheel's own,
    ``local[2]``) that every test process of the run shares, and stops it at the
    end. Arguments replace the default selection, as in the tests session.
    """
    # uv: the JVM-free client test builds its own virtualenv with it.
    session.install("pyspark[connect]==4.3.*", "-e", ".[test]", "uv")
    selection = session.posargs or [
        "-m", "not storage and (not slow or connect)",
        *ENGINE_TESTS, "tests/test_source_conformance.py", "tests/test_sink_conformance.py",
        "tests/test_connect.py",
        "tests/test_benchmarks.py::test_benchmark_runs_to_its_table[connect]",
    ]
    session.run("python", "tests/connect_server.py", "pytest", "-n", "2", "--dist", "worksteal",
                "--durations=10", *selection)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Ruff over the code, then the import contracts (layers, no cycles) of pyproject.toml."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", "src", "tests", "benchmarks", "examples", "noxfile.py")
    # lint-imports reads the source tree's import graph; nothing is imported,
    # so sparkjet and pyspark need not be installed here.
    session.install("import-linter>=2.13")
    session.run("lint-imports", env={"PYTHONPATH": "src"})


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package (with classic pyspark, whose types the Spark engine uses)."""
    session.install("-e", ".[spark,typecheck]")
    session.run("mypy")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the documentation; warnings are errors."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", "--site-dir", f"{session.create_tmp()}/site")
