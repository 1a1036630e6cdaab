"""Every upgrade is refused, or gives the counts a from-scratch run gives (hypothesis).

One v1 job runs over the first half of a stream and is cancelled into a
snapshot. Hypothesis then edits v1 the ways users do (insert, drop, rename,
reorder stateful stages, change a key or an operation, rename the source or
point it at another stream, with or without the options that accept
renames and dropped state) and submits each v2 from the snapshot. Either
the submit is refused (and check-upgrade said why), or every stage of v2
holds what the oracle computes from scratch: a restored stage, what its v1
stage counted up to the cut plus what v2's counts after it; a new one, only
the latter. Edits also put a stage behind a filter (another input, the
same state: Jet keeps it).
``allow_changed_state`` and ``source_starts`` are left out: they accept
results that differ from a from-scratch run by design.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from sparkjet.aggregate import counting, summing
from sparkjet.errors import JobCancelledError, StateIncompatibleError
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from tests.conftest import wait_until

pytestmark = pytest.mark.slow

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE
USERS = ["ada", "bob", "cy"]
CUT = 30
ALL = 60
KEYS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "u": lambda e: e["u"],
    "page": lambda e: e["page"],
}


def events(start: int, end: int) -> list[dict[str, Any]]:
    return [{"u": USERS[i % 3], "page": i % 2} for i in range(start, end)]


@dataclass(frozen=True)
class StageDef:
    """A keyed aggregation stage: ``ident`` says which logical stage it is (its sink map)."""

    ident: str
    name: str | None
    key: str  # "u" | "page"
    op: str  # "count" | "sum" (of page: the same accumulator type) | "pair" (another type)
    filtered: bool = False  # behind a filter (page 1 only): another input, the same state

    def operation(self) -> Any:
        if self.op == "count":
            return counting()
        if self.op == "sum":
            return summing(lambda e: e["page"])
        return None

    def expected(self, items: list[dict[str, Any]]) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for e in items:
            if self.filtered and e["page"] != 1:
                continue
            k = KEYS[self.key](e)
            if self.op == "count":
                out[k] = out.get(k, 0) + 1
            elif self.op == "sum":
                out[k] = out.get(k, 0) + e["page"]
            else:
                c, s = out.get(k, (0, 0))
                out[k] = (c + 1, s + e["page"])
        return out


@dataclass(frozen=True)
class Version:
    source: str | None
    stream: str
    stages: tuple[StageDef, ...]

    def build(self, prefix: str) -> Pipeline:
        p = Pipeline.create()
        read = p.read_from(StreamSource(self.stream))
        if self.source is not None:
            read = read.set_name(self.source)
        for stage in self.stages:
            branch = read.filter(lambda e: e["page"] == 1) if stage.filtered else read
            grouped = branch.group_by(KEYS[stage.key])
            operation = stage.operation()
            if operation is not None:
                agg = grouped.aggregate(operation)
            else:
                agg = grouped.aggregate(
                    accumulator=lambda acc, e: (acc[0] + 1, acc[1] + e["page"]),
                    initial=(0, 0))
            if stage.name is not None:
                agg = agg.set_name(stage.name)
            agg.write_to(Pipeline.to_map(f"{prefix}-{stage.ident}"))
        return p


V1 = Version("src", "views", (
    StageDef("a", "by-user", "u", "count"),
    StageDef("b", None, "page", "count"),
    StageDef("c", None, "u", "sum"),
))
#: v1's stage names as the snapshot holds them (generated ones numbered in order).
V1_NAMES = {"a": "by-user", "b": "group-aggregate", "c": "group-aggregate-2"}

_new_ids = itertools.count()


def apply_edit(version: Version, edit: tuple[Any, ...]) -> Version:
    stages = list(version.stages)
    kind = edit[0]
    if kind == "insert":
        _, pos, named, key, op = edit
        ident = f"n{next(_new_ids)}"
        stages.insert(pos % (len(stages) + 1),
                      StageDef(ident, f"new-{ident}" if named else None, key, op))
    elif kind == "source":
        return replace(version, source=edit[1])
    elif kind == "stream":
        return replace(version, stream=edit[1])
    elif not stages:
        return version
    elif kind == "drop":
        del stages[edit[1] % len(stages)]
    elif kind == "rename":
        i = edit[1] % len(stages)
        stages[i] = replace(stages[i], name=edit[2])
    elif kind == "key":
        i = edit[1] % len(stages)
        stages[i] = replace(stages[i], key=edit[2])
    elif kind == "op":
        i = edit[1] % len(stages)
        stages[i] = replace(stages[i], op=edit[2])
    elif kind == "filter":
        i = edit[1] % len(stages)
        stages[i] = replace(stages[i], filtered=edit[2])
    elif kind == "swap":
        i, j = edit[1] % len(stages), edit[2] % len(stages)
        stages[i], stages[j] = stages[j], stages[i]
    return replace(version, stages=tuple(stages))


index = st.integers(0, 5)
keys = st.sampled_from(["u", "page"])
ops = st.sampled_from(["count", "sum", "pair"])
edit = st.one_of(
    st.tuples(st.just("insert"), index, st.booleans(), keys, ops),
    st.tuples(st.just("drop"), index),
    st.tuples(st.just("rename"), index, st.sampled_from(["renamed", "by-user", None])),
    st.tuples(st.just("key"), index, keys),
    st.tuples(st.just("op"), index, ops),
    st.tuples(st.just("swap"), index, index),
    st.tuples(st.just("filter"), index, st.booleans()),
    st.tuples(st.just("source"), st.sampled_from(["src", "src-b", None])),
    st.tuples(st.just("stream"), st.just("other")),
)


def options_for(v2: Version, use_renames: bool, allow_dropped: bool) -> dict[str, Any]:
    """The options a user who knows what they changed would give."""
    renames: dict[str, str] = {}
    if use_renames:
        for stage in v2.stages:
            old = V1_NAMES.get(stage.ident)
            if old is not None and stage.name is not None and stage.name != old:
                renames[old] = stage.name
        if v2.source is not None and v2.source != V1.source and V1.source is not None:
            renames[V1.source] = v2.source
        if len(set(renames.values())) != len(renames):
            renames = {}
    return {"stage_renames": renames, "allow_dropped_state": allow_dropped}


@pytest.fixture
def v1_snapshot(client: Any) -> str:
    stream = client.get_stream("views", partitions=2)
    client.get_stream("other", partitions=2).publish_all(events(100, 110))
    stream.publish_all(events(0, CUT))
    config = JobConfig(name="v1", processing_guarantee=EXACTLY_ONCE,
                       snapshot_interval_millis=100, key_groups=8)
    job = client.get_jet().submit(V1.build("v1"), config)
    try:
        want = V1.stages[0].expected(events(0, CUT))
        wait_until(lambda: dict(client.get_map("v1-a").entry_set()) == want, what="v1")
        wait_until(lambda: all(dict(client.get_map(f"v1-{s.ident}").entry_set()) == s.expected(
            events(0, CUT)) for s in V1.stages), what="v1's stages")
        job.cancel_and_export_snapshot("v1")
        with pytest.raises(JobCancelledError):
            job.join(timeout=60)
    finally:
        if not job.is_terminal():
            job.cancel()
    stream.publish_all(events(CUT, ALL))
    return "v1"


_runs = itertools.count()


@settings(max_examples=int(os.environ.get("SPARKJET_UPGRADE_EXAMPLES", "40")), deadline=None,
          database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits=st.lists(edit, min_size=1, max_size=3), use_renames=st.booleans(),
       allow_dropped=st.booleans())
@example(edits=[("drop", 0)] * 3, use_renames=False, allow_dropped=False)  # no stage left
def test_every_upgrade_is_refused_or_exact(
    client: Any, v1_snapshot: str, edits: list[tuple[Any, ...]], use_renames: bool,
    allow_dropped: bool,
) -> None:
    v2 = V1
    for e in edits:
        v2 = apply_edit(v2, e)
    names = [s.name for s in v2.stages if s.name is not None]
    if len(set(names)) != len(names) or any(n.startswith("group-aggregate") for n in names):
        event("not a pipeline")
        return  # two stages of one name: the pipeline itself is refused (tested elsewhere)
    if not v2.stages:
        # Every stage dropped: a source with no sink downstream, refused at submit
        # (tested elsewhere). Hypothesis met it once as three drops in a row.
        event("not a pipeline")
        return
    run = next(_runs)
    prefix = f"r{run}"
    pipeline = v2.build(prefix)
    options = options_for(v2, use_renames, allow_dropped)
    jet = client.get_jet()
    rows = jet.check_upgrade(pipeline, v1_snapshot, config=JobConfig(**options))
    config = JobConfig(name=f"v2-{run}", processing_guarantee=EXACTLY_ONCE,
                       snapshot_interval_millis=100, key_groups=8, **options)
    config.initial_snapshot_name = v1_snapshot
    refused = [r for r in rows if r.refusal]
    event("refused" if refused else "accepted")
    if refused:
        with pytest.raises(StateIncompatibleError) as raised:
            jet.submit(pipeline, config)
        assert set(raised.value.stages) == {r.stage for r in refused}
        return
    assert v2.stream == "views", f"a source reading another stream was accepted: {rows}"
    restored_from = {r.stage: r.snapshot_name for r in rows
                     if r.kind == "state" and r.status == "restored"}
    v1_stage = {V1_NAMES[s.ident]: s for s in V1.stages}
    plan_names = _stage_names(v2)
    job = jet.submit(pipeline, config)
    try:
        wait_until(lambda: job.status is JobStatus.RUNNING, what=f"v2 {v2} to run")
        # The oracle: a restored stage holds what its v1 stage counted up to the cut,
        # plus what v2's stage counts after it; a new one only the latter. (An
        # accepted upgrade keeps the key and operation, so the two add up.)
        expected = {}
        for stage in v2.stages:
            after = stage.expected(events(CUT, ALL))
            old = restored_from.get(plan_names[stage.ident])
            before = v1_stage[old].expected(events(0, CUT)) if old is not None else {}
            expected[stage.ident] = {k: _add(before.get(k), v) for k, v in after.items()}

        def holds() -> bool:
            return all(dict(client.get_map(f"{prefix}-{s.ident}").entry_set())
                       == expected[s.ident] for s in v2.stages)

        wait_until(holds, timeout=60, what=(
            f"v2 {v2} with {options} to give the oracle's counts {expected} (check-upgrade: "
            f"{[(r.stage, r.status, r.renamed_from) for r in rows]})"))
    finally:
        if not job.is_terminal():
            job.cancel()
            with pytest.raises(JobCancelledError):
                job.join(timeout=60)


def _add(before: Any, after: Any) -> Any:
    if before is None:
        return after
    if isinstance(after, tuple):
        return (before[0] + after[0], before[1] + after[1])
    return before + after


def _stage_names(version: Version) -> dict[str, str]:
    """The stage name each logical stage gets in ``version`` (generated ones in order)."""
    out, n = {}, 0
    for stage in version.stages:
        if stage.name is not None:
            out[stage.ident] = stage.name
        else:
            n += 1
            out[stage.ident] = "group-aggregate" if n == 1 else f"group-aggregate-{n}"
    return out
