"""Changing a store's files: whole-file and create-only writes, deletes, moves, and the probes.

A whole-file write is seen whole or not at all (a local write renames a
complete temp file into place); a create-only write
(:meth:`FsWrites.create_exclusive`) links one on a local folder and uses the
filesystem's own create-only call elsewhere, probed once per process
(:attr:`FsWrites.conditional_writes`). The store's clock is probed by a
write too (:meth:`FsWrites.now`). Deletes never leave the root.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
import uuid
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.store import requests
from sparkjet.core.store.fs_access import _is_local
from sparkjet.core.store.fs_listing import FsListing, _pages

log = logging.getLogger("sparkjet.store")

#: How often :meth:`Store.now` measures the store's clock again.
CLOCK_PROBE_SECONDS = 60.0


class FsWrites(FsListing):
    """Writes, create-only writes, deletes and moves in a store, and its clock."""

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file; readers see the old or the new content, never a mix."""
        requests.count("put")
        try:
            self._folder_for(path)
            if _is_local(self.fs):
                tmp = _complete_temp_file(path, data)
                try:
                    os.replace(tmp, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
            else:
                # A single-object PUT is atomic on S3, GCS and in memory.
                self.fs.pipe_file(path, data)
        except Exception as exc:
            raise self._error(f"cannot write {path!r} in store {self.shown_url!r}: {exc}") from exc

    @property
    def conditional_writes(self) -> bool:
        """Whether the store enforces create-only writes (probed once per process).

        Local folders always do (a hard link fails on an existing name). On
        other filesystems a probe file is created twice through the
        filesystem's create-only call (``pipe_file(mode="create")`` where the
        filesystem implements it, as s3fs and gcsfs do with ``If-None-Match``
        and ``ifGenerationMatch=0``; else ``open(mode="xb")``): the second
        create must be refused. Where it is not, :meth:`create_exclusive`
        falls back to check-then-write, which two writers can race, and
        EXACTLY_ONCE is refused at submit.
        """
        if self._conditional is None:
            self._conditional = _is_local(self.fs) or self._probe_conditional()
        return self._conditional

    def _create_only(self, path: str, data: bytes) -> None:
        """The filesystem's own create-only write; FileExistsError if ``path`` exists."""
        requests.count("put")
        if _implements_pipe_file(self.fs):
            self.fs.pipe_file(path, data, mode="create")
        else:
            with self.fs.open(path, "xb") as fh:
                fh.write(data)

    def _probe_conditional(self) -> bool:
        path = self.layout.new_probe()
        try:
            self._folder_for(path)
            try:
                self._create_only(path, b"1")
            except (ValueError, NotImplementedError, TypeError):
                return False  # the filesystem has no create-only mode at all
            try:
                self._create_only(path, b"2")
            except FileExistsError:
                return True
            except (ValueError, NotImplementedError, TypeError):
                return False
            log.warning(
                "store %s does not enforce create-only writes (a probe file was created "
                "twice); EXACTLY_ONCE is refused on it", self.shown_url,
            )
            return False  # the second create went through: the server ignores the condition
        except Exception as exc:
            raise self._error(
                f"cannot probe store {self.shown_url!r} for create-only writes: {exc}"
            ) from exc
        finally:
            requests.count("delete")
            with contextlib.suppress(Exception):
                self.fs.rm(path)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` only if it does not exist; False if it already does.

        A create that the filesystem client retried after it had landed
        reports "already exists"; the file is then read back, and a file
        holding exactly ``data`` counts as written by this call. So callers
        whose payloads could collide with another writer's make them unique
        (a writer token or a nonce in the payload).
        """
        try:
            self._folder_for(path)
            if _is_local(self.fs):
                requests.count("put")
                tmp = _complete_temp_file(path, data)
                try:
                    os.link(tmp, path)  # atomic, fails if path exists; content complete
                except FileExistsError:
                    return self._landed(path, data)  # the same rule on every filesystem
                finally:
                    # Gone already if the folder was removed once the file landed
                    # (a newer snapshot export retiring this attempt at once).
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
                return True
            if not self.conditional_writes:
                # Check, then write: documented as racy; EXACTLY_ONCE is refused here.
                if self.exists(path):
                    return False
                requests.count("put")
                self.fs.pipe_file(path, data)
                return True
            try:
                self._create_only(path, data)
                return True
            except FileExistsError:
                return self._landed(path, data)
            finally:
                self._fresh(path)
        except StoreError:
            raise
        except Exception as exc:
            raise self._error(
                f"cannot create {path!r} in store {self.shown_url!r}: {exc}"
            ) from exc

    def _landed(self, path: str, data: bytes) -> bool:
        """After "already exists": True if the file holds ``data`` (our own retried write)."""
        try:
            return self.read_bytes(path) == data
        except FileNotFoundError:
            return False

    def now(self) -> float | None:
        """The store's current time, in seconds since the epoch; None if it cannot tell.

        Measured without trusting this machine's wall clock: a probe file is
        written and its modification time (stamped by the store) read back,
        then advanced by this process's monotonic clock; probed again every
        :data:`CLOCK_PROBE_SECONDS`. The probe is taken after the write
        returns, so the result may run behind the store by the write's latency
        (never ahead of it). A store that takes no writes (full, read-only)
        keeps the last probe; before any probe succeeded, this machine's clock
        stands in.
        """
        anchored = self._clock
        if anchored is None or time.monotonic() - anchored[1] > CLOCK_PROBE_SECONDS:
            try:
                stamp = self._probe_clock()
            except StoreError as exc:
                if anchored is None:
                    # A store that takes no writes (full, read-only): this machine's
                    # clock is the best there is until a probe succeeds.
                    log.debug("cannot probe the clock of store %s, using this machine's: %s",
                              self.shown_url, exc)
                    return time.time()
                stamp = None  # the last probe, advanced, stays right
            if stamp is not None:
                anchored = self._clock = (stamp, time.monotonic())
            elif anchored is None:
                return None
        return anchored[0] + (time.monotonic() - anchored[1])

    def _probe_clock(self) -> float | None:
        """The store's time now: the modification time of a probe file written now."""
        path = self.layout.new_probe("clock")
        try:
            self.write_bytes(path, b"")
            return self.modified(path)
        finally:
            requests.count("delete")
            with contextlib.suppress(Exception):
                self.fs.rm(path)

    def temp_files(self) -> list[str]:
        """Temp files of writes that never finished (their process was killed), anywhere.

        Only a local folder has them: other filesystems write whole objects.
        """
        if not _is_local(self.fs):
            return []
        found: list[str] = []
        for folder, _, files in os.walk(self.root):
            found.extend(os.path.join(folder, f) for f in files if _TEMP_FILE.search(f))
        return sorted(found)

    def remove(self, path: str, recursive: bool = False) -> None:
        """Delete ``path`` (a whole folder with ``recursive``); never anything outside the root."""
        target = self._inside(path)
        if recursive and target == self.root:
            raise self._error(f"refusing to delete the whole store {self.shown_url!r}")
        if recursive and self._protocol in ("s3", "gcs"):
            # A listing, then the deletes: S3 takes 1,000 keys a request, GCS one.
            try:
                files = sorted(self.find(target))
            except FileNotFoundError:
                files = []
            if files:
                requests.count("delete", _pages(files) if self._protocol == "s3" else len(files))
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(files)
            else:  # a file, or nothing: as asked
                requests.count("delete")
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(target, recursive=True)
        else:
            requests.count("delete")
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(target, recursive=recursive)
        self._fresh(target)

    def remove_many(self, paths: list[str]) -> None:
        """Delete the files ``paths`` (those already gone are no error).

        On S3 one request per 1,000 files (a bulk delete), on GCS one
        delete each, sent together: a fold removing a hundred records, or a
        checkpoint its old plans, waits about one round trip, not one each.
        """
        if len(paths) < 2 or not self.object_store:
            for path in paths:
                self.remove(path)
            return
        targets = [self._inside(path) for path in paths]
        requests.count("delete", _pages(targets) if self._protocol == "s3" else len(targets))
        try:
            self.fs.rm(targets)
        except FileNotFoundError:
            for target in targets:  # one was gone already: the rest one by one
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(target)
        except Exception as exc:
            raise self._error(f"cannot delete {len(paths)} files ({paths[0]!r}, ...) in store "
                              f"{self.shown_url!r}: {exc}") from exc
        for target in targets:
            self._fresh(target)

    def move(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` inside the store."""
        target = self._inside(dst)
        self._folder_for(target)
        requests.count("put")  # a copy on S3 and GCS (or a rename), then the delete
        requests.count("delete")
        self.fs.mv(self._inside(src), target)


#: The name of a temp file :func:`_complete_temp_file` writes beside its target.
_TEMP_FILE = re.compile(r"\.[0-9a-f]{32}\.tmp$")


def is_temp_file(path: str) -> bool:
    """Whether ``path`` is the temp file of a local write (beside its target, for a moment).

    A create-only write links its complete temp file into place and then
    removes it, so a listing between the two shows both: readers that
    check a folder's exact contents leave such names out.
    """
    return _TEMP_FILE.search(path) is not None


def _complete_temp_file(path: str, data: bytes) -> str:
    """A uniquely named file beside ``path`` holding ``data``, to rename or link into place.

    A write that fails (a full disk) removes its temp file before raising.
    """
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _implements_pipe_file(fs: Any) -> bool:
    """Whether ``fs`` has a ``pipe_file`` of its own (fsspec's default checks, then writes)."""
    from fsspec.asyn import AsyncFileSystem
    from fsspec.spec import AbstractFileSystem

    if isinstance(fs, AsyncFileSystem) and type(fs)._pipe_file is not AsyncFileSystem._pipe_file:
        return True
    return type(fs).pipe_file is not AbstractFileSystem.pipe_file

