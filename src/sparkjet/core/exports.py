"""A streaming job's state in and out of snapshots: export, the upgrade rules, restore.

An exported snapshot is the state of one committed batch of the job's
checkpoint, by key group, plus its sources' offsets at that batch (the format
and its storage are :mod:`sparkjet.core.snapshots`'). Each stateful stage's
state is written as one file per range of key groups the batch's state tasks
owned, ``state/<stage>/<lo>-<hi>-<keys>.state``, holding what a checkpoint's
full copy holds (``{"values": {key: entry}, "touched": {key: millis}}``,
cloudpickled; see :mod:`sparkjet.core.checkpoint`).

A job submitted with ``initial_snapshot_name`` starts from it by Jet's rules
(``003``, "State Compatibility"), with state matched by stage name:

- a stateful stage in both, with the same *state signature*, is restored;
- a stateful stage only in the new pipeline starts empty;
- a stage only in the snapshot is ignored (and reported);
- a stage in both whose signature differs is refused at submit
  (:class:`StateIncompatibleError`, naming the stage and both signatures);
- sources in the snapshot resume at their recorded offsets, new ones start
  where they would without a snapshot.

Restoring seeds the new job's empty checkpoint: its meta.json with the
snapshot's number of key groups (state is carried by key group, so the new
job may run any number of tasks), each restored stage's files as full copies
of batch 0, and a commit record of batch 0 holding the sources' offsets and
the files that count. The job then goes on from batch 1 as if it had always
run.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import cloudpickle

from sparkjet.core import compaction
from sparkjet.core.checkpoint import Checkpoint, CommitRecord, RestoredFrom
from sparkjet.core.errors import (
    JobStateError,
    SnapshotCorruptedError,
    StateIncompatibleError,
    StoreError,
)
from sparkjet.core.event_time import EventTime
from sparkjet.core.keygroups import task_range
from sparkjet.core.model import DEFAULT_KEY_GROUPS, JobConfig
from sparkjet.core.planner import Plan
from sparkjet.core.snapshots.format import (
    EVENT_TIME_FILE,
    IDENTITY_FIELDS,
    UPSTREAM_FIELD,
    parse_state_file,
    pipeline_fingerprint,
    source_identity,
    state_file_path,
    state_signature,
    stateful_stages,
)
from sparkjet.core.snapshots.manifest import Manifest, ManifestFields, StageFields
from sparkjet.core.snapshots.reader import Snapshot
from sparkjet.core.snapshots.storage import SnapshotStore
from sparkjet.core.state_files import Counted, StatePaths, StateRange, StateVersion
from sparkjet.core.windows import WindowDefinition

__all__ = [
    "ExportCut",
    "SourceOffsets",
    "UpgradeOptions",
    "UpgradeRow",
    "check_upgrade",
    "cut_export",
    "export_state",
    "release_cut",
    "require_compatible",
    "seed_checkpoint",
    "window_transition",
]


@dataclass(frozen=True)
class UpgradeOptions:
    """What a submit from a snapshot accepts beyond the safe default (from ``JobConfig``)."""

    #: Snapshot stages and sources with no counterpart may be left behind.
    allow_dropped_state: bool = False
    #: A stage whose key function or operation changed keeps its state.
    allow_changed_state: bool = False
    #: ``{name in the snapshot: name in the pipeline}``.
    renames: Mapping[str, str] = field(default_factory=dict)
    #: ``{source stage or "*": "initial" | "latest"}``: where a source without offsets starts.
    source_starts: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, config: JobConfig | None) -> UpgradeOptions:
        """The options a job's configuration sets (the defaults without one)."""
        if config is None:
            return cls()
        return cls(config.allow_dropped_state, config.allow_changed_state,
                   dict(config.stage_renames), dict(config.source_starts))

    def start_of(self, source: str) -> str | None:
        """Where ``source`` starts if it has no offsets to restore (None: not said)."""
        return self.source_starts.get(source, self.source_starts.get("*"))


