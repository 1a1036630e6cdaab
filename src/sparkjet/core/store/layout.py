"""The store's layout: the one place every path in the store is built.

Under the store's root::

    lists/<list>/          a list's commit log (see CommitLogPaths)
    maps/<map>/            a map's commit log
    streams/<stream>/      a stream (see StreamPaths)
    jobs/<job id>/
        job.json           the job's record
        pipeline.pkl       the pipeline of a streaming job, for a driver taking it over
        checkpoint/        the checkpoint of an AT_LEAST_ONCE or EXACTLY_ONCE job;
        scratch-<hex>/     a NONE job's, thrown away on restart (inside: core.state.checkpoint)
        owner-<epoch>      take-over claims, created only if absent
        control/<time>-<action>.req    control requests to the job's driver
        control/quarantine/            requests that did not parse
    job-names/<name>       the lock on an active job's name, holding its id
    _probe/                files of the create-only probe

Names of lists, maps, streams, jobs and writers are encoded with
:func:`sparkjet.core.store.naming.encode_name`. Nothing here touches the store: the
classes only build paths and read back the names found in listings.
"""

from __future__ import annotations

import re
import secrets
import uuid
from dataclasses import dataclass

from sparkjet.core.store.naming import decode_name, encode_name

#: Digits of the record, base and chunk numbers in file names (so names sort by number).
_SEQ_WIDTH = 20
#: The checkpoint folders a job's record may name.
_CHECKPOINT_FOLDER = re.compile(r"checkpoint|scratch-[0-9a-f]{8}")
_OWNER_CLAIM = re.compile(r"owner-(\d+)")
_REQUEST_SUFFIX = ".req"


def _join(*parts: str) -> str:
    return "/".join(parts)


def _numbered(entry: str, suffix: str) -> int | None:
    """The number of a file named ``<digits><suffix>``, or None for any other entry."""
    stem = entry[: -len(suffix)]
    return int(stem) if entry.endswith(suffix) and stem.isdigit() else None


@dataclass(frozen=True)
class CommitLogPaths:
    """The files of one commit log (a list or a map) in its ``folder``.

    ``log/<seq>.rec`` the records, ``base/<seq>.pkl`` the folds,
    ``data/<writer>-<hex>.pkl`` the segments staged by writers (and
    ``data/aborted-<writer>`` their abort markers), ``writers/<writer>.json``
    each micro-batch writer's last record number.
    """

    folder: str

    @property
    def log(self) -> str:
        """The folder of the records."""
        return _join(self.folder, "log")

    @property
    def bases(self) -> str:
        """The folder of the folded bases."""
        return _join(self.folder, "base")

    @property
    def data(self) -> str:
        """The folder of staged segments and abort markers."""
        return _join(self.folder, "data")

    def record(self, seq: int) -> str:
        """Record number ``seq``."""
        return _join(self.log, f"{seq:0{_SEQ_WIDTH}d}.rec")

    def base(self, seq: int) -> str:
        """The base that folds the log up to record ``seq``."""
        return _join(self.bases, f"{seq:0{_SEQ_WIDTH}d}.pkl")

    @staticmethod
    def record_number(entry: str) -> int | None:
        """The number of a record file listed in :attr:`log`; None for other entries."""
        return _numbered(entry, ".rec")

    @staticmethod
    def base_number(entry: str) -> int | None:
        """The record number a base listed in :attr:`bases` folds up to; None for others."""
        return _numbered(entry, ".pkl")

    def new_segment(self, writer: str) -> str:
        """A fresh, unique segment path for ``writer``."""
        return _join(self.data, f"{writer}-{uuid.uuid4().hex}.pkl")

    def data_file(self, entry: str) -> str:
        """The file ``entry`` listed in :attr:`data`."""
        return _join(self.data, entry)

    @staticmethod
    def file_name(path: str) -> str:
        """The name a segment path is listed under in :attr:`data`."""
        return path.rsplit("/", 1)[-1]

    @staticmethod
    def is_writers_segment(entry: str, writer: str) -> bool:
        """Whether ``entry`` in :attr:`data` is a segment staged by ``writer``."""
        return entry.startswith(f"{writer}-")

    def abort_marker(self, writer: str) -> str:
        """The marker saying ``writer`` was aborted: its tasks delete what they stage."""
        return _join(self.data, f"aborted-{writer}")

    @staticmethod
    def is_abort_marker(entry: str) -> bool:
        """Whether ``entry`` in :attr:`data` is an abort marker."""
        return entry.startswith("aborted-")

    @property
    def writers(self) -> str:
        """The folder of the micro-batch writers' indexes."""
        return _join(self.folder, "writers")

    def writer_index(self, writer: str) -> str:
        """Where ``writer`` keeps the number of its last record."""
        return _join(self.writers, f"{encode_name('writer', writer)}.json")


