"""The process-wide Spark session sparkjet runs on."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from sparkjet.core.config import Config
from sparkjet.core.errors import ConfigError
from sparkjet.core.host.manager import PluginHost

log = logging.getLogger("sparkjet.spark")

_lock = threading.Lock()
_session: Any = None

#: Settings sparkjet applies unless the configuration sets them.
DEFAULT_CONF = {
    # sparkjet's streaming jobs keep their own state; Structured Streaming queries
    # run in the same session (by plugins or users) get RocksDB, which Spark's
    # stateful Python operators need.
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
    "spark.log.level": "WARN",
}


def get_session(config: Config, host: PluginHost) -> Any:
    """The Spark session, built on first use with ``config`` and plugin hooks."""
    global _session
    with _lock:
        if _session is not None and _session.sparkContext._jsc is not None:
            _warn_if_different(_session, config)
            return _session
        check_classic(config)
        # Workers must run this interpreter, or they miss sparkjet and its dependencies.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        conf = dict(DEFAULT_CONF)
        conf.update(config.spark_conf)
        builder = SparkSession.builder.master(config.spark_master).appName(config.spark_app_name)
        for key, value in conf.items():
            builder = builder.config(key, value)
        host.spark_session_building(builder=builder, spark_conf=conf)
        log.info("starting Spark (%s)", config.spark_master)
        _session = builder.getOrCreate()
        if config.spark_master.startswith("local"):
            _quiet_task_failures(_session)
        return _session


def check_classic(config: Config) -> None:
    """Refuse, naming the fix, an environment that cannot start a classic session."""
    where = config.source or "configuration"
    try:
        from pyspark.util import is_remote_only
    except ImportError:
        raise ConfigError(
            f"{where}: this job's large work runs on Spark, and pyspark is not installed: "
            "pip install 'sparkjet[spark]' (a local or cluster session, with Java 17+), or "
            "'sparkjet[connect]' with [spark] remote (a Spark Connect server); or run every "
            "job in this process with [engine] driver_only = true"
        ) from None
    if is_remote_only():
        raise ConfigError(
            f"{where}: this environment has the Spark Connect client only (pyspark-client, "
            "the 'connect' extra), which cannot start a classic session: set [spark] remote "
            "to a Spark Connect server (sc://host:port), or pip install 'sparkjet[spark]' "
            "in an environment of its own"
        )


def _quiet_task_failures(session: Any) -> None:
    """Turn off the two JVM loggers that repeat a failing task's stack trace.

    In local mode executors log into the driver's console: a failing user
    function would print a page of JVM stack trace that sparkjet already
    reports as one JobFailedError naming the stage.
    """
    try:
        jvm = session.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.OFF
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        for name in (
            "org.apache.spark.executor.Executor",
            "org.apache.spark.scheduler.TaskSetManager",
        ):
            configurator.setLevel(name, level)
    except Exception:  # a different logging backend: keep Spark's output
        log.debug("could not quiet executor logs", exc_info=True)


def _warn_if_different(session: Any, config: Config) -> None:
    conf = session.sparkContext.getConf()
    wanted = {"spark.master": config.spark_master, **config.spark_conf}
    differs = sorted(k for k, v in wanted.items() if conf.get(k, None) not in (None, v))
    if differs:
        log.warning(
            "this process already runs a Spark session; its settings are kept and these "
            "differ from the client's configuration: %s", ", ".join(differs)
        )


def executor_ids(sc: Any) -> set[str] | None:
    """The ids of the application's executors now; None in local mode (nothing to watch)."""
    if str(sc.master).startswith("local"):
        return None
    ids = sc._jsc.sc().getExecutorIds()  # a Scala Seq, driver excluded
    out = set()
    it = ids.iterator()
    while it.hasNext():
        out.add(str(it.next()))
    return out


def set_job_group(sc: Any, group: str, description: str) -> None:
    """Tag Spark jobs started from this thread, so they can be cancelled together."""
    sc.setJobGroup(group, description, interruptOnCancel=True)


def cancel_job_group(group: str) -> bool:
    """Cancel the Spark jobs of ``group``, running and future ones if Spark can.

    Returns False when only running jobs could be cancelled (then the caller
    must cancel again if a job of the group may still start).
    """
    if _session is None:
        return True
    sc = _session.sparkContext
    try:
        sc._jsc.sc().cancelJobGroupAndFutureJobs(group)  # Spark 4.0+
        return True
    except Exception:
        sc.cancelJobGroup(group)
        return False
