"""What the file source and sink share: the formats, the markers' folder, opening a folder.

Also :func:`_pyarrow_parquet`, which imports pyarrow only when Parquet is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fsspec

#: The formats the source reads; the sink writes ``jsonl`` and ``parquet``.
FORMATS = ("jsonl", "csv", "parquet")
_SINK_FORMATS = ("jsonl", "parquet")
#: The folder of the sink's commit markers, under its URL.
MARKERS = "_committed"


def _pyarrow_parquet(what: str) -> Any:
    """``pyarrow.parquet``, imported on first use, or an error naming the extra."""
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - pyarrow is installed in tests
        raise ImportError(
            f"{what}: Parquet needs pyarrow: pip install 'sparkjet[files]'"
        ) from exc
    return pq


def _open_fs(url: str, storage_options: Mapping[str, Any]) -> tuple[Any, str]:
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options))
    return fs, str(root).rstrip("/") or "/"
