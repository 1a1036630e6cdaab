r"""Pipelines: ``Pipeline.create()``, the stage types, and the built-in sources and sinks.

Mirrors the Jet Python pipeline API::

    pipeline = Pipeline.create()
    pipeline.read_from(Pipeline.from_list("numbers", [1, 2, 3])) \\
        .map(lambda x: x * 2) \\
        .write_to(Pipeline.to_list("results"))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sparkjet.contrib.files import FileSink, FileSource
from sparkjet.core import graph
from sparkjet.core.graph import (
    GroupedStage,
    SinkStage,
    Stage,
    WindowedGroupedStage,
    WindowedStage,
)
from sparkjet.core.windows import KeyedWindowResult, WindowDefinition, WindowResult
from sparkjet.plugins.lists import ListSink, ListSource
from sparkjet.plugins.logger import LoggerSink
from sparkjet.plugins.maps import MapSink, MapSource
from sparkjet.plugins.streams import StreamSink, StreamSource

__all__ = [
    "FileSink",
    "FileSource",
    "GroupedStage",
    "KeyedWindowResult",
    "ListSink",
    "ListSource",
    "LoggerSink",
    "MapSink",
    "MapSource",
    "Pipeline",
    "SinkStage",
    "Stage",
    "StreamSink",
    "StreamSource",
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
    ) -> FileSource:
        """A source of the files in a folder or bucket prefix (see :class:`FileSource`)."""
        return FileSource(url, glob, format, **options)

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
    def to_files(url: str, format: str = "jsonl", **options: Any) -> FileSink:
        """A sink writing one file per micro-batch and partition, with commit markers."""
        return FileSink(url, format, **options)

    @staticmethod
    def to_logger(to_string: Callable[[Any], str] = str) -> LoggerSink:
        """A sink logging each item at INFO on logger ``sparkjet.sink.logger``."""
        return LoggerSink(to_string)