@dataclass(frozen=True)
class UpgradeRow:
    """What starting a pipeline from a snapshot does with one stateful stage or source."""

    stage: str
    #: ``restored``; ``new`` (state starts empty, a source where ``source_starts``
    #: says); ``changed`` (same state shape, but another key function or
    #: operation, or a source reading something else); ``dropped`` (in the snapshot
    #: only); ``incompatible`` (another shape of state: never restored).
    status: str
    #: The keys of state the snapshot holds for the stage (0 for a new one and sources).
    keys: int
    #: The state signature (a source: its identity) in the snapshot, and in the pipeline.
    old_signature: Any = None
    new_signature: Any = None
    #: What the restore does beyond copying (a window's new definition, where a
    #: source starts, what changed); "" for nothing.
    note: str = ""
    #: ``state`` (a stateful stage) or ``source``.
    kind: str = "state"
    #: The name in the snapshot, when ``stage_renames`` carries it to ``stage``.
    renamed_from: str | None = None
    #: Why a submit refuses this row, and how to accept it; "" if it goes ahead.
    refusal: str = ""

    @property
    def old_window(self) -> WindowDefinition | None:
        """The window definition in the snapshot (windowed stages)."""
        return _definition(self.old_signature)

    @property
    def new_window(self) -> WindowDefinition | None:
        """The window definition in the new pipeline (windowed stages)."""
        return _definition(self.new_signature)

    @property
    def snapshot_name(self) -> str:
        """The stage's name in the snapshot."""
        return self.renamed_from or self.stage

    @property
    def carried(self) -> bool:
        """Whether the snapshot's state or offsets go into the new job for this row."""
        if self.refusal:
            return False
        return self.status in (("restored", "changed") if self.kind == "state"
                               else ("restored",))


def _definition(signature: Any) -> WindowDefinition | None:
    if isinstance(signature, dict):
        return WindowDefinition.from_json(signature.get("definition"))
    return None


def _shape(signature: Any) -> Any:
    """What must match for state to be restored: the signature but what it means.

    A window's definition may change (Jet's rules), and a changed key function
    or operation is judged apart (``changed``, see :func:`check_upgrade`).
    """
    if isinstance(signature, dict):
        return {k: v for k, v in signature.items()
                if k not in IDENTITY_FIELDS and k != UPSTREAM_FIELD
                and not (k == "definition" and signature.get("op") == "window")}
    return signature


def window_transition(old: WindowDefinition, new: WindowDefinition) -> str:
    """What starting ``new`` from state kept by ``old`` does, in a sentence or two ("": nothing).

    Jet's rules (``003``): sizes, slides and timeouts may change, frames being
    reassigned by their end; early results may be switched on or off.
    """
    notes = []
    if old.is_session:
        if new.timeout != old.timeout:
            notes.append(f"open sessions are merged anew with the new timeout "
                         f"({old.timeout} -> {new.timeout} ms)")
    else:
        if new.slide != old.slide:
            notes.append(f"frames are reassigned to the new slide by their end "
                         f"({old.slide} -> {new.slide} ms); where the slides do not divide "
                         "each other, a frame's events count in the new frame its end falls in")
        if new.size > old.size:
            notes.append(f"the window grows ({old.size} -> {new.size} ms): frames purged under "
                         "the old size are gone, so results miss them until one full new "
                         "window has passed")
        elif new.size < old.size:
            notes.append(f"the window shrinks ({old.size} -> {new.size} ms): frames older "
                         "than the new size are purged at the next emission")
    if bool(new.early_period) != bool(old.early_period):
        notes.append("early results are switched " + ("on" if new.early_period else "off"))
    elif new.early_period != old.early_period:
        notes.append(f"early results every {new.early_period} ms (was {old.early_period})")
    return "; ".join(notes)


