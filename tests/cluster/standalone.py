"""A Spark standalone cluster on 127.0.0.1 for tests: one master, workers that can be killed.

The pip ``pyspark`` package has no ``sbin`` scripts, so the master and the
workers run in the foreground through ``bin/spark-class``, each in a process
group of its own (``start_new_session``). A worker's executor is a child of the
worker JVM (same group); the executor's Python daemon makes a group of its own,
so killing a worker "like a lost machine" kills the worker's group and every
descendant's group, found through ``/proc``.

Every address is 127.0.0.1 (``SPARK_LOCAL_IP``), the master's REST server is
off, and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((LOOPBACK, port)) == 0


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll until ``predicate()`` is truthy; TimeoutError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid`` (children first found, depth-first), via /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # Fields after the command name, which is in parentheses and may hold spaces.
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the group ``pid`` leads, and the group and pid of every descendant of ``pid``."""
    targets = [pid, *descendants(pid)]
    groups = {pid}  # started with start_new_session: pid is its group's id
    for target in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            groups.add(os.getpgid(target))
    for group in groups:
        if group > 1 and group != os.getpgrp():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
    for target in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, sig)


class Proc:
    """A process the cluster started: its Popen, its name and its log file."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.popen = popen
        self.log = log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, timeout: float = 15) -> None:
        """SIGKILL the process, its group and its descendants; reap it."""
        if self.alive():
            kill_tree(self.pid)
        else:  # reaped: its pid may be reused, but not while its group has members
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return f"<no log {self.log}>"
        return "\n".join(text[-lines:])


class StandaloneCluster:
    """A master and workers on 127.0.0.1; ``close()`` kills everything it started."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.conf_dir = root / "conf"
        self.conf_dir.mkdir(exist_ok=True)
        self.port = free_port()
        self.ui_port = free_port()
        self.master: Proc | None = None
        self.workers: list[Proc] = []
        self._others: list[Proc] = []
        self._count = 0

    @property
    def url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of every cluster process (and of drivers that connect to it)."""
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(SPARK_HOME),
            SPARK_CONF_DIR=str(self.conf_dir),  # empty: no stray spark-defaults.conf
            SPARK_LOCAL_IP=LOOPBACK,
            SPARK_PUBLIC_DNS=LOOPBACK,
            SPARK_DAEMON_MEMORY="256m",
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
        )
        env.update(extra)
        return env

    def spawn(
        self, name: str, argv: list[str], env: dict[str, str], stdout: int | IO[Any] | None = None
    ) -> Proc:
        log = self.root / f"{name}.log"
        with open(log, "wb") as fh:
            popen = subprocess.Popen(
                argv, env=env, cwd=self.root, stdin=subprocess.DEVNULL,
                stdout=fh if stdout is None else stdout, stderr=fh,
                start_new_session=True,
            )
        return Proc(name, popen, log)

    def start_master(self, timeout: float = 60) -> None:
        self.master = self.spawn(
            "master",
            [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", LOOPBACK,
             "--port", str(self.port), "--webui-port", str(self.ui_port)],
            self.env(SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false"),
        )
        master = self.master
        try:
            wait_for(
                lambda: (
                    port_open(self.port) and port_open(self.ui_port) and self.state() is not None
                ) or not master.alive(),
                timeout, "the Spark master to accept connections",
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n--- master log ---\n{master.tail()}") from None
        if not master.alive():
            raise RuntimeError(f"the Spark master exited\n--- master log ---\n{master.tail()}")

    def start_worker(self) -> Proc:
        """Start a worker (1 core, 1g) with a work dir of its own; returns at once."""
        self._count += 1
        name = f"worker-{self._count}"
        work = self.root / name
        work.mkdir()
        worker = self.spawn(
            name,
            [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", self.url,
             "--host", LOOPBACK, "--cores", "1", "--memory", "1g",
             "--webui-port", str(free_port()), "--work-dir", str(work)],
            self.env(SPARK_WORKER_DIR=str(work)),
        )
        self.workers.append(worker)
        return worker

    def kill_worker(self, worker: Proc) -> None:
        """SIGKILL a worker with its executor and the executor's Python processes."""
        worker.kill()

    def track(self, proc: Proc) -> Proc:
        """Have ``close()`` kill ``proc`` (a driver) too."""
        self._others.append(proc)
        return proc

    def state(self) -> dict[str, Any] | None:
        """The master's status JSON (workers, applications), or None if unreachable."""
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.ui_port}/json/", timeout=3) as r:
                state: dict[str, Any] = json.load(r)
                return state
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> int:
        state = self.state() or {}
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def wait_workers(self, count: int, timeout: float = 60) -> None:
        try:
            wait_for(lambda: self.alive_workers() >= count, timeout,
                     f"{count} alive workers registered with the master")
        except TimeoutError as exc:
            logs = "\n".join(f"--- {w.name} ---\n{w.tail(15)}" for w in self.workers)
            raise TimeoutError(f"{exc}\n{logs}") from None

    def logs(self, lines: int = 20) -> str:
        procs = [p for p in (self.master, *self.workers, *self._others) if p is not None]
        return "\n".join(f"--- {p.name} ({p.log}) ---\n{p.tail(lines)}" for p in procs)

    def reset(self, timeout: float = 30) -> None:
        """Kill every worker and driver (the master stays) and wait until no worker is alive."""
        for proc in [*self._others, *self.workers]:
            proc.kill()
        self._others.clear()
        self.workers.clear()
        wait_for(lambda: self.alive_workers() == 0, timeout, "the master to drop dead workers")

    def close(self) -> None:
        """Kill drivers, workers and master (in that order), with every descendant."""
        for proc in [*self._others, *reversed(self.workers), self.master]:
            if proc is not None:
                proc.kill()
