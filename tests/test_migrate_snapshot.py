"""``migrate-snapshot``: a new snapshot from an old one, stages renamed, dropped or rewritten.

A real streaming job's snapshot is migrated and an upgraded pipeline started
from it counts exactly; the key-by-key rules (rebucketing, deletes, collisions,
a raising function, signatures, provenance, signing) run on snapshots written in
the real format through a real :class:`SnapshotStore` (in memory, on S3 and on
GCS servers), and the command runs through ``main()``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import sparkjet
from sparkjet.aggregate import counting
from sparkjet.cli import main
from sparkjet.core.state.keygroups import key_group
from sparkjet.core.state.snapshots import ManifestFields, SnapshotStore, StageFields
from sparkjet.core.state.snapshots.format import EVENT_TIME_FILE, parse_state_file, state_file_path
from sparkjet.errors import (
    JobCancelledError,
    SnapshotCorruptedError,
    SnapshotError,
    SnapshotSignatureError,
)
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.testing import StoreLocation
from tests.conftest import cancel_job as stop
from tests.conftest import wait_until
from tests.test_cli import write_config

GROUPS = 8
#: The snapshot's files: two ranges of key groups, as two state tasks would write them.
RANGES = [(0, 3), (3, 8)]
COUNTS = {"op": "aggregate", "accumulator": "int", "combiner": True}
TOTALS = {"op": "map_stateful", "state": "list"}
UNIQ = {"op": "distinct"}
WINDOW = {"op": "window", "window": "frames", "accumulator": "int", "combiner": True,
          "definition": {"kind": "tumbling", "size": 1000}}


# --- a real job's snapshot, migrated, and an upgraded job started from it ------------------


def v1() -> Pipeline:
    def running_total(state: list[int], key: int, item: int) -> tuple[int, int]:
        state[0] += item  # (a local function: shipped to Spark's workers by value)
        return key, state[0]

    p = Pipeline.create()
    events = p.read_from(StreamSource("clicks")).set_name("clicks")
    (events.group_by(lambda x: x % 10).aggregate(counting()).set_name("per-user")
     .write_to(Pipeline.to_map("counts")))
    events.distinct().set_name("uniq").write_to(Pipeline.to_list("firsts"))
    (events.group_by(lambda x: x % 3).map_stateful(lambda: [0], running_total)
     .set_name("totals").write_to(Pipeline.to_map("totals")))
    return p


def v2() -> Pipeline:
    """Renamed source and counts, string user keys, dict totals, no ``uniq``."""

    def running_total(state: dict[str, int], key: int, item: int) -> tuple[int, int]:
        state["sum"] += item
        return key, state["sum"]

    p = Pipeline.create()
    events = p.read_from(StreamSource("clicks")).set_name("clicks-v2")
    (events.group_by(lambda x: f"u{x % 10}").aggregate(counting()).set_name("per-user-v2")
     .write_to(Pipeline.to_map("counts-v2")))
    (events.group_by(lambda x: x % 3).map_stateful(lambda: {"sum": 0}, running_total)
     .set_name("totals").write_to(Pipeline.to_map("totals-v2")))
    return p


def to_user(key: int, count: int) -> tuple[str, int]:
    return f"u{key}", count


def to_dict(key: int, state: list[int]) -> tuple[int, dict[str, int]]:
    return key, {"sum": state[0]}


def start(client: sparkjet.Client, pipeline: Pipeline, name: str,
          snapshot: str | None = None) -> Any:
    config = JobConfig(name=name, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                       snapshot_interval_millis=100, key_groups=16)
    config.initial_snapshot_name = snapshot
    job = client.get_jet().submit(pipeline, config)
    wait_until(lambda: job.status is JobStatus.RUNNING, 120, f"{name} to run")
    return job


def test_a_migrated_snapshot_restores_an_upgraded_pipeline_exactly(
    client: sparkjet.Client,
) -> None:
    jet = client.get_jet()
    stream = client.get_stream("clicks", partitions=2)
    job = start(client, v1(), "clicks")
    first = range(300)
    try:
        stream.publish_all(first)
        wait_until(lambda: dict(client.get_map("counts").entry_set()) == {
            k: 30 for k in range(10)}, 90, "v1's counts")
        wait_until(lambda: dict(client.get_map("totals").entry_set()) == {
            k: sum(x for x in first if x % 3 == k) for k in range(3)}, 90, "v1's totals")
        old = job.cancel_and_export_snapshot("v1")
        with pytest.raises(JobCancelledError):
            job.join(timeout=60)
    finally:
        stop(job)
    old_files = {f.path: f.sha256 for f in old.manifest.all_files()}

    new = jet.migrate_snapshot(
        "v1", "v2", renames={"per-user": "per-user-v2", "clicks": "clicks-v2"},
        drop=["uniq"], transforms={"per-user": to_user, "totals": to_dict},
    )
    # The old snapshot is as it was.
    assert {f.path: f.sha256 for f in jet.get_snapshot("v1").manifest.all_files()} == old_files
    jet.get_snapshot("v1").verify()
    new.verify()
    assert new.read_state("per-user-v2") == {f"u{k}": 30 for k in range(10)}
    assert new.read_state("totals") == {
        k: {"sum": sum(x for x in first if x % 3 == k)} for k in range(3)}
    stages = {s.name: s for s in new.manifest.stages}
    assert set(stages) == {"per-user-v2", "totals"}
    totals = stages["totals"].state_signature
    assert totals == {"op": "map_stateful", "state": "dict", "upstream": totals["upstream"]}
    # Counts stay ints; the key and operation identities go: the function rewrote the keys.
    assert stages["per-user-v2"].state_signature == {
        k: v for k, v in old.manifest.stage("per-user").state_signature.items()
        if k not in ("key", "operation")}
    assert new.manifest.source_identities == {
        "clicks-v2": old.manifest.source_identities["clicks"]}
    assert stages["per-user-v2"].key_groups == old.manifest.stage("per-user").key_groups
    assert new.manifest.sources == {"clicks-v2": old.manifest.sources["clicks"]}
    assert new.manifest.batch_id == old.manifest.batch_id
    assert new.manifest.derived_from == {
        "snapshot": "v1", "attempt": old.attempt, "batch_id": old.manifest.batch_id,
        "renamed": {"per-user": "per-user-v2", "clicks": "clicks-v2"}, "dropped": ["uniq"],
        "transformed": ["per-user", "totals"],
    }

    # Published while no job ran, then more: the upgraded job counts each item once.
    stream.publish_all(range(300, 350))
    job2 = start(client, v2(), "clicks-v2", snapshot="v2")
    try:
        stream.publish_all(range(350, 420))
        everything = range(420)
        expected: dict[str, int] = {}
        for x in everything:
            expected[f"u{x % 10}"] = expected.get(f"u{x % 10}", 0) + 1
        wait_until(lambda: dict(client.get_map("counts-v2").entry_set()) == expected, 90,
                   "v2's counts, on from the migrated ones")
        wait_until(lambda: dict(client.get_map("totals-v2").entry_set()) == {
            k: sum(x for x in everything if x % 3 == k) for k in range(3)}, 90, "v2's totals")
        restore = job2.get_metrics()["snapshotRestore"]
        assert restore["snapshot"] == "v2"
        assert restore["stages"] == {"per-user-v2": "restored", "totals": "restored"}
    finally:
        stop(job2)


# --- the rules, on snapshots in the real format --------------------------------------------


def write_snapshot(
    store: SnapshotStore,
    name: str,
    stages: dict[str, tuple[Any, dict[Any, Any], dict[Any, int]]],
    sources: dict[str, Any] | None = None,
    event_time: dict[str, Any] | None = None,
    ranges: list[tuple[int, int]] = RANGES,
) -> Any:
    """Export ``{stage: (signature, {key: value}, {key: touched})}`` as the runtime lays it out."""
    fields, files = [], []
    for stage, (signature, state, touched) in stages.items():
        paths = []
        for lo, hi in ranges:
            values = {k: True if signature["op"] == "distinct" else (k, v)
                      for k, v in state.items() if lo <= key_group(k, GROUPS) < hi}
            data = {"values": values, "touched": {k: touched[k] for k in values if k in touched}}
            path = state_file_path(stage, lo, hi, len(values))
            files.append((path, cloudpickle.dumps(data)))
            paths.append(path)
        fields.append(StageFields(stage, signature["op"], signature, len(state), GROUPS, paths))
    extra = []
    if event_time is not None:
        files.append((EVENT_TIME_FILE, json.dumps(event_time).encode()))
        extra.append(EVENT_TIME_FILE)
    return store.write(name, ManifestFields(
        job_id="job-1", job_name="clicks", sparkjet_version="0.1", spark_version="4.3",
        pipeline_fingerprint="0123456789abcdef", batch_id=7,
        sources=sources if sources is not None else {"clicks": {"0": 5, "1": 3}},
        stages=fields, files=extra,
    ), files)


def state_files(store: SnapshotStore, name: str, stage: str) -> dict[tuple[int, int], Any]:
    """Each file of ``stage``: ``(lo, hi)`` -> its unpickled content (checked by the reader)."""
    snapshot = store.get(name)
    found = {}
    for entry in snapshot.manifest.stage(stage).files:
        lo, hi, keys = parse_state_file(entry.path)
        data = cloudpickle.loads(snapshot.read_file(entry.path))
        assert len(data["values"]) == keys
        found[(lo, hi)] = data
    return found


@pytest.fixture
def store(memory_location: StoreLocation) -> SnapshotStore:
    return SnapshotStore(memory_location.fresh().snapshot_backend())


def migrate(store: SnapshotStore, src: str, dst: str, **kwargs: Any) -> Any:
    from sparkjet.core.state.snapshots.migrate import migrate_snapshot

    manifest, report = migrate_snapshot(store, src, dst, **kwargs)
    written = store.get(dst)
    assert written.manifest == manifest  # the manifest written is the one published
    return written, report


def test_changed_keys_move_to_their_key_groups_and_keep_their_touched_times(
    store: SnapshotStore,
) -> None:
    counts = {k: k * 10 for k in range(40)}
    write_snapshot(store, "v1", {"counts": (COUNTS, counts, {k: 1000 + k for k in range(40)})})
    moved = sum(1 for k in counts if key_group(k, GROUPS) != key_group(k + 1003, GROUPS))
    assert moved == 40  # the rewrite moves every key to another key group

    new, report = migrate(store, "v1", "v2", transforms={"counts": lambda k, v: (k + 1003, v)})
    assert new.read_state("counts") == {k + 1003: v for k, v in counts.items()}
    files = state_files(store, "v2", "counts")
    assert sorted(files) == RANGES  # the old layout, the same key groups
    for (lo, hi), data in files.items():
        assert all(lo <= key_group(k, GROUPS) < hi for k in data["values"])
        assert all(entry == (k, counts[k - 1003]) for k, entry in data["values"].items())
        assert data["touched"] == {k: k - 3 for k in data["values"]}  # 1000 + the old key
    stage = new.manifest.stage("counts")
    assert (stage.key_count, stage.key_groups, stage.state_signature) == (40, GROUPS, COUNTS)
    assert [(r.name, r.new_name, r.keys_in, r.keys_out, r.transformed) for r in report] == [
        ("counts", "counts", 40, 40, True), ("clicks", "clicks", 0, 0, False)]


def test_none_deletes_a_key_and_distinct_keys_can_be_rewritten(store: SnapshotStore) -> None:
    write_snapshot(store, "v1", {
        "counts": (COUNTS, {k: 1 for k in range(10)}, {}),
        "uniq": (UNIQ, {k: True for k in ("a", "b", "c")}, {"a": 5}),
    })
    new, _ = migrate(store, "v1", "v2", transforms={
        "counts": lambda k, v: None if k % 2 else (k, v),
        "uniq": lambda k, v: (k.upper(), v),
    })
    assert new.read_state("counts") == {k: 1 for k in range(0, 10, 2)}
    assert new.manifest.stage("counts").key_count == 5
    assert new.read_state("uniq") == {"A": True, "B": True, "C": True}
    assert {k: t for d in state_files(store, "v2", "uniq").values()
            for k, t in d["touched"].items()} == {"A": 5}
    with pytest.raises(SnapshotError, match=r"stage 'uniq', key '[abc]': a distinct stage keeps "
                       r"True per key; the transform returned 1"):
        migrate(store, "v1", "v3", transforms={"uniq": lambda k, v: (k, 1)})


def test_two_keys_mapped_to_one_is_an_error_naming_stage_and_keys(store: SnapshotStore) -> None:
    write_snapshot(store, "v1", {"counts": (COUNTS, {k: k for k in range(10)}, {})})
    with pytest.raises(SnapshotError, match=r"stage 'counts', key \d: the transform maps it to "
                       r"key 'same', which key \d was mapped to as well; snapshot 'v2' was not "
                       "written"):
        migrate(store, "v1", "v2", transforms={"counts": lambda k, v: ("same", v)})
    assert not store.exists("v2")
    assert store.backend.list("") == store.backend.list(store.get("v1").folder)


def test_a_snapshot_missing_a_key_group_is_refused_by_name(store: SnapshotStore) -> None:
    # Files for key groups [0, 3) only: a key moved into group 3..7 has no file to go to.
    inside = [k for k in range(50) if key_group(k, GROUPS) < 3]
    write_snapshot(store, "v1", {"counts": (COUNTS, dict.fromkeys(inside, 1), {})},
                   ranges=[(0, 3)])
    target = next(k for k in range(100, 200) if key_group(k, GROUPS) >= 3)
    with pytest.raises(SnapshotError, match=rf"snapshot 'v1': stage 'counts': no file holds "
                       rf"key group {key_group(target, GROUPS)} of 8"):
        migrate(store, "v1", "v2", transforms={
            "counts": lambda k, v: (target, v) if k == inside[0] else (k, v)})
    assert not store.exists("v2")


def test_a_raising_transform_names_stage_and_key_and_writes_nothing(
    store: SnapshotStore,
) -> None:
    write_snapshot(store, "v1", {"counts": (COUNTS, {k: k for k in range(10)}, {})})
    write_snapshot(store, "v2", {"counts": (COUNTS, {"kept": 1}, {})})

    def boom(key: int, value: int) -> tuple[int, int]:
        if key == 7:
            raise ValueError("no sevens")
        return key, value

    with pytest.raises(SnapshotError, match=r"stage 'counts', key 7: the transform raised "
                       r"ValueError: no sevens; snapshot 'v2' was not written") as caught:
        migrate(store, "v1", "v2", transforms={"counts": boom}, overwrite=True)
    assert isinstance(caught.value.__cause__, ValueError)
    assert store.get("v2").read_state("counts") == {"kept": 1}  # the old v2, whole
    with pytest.raises(SnapshotError, match=r"stage 'counts', key 0: the transform returned "
                       r"int 0, expected a \(key, value\) pair or None"):
        migrate(store, "v1", "v3", transforms={"counts": lambda k, v: v})
    with pytest.raises(SnapshotError, match=r"stage 'counts', key 0: the transform's new key "
                       r"\[0\] is unhashable \(list\)"):
        migrate(store, "v1", "v3", transforms={"counts": lambda k, v: ([k], v)})
    assert not store.exists("v3")


def test_a_new_value_type_updates_the_signature_and_two_types_are_refused(
    store: SnapshotStore,
) -> None:
    write_snapshot(store, "v1", {
        "totals": (TOTALS, {k: [k] for k in range(6)}, {}),
        "counts": (COUNTS, {k: k for k in range(6)}, {}),
    })
    new, _ = migrate(store, "v1", "v2", transforms={
        "totals": lambda k, v: (k, {"sum": v[0]}), "counts": lambda k, v: (k, v * 2)})
    assert new.manifest.stage("totals").state_signature == {"op": "map_stateful",
                                                            "state": "dict"}
    assert new.manifest.stage("counts").state_signature == COUNTS  # still ints
    with pytest.raises(SnapshotError, match=r"stage 'counts': the transform returned values of "
                       r"two types, (int|float) \(key \d\) and (int|float) \(key \d\)"):
        migrate(store, "v1", "v3",
                transforms={"counts": lambda k, v: (k, float(v) if k % 2 else v)})


def test_renames_and_drops_move_state_offsets_and_event_time(store: SnapshotStore) -> None:
    old = write_snapshot(
        store, "v1",
        {"counts": (COUNTS, {k: k for k in range(20)}, {}), "win": (WINDOW, {1: 2}, {}),
         "uniq": (UNIQ, {"a": True}, {})},
        sources={"clicks": {"0": 5}, "views": {"0": 9}},
        event_time={"partitions": {"clicks": {"0": [100, 200]}, "views": {"0": [1, 2]}},
                    "watermarks": {"win": 50}, "time": 300},
    )
    new, report = migrate(store, "v1", "v2",
                          renames={"counts": "per-user", "clicks": "events", "win": "windows"},
                          drop=["uniq", "views"])
    assert [s.name for s in new.manifest.stages] == ["per-user", "windows"]
    assert new.read_state("per-user") == {k: k for k in range(20)}
    # Without a transform a stage's files are copied byte for byte under the new name.
    for old_entry, new_entry in zip(old.stage("counts").files,
                                    new.manifest.stage("per-user").files, strict=True):
        assert new_entry.sha256 == old_entry.sha256
        assert new_entry.path == old_entry.path.replace("/counts/", "/per-user/")
    assert new.manifest.stage("windows").state_signature == WINDOW
    assert new.manifest.sources == {"events": {"0": 5}}
    event_time = new.event_time()
    assert event_time is not None
    assert dict(event_time.partitions) == {"events": {"0": (100, 200)}}
    assert dict(event_time.watermarks) == {"windows": 50}
    assert [(r.name, r.new_name, r.what) for r in report] == [
        ("counts", "per-user", "stage"), ("win", "windows", "stage"), ("uniq", None, "stage"),
        ("clicks", "events", "source"), ("views", None, "source")]


def test_bad_arguments_are_refused_naming_the_culprit(store: SnapshotStore) -> None:
    write_snapshot(store, "v1", {"counts": (COUNTS, {1: 1}, {}), "win": (WINDOW, {1: 2}, {}),
                                 "uniq": (UNIQ, {"a": True}, {})})
    known = r"its stateful stages: 'counts', 'win', 'uniq'; its sources: 'clicks'"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"renames": {"count": "c"}}, rf"a rename names stage 'count', which snapshot 'v1' "
                                      rf"does not hold \({known}\)"),
        ({"drop": ["nope"]}, "a drop names stage 'nope'"),
        ({"transforms": {"nope": lambda k, v: (k, v)}}, "a transform names stage 'nope'"),
        ({"renames": {"counts": "uniq"}}, r"stage 'counts' cannot be renamed to 'uniq': 'uniq' "
                                          "is the name of an existing stage"),
        ({"renames": {"counts": "x", "uniq": "x"}}, r"stage 'uniq' cannot be renamed to 'x': "
                                                    r"'x' is also the new name of 'counts'"),
        ({"transforms": {"win": lambda k, v: (k, v)}}, r"stage 'win' is windowed"),
        ({"transforms": {"clicks": lambda k, v: (k, v)}}, r"'clicks' is a source"),
        ({"transforms": {"counts": 3}}, r"the transform of stage 'counts' is not callable"),
        ({"drop": ["counts"], "renames": {"counts": "c"}}, "'counts' is dropped and also renamed"),
    ]
    for kwargs, message in cases:
        with pytest.raises(SnapshotError, match=message):
            migrate(store, "v1", "v2", **kwargs)
    assert not store.exists("v2")
    # Renaming onto a name that is itself renamed away is fine (a swap).
    swapped, _ = migrate(store, "v1", "v2", renames={"counts": "uniq", "uniq": "counts"})
    assert swapped.read_state("uniq") == {1: 1}
    with pytest.raises(SnapshotError, match=r"snapshot 'v2' exists; overwrite it with "
                       r"overwrite=True \(--force\)"):
        migrate(store, "v1", "v2")
    migrate(store, "v1", "v2", overwrite=True)
    assert store.get("v2").read_state("counts") == {1: 1}
    with pytest.raises(SnapshotError, match="needs another name than the one it is made from"):
        migrate(store, "v1", "v1")


def test_provenance_is_signed_and_ordinary_exports_have_none(
    memory_location: StoreLocation,
) -> None:
    backend = memory_location.fresh().snapshot_backend()
    signed = SnapshotStore(backend, signing_key="team-key")
    write_snapshot(signed, "v1", {"counts": (COUNTS, {1: 1}, {})})
    assert "derived_from" not in json.loads(backend.read_bytes(
        f"{signed.get('v1').folder}/MANIFEST.json"))
    assert signed.get("v1").manifest.derived_from is None
    new, _ = migrate(signed, "v1", "v2", renames={"counts": "c"})
    assert new.manifest.signed
    path = f"{new.folder}/MANIFEST.json"
    document = json.loads(backend.read_bytes(path))
    assert document["derived_from"]["renamed"] == {"counts": "c"}
    # Copies keep the provenance.
    assert signed.copy_to(SnapshotStore(memory_location.fresh().snapshot_backend()), "v2"
                          ).derived_from == new.manifest.derived_from
    # Changing the provenance breaks the signature (and the checksum, if not recomputed).
    document["derived_from"]["snapshot"] = "other"
    backend.write_bytes(path, json.dumps(document).encode())
    with pytest.raises(SnapshotCorruptedError, match="does not match its checksum"):
        signed.get("v2")
    from sparkjet.core.state.snapshots import canonical

    body = {k: v for k, v in document.items() if k not in ("manifest_sha256", "signature")}
    document["manifest_sha256"] = __import__("hashlib").sha256(canonical(body)).hexdigest()
    backend.write_bytes(path, json.dumps(document).encode())
    with pytest.raises(SnapshotSignatureError, match="does not match the configured signing"):
        signed.get("v2")
    # A malformed provenance is refused by name.
    unsigned = SnapshotStore(memory_location.fresh().snapshot_backend())
    write_snapshot(unsigned, "v1", {"counts": (COUNTS, {1: 1}, {})})
    made, _ = migrate(unsigned, "v1", "v2")
    path = f"{made.folder}/MANIFEST.json"
    document = json.loads(unsigned.backend.read_bytes(path))
    del document["manifest_sha256"]
    document["derived_from"]["dropped"] = "counts"
    document["manifest_sha256"] = __import__("hashlib").sha256(canonical(document)).hexdigest()
    unsigned.backend.write_bytes(path, json.dumps(document).encode())
    with pytest.raises(SnapshotCorruptedError, match=r"derived_from\.dropped: expected"):
        unsigned.get("v2")


@pytest.mark.storage
@pytest.mark.parametrize("where", ["s3_location", "gcs_location"])
def test_migrate_on_object_stores(where: str, request: pytest.FixtureRequest) -> None:
    location: StoreLocation = request.getfixturevalue(where).fresh()
    store = SnapshotStore(location.snapshot_backend(separate_client=True), signing_key="k")
    counts = {k: k for k in range(30)}
    write_snapshot(store, "v1", {"counts": (COUNTS, counts, {k: 9 for k in range(30)}),
                                 "uniq": (UNIQ, {"a": True}, {})})
    new, _ = migrate(store, "v1", "v2", renames={"counts": "c"}, drop=["uniq"],
                     transforms={"counts": lambda k, v: None if k == 0 else (-k, v)})
    assert new.manifest.signed and new.manifest.derived_from["transformed"] == ["counts"]
    again = SnapshotStore(location.snapshot_backend(separate_client=True), signing_key="k")
    again.get("v2").verify()
    assert again.get("v2").read_state("c") == {-k: k for k in range(1, 30)}
    assert [s.name for s in again.get("v2").manifest.stages] == ["c"]
    assert again.get("v1").read_state("counts") == counts
    with pytest.raises(SnapshotError, match="stage 'counts', key 3: the transform raised"):
        migrate(store, "v1", "v3", transforms={"counts": lambda k, v: (k, 1 // (k - 3))})
    assert not again.exists("v3")


# --- the command -----------------------------------------------------------------------------


TRANSFORMS = """
    def to_user(key, count):
        return f"u{key}", count

    def odd_only(key, count):
        return (key, count) if key % 2 else None

    NOT_A_FUNCTION = 3
