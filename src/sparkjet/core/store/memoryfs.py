"""fsspec's memory filesystem, made safe for the threads of one process.

A ``memory://`` store is shared by every thread of the process: a job's loop,
its export thread, its heartbeat, committers in tests. fsspec's
``MemoryFileSystem`` is not written for that:

- ``ls`` takes the store's keys, then reads each entry, so a file deleted in
  between raises ``KeyError`` (a log's fold deletes what it folded while a
  reader lists the folder); here such a file is left out, as a listing taken
  a moment later would;
- a create-only write checks that the path is absent, then stores the file,
  so two threads can both "create" one path and the second silently replaces
  the first (two committers would both win one record number);
- a recursive delete lists, then deletes file by file and folder by folder,
  failing half-way when another thread deletes the same tree.

:class:`ThreadSafeMemoryFileSystem` does each of these in one step on the
shared dict (a ``tuple`` of its keys, ``get``, ``setdefault``, ``pop``), which
the GIL makes atomic. It shares the store with fsspec's own memory filesystem, so a
``memory://`` URL names the same files from either.
"""

from __future__ import annotations

import contextlib
from typing import Any

from fsspec.implementations.memory import MemoryFile, MemoryFileSystem


def _file_info(name: str, file: MemoryFile) -> dict[str, Any]:
    return {
        "name": name,
        "size": file.size,
        "type": "file",
        "created": file.created.timestamp(),
    }


class ThreadSafeMemoryFileSystem(MemoryFileSystem):  # type: ignore[misc]
    """``MemoryFileSystem`` whose listings, create-only writes and deletes are atomic."""

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """The entries directly in ``path``, from one snapshot of the store's keys."""
        path = self._strip_protocol(path)
        exact = self.store.get(path)
        if exact is not None:
            entries = [_file_info(path, exact)]
        else:
            starter = path + "/"
            found: dict[str, dict[str, Any]] = {}
            for name in tuple(self.store):
                if not name.startswith(starter) or len(name) == len(starter):
                    continue
                child, deeper, _ = name[len(starter):].partition("/")
                full = starter + child
                if deeper:
                    found.setdefault(full, {"name": full, "size": 0, "type": "directory"})
                elif (file := self.store.get(name)) is not None:  # None: deleted meanwhile
                    found[full] = _file_info(name, file)
            for folder in tuple(self.pseudo_dirs):
                if folder.startswith(starter) and len(folder) > len(starter):
                    full = starter + folder[len(starter):].split("/", 1)[0]
                    found.setdefault(full, {"name": full, "size": 0, "type": "directory"})
            if not found and path not in self.pseudo_dirs:
                raise FileNotFoundError(path)
            entries = [found[name] for name in sorted(found)]
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """A file's details read in one step; a folder's as fsspec gives them."""
        path = self._strip_protocol(path)
        file = self.store.get(path)
        if file is not None:
            return _file_info(path, file)
        info: dict[str, Any] = super().info(path, **kwargs)
        return info

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """Write ``value``; with ``mode="create"`` only if ``path`` is absent (FileExistsError)."""
        if mode != "create":
            super().pipe_file(path, value, mode=mode, **kwargs)
            return
        path = self._strip_protocol(path)
        if path in self.pseudo_dirs:
            raise IsADirectoryError(path)
        file = MemoryFile(self, path, value)
        if self.store.setdefault(path, file) is not file:
            raise FileExistsError(path)

    def rm(self, path: str | list[str], recursive: bool = False, maxdepth: int | None = None
           ) -> None:
        """Delete ``path``; a recursive delete takes every file under it at once.

        FileNotFoundError if nothing was there.
        """
        if not recursive or maxdepth is not None or not isinstance(path, str):
            super().rm(path, recursive=recursive, maxdepth=maxdepth)
            return
        target: str = self._strip_protocol(path)
        inside = target + "/"
        files = [name for name in tuple(self.store) if name == target or name.startswith(inside)]
        folders = [d for d in tuple(self.pseudo_dirs) if d == target or d.startswith(inside)]
        if not files and not folders:
            raise FileNotFoundError(target)
        for name in files:
            self.store.pop(name, None)
        for folder in sorted(folders, reverse=True):
            with contextlib.suppress(ValueError):  # another thread removed it first
                self.pseudo_dirs.remove(folder)