def _changes(old: Any, new: Any) -> list[str]:
    """What the identity fields of two signatures of one shape say changed ([] if known same)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return []
    return [f"{name} {old[name]} -> {new[name]}" for name in IDENTITY_FIELDS
            if name in old and name in new and old[name] != new[name]]


def _read_identity(identity: Any) -> Any:
    """What must match for offsets to be carried: plugin and what it reads, not partitions."""
    if isinstance(identity, dict):
        return {k: v for k, v in identity.items() if k != "partitions"}
    return identity


def check_upgrade(
    plan: Plan, manifest: Manifest, options: UpgradeOptions | None = None
) -> list[UpgradeRow]:
    """Per stateful stage and per source, of the pipeline and of the snapshot: what a restore does.

    The rules (see docs/snapshots.md): state and offsets are matched by stage
    name, or by ``options.renames``. A stage whose state changed shape is
    ``incompatible``; one whose key function or operation changed is
    ``changed``, refused unless ``allow_changed_state``; a windowed stage may
    change its window's size, slide or session timeout (the row's ``note``
    says what that does). A source is ``changed`` when it reads something
    else, and ``new`` when the snapshot has no offsets for it: both refused
    unless ``source_starts`` says where it starts. A snapshot's stage or
    source with no counterpart is ``dropped``, refused unless
    ``allow_dropped_state``. State never goes into a stage whose name was
    generated, unless every stateful stage and source is as in the snapshot
    (an inserted stage shifts generated names); nor do offsets into a source
    whose generated name is shared by two sources reading the same data.
    """
    options = options or UpgradeOptions()
    _check_renames(plan, manifest, options)
    from_name = {new: old for old, new in options.renames.items()}

    def snapshot_name(stage: str) -> str | None:
        if stage in from_name:
            return from_name[stage]
        return None if stage in options.renames else stage

    stateful = stateful_stages(plan)
    signatures = {name: state_signature(node) for name, node in stateful.items()}
    sources = {plan.name(n): spec.source for n, spec in plan.sources().items()}
    identities = {name: {"plugin": source.kind, "reads": source.identity()}
                  for name, source in sources.items()}
    generated = {plan.name(n) for n in plan.nodes if not n.explicit_name}
    unchanged = not options.renames and _as_snapshot(signatures, identities, manifest)
    rows: list[UpgradeRow] = []
    used: set[str] = set()
    for name, signature in signatures.items():
        old_name = snapshot_name(name)
        old = manifest.stage(old_name) if old_name is not None else None
        renamed = old_name if old_name != name else None
        if old is None:
            rows.append(UpgradeRow(name, "new", 0, None, signature))
            continue
        used.add(old.name)
        row = UpgradeRow(name, "restored", old.key_count, old.state_signature, signature,
                         renamed_from=renamed)
        if _shape(old.state_signature) != _shape(signature):
            rows.append(replace(row, status="incompatible", refusal=(
                f"stage {name!r} keeps state {json.dumps(_shape(old.state_signature))} in the "
                f"snapshot but {json.dumps(_shape(signature))} in this pipeline: it cannot be "
                "restored (rename the stage to start it empty, or rewrite its state with "
                "sparkjet migrate-snapshot)")))
            continue
        changes = _changes(old.state_signature, signature)
        before, after = row.old_window, row.new_window
        notes = [window_transition(before, after)] if before and after else []
        if changes:
            row = replace(row, status="changed")
            notes.insert(0, "; ".join(changes))
        if name in generated and not unchanged:
            row = replace(row, refusal=_generated(name, "state"))
        elif changes and not options.allow_changed_state:
            row = replace(row, refusal=(
                f"stage {name!r}: its state was built with another "
                + " and another ".join(c.split(" ", 1)[0] for c in changes)
                + f" ({'; '.join(changes)}); restoring it would mix the two "
                "(accept with allow_changed_state / --allow-changed-state, or rename the "
                "stage to start it empty)"))
        rows.append(replace(row, note="; ".join(n for n in notes if n)))
    for name in sources:
        old_name = snapshot_name(name)
        identity = identities[name]
        renamed = old_name if old_name != name else None
        start = options.start_of(name)
        if old_name is None or old_name not in manifest.sources:
            rows.append(_fresh_source(UpgradeRow(name, "new", 0, None, identity, kind="source"),
                                      start, f"the snapshot has no offsets for source {name!r}"))
            continue
        used.add(old_name)
        old_identity = manifest.source_identities.get(old_name)
        row = UpgradeRow(name, "restored", 0, old_identity, identity, kind="source",
                         renamed_from=renamed)
        if old_identity is not None and _read_identity(old_identity) != identity:
            rows.append(_fresh_source(replace(row, status="changed"), start, (
                f"source {name!r} read {json.dumps(_read_identity(old_identity))} in the "
                f"snapshot and reads {json.dumps(identity)} now: its offsets belong to other "
                "data")))
            continue
        if old_identity is None:
            row = replace(row, note="the snapshot does not record what the source read "
                                    "(an older sparkjet wrote it): its offsets are applied as "
                                    "they are")
        if name in generated and not unchanged and _ambiguous(identity, identities, manifest):
            row = replace(row, refusal=_generated(name, "offsets"))
        rows.append(row)
    for stage in manifest.stages:
        if stage.name not in used:
            rows.append(_dropped(UpgradeRow(stage.name, "dropped", stage.key_count,
                                            stage.state_signature, None), options))
    for source_name in manifest.sources:
        if source_name not in used:
            rows.append(_dropped(UpgradeRow(
                source_name, "dropped", 0, manifest.source_identities.get(source_name), None,
                kind="source"), options))
    return rows


def _fresh_source(row: UpgradeRow, start: str | None, why: str) -> UpgradeRow:
    """A source that cannot take offsets from the snapshot: where it starts, or refused."""
    if start is None:
        return replace(row, refusal=(
            f"{why}; say where it starts with source_starts / --source-start "
            f"{row.stage}=initial (where it starts without a snapshot) or "
            f"{row.stage}=latest (at the data's end now)"))
    where = ("where it starts without a snapshot" if start == "initial"
             else "at the end of its data at submit")
    return replace(row, note=f"starts {where} (source_starts)")


def _dropped(row: UpgradeRow, options: UpgradeOptions) -> UpgradeRow:
    what = f"{row.keys} keys of state" if row.kind == "state" else "offsets"
    if options.allow_dropped_state:
        return replace(row, note=f"its {what} are left behind (allow_dropped_state)")
    return replace(row, refusal=(
        f"the snapshot holds {what} of {row.kind if row.kind == 'source' else 'stage'} "
        f"{row.stage!r}, which this pipeline does not have (accept losing them with "
        f"allow_dropped_state / --allow-dropped-state, or carry them to a new name with "
        f"stage_renames / --rename {row.stage}=NEW)"))


def _ambiguous(identity: Any, identities: Mapping[str, Any], manifest: Manifest) -> bool:
    """Whether more than one source reads the data ``identity`` names, here or in the snapshot.

    A source's generated name comes from what it reads (``from-stream(events)``),
    so it only shifts between sources reading the same data.
    """
    here = sum(i == identity for i in identities.values())
    there = sum(_read_identity(i) == identity for i in manifest.source_identities.values())
    return here > 1 or there > 1 or not manifest.source_identities


def _generated(name: str, what: str) -> str:
    return (f"stage {name!r} has a generated name, and the pipeline's stateful stages or "
            f"sources are not those of the snapshot: generated names shift when stages are "
            f"added, so its {what} could belong to another stage; give it a name with "
            f"set_name({name!r}) in the version that wrote the snapshot, or carry the "
            f"snapshot's {what} to a named stage with stage_renames / --rename")


def _as_snapshot(
    signatures: Mapping[str, Any], identities: Mapping[str, Any], manifest: Manifest
) -> bool:
    """Whether the pipeline's stateful stages and sources are exactly the snapshot's."""
    if set(signatures) != {s.name for s in manifest.stages} or set(identities) != set(
            manifest.sources):
        return False
    for stage in manifest.stages:
        old, new = stage.state_signature, signatures[stage.name]
        if _shape(old) != _shape(new) or _changes(old, new):
            return False
        if isinstance(old, dict) and old.get(UPSTREAM_FIELD) != new.get(UPSTREAM_FIELD):
            return False  # the same stage over other inputs (put behind a filter, say)
    return all(_read_identity(manifest.source_identities.get(name, identity)) == identity
               for name, identity in identities.items())


def _check_renames(plan: Plan, manifest: Manifest, options: UpgradeOptions) -> None:
    """Every rename names a stage or source of the snapshot and one of the pipeline."""
    known = {s.name for s in manifest.stages} | set(manifest.sources)
    names = set(plan.names.values())
    for old, new in options.renames.items():
        if old not in known:
            raise StateIncompatibleError(
                f"cannot start from snapshot {manifest.name!r}: stage_renames names "
                f"{old!r}, which the snapshot has no state or offsets of (it has: "
                f"{', '.join(sorted(known)) or 'nothing'})", stages=[old])
        if new not in names:
            raise StateIncompatibleError(
                f"cannot start from snapshot {manifest.name!r}: stage_renames carries "
                f"{old!r} to {new!r}, which is not a stage of this pipeline", stages=[new])


def require_compatible(
    plan: Plan, manifest: Manifest, options: UpgradeOptions | None = None
) -> list[UpgradeRow]:
    """:func:`check_upgrade`, raising StateIncompatibleError naming every refused row."""
    if not plan.streaming:
        raise JobStateError(
            f"snapshot {manifest.name!r}: only a streaming pipeline can start from a "
            "snapshot (a batch job keeps no state between runs)"
        )
    rows = check_upgrade(plan, manifest, options)
    bad = [r for r in rows if r.refusal]
    if bad:
        raise StateIncompatibleError(
            f"cannot start from snapshot {manifest.name!r}: "
            + "; ".join(r.refusal for r in bad),
            stages=[r.stage for r in bad],
        )
    return rows


@dataclass(frozen=True)
class ExportCut:
    """The batch a snapshot export reads, pinned (see :meth:`Checkpoint.pin`)."""

    #: The batch (-1: before the job's first; its state is empty).
    batch: int
    #: The sources' offsets at the end of the batch.
    ends: dict[str, Any]
    #: The state tasks the batch ran (its ranges of key groups are the snapshot's files).
    tasks: int
    key_groups: int
    #: Per stateful stage, per range ``(lo, hi)``: the files its state as of
    #: the batch is made of, listed when the cut was taken.
    chains: dict[str, dict[tuple[int, int], list[StateVersion]]]
    #: Which state files count, as the commit records said at the cut.
    counted: Counted
    #: The pin's token, for :func:`release_cut` ("": nothing pinned).
    pin: str
    #: Event time as of the batch (None: the job has none).
    event_time: EventTime | None = None


def cut_export(
    checkpoint: Checkpoint,
    plan: Plan,
    name: str,
    job: str,
    before_first: Callable[[], dict[str, Any]] | None = None,
    key_groups: int = DEFAULT_KEY_GROUPS,
) -> ExportCut:
    """Pin the checkpoint's last committed batch for exporting snapshot ``name`` of ``job``.

    Called where no batch runs (between two, or with the job suspended): it
    lists the files each range's state is made of (one listing per stateful
    stage) and pins the batch, so no batch after it removes them and the job
    may go on while :func:`export_state` reads them. Release with
    :func:`release_cut`.

    A job that has not committed a batch yet has empty state: its cut is
    batch -1, at the offsets ``before_first()`` gives (where its first batch
    starts), with the checkpoint's key groups or ``key_groups``. Without
    ``before_first`` that is refused.
    """
    batch = checkpoint.last_commit()
    if batch < 0:
        if before_first is None:
            raise JobStateError(
                f"cannot export snapshot {name!r} of job {job}: it has not committed a "
                "micro-batch yet"
            )
        return ExportCut(-1, dict(before_first()), 1,
                         checkpoint.written_key_groups() or key_groups,
                         {stage: {} for stage in stateful_stages(plan)}, {}, "")
    record = checkpoint.commit_record(batch)
    groups = checkpoint.written_key_groups()
    assert groups is not None
    planned = checkpoint.planned(batch)
    tasks = max(1, min(planned.state_tasks(groups) if planned else groups, groups))
    counted = checkpoint.counted()
    paths = checkpoint.state(groups).with_counted(counted)
    ranges = [task_range(t, tasks, groups) for t in range(tasks)]
    chains = {}
    for stage in stateful_stages(plan):
        listed = paths.versions(stage)
        chains[stage] = {(lo, hi): StatePaths.chain(listed, batch, lo, hi) for lo, hi in ranges}
    pin = checkpoint.pin(batch)
    return ExportCut(batch, dict(record.ends), tasks, groups, chains, counted, pin,
                     record.event_time)


def release_cut(checkpoint: Checkpoint, cut: ExportCut) -> None:
    """The export of ``cut`` is done (or failed): its state files may go again."""
    if cut.pin:
        checkpoint.unpin(cut.pin)


def export_state(
    checkpoint: Checkpoint,
    cut: ExportCut,
    plan: Plan,
    snapshots: SnapshotStore,
    name: str,
    *,
    job_id: str,
    job_name: str | None,
    versions: tuple[str, str],
) -> Manifest:
    """Export the state of ``cut``'s batch as snapshot ``name``.

    The job may run meanwhile: the cut's pin keeps the files it listed.
    Reads each stage's state range by range (the ranges the batch's tasks
    owned), so the driver holds one range at a time. ``versions`` are
    sparkjet's and Spark's.
    """
    batch, groups = cut.batch, cut.key_groups
    paths: StatePaths = checkpoint.state(groups).with_counted(cut.counted).with_pin(batch)
    chains = _compacted(paths, cut)
    stages = []
    files: list[tuple[str, _Lazy]] = []
    for stage, node in stateful_stages(plan).items():
        stage_files = []
        total = 0
        for (lo, hi), chain in chains[stage].items():
            read = _Lazy(paths, stage, lo, hi, batch, chain)
            if chain and all((v.lo, v.hi) == (lo, hi) for v in chain):
                keys = chain[-1].keys  # the key count the range's newest file names
            else:  # files of other ranges (or none): count by reading
                keys = read.keys()
            path = state_file_path(stage, lo, hi, keys)
            files.append((path, read))
            stage_files.append(path)
            total += keys
        stages.append(StageFields(stage, node.op.value, state_signature(node), total, groups,
                                  stage_files))
    extra: list[str] = []
    if cut.event_time is not None and not cut.event_time.empty():
        encoded = json.dumps(cut.event_time.to_json(), sort_keys=True).encode()
        files.append((EVENT_TIME_FILE, [encoded]))  # type: ignore[arg-type]
        extra.append(EVENT_TIME_FILE)
    identities = {plan.name(n): source_identity(spec.source, cut.ends[plan.name(n)])
                  for n, spec in plan.sources().items() if plan.name(n) in cut.ends}
    fields = ManifestFields(
        job_id=job_id, job_name=job_name, sparkjet_version=versions[0],
        spark_version=versions[1], pipeline_fingerprint=pipeline_fingerprint(plan),
        batch_id=batch, sources=dict(cut.ends), stages=stages, files=extra,
        source_identities=identities,
    )
    return snapshots.write(name, fields, files)


def _folds(chain: list[StateVersion], lo: int, hi: int) -> bool:
    """Whether exporting the range's ``chain`` means folding changelogs into its full copy."""
    return any(not v.full for v in chain) and all((v.lo, v.hi) == (lo, hi) for v in chain)


