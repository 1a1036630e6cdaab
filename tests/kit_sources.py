"""A source with opaque offsets for the source conformance kit's own tests, and its planted bugs.

:class:`FolderLinesSource` is what a plugin author writes from docs/plugins.md:
append-only text files in a folder, one JSON item per line, offsets a dict
of file name to byte position (opaque: a byte is not an item, so it declares
``offsets_count_items = False``), each file a partition (so
``initial_offsets`` names every file at 0: a restore from a snapshot finds
them). :class:`FolderLinesHarness` feeds it the kit's items, and grows the
folder by a file for ``add_partitions``.

``bug`` plants one of the mistakes the kit must catch
(tests/test_source_kit_mutants.py runs the kit against each):

- ``"ignores-start"``: ``plan_range`` reads each file from its beginning, not from ``start``;
- ``"replay-drops-last"``: a second read of the same range (remembered in a
  marker file beside the data, so across driver processes too) drops its last line;
- ``"cursor-at-planning"``: ``plan_range`` plans from a cursor the source keeps
  in a file (a "committed position") and moves it to ``end`` when it plans, so a
  replayed plan reads from where the last plan ended, not from its ``start``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from sparkjet import Client
from sparkjet.plugin import ALL_GUARANTEES, JobContext, Source, TaskContext, hookimpl
from sparkjet.testing import SourceHarness

#: The planted bugs :class:`FolderLinesSource` knows (None: none).
BUGS = ("ignores-start", "replay-drops-last", "cursor-at-planning")


class FolderLinesSource(Source):
    """JSON lines appended to ``*.txt`` files in ``folder``; offsets: ``{file: byte position}``."""

    kind = "kit-folder-lines"
    streaming = True
    guarantees = ALL_GUARANTEES
    offsets_count_items = False  # byte positions, not item counts

    def __init__(self, folder: str, bug: str | None = None) -> None:
        super().__init__(os.path.basename(folder))
        if bug is not None and bug not in BUGS:
            raise ValueError(f"unknown planted bug {bug!r}; known: {', '.join(BUGS)}")
        self.folder = folder
        self.bug = bug

    def identity(self) -> Any:
        """The folder it reads."""
        return self.folder

    def _files(self) -> list[str]:
        if not os.path.isdir(self.folder):
            return []
        return sorted(name for name in os.listdir(self.folder) if name.endswith(".txt"))

    def initial_offsets(self, context: JobContext) -> dict[str, int]:
        """Every file the folder holds, at its start."""
        return {name: 0 for name in self._files()}

    def latest_offsets(self, context: JobContext) -> dict[str, int]:
        """Each file's end of its last complete line."""
        ends = {}
        for name in self._files():
            with open(os.path.join(self.folder, name), "rb") as fh:
                ends[name] = fh.read().rfind(b"\n") + 1
        return ends

    def plan_range(self, start: Any, end: Any, context: JobContext) -> Sequence[Any]:
        """One descriptor ``(file, from, to)`` per file that grew between ``start`` and ``end``."""
        if self.bug == "cursor-at-planning":
            cursor_file = os.path.join(self.folder, ".cursor.json")
            if os.path.exists(cursor_file):
                with open(cursor_file) as fh:
                    start = json.load(fh)
            with open(cursor_file, "w") as fh:
                json.dump(end, fh)
        descriptors = []
        for name, to in sorted(end.items()):
            begin = 0 if self.bug == "ignores-start" else start.get(name, 0)
            if to > begin:
                descriptors.append((name, begin, to))
        return descriptors

    def partitions(self, context: JobContext) -> Sequence[Any]:
        """Not a batch source."""
        raise NotImplementedError("read by streaming jobs only")

    def read(self, partition: Any, context: TaskContext) -> list[Any]:
        """The items of the lines from byte ``begin`` to ``to`` of the file."""
        name, begin, to = partition
        with open(os.path.join(self.folder, name), "rb") as fh:
            fh.seek(begin)
            lines = fh.read(to - begin).decode("utf-8").splitlines()
        if self.bug == "replay-drops-last":
            marker = os.path.join(self.folder, f".read-{name}-{begin}-{to}")
            if os.path.exists(marker):
                lines = lines[:-1]
            else:
                open(marker, "w").close()
        return [json.loads(line) for line in lines]

    def watermark_partition(self, descriptor: Any) -> str:
        """The file a descriptor reads."""
        return str(descriptor[0])

    def watermark_partitions(self, offsets: Any) -> Sequence[str]:
        """The files the offsets name."""
        return sorted(offsets)


class FolderLinesPlugin:
    """The plugin that registers :class:`FolderLinesSource`."""

    @hookimpl
    def register_sources(self, register: Any) -> None:
        """Registers :class:`FolderLinesSource`."""
        register(FolderLinesSource)


class FolderLinesHarness(SourceHarness):
    """The kit's items as lines appended to two files, then three once partitions are added."""

    can_add_partitions = True
    why_not = {"cap": "the source reads up to the files' ends",
               "trim": "append-only files are never trimmed"}

    def __init__(self, folder: str, bug: str | None = None) -> None:
        self.folder = folder
        self.bug = bug
        self.files = 2

    def prepare(self, client: Client) -> None:
        if FolderLinesSource.kind not in {info.name for info in client.list_plugins()}:
            client.register_plugin(FolderLinesPlugin(), FolderLinesSource.kind)

    def new_source(self, *, capped: bool = True) -> Source:
        return FolderLinesSource(self.folder, self.bug)

    def add(self, client: Client, items: list[dict[str, Any]]) -> None:
        os.makedirs(self.folder, exist_ok=True)
        by_file: dict[str, list[str]] = {}
        for i, item in enumerate(items):
            by_file.setdefault(f"part-{i % self.files:04d}.txt", []).append(json.dumps(item))
        for name, lines in by_file.items():
            # One write of whole lines: a reader sees at most a half line, which it leaves.
            with open(os.path.join(self.folder, name), "a") as fh:
                fh.write("".join(line + "\n" for line in lines))

    def add_partitions(self, client: Client) -> None:
        self.files += 1
