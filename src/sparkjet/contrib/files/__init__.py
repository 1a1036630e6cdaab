"""Files in a folder or bucket prefix as a source and a sink (Jet's ``Sources.files``).

Any fsspec URL works: a local folder, ``s3://bucket/prefix``, ``gcs://bucket/prefix``
(with the ``s3`` or ``gcs`` extra). Formats: JSON lines (``json``), CSV (``csv``,
a header row, rows as dicts) and Parquet (pyarrow, the ``files`` extra, imported
only when Parquet is used; rows as dicts).

:class:`FileSource` reads every file of the folder once in a batch job; in a
streaming job it picks up new files as they land, in the order of their
modification time and name, a bounded number per micro-batch, and only once a
file has stopped changing. Its offsets (kept in the job's checkpoint, never in
the folder) say which files are done and how far the file being read is, so
every guarantee holds, EXACTLY_ONCE included.

:class:`FileSink` writes one file per micro-batch and partition, named after
the micro-batch, and then a commit marker ``_committed/<batch>.json`` naming
them: readers that honour the markers (:func:`committed_files`,
:func:`read_committed`) see whole micro-batches only, each once, even when a
micro-batch was written twice after a failure.

The package's modules: :mod:`~sparkjet.contrib.files.source` (the source),
:mod:`~sparkjet.contrib.files.listing` (the driver's listings of the folder),
:mod:`~sparkjet.contrib.files.planning` (the offsets and partitions of a
micro-batch), :mod:`~sparkjet.contrib.files.reading` (reading a file's range),
:mod:`~sparkjet.contrib.files.sink` (the sink and the readers of its output)
and :mod:`~sparkjet.contrib.files.common` (what they share). This module is
the plugin the ``files`` entry point names: it registers the source and sink.
"""

from __future__ import annotations

from typing import Any

from sparkjet.contrib.files.common import FORMATS
from sparkjet.contrib.files.common import MARKERS as MARKERS
from sparkjet.contrib.files.sink import FileSink, committed_files, read_committed
from sparkjet.contrib.files.source import FileSource
from sparkjet.plugin import hookimpl

__all__ = [
    "FORMATS",
    "FileSink",
    "FileSource",
    "committed_files",
    "read_committed",
]

# Their public home is this module: ``sparkjet plugins`` names them
# sparkjet.contrib.files.FileSource and .FileSink, and pickles refer to them here.
FileSource.__module__ = __name__
FileSink.__module__ = __name__


@hookimpl
def register_sources(register: Any) -> None:
    """Register the file source."""
    register(FileSource)


@hookimpl
def register_sinks(register: Any) -> None:
    """Register the file sink."""
    register(FileSink)