def _compacted(
    paths: StatePaths, cut: ExportCut
) -> dict[str, dict[tuple[int, int], list[StateVersion]]]:
    """The cut's chains, those with changelogs folded first by compaction children at once.

    Folding unpickles and repickles a range's whole state: in this process,
    one range at a time under the GIL (about 20 MB/s of state), beside the
    job's own driver work. Child processes (:func:`compaction.compact_now`,
    one per core) fold the ranges at once and write each a full copy into
    the checkpoint, as background compaction does (the job's next batches
    read it too); the export then copies those files byte for byte. A range
    whose child failed keeps its chain, and is folded here. Stores other
    processes cannot see (``memory://``) fold here.
    """
    todo = [(stage, lo, hi) for stage, ranges in cut.chains.items()
            for (lo, hi), chain in ranges.items() if _folds(chain, lo, hi)]
    if not todo or not compaction.shared(paths):
        return cut.chains
    compaction.compact_now(paths, todo, cut.batch)
    chains = {stage: dict(ranges) for stage, ranges in cut.chains.items()}
    for stage in {stage for stage, _, _ in todo}:
        listed = paths.versions(stage)
        for (lo, hi), chain in chains[stage].items():
            if _folds(chain, lo, hi):
                # The copy a child wrote (a full copy at the batch of the chain's
                # newest file, which the cut's pin keeps), else the chain as it was.
                now = StatePaths.chain(listed, cut.batch, lo, hi)
                if len(now) == 1 and now[0].full and now[0].batch == chain[-1].batch:
                    chains[stage][(lo, hi)] = now
    return chains