"""


def test_the_command(capsys: pytest.CaptureFixture[str], client: sparkjet.Client) -> None:
    write_config(client)
    Path("my_transforms.py").write_text(textwrap.dedent(TRANSFORMS), encoding="utf-8")
    Path("broken_transforms.py").write_text("raise RuntimeError('half written')\n",
                                            encoding="utf-8")
    write_snapshot(client.snapshots, "v1", {
        "counts": (COUNTS, {k: 10 for k in range(10)}, {}), "uniq": (UNIQ, {"a": True}, {})})
    capsys.readouterr()
    assert main(["migrate-snapshot", "v1", "v2", "--rename", "counts=per-user",
                 "--rename", "clicks=events", "--drop", "uniq",
                 "--transform", "counts=my_transforms:odd_only"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  stage 'counts': 10 keys in, 5 keys out (renamed to 'per-user', transformed)",
        "  stage 'uniq': dropped (1 keys in)",
        "  source 'clicks': offsets renamed to 'events'",
    ]
    assert client.snapshots.get("v2").read_state("per-user") == {k: 10 for k in (1, 3, 5, 7, 9)}

    bad = [
        (["--transform", "counts=my_transforms"], "--transform counts=my_transforms: expected "
                                                  "module:function"),
        (["--transform", "counts"], "--transform 'counts': expected STAGE=module:function"),
        (["--transform", "counts=no_such_module:f"], "no module named 'no_such_module'"),
        (["--transform", "counts=my_transforms:nope"], "module 'my_transforms' has no 'nope'"),
        (["--transform", "counts=my_transforms:NOT_A_FUNCTION"], "is a int, not a function"),
        (["--transform", "counts=broken_transforms:f"], "importing 'broken_transforms' raised "
                                                        "RuntimeError: half written"),
        (["--rename", "counts"], "--rename 'counts': expected OLD=NEW"),
    ]
    for extra, message in bad:
        assert main(["migrate-snapshot", "v1", "v3", *extra]) == 2, extra
        assert message in capsys.readouterr().err
    assert main(["migrate-snapshot", "v1", "v3", "--drop", "nope"]) == 1
    assert "a drop names stage 'nope'" in capsys.readouterr().err
    assert not client.snapshots.exists("v3")

    assert main(["migrate-snapshot", "v1", "v2", "--transform",
                 "counts=my_transforms:to_user"]) == 1
    assert "snapshot 'v2' exists: give --force" in capsys.readouterr().err
    assert main(["migrate-snapshot", "v1", "v2", "--transform",
                 "counts=my_transforms:to_user", "--force"]) == 0
    assert "  stage 'counts': 10 keys in, 10 keys out (transformed)" in capsys.readouterr().out
    assert client.snapshots.get("v2").read_state("counts") == {f"u{k}": 10 for k in range(10)}
