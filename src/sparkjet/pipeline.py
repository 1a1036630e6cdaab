r"""Pipelines: ``Pipeline.create()``, the stage types, and the built-in sources and sinks.

Mirrors the Jet Python pipeline API::

    pipeline = Pipeline.create()
    pipeline.read_from(Pipeline.from_list("numbers", [1, 2, 3])) \\
        .map(lambda x: x * 2) \\
        .write_to(Pipeline.to_list("results"))
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

from sparkjet.core.host.contracts import Sink, Source
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.host.plugin_info import Category
from sparkjet.core.pipeline import graph
from sparkjet.core.pipeline.graph import (
    AggregateBuilder,
    GroupedStage,
    HashJoinBuilder,
    SinkStage,
    Stage,
    WindowedGroupedStage,
    WindowedStage,
)
from sparkjet.core.pipeline.joins import ItemsByTag, JoinClause, Tag
from sparkjet.core.pipeline.services import ServiceFactory
from sparkjet.core.pipeline.windows import KeyedWindowResult, WindowDefinition, WindowResult
from sparkjet.plugins.lists import ListSink, ListSource
from sparkjet.plugins.logger import LoggerSink
from sparkjet.plugins.maps import MapSink, MapSource
from sparkjet.plugins.streams import StreamSink, StreamSource

__all__ = [
    "AggregateBuilder",
    "GroupedStage",
    "HashJoinBuilder",
    "ItemsByTag",
    "JoinClause",
    "KeyedWindowResult",
    "ListSink",
    "ListSource",
    "LoggerSink",
    "MapSink",
    "MapSource",
    "Pipeline",
    "ServiceFactory",
    "SinkStage",
    "Stage",
    "StreamSink",
    "StreamSource",
    "Tag",
    "WindowDefinition",
    "WindowResult",
    "WindowedGroupedStage",
    "WindowedStage",
]


class Pipeline(graph.PipelineGraph):
    """A DAG of stages; build it with :meth:`read_from` and the stage methods."""

    @staticmethod
    def from_list(name: str, items: Iterable[Any] | None = None) -> ListSource:
        """A source of ``items``, or of the store's list ``name`` when ``items`` is None."""
        return ListSource(name, items)

    @staticmethod
    def from_map(name: str) -> MapSource:
        """A source of the store's map ``name`` as ``(key, value)`` items."""
        return MapSource(name)

    @staticmethod
    def from_files(
        url: str, glob: str | None = None, format: str = "jsonl", **options: Any
    ) -> Source:
        """A source of the files in a folder or bucket prefix.

        The source registered as kind ``"files"``: by default
        ``sparkjet.contrib.files.FileSource`` (docs/files.md), found through
        the plugin registry, so this module never imports a plugin.
        """
        return _registered(Category.SOURCE, "files")(url, glob, format, **options)  # type: ignore[no-any-return]

    @staticmethod
    def to_list(name: str) -> ListSink:
        """A sink appending to the store's list ``name``."""
        return ListSink(name)

    @staticmethod
    def to_map(name: str) -> MapSink:
        """A sink upserting ``(key, value)`` items into the store's map ``name``."""
        return MapSink(name)

    @staticmethod
    def to_stream(name: str) -> StreamSink:
        """A sink appending to the store's stream ``name`` (once per micro-batch)."""
        return StreamSink(name)

    @staticmethod
    def to_files(url: str, format: str = "jsonl", **options: Any) -> Sink:
        """A sink writing one file per micro-batch and partition, with commit markers.

        The sink registered as kind ``"files"``: by default
        ``sparkjet.contrib.files.FileSink``, found through the plugin registry.
        """
        return _registered(Category.SINK, "files")(url, format, **options)  # type: ignore[no-any-return]

    @staticmethod
    def to_logger(to_string: Callable[[Any], str] = str) -> LoggerSink:
        """A sink logging each item at INFO on logger ``sparkjet.sink.logger``."""
        return LoggerSink(to_string)


def _registered(category: Category, kind: str) -> type[Any]:
    """The class a plugin registers as ``kind``: PluginError naming the known kinds if none does.

    Loaded the way ``sparkjet.connect()`` loads plugins (entry points, the
    block list and the autoload switch from the environment).
    """
    return PluginHost().lookup_kind(category, kind).cls


#: Names this module exported before the file plugin moved out of it, with their new home.
_MOVED = {
    "FileSource": (Category.SOURCE, "files", "sparkjet.contrib.files"),
    "FileSink": (Category.SINK, "files", "sparkjet.contrib.files"),
}


def __getattr__(name: str) -> Any:
    """``FileSource`` and ``FileSink`` for one more release, with a DeprecationWarning."""
    moved = _MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    category, kind, module = moved
    warnings.warn(
        f"'from sparkjet.pipeline import {name}' is deprecated and goes in the next release: "
        f"use 'from {module} import {name}' (the file plugin is a plugin like any other; "
        "sparkjet.pipeline no longer imports plugins)",
        DeprecationWarning,
        stacklevel=2,
    )
    return _registered(category, kind)