@dataclass(frozen=True)
class StreamPaths:
    """The files of one stream in its ``folder``.

    ``meta.json`` (the partition count), ``p<partition>/<offset>.chunk``
    the chunks, ``p<partition>/<offset>.start`` where a partition whose
    every chunk was trimmed starts (and ends), ``registry/p<partition>/<token>``
    the registered batch chunks, and under ``writers/`` each exactly-once writer's end offsets and
    pending batch.
    """

    folder: str

    @property
    def meta(self) -> str:
        """The stream's metadata (its partition count)."""
        return _join(self.folder, "meta.json")

    def partition(self, partition: int) -> str:
        """The folder of ``partition``'s chunks."""
        return _join(self.folder, f"p{partition:04d}")

    def chunk(self, partition: int, start: int) -> str:
        """The chunk of ``partition`` whose first offset is ``start``."""
        return _join(self.partition(partition), f"{start:0{_SEQ_WIDTH}d}.chunk")

    @staticmethod
    def chunk_start(entry: str) -> int | None:
        """The first offset of a chunk listed in a partition's folder; None for others."""
        return _numbered(entry, ".chunk")

    def start_mark(self, partition: int, offset: int) -> str:
        """The marker saying ``partition`` starts at ``offset`` (written when a trim empties it)."""
        return _join(self.partition(partition), f"{offset:0{_SEQ_WIDTH}d}.start")

    @staticmethod
    def start_mark_offset(entry: str) -> int | None:
        """The offset of a start marker listed in a partition's folder; None for others."""
        return _numbered(entry, ".start")

    def registration(self, partition: int, token: str) -> str:
        """The registration of ``token``'s batch chunk in ``partition``."""
        return _join(self.folder, "registry", f"p{partition:04d}", encode_name("token", token))

    @property
    def writers(self) -> str:
        """The folder of the exactly-once writers' end offsets and pending batches."""
        return _join(self.folder, "writers")

    def writer_index(self, writer: str) -> str:
        """Where ``writer`` keeps the end offsets its last batch started from."""
        return _join(self.writers, f"{encode_name('writer', writer)}.json")

    def pending(self, writer: str, token: str) -> str:
        """``writer``'s split of batch ``token`` into partitions, written ahead."""
        return _join(
            self.writers, f"{encode_name('writer', writer)}.{encode_name('token', token)}.pending"
        )


