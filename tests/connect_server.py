"""A real Spark Connect server on 127.0.0.1, started from the installed pyspark (its sbin script).

Used three ways:

- ``python tests/connect_server.py pytest ...``: starts one server, runs the
  command with ``SPARKJET_TEST_REMOTE`` set to its URL, stops it (the nox
  ``connect`` session: every test process of the run shares the one server);
- :func:`start` in a test, for a server of its own (one whose Python
  workers see another sparkjet, one that outlives a killed client);
- :func:`free_port`.

The server runs ``local[2]`` in its own JVM, started as docs/connect.md
says (``start-connect-server.sh --master 'local[2]'``, nothing else set but
its address, a free port on 127.0.0.1, and ``conf`` if given); its Python
workers run ``python`` (default: this interpreter), with ``env`` added to the
server's environment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: How long a server may take to listen (it takes 8-15 s on two loaded cores).
START_TIMEOUT_SECONDS = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A running server: its URL, its process and its log."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def start(python: str | None = None, env: dict[str, str] | None = None,
          conf: dict[str, str] | None = None) -> Server:
    """Start a Connect server on a free port and wait until it listens."""
    import pyspark

    home = Path(pyspark.__file__).parent
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="sparkjet-connect-server-"))
    log = folder / "server.log"
    # The docs' recipe and nothing more: these two are only where it listens. No tuning
    # (parallelism, shuffle partitions, memory, the UI): the suite runs on the server a
    # reader starts, whose defaults sparkjet must handle (``conf`` adds settings for a
    # test that means to). A second server's UI takes the next free port by itself.
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        **(conf or {}),
    }
    args = [str(home / "sbin" / "start-connect-server.sh"), "--wait", "--master", "local[2]"]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    environment = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOG_DIR": str(folder),
        "SPARK_PID_DIR": str(folder),
        "PYSPARK_PYTHON": python or sys.executable,
        **(env or {}),
    }
    for var in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
        environment.pop(var, None)
    with log.open("wb") as out:
        process = subprocess.Popen(args, env=environment, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = Server(f"sc://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the Connect server exited ({process.returncode}):\n"
                               f"{server.log_tail()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"the Connect server did not listen in {START_TIMEOUT_SECONDS} s:\n"
                       f"{server.log_tail()}")


def main(argv: list[str]) -> int:
    """Start a server, run ``argv`` with SPARKJET_TEST_REMOTE set to its URL, stop it."""
    started = time.monotonic()
    server = start()
    print(f"Spark Connect server at {server.url} (started in "
          f"{time.monotonic() - started:.1f} s)", flush=True)
    try:
        env = {**os.environ, "SPARKJET_TEST_REMOTE": server.url,
               "SPARKJET_TEST_ENGINE": "connect"}
        return subprocess.call(argv, env=env)
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