class _Lazy:
    """One range's state file, made only when the snapshot store reads it.

    So the exporting driver holds one range of key groups at a time.
    """

    def __init__(
        self, paths: StatePaths, stage: str, lo: int, hi: int, batch: int,
        chain: list[StateVersion],
    ) -> None:
        self.paths, self.stage, self.lo, self.hi, self.batch = paths, stage, lo, hi, batch
        self.chain = chain

    def _state(self) -> tuple[int, bytes]:
        with self._gone():
            state = self.paths.read_chain(self.stage, self.lo, self.hi, self.chain)
        data = cloudpickle.dumps({"values": state.values, "touched": state.touched})
        return len(state.values), data

    @contextlib.contextmanager
    def _gone(self) -> Iterator[None]:
        """A chain's file missing: say which, and why it can be (never a bare ENOENT)."""
        try:
            yield
        except FileNotFoundError as exc:
            missing = next((self.paths.path(self.stage, v) for v in self.chain
                            if not self.paths.store.exists(self.paths.path(self.stage, v))),
                           str(exc))
            raise StoreError(self.paths.store.redact(
                f"stage {self.stage!r}: state file {missing!r} of batch {self.batch}'s state "
                "was removed while it was being exported (the checkpoint was deleted, or "
                "another driver took the job over); export the snapshot again"
            )) from None

    def keys(self) -> int:
        return self._state()[0]

    def __iter__(self) -> Iterator[bytes]:
        if len(self.chain) == 1 and self.chain[0].full and (
                self.chain[0].lo, self.chain[0].hi) == (self.lo, self.hi):
            # One full copy of exactly this range: the snapshot's file is that
            # file, byte for byte (the formats are the same); no unpickling.
            with self._gone():
                data = self.paths.store.read_bytes(self.paths.path(self.stage, self.chain[0]))
            yield data
            return
        yield self._state()[1]


