"""sparkjet: Hazelcast Jet's job model in Python, running on Apache Spark.

Public modules: :mod:`sparkjet` (this one), :mod:`sparkjet.pipeline`,
:mod:`sparkjet.job`, :mod:`sparkjet.aggregate`, :mod:`sparkjet.errors`,
:mod:`sparkjet.plugin`. Everything under ``sparkjet.core`` is internal.
"""

from __future__ import annotations

from sparkjet.core.client import Client, connect
from sparkjet.core.host.hookspecs import hookimpl
from sparkjet.core.version import VERSION as __version__

__all__ = ["Client", "__version__", "connect", "hookimpl"]
