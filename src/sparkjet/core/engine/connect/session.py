"""The Spark Connect session sparkjet runs on, checked before any job uses it.

:func:`remote_session` connects once per process and URL, and refuses what
cannot work with one error naming ``[spark] remote``:

- a URL that is not ``sc://host[:port]`` or ``local[...]``, or a server
  nothing listens at (checked with a plain TCP connect first: the gRPC
  client would retry for minutes);
- a Connect client or server outside :data:`SUPPORTED_MAJOR` (both Spark 4);
- a server whose Python workers cannot import sparkjet, or import another
  version of it. When they lack it, or have another version, sparkjet's own
  package is shipped as a zip with ``addArtifacts`` (for this session only)
  and the workers are asked again (:func:`ensure_code`).

``local[N]`` starts a Connect server inside this process (it needs the full
pyspark and a JVM): the way to try Connect, and how the tests run on it.
"""

from __future__ import annotations

import logging
import os
import pickletools
import socket
import sys
import sysconfig
import tempfile
import threading
import warnings
import zipfile
from pathlib import Path
from typing import Any

from sparkjet.core.config import Config
from sparkjet.core.errors import ConfigError
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.version import VERSION

__all__ = [
    "DEFAULT_PORT",
    "SUPPORTED_MAJOR",
    "check_versions",
    "current",
    "ensure_code",
    "ensure_modules",
    "remote_session",
    "server_address",
    "user_modules",
]

log = logging.getLogger("sparkjet.connect")

#: Spark Connect's default port.
DEFAULT_PORT = 15002
#: The Spark major version a client and a server must both have.
SUPPORTED_MAJOR = 4
#: How long the TCP check waits for the server.
CONNECT_TIMEOUT_SECONDS = 5.0

#: Settings a ``local[N]`` server starts with unless the configuration sets them.
LOCAL_CONF = {
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
    "spark.log.level": "WARN",
}

_lock = threading.Lock()
_sessions: dict[str, Any] = {}

#: Asks a worker which sparkjet it imports. Compiled from source in a module
#: of its own, so cloudpickle ships it by value: it runs where sparkjet is missing.
_PROBE = '''
def probe(batches):
    import importlib, sys
    import pyarrow as pa
    names, wanted = [], []
    for batch in batches:
        names.extend(batch.column("name").to_pylist())
        wanted.extend(batch.column("wanted").to_pylist())
    found, errors = [], []
    for name, want in zip(names, wanted):
        try:
            module = importlib.import_module(name)
            found.append(str(getattr(module, "__version__", "")))
            errors.append("")
        except BaseException as exc:
            found.append("")
            errors.append(f"{type(exc).__name__}: {exc}")
        if found[-1] != want:
            # Not the code wanted: forget it, so this (reused) worker imports
            # what is shipped next instead of keeping this one.
            for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[loaded]
            importlib.invalidate_caches()
    yield pa.RecordBatch.from_pydict(
        {"name": names, "version": found, "error": errors,
         "python": [sys.version.split()[0]] * len(names)})
'''


def _probe_function() -> Any:
    namespace: dict[str, Any] = {"__name__": "sparkjet_connect_probe"}
    exec(compile(_PROBE, "<sparkjet connect probe>", "exec"), namespace)
    return namespace["probe"]


def _where(config: Config) -> str:
    # A token in the URL from ${env:NAME} is a configured secret: masked.
    return config.redact(
        f"{config.source or 'configuration'}: [spark] remote = {config.spark_remote!r}")


def server_address(url: str) -> tuple[str, int] | None:
    """``(host, port)`` of an ``sc://`` URL; None for ``local[...]``; ValueError otherwise."""
    if url == "local" or url.startswith("local["):
        return None
    if not url.startswith("sc://"):
        raise ValueError("it must be sc://host[:port] (a Spark Connect server) or local[N]")
    rest = url[len("sc://"):]
    authority = rest.split("/", 1)[0].split(";", 1)[0]
    host, _, port = authority.rpartition(":") if ":" in authority else (authority, "", "")
    if not host:
        raise ValueError("it names no host")
    try:
        number = int(port) if port else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"its port {port!r} is not a number") from None
    return host.strip("[]"), number