def seed_checkpoint(
    checkpoint: Checkpoint,
    plan: Plan,
    snapshot: Snapshot,
    offsets: SourceOffsets,
    key_groups: int,
    options: UpgradeOptions | None = None,
) -> list[UpgradeRow]:
    """Seed the new job's empty checkpoint from ``snapshot`` (see the module docstring).

    ``offsets`` tells a source's offsets now (where it would start, and its
    data's end): a source restored from the snapshot takes the snapshot's
    offsets, for the partitions it had (a partition it had that is gone is
    refused; a new one starts where the source starts); others start where
    ``options.source_starts`` says. The checkpoint takes the snapshot's number
    of key groups where a stage is restored (keys were assigned by it), else
    ``key_groups`` (the new job's own). Every file is checked against the
    manifest as it is copied; a bad one is an error naming it, and the
    checkpoint then holds no commit (the job starts from nothing only if
    restarted without the snapshot). Create-only at the commit record: a
    second driver seeding at once finds batch 0 committed and goes on from it.
    """
    options = options or UpgradeOptions()
    manifest = snapshot.manifest
    rows = require_compatible(plan, manifest, options)
    restored = {r.snapshot_name: r.stage for r in rows if r.kind == "state" and r.carried}
    groups = {s.key_groups for s in manifest.stages if s.name in restored}
    if len(groups) > 1:
        raise SnapshotCorruptedError(
            f"snapshot {manifest.name!r}: its stages are split into different numbers of key "
            f"groups ({sorted(groups)})"
        )
    ends = _seed_offsets(plan, manifest, rows, offsets, options)
    carried = groups.pop() if groups else None
    meta = checkpoint.meta()
    if meta is None:
        checkpoint.key_groups(carried or key_groups, list(plan.names.values()))
    elif carried is not None and checkpoint.written_key_groups() != carried:
        raise SnapshotCorruptedError(
            f"snapshot {manifest.name!r} holds {carried} key groups but checkpoint "
            f"{checkpoint.root!r} was started with {checkpoint.written_key_groups()}"
        )
    paths = checkpoint.state(checkpoint.written_key_groups() or 1)
    counted: dict[StateRange, str] = {}
    for stage in manifest.stages:
        if stage.name not in restored:
            continue
        into = restored[stage.name]
        for entry in stage.files:
            parsed = parse_state_file(entry.path)
            if parsed is None:
                raise SnapshotCorruptedError(
                    f"snapshot {manifest.name!r}: stage {stage.name!r} has a file "
                    f"{entry.path!r} this sparkjet cannot read"
                )
            lo, hi, keys = parsed
            data = snapshot.read_file(entry.path)  # checked against its sha256 and size
            version = paths.write_copy(into, lo, hi, 0, keys, data)
            counted[StateRange(into, lo, hi)] = version.name
    carried_time = snapshot.event_time()
    if carried_time is not None:
        carried_time = carried_time.renamed(
            {r.snapshot_name: r.stage for r in rows if r.carried})
        windows = {r.stage for r in rows if r.kind == "state" and r.carried and r.new_window}
        restored_sources = {r.stage for r in rows if r.kind == "source" and r.carried}
        carried_time = carried_time.restricted(restored_sources, windows)
    checkpoint.write_commit(CommitRecord(
        0, ends, int(time.time() * 1000), 0, counted,
        RestoredFrom(manifest.name, manifest.batch_id, manifest.job_id), carried_time,
    ))
    return rows