class StoreLayout:
    """Every path in the store under ``root``; see the module docstring for the tree."""

    #: The checkpoint folder of a job that keeps its checkpoint across restarts.
    DURABLE_CHECKPOINT = "checkpoint"

    def __init__(self, root: str) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"StoreLayout({self.root!r})"

    def under_root(self, *parts: str) -> str:
        """``parts`` joined under the root (for a plugin's own files)."""
        return _join(self.root, *parts)

    # --- lists, maps and streams ---------------------------------------------

    @property
    def lists(self) -> str:
        """The folder of every list."""
        return self.under_root("lists")

    @property
    def maps(self) -> str:
        """The folder of every map."""
        return self.under_root("maps")

    def list_paths(self, name: str) -> CommitLogPaths:
        """The commit log of the list ``name``."""
        return CommitLogPaths(_join(self.lists, encode_name("list", name)))

    def map_paths(self, name: str) -> CommitLogPaths:
        """The commit log of the map ``name``."""
        return CommitLogPaths(_join(self.maps, encode_name("map", name)))

    def stream_paths(self, name: str) -> StreamPaths:
        """The files of the stream ``name``."""
        return StreamPaths(self.under_root("streams", encode_name("stream", name)))

    @staticmethod
    def name_of(entry: str) -> str:
        """The name of a list, map or job listed in :attr:`lists`, :attr:`maps` or :attr:`jobs`."""
        return decode_name(entry)

    # --- jobs ----------------------------------------------------------------

    @property
    def jobs(self) -> str:
        """The folder of every job."""
        return self.under_root("jobs")

    def job(self, job_id: str) -> str:
        """The folder of the job ``job_id``."""
        return _join(self.jobs, encode_name("job id", job_id))

    def job_record(self, job_id: str) -> str:
        """The job's record (``job.json``)."""
        return _join(self.job(job_id), "job.json")

    def pipeline(self, job_id: str) -> str:
        """The job's pickled pipeline."""
        return _join(self.job(job_id), "pipeline.pkl")

    @staticmethod
    def new_scratch_checkpoint() -> str:
        """A fresh checkpoint folder name for a NONE job (thrown away on restart)."""
        return f"scratch-{secrets.token_hex(4)}"

    @staticmethod
    def is_checkpoint_folder(folder: str) -> bool:
        """Whether ``folder`` names a checkpoint folder (durable or scratch)."""
        return bool(_CHECKPOINT_FOLDER.fullmatch(folder))

    @staticmethod
    def is_scratch_checkpoint(entry: str) -> bool:
        """Whether ``entry`` in a job's folder is a scratch checkpoint."""
        return entry.startswith("scratch-")

    def checkpoint(self, job_id: str, folder: str) -> str:
        """The job's checkpoint folder ``folder``.

        ``folder`` is :attr:`DURABLE_CHECKPOINT`, a :meth:`new_scratch_checkpoint`
        name, or an entry listed in the job's folder; a name read from a job's
        record is checked with :meth:`is_checkpoint_folder` first.
        """
        return _join(self.job(job_id), folder)

    def owner_claim(self, job_id: str, epoch: int) -> str:
        """The claim a driver creates to take the job over at ``epoch``."""
        return _join(self.job(job_id), f"owner-{epoch:06d}")

    @staticmethod
    def owner_epoch(entry: str) -> int | None:
        """The epoch of a take-over claim listed in a job's folder; None for other entries."""
        match = _OWNER_CLAIM.fullmatch(entry)
        return int(match.group(1)) if match else None

    def control(self, job_id: str) -> str:
        """The folder of the job's control requests."""
        return _join(self.job(job_id), "control")

    def control_request(self, job_id: str, action: str, stamp_ns: int) -> str:
        """A request for ``action`` made at ``stamp_ns`` (so requests sort oldest first)."""
        return _join(self.control(job_id), f"{stamp_ns:020d}-{action}{_REQUEST_SUFFIX}")

    def control_file(self, job_id: str, entry: str) -> str:
        """The file ``entry`` listed in the job's control folder."""
        return _join(self.control(job_id), entry)

    @staticmethod
    def is_control_request(entry: str) -> bool:
        """Whether ``entry`` in a control folder is a request."""
        return entry.endswith(_REQUEST_SUFFIX)

    @staticmethod
    def control_action(entry: str) -> str:
        """The action a request file's name says; ValueError if the name is not a request's."""
        _, dash, action = entry[: -len(_REQUEST_SUFFIX)].partition("-")
        if not entry.endswith(_REQUEST_SUFFIX) or not dash:
            raise ValueError(f"{entry!r} is not named <time>-<action>{_REQUEST_SUFFIX}")
        return action

    def quarantine(self, job_id: str) -> str:
        """The folder where control requests that did not parse are kept."""
        return _join(self.control(job_id), "quarantine")

    def quarantined(self, job_id: str, entry: str) -> str:
        """The quarantined request ``entry``."""
        return _join(self.quarantine(job_id), entry)

    def name_lock(self, name: str) -> str:
        """The lock on the job name ``name``, holding the id of the job that has it."""
        return self.under_root("job-names", encode_name("job name", name))

    # --- probes: create-only writes, the store's clock ------------------------------

    @property
    def probes(self) -> str:
        """The folder of the probe files (create-only writes, the store's clock)."""
        return self.under_root("_probe")

    def new_probe(self, kind: str = "create-only") -> str:
        """A fresh probe file of ``kind``."""
        return _join(self.probes, f"{kind}-{uuid.uuid4().hex}")

    def probe(self, entry: str) -> str:
        """The probe file ``entry`` listed in :attr:`probes`."""
        return _join(self.probes, entry)
