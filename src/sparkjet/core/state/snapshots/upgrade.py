"""Jet's upgrade rules: what a pipeline may start from a snapshot (``003``, "State Compatibility").

A job submitted with ``initial_snapshot_name`` starts from it by these rules,
with state matched by stage name:

- a stateful stage in both, with the same *state signature*, is restored;
- a stateful stage only in the new pipeline starts empty;
- a stage only in the snapshot is ignored (and reported);
- a stage in both whose signature differs is refused at submit
  (:class:`StateIncompatibleError`, naming the stage and both signatures);
- sources in the snapshot resume at their recorded offsets, new ones start
  where they would without a snapshot.

This module owns the rules and nothing else: :func:`check_upgrade` says per
stateful stage and per source what a restore does (:class:`UpgradeRow`, what
``jet.check_upgrade`` and ``sparkjet check-upgrade`` show), and
:func:`require_compatible` refuses a start that any row refuses, or returns
the start as checked (:class:`CheckedUpgrade`): a submit runs the rules once,
and the restore (a new checkpoint seeded from the snapshot,
:mod:`sparkjet.core.state.restore`) goes by what they said. The rules read a
snapshot's manifest, never its files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sparkjet.core.errors import JobStateError, StateIncompatibleError
from sparkjet.core.model import JobConfig
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.pipeline.windows import WindowDefinition
from sparkjet.core.state.snapshots.format import (
    IDENTITY_FIELDS,
    UPSTREAM_FIELD,
    state_signature,
    stateful_stages,
)
from sparkjet.core.state.snapshots.manifest import Manifest

__all__ = [
    "CheckedUpgrade",
    "UpgradeOptions",
    "UpgradeRow",
    "check_upgrade",
    "require_compatible",
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
    #: only); ``incompatible`` (another shape of state: never restored);
    #: ``rebuilt`` (a hash join: no state, its tables read anew at the start).
    status: str
    #: The keys of state the snapshot holds for the stage (0 for a new one and sources).
    keys: int
    #: The state signature (a source: its identity) in the snapshot, and in the pipeline.
    old_signature: Any = None
    new_signature: Any = None
    #: What the restore does beyond copying (a window's new definition, where a
    #: source starts, what changed); "" for nothing.
    note: str = ""
    #: ``state`` (a stateful stage), ``source`` or ``join`` (a hash join).
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
    for node in plan.joins():
        sides = ", ".join(f"'{plan.name(side)}'" for side in node.inputs[1:])
        rows.append(UpgradeRow(plan.name(node), "rebuilt", 0, kind="join", note=(
            f"keeps no state: its build side(s) {sides} are read anew when the job starts")))
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


@dataclass(frozen=True)
class CheckedUpgrade:
    """Starting ``plan`` from the snapshot of ``manifest``: checked, and allowed.

    What :func:`require_compatible` returns, and what the restore takes
    (:func:`sparkjet.core.state.restore.seed_checkpoint`), so a submit runs the
    rules once.
    """

    plan: Plan
    manifest: Manifest
    #: The options the rules were run with.
    options: UpgradeOptions
    #: :func:`check_upgrade`'s rows, none of them refused.
    rows: tuple[UpgradeRow, ...]


def require_compatible(
    plan: Plan, manifest: Manifest, options: UpgradeOptions | None = None
) -> CheckedUpgrade:
    """:func:`check_upgrade`, raising StateIncompatibleError naming every refused row."""
    options = options or UpgradeOptions()
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
    return CheckedUpgrade(plan, manifest, options, tuple(rows))