@dataclass(frozen=True)
class SourceOffsets:
    """A new job's sources' offsets now, by source stage name (called at most once each)."""

    #: Where the source starts without a snapshot (``Source.initial_offsets``).
    initial: Callable[[str], Any]
    #: The end of its data now (``Source.latest_offsets``).
    latest: Callable[[str], Any]
    #: The source's partitions at some offsets (``Source.watermark_partitions``).
    partitions: Callable[[str, Any], list[str]]


def _seed_offsets(
    plan: Plan, manifest: Manifest, rows: list[UpgradeRow], offsets: SourceOffsets,
    options: UpgradeOptions,
) -> dict[str, Any]:
    """Each source's offsets at the seeded batch 0 (see :func:`seed_checkpoint`)."""
    by_stage = {r.stage: r for r in rows if r.kind == "source"}
    ends: dict[str, Any] = {}
    for node in plan.sources():
        source = plan.name(node)
        row = by_stage[source]
        if not row.carried:
            start = options.start_of(source)
            ends[source] = offsets.latest(source) if start == "latest" else offsets.initial(
                source)
            continue
        restored = manifest.sources[row.snapshot_name]
        initial = offsets.initial(source)
        had = offsets.partitions(source, restored)
        has = offsets.partitions(source, initial)
        gone = [p for p in had if p not in has]
        start = options.start_of(source)
        if gone and start is not None:
            ends[source] = offsets.latest(source) if start == "latest" else initial
            continue
        if gone:
            raise StateIncompatibleError(
                f"cannot start from snapshot {manifest.name!r}: source {source!r} had "
                f"{len(had)} partitions in the snapshot and has {len(has)} now; partition(s) "
                f"{', '.join(gone[:5])} are gone, so their offsets cannot be carried (say "
                f"where it starts with source_starts / --source-start {source}=initial or "
                f"{source}=latest)",
                stages=[source])
        ends[source] = _with_new_partitions(restored, initial)
    return ends


def _with_new_partitions(restored: Any, initial: Any) -> Any:
    """Restored offsets, with partitions that came since taking their initial offsets."""
    if isinstance(restored, list) and isinstance(initial, list) and len(initial) > len(restored):
        return [*restored, *initial[len(restored):]]
    if isinstance(restored, dict) and isinstance(initial, dict):
        return {**{k: v for k, v in initial.items() if k not in restored}, **restored}
    return restored
