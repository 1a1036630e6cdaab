"""sparkjet's version: the installed distribution's, or the one a shipped copy carries.

The Spark Connect engine ships sparkjet to a server's Python workers as a zip
(:mod:`sparkjet.core.engine.connect.session`); the zip adds a module
``sparkjet.core.shipped`` naming the client's version, so a worker with no
sparkjet installed (or another one) still says which copy it runs.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["VERSION"]


def _version() -> str:
    try:
        from sparkjet.core import shipped  # type: ignore[attr-defined]  # only in a shipped zip
    except ImportError:
        pass
    else:
        return str(shipped.VERSION)
    try:
        return version("sparkjet")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


#: The version of this copy of sparkjet.
VERSION = _version()
