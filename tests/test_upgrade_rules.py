"""Upgrades that cannot silently lose or double count (issue 24's holes, each reproduced).

v1 counts page views per user from a stream; each test edits it the way a
user would and checks that the upgrade is refused naming the stage, or,
accepted with the option that says so, gives the counts a from-scratch run
gives.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from sparkjet.aggregate import counting, summing
from sparkjet.errors import JobCancelledError, JobFailedError, StateIncompatibleError
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from tests.conftest import cancel_job as stop
from tests.conftest import wait_until

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE
USERS = ["ada", "bob", "cy"]


def events(start: int, end: int) -> list[dict[str, Any]]:
    """Item i: user USERS[i % 3], page i % 2."""
    return [{"u": USERS[i % 3], "page": i % 2, "n": 1} for i in range(start, end)]


def per_user(items: list[dict[str, Any]]) -> dict[str, int]:
    return dict(Counter(e["u"] for e in items))


def pipeline(
    *, stream: str = "views", source: str | None = "src-a", stage: str | None = "per-user",
    key: Any = None, operation: Any = None, before: bool = False,
) -> Pipeline:
    """v1 by default: stream ``views`` read as ``src-a``, counts per user in ``per-user``."""
    p = Pipeline.create()
    read = p.read_from(StreamSource(stream))
    if source is not None:
        read = read.set_name(source)
    if before:  # a stateful stage inserted before (unnamed): shifts generated names
        read.group_by(lambda e: e["page"]).aggregate(counting()).write_to(
            Pipeline.to_map("per-page"))
    counts = read.group_by(key or (lambda e: e["u"])).aggregate(operation or counting())
    if stage is not None:
        counts = counts.set_name(stage)
    counts.write_to(Pipeline.to_map("counts"))
    return p


def run(client: Any, p: Pipeline, name: str, snapshot: str | None = None, **options: Any) -> Any:
    config = JobConfig(name=name, processing_guarantee=EXACTLY_ONCE,
                       snapshot_interval_millis=100, key_groups=8, **options)
    config.initial_snapshot_name = snapshot
    job = client.get_jet().submit(p, config)
    wait_until(lambda: job.status is JobStatus.RUNNING, what=f"{name} to run")
    return job


def counts(client: Any) -> dict[str, int]:
    return dict(client.get_map("counts").entry_set())


@pytest.fixture
def v1_snapshot(client: Any) -> Any:
    """v1 ran over items 0..30 of ``views`` and was cancelled into snapshot ``v1``."""
    client.get_stream("views", partitions=2).publish_all(events(0, 30))
    job = run(client, pipeline(), "v1")
    try:
        wait_until(lambda: counts(client) == per_user(events(0, 30)), what="v1's counts")
        snapshot = job.cancel_and_export_snapshot("v1")
        with pytest.raises(JobCancelledError):
            job.join(timeout=60)
    finally:
        stop(job)
    return snapshot


def rows(client: Any, p: Pipeline, **options: Any) -> dict[str, Any]:
    found = client.get_jet().check_upgrade(p, "v1", config=JobConfig(**options))
    return {(r.kind, r.stage): r for r in found}


def upgrade_counts(client: Any, p: Pipeline, **options: Any) -> dict[str, int]:
    """Submit ``p`` from ``v1``, publish items 30..60, and the counts when they settle."""
    client.get_stream("views").publish_all(events(30, 60))
    job = run(client, p, "v2", snapshot="v1", **options)
    try:
        wait_until(lambda: job.get_metrics()["lastCommittedBatch"] >= 1 and sum(
            counts(client).values()) >= 30, what="v2 to read on")
        return counts(client)
    finally:
        stop(job)


def test_a_submit_from_a_snapshot_runs_the_rules_once(
    client: Any, v1_snapshot: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked at submit, seeded by what the check said: the rules are not run again."""
    from sparkjet.core.state.snapshots import upgrade

    checked = upgrade.check_upgrade
    calls: list[str] = []

    def counted(plan: Any, manifest: Any, options: Any = None) -> Any:
        calls.append(manifest.name)
        return checked(plan, manifest, options)

    monkeypatch.setattr(upgrade, "check_upgrade", counted)
    # A rename: the seeding carries the state and offsets by the submit's options.
    assert upgrade_counts(client, pipeline(source="src-b"),
                          stage_renames={"src-a": "src-b"}) == per_user(events(0, 60))
    assert calls == ["v1"]