def check_versions(client: str, server: str) -> None:
    """Refuse a Connect client or server outside :data:`SUPPORTED_MAJOR`; ValueError says which."""
    def major(version: str) -> int:
        try:
            return int(version.split(".")[0])
        except ValueError:
            return -1

    if major(client) != SUPPORTED_MAJOR:
        raise ValueError(f"the Spark Connect client here is pyspark {client}; sparkjet "
                         f"needs a {SUPPORTED_MAJOR}.x client (pip install 'sparkjet[connect]')")
    if major(server) != SUPPORTED_MAJOR:
        raise ValueError(f"the server runs Spark {server}; sparkjet needs a Spark "
                         f"{SUPPORTED_MAJOR}.x server (this client is pyspark {client})")


def remote_session(config: Config, host: PluginHost) -> Any:
    """The Connect session for ``config.spark_remote``, made and checked on first use."""
    url = config.spark_remote
    assert url is not None
    with _lock:
        session = _sessions.get(url)
        if session is not None and not getattr(session, "is_stopped", False):
            return session
        session = _sessions[url] = _connect(config, host, url)
        return session


def current(config: Config) -> Any:
    """The session of ``config.spark_remote`` if this process made one, else None."""
    with _lock:
        return _sessions.get(config.spark_remote or "")


def _connect(config: Config, host: PluginHost, url: str) -> Any:
    where = _where(config)
    try:
        address = server_address(url)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if address is not None:
        try:
            socket.create_connection(address, timeout=CONNECT_TIMEOUT_SECONDS).close()
        except OSError as exc:
            raise ConfigError(
                f"{where}: no Spark Connect server answers at {address[0]}:{address[1]} "
                f"({exc.strerror or exc}); start one (see docs/connect.md) or fix the URL"
            ) from None
    try:
        import pyspark
        from pyspark.sql import SparkSession

        # What pyspark.sql.connect needs (its own check exits the process where
        # __main__ has no spec, as in a pytest-xdist worker).
        for module in ("pandas", "pyarrow", "grpc", "grpc_status", "google.protobuf"):
            __import__(module)
    except ImportError as exc:
        raise ConfigError(
            f"{where}: the Spark Connect client cannot load here ({exc}); "
            "pip install 'sparkjet[connect]'"
        ) from None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = dict(LOCAL_CONF) if address is None else {}
    conf.update(config.spark_conf)
    builder = SparkSession.builder.remote(url)
    for key, value in conf.items():
        builder = builder.config(key, value)
    host.spark_session_building(builder=builder, spark_conf=conf)
    log.info("connecting to Spark Connect at %s", config.redact(url))
    try:
        with warnings.catch_warnings():
            if address is None:  # a local server took its static settings when it started
                warnings.filterwarnings("ignore", message=".*CANNOT_MODIFY_CONFIG")
            # A server of its own URL: getOrCreate() would hand back any session
            # this process made before, whatever its URL.
            session = builder.getOrCreate() if address is None else builder.create()
        server = str(session.version)
    except Exception as exc:
        raise ConfigError(f"{where}: the Spark Connect session failed: "
                          f"{_first_line(exc)}") from None
    try:
        check_versions(pyspark.__version__, server)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    ensure_code(session, where)
    return session


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _probe(
    session: Any, names: list[str], wanted: str = ""
) -> dict[str, tuple[str, str, str]]:
    """Per module name, ``(version, error, python)`` as the server's Python workers import it.

    A worker that imports another version than ``wanted`` (or fails to) forgets it again.
    """
    frame = session.createDataFrame([(n, wanted) for n in names],
                                    "name string, wanted string").repartition(1)
    rows = frame.mapInArrow(_probe_function(),
                            "name string, version string, error string, python string").collect()
    return {row["name"]: (row["version"], row["error"], row["python"]) for row in rows}