def test_a_renamed_source_is_refused_and_carried_by_a_rename(
    client: Any, v1_snapshot: Any
) -> None:
    """Hole 1: ``src-a`` -> ``src-b`` re-read everything (ada 55 where 35 is right)."""
    v2 = pipeline(source="src-b")
    found = rows(client, v2)
    assert found["source", "src-b"].status == "new"
    assert "--source-start src-b=initial" in found["source", "src-b"].refusal
    assert found["source", "src-a"].status == "dropped"
    assert "--rename src-a=NEW" in found["source", "src-a"].refusal
    with pytest.raises(StateIncompatibleError, match="src-b") as refused:
        run(client, v2, "v2", snapshot="v1")
    assert set(refused.value.stages) == {"src-a", "src-b"}
    renamed = rows(client, v2, stage_renames={"src-a": "src-b"})
    assert renamed["source", "src-b"].renamed_from == "src-a"
    assert not renamed["source", "src-b"].refusal
    assert upgrade_counts(client, v2, stage_renames={"src-a": "src-b"}) == per_user(
        events(0, 60))


def test_a_source_reading_another_stream_is_refused(client: Any, v1_snapshot: Any) -> None:
    """Hole 2: ``src-a`` now reads ``other``: v1's offsets applied to it skipped items."""
    other = client.get_stream("other", partitions=3)
    other.publish_all(events(100, 112))
    v2 = pipeline(stream="other")
    row = rows(client, v2)["source", "src-a"]
    assert row.status == "changed"
    assert '"views"' in row.refusal and '"other"' in row.refusal
    with pytest.raises(StateIncompatibleError, match="src-a"):
        run(client, v2, "v2", snapshot="v1")
    # Said where it starts: all of 'other', on top of v1's restored counts.
    job = run(client, v2, "v2", snapshot="v1", source_starts={"src-a": "initial"})
    try:
        want = per_user(events(0, 30) + events(100, 112))
        wait_until(lambda: counts(client) == want, what="other read from its start")
        assert job.get_metrics()["snapshotRestore"]["sources"] == {"src-a": "changed"}
    finally:
        stop(job)


def test_a_source_started_at_latest_skips_what_is_there(client: Any, v1_snapshot: Any) -> None:
    other = client.get_stream("other", partitions=1)
    other.publish_all(events(100, 112))
    job = run(client, pipeline(stream="other"), "v2", snapshot="v1",
              source_starts={"*": "latest"})
    try:
        other.publish_all(events(200, 203))
        want = per_user(events(0, 30) + events(200, 203))
        wait_until(lambda: counts(client) == want, what="only what came after the submit")
        assert job.get_metrics()["snapshotRestore"]["sources"] == {"src-a": "changed"}
        assert counts(client) == want  # items 100..111, there before the submit, never read
    finally:
        stop(job)


def test_a_stage_inserted_before_an_unnamed_one_is_refused(client: Any) -> None:
    """Hole 3: generated names shifted, per-user counts landed in the new per-page stage."""
    client.get_stream("views", partitions=1).publish_all(events(0, 30))
    job = run(client, pipeline(source=None, stage=None), "v1")
    try:
        wait_until(lambda: counts(client) == per_user(events(0, 30)), what="v1's counts")
        job.cancel_and_export_snapshot("v1")
        with pytest.raises(JobCancelledError):
            job.join(timeout=60)
    finally:
        stop(job)
    v2 = pipeline(source=None, stage=None, before=True)
    with pytest.raises(StateIncompatibleError, match=r"generated name.*set_name") as refused:
        run(client, v2, "v2", snapshot="v1")
    assert "group-aggregate" in refused.value.stages
    # The same pipeline, unchanged: its generated names are safe to restore by.
    assert upgrade_counts(client, pipeline(source=None, stage=None)) == per_user(
        events(0, 60))