def ensure_code(session: Any, where: str) -> None:
    """Make the server's Python workers import this very sparkjet, shipping it if need be."""
    ours = VERSION
    version, error, python = _probe(session, ["sparkjet"], ours)["sparkjet"]
    if version == ours:
        return
    log.info("shipping sparkjet %s to the Spark Connect server's workers (they %s)", ours,
             f"have sparkjet {version}" if version else f"cannot import it: {error}")
    session.addArtifacts(_package_zip(), pyfile=True)
    shipped, error, python = _probe(session, ["sparkjet"], ours)["sparkjet"]
    if shipped == ours:
        return
    if shipped:
        raise ConfigError(
            f"{where}: the server's Python workers import sparkjet {shipped}, and this client "
            f"is sparkjet {ours}, even after shipping it; install sparkjet {ours} where the "
            "workers run (a mismatch could compute wrong results)"
        )
    raise ConfigError(
        f"{where}: the server's Python workers (Python {python}) cannot import the sparkjet "
        f"shipped to them: {error}; install sparkjet {ours}'s dependencies where the workers "
        f"run (pip install 'sparkjet=={ours}')"
    )


def _package_zip() -> str:
    """Sparkjet's own package as a zip (made once per process), for ``addArtifacts``."""
    global _zip
    if _zip is None or not os.path.exists(_zip):
        root = _PACKAGE
        folder = tempfile.mkdtemp(prefix="sparkjet-connect-")
        path = os.path.join(folder, f"sparkjet-{VERSION}.zip")
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in sorted(root.rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts:
                    archive.write(file, Path("sparkjet") / file.relative_to(root))
            # The copy says which version it is, installed metadata or not (see core.version).
            archive.writestr("sparkjet/core/shipped.py", f"VERSION = {VERSION!r}\n")
        _zip = path
    return _zip


_zip: str | None = None
#: sparkjet's own package folder (this module is sparkjet/core/engine/connect/session.py).
_PACKAGE = Path(__file__).resolve().parents[3]


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.add(str(_PACKAGE))
    return tuple(sorted(os.path.realpath(r) for r in roots))


def user_modules(frozen: bytes) -> list[str]:
    """The top-level modules of the user's own code that a pickled pipeline refers to.

    A module counts when it was imported from a file outside the standard
    library, the installed packages and sparkjet: the user's project.
    """
    names: set[str] = set()
    strings: list[str] = []
    for opcode, arg, _ in pickletools.genops(frozen):
        if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(str(arg))
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            names.add(strings[-2])
        elif opcode.name == "GLOBAL" and arg:
            names.add(str(arg).split(" ", 1)[0])
    roots = _library_roots()
    found = set()
    for name in names:
        top = name.split(".", 1)[0]
        module = sys.modules.get(top)
        file = getattr(module, "__file__", None)
        if top == "__main__" or module is None or not file:
            continue
        real = os.path.realpath(file)
        if not real.startswith(roots):
            found.add(top)
    return sorted(found)


def ensure_modules(session: Any, names: list[str], where: str) -> None:
    """Ship the user's modules ``names`` that the server's workers cannot import."""
    if not names:
        return
    missing = [n for n, (_, error, _) in _probe(session, names).items() if error]
    if not missing:
        return
    for name in missing:
        module = sys.modules[name]
        file = Path(str(module.__file__))
        if file.name == "__init__.py":
            folder = tempfile.mkdtemp(prefix="sparkjet-connect-")
            path = os.path.join(folder, f"{name}.zip")
            with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
                for item in sorted(file.parent.rglob("*.py")):
                    archive.write(item, Path(name) / item.relative_to(file.parent))
            session.addArtifacts(path, pyfile=True)
        else:
            session.addArtifacts(str(file), pyfile=True)
        log.info("shipped module %s to the Spark Connect server's workers", name)
    still = {n: e for n, (_, e, _) in _probe(session, missing).items() if e}
    if still:
        listed = "; ".join(f"{n}: {e}" for n, e in sorted(still.items()))
        raise ConfigError(f"{where}: the server's Python workers cannot import the "
                          f"pipeline's modules even after shipping them: {listed}")