@pytest.mark.parametrize("edit", ["operation", "key"])
def test_a_changed_operation_or_key_is_refused_unless_accepted(
    client: Any, v1_snapshot: Any, edit: str
) -> None:
    """Hole 4: counting() -> summing(), group_by(u) -> group_by(page) kept the state silently."""
    if edit == "operation":
        v2 = pipeline(operation=summing(lambda e: e["n"]))
    else:
        v2 = pipeline(key=lambda e: str(e["page"]))
    row = rows(client, v2)["state", "per-user"]
    assert row.status == "changed"
    assert f"{edit} " in row.note and "allow_changed_state" in row.refusal
    with pytest.raises(StateIncompatibleError, match="per-user"):
        run(client, v2, "v2", snapshot="v1")
    assert not rows(client, v2, allow_changed_state=True)["state", "per-user"].refusal
    if edit == "operation":  # summing n (always 1) counts as counting did: accepted, exact
        assert upgrade_counts(client, v2, allow_changed_state=True) == per_user(events(0, 60))


def test_a_renamed_stateful_stage_is_refused_and_carried_by_a_rename(
    client: Any, v1_snapshot: Any
) -> None:
    """Hole 5: a renamed stateful stage silently started from zero (exit 0, one log line)."""
    v2 = pipeline(stage="by-user")
    found = rows(client, v2)
    assert (found["state", "by-user"].status, found["state", "per-user"].status) == (
        "new", "dropped")
    assert "allow_dropped_state" in found["state", "per-user"].refusal
    with pytest.raises(StateIncompatibleError, match="'per-user'"):
        run(client, v2, "v2", snapshot="v1")
    carried = rows(client, v2, stage_renames={"per-user": "by-user"})["state", "by-user"]
    assert (carried.status, carried.renamed_from, carried.keys) == ("restored", "per-user", 3)
    assert upgrade_counts(client, v2, stage_renames={"per-user": "by-user"}) == per_user(
        events(0, 60))


def test_dropped_state_accepted_starts_the_new_stage_empty(
    client: Any, v1_snapshot: Any
) -> None:
    v2 = pipeline(stage="by-user")
    assert upgrade_counts(client, v2, allow_dropped_state=True) == per_user(events(30, 60))


def test_renames_that_name_nothing_are_refused(client: Any, v1_snapshot: Any) -> None:
    with pytest.raises(StateIncompatibleError, match=r"'nope'.*per-user"):
        rows(client, pipeline(), stage_renames={"nope": "per-user"})
    with pytest.raises(StateIncompatibleError, match="'ghost', which is not a stage"):
        rows(client, pipeline(), stage_renames={"per-user": "ghost"})


def test_offsets_never_go_backwards(client: Any, store_url: str, v1_snapshot: Any) -> None:
    """Hole 2's last part: offsets past the stream's end were moved back to it, silently.

    The stream is deleted and created again with fewer items under the same
    name (same identity): the restored offsets lie past its end, and the job
    fails naming the source and both offsets.
    """
    layout = client.store.layout
    client.store.remove(layout.stream_paths("views").folder, recursive=True)
    client.get_stream("views", partitions=2).publish_all(events(0, 4))
    config = JobConfig(name="v2", processing_guarantee=EXACTLY_ONCE, key_groups=8)
    config.initial_snapshot_name = "v1"
    job = client.get_jet().submit(pipeline(), config)
    with pytest.raises(JobFailedError, match=r"source 'src-a'.*before the offsets") as failed:
        job.join(timeout=60)
    assert "SourceOffsetsError" in str(failed.value)
    assert counts(client) == per_user(events(0, 30))  # nothing read, nothing skipped
