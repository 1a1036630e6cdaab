"""The upgrade rules' parts that need no Spark: code identities, offsets, partitions, warnings."""

from __future__ import annotations

import logging
import operator
import subprocess
import sys
from typing import Any

import pytest

from sparkjet.aggregate import counting, summing
from sparkjet.core.microbatch.loop import offsets_behind
from sparkjet.core.state.restore import SourceOffsets, seed_checkpoint
from sparkjet.core.state.snapshots.format import code_identity, operation_identity
from sparkjet.core.state.snapshots.upgrade import UpgradeOptions
from sparkjet.errors import StateIncompatibleError
from sparkjet.job import ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource


def make_key(field: str) -> Any:
    return lambda e: e[field]


def test_a_code_identity_follows_what_a_function_computes() -> None:
    def v1() -> Any:
        return lambda e: e["u"]

    def v2() -> Any:
        return lambda e: e["u"]

    # The same code in two versions of a file (other enclosing functions): the same.
    assert code_identity(v1()) == code_identity(v2())
    assert code_identity(v1()).startswith("<lambda>#")
    assert code_identity(lambda e: e["u"]) != code_identity(lambda e: e["page"])
    assert code_identity(lambda e: e["u"]) != code_identity(lambda e: e["u"].lower())
    # What the closure holds is part of it.
    assert code_identity(make_key("u")) == code_identity(make_key("u"))
    assert code_identity(make_key("u")) != code_identity(make_key("page"))
    # Built-ins without code are known by their repr.
    assert code_identity(operator.itemgetter("u")) == "operator.itemgetter('u')"
    assert operation_identity(counting()) == "count"
    assert operation_identity(summing(lambda e: e["n"])) != operation_identity(
        summing(lambda e: e["m"]))


IDENTITY_SCRIPT = """
from sparkjet.core.state.snapshots.format import code_identity
print(code_identity(lambda e: e["kind"] in {"click", "view", "buy", "scroll", "share"}))
"""


def test_a_code_identity_is_the_same_in_every_process() -> None:
    """A set constant's repr follows the hash seed; its identity must not."""
    seen = {
        subprocess.run([sys.executable, "-c", IDENTITY_SCRIPT], check=True, text=True,
                       capture_output=True, env={"PYTHONHASHSEED": str(seed), "PATH": ""},
                       ).stdout
        for seed in (1, 2, 3, 4)
    }
    assert len(seen) == 1, seen


@pytest.mark.parametrize(("start", "latest", "behind"), [
    ([5, 7], [5, 9], None),
    ([5, 7], [5, 6], "1"),
    ({"0": 3, "1": 4}, {"0": 3, "1": 4, "2": 0}, None),  # a new partition
    ({"0": 3, "1": 4}, {"0": 2, "1": 9}, "0"),
    (10, 9, ""),
    ({"file": "a", "pos": 10}, {"file": "b", "pos": 2}, None),  # the source's own shape
    (None, [1, 2], None),
])
def test_offsets_behind_compares_partition_by_partition(
    start: Any, latest: Any, behind: str | None
) -> None:
    assert offsets_behind(start, latest) == behind


def _seed(tmp_path: Any, restored: Any, now: Any, options: UpgradeOptions | None = None) -> Any:
    """Seed a job reading stream ``s`` from a snapshot whose offsets for it are ``restored``."""
    from sparkjet.core.host.manager import PluginHost
    from sparkjet.core.pipeline.planner import plan
    from sparkjet.core.state.checkpoint import Checkpoint
    from sparkjet.core.state.snapshots import ManifestFields, SnapshotStore
    from sparkjet.core.store.fs import Store
    from sparkjet.testing import StoreLocation

    snapshots = SnapshotStore(StoreLocation(str(tmp_path / "snapshots")).snapshot_backend())
    identity = {"plugin": "stream", "reads": "s", "partitions": len(restored)}
    snapshots.write("old", ManifestFields(
        job_id="j", job_name="old", sparkjet_version="x", spark_version="y",
        pipeline_fingerprint="f", batch_id=3, sources={"src": restored},
        source_identities={"src": identity}), [])
    store = Store(str(tmp_path / "store"))
    checkpoint = Checkpoint(store, store.path("jobs", "new", "checkpoint"))
    p = Pipeline.create()
    p.read_from(StreamSource("s")).set_name("src").write_to(Pipeline.to_list("out"))
    planned = plan(p, PluginHost(), ProcessingGuarantee.EXACTLY_ONCE)
    offsets = SourceOffsets(lambda s: [0] * len(now), lambda s: list(now),
                            lambda s, at: [str(i) for i in range(len(at))])
    seed_checkpoint(checkpoint, planned, snapshots.get("old"), offsets, 8, options)
    return checkpoint.commit_record(0).ends["src"]


def test_new_partitions_start_where_the_source_starts(tmp_path: Any) -> None:
    assert _seed(tmp_path, [5, 7], [9, 9, 4]) == [5, 7, 0]


def test_partitions_gone_are_refused_unless_told_where_to_start(tmp_path: Any) -> None:
    with pytest.raises(StateIncompatibleError) as refused:
        _seed(tmp_path / "a", [5, 7, 1], [9, 9])
    # What differs, from which offsets: the snapshot's (3 partitions) and the
    # source's initial offsets now (2 of them), both by watermark_partitions.
    assert ("source 'src': partition(s) 2 are gone, so their offsets cannot be carried. "
            "The snapshot's offsets [5, 7, 1] name 3 partition(s) (0, 1, 2); the source's "
            "initial offsets now, [0, 0], name 2 (0, 1), both by its "
            "watermark_partitions(offsets)") in str(refused.value)
    assert "initial_offsets must name every partition it has" in str(refused.value)
    assert _seed(tmp_path / "b", [5, 7, 1], [9, 9],
                 UpgradeOptions(source_starts={"src": "latest"})) == [9, 9]


def test_a_streaming_job_with_unnamed_stateful_stages_is_warned_at_submit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from sparkjet.core.host.manager import PluginHost
    from sparkjet.core.jobs.service import _warn_unnamed_state
    from sparkjet.core.pipeline.planner import plan
    from sparkjet.job import JobConfig

    p = Pipeline.create()
    src = p.read_from(StreamSource("s"))
    src.group_by(lambda e: e).aggregate(counting()).write_to(Pipeline.to_map("a"))
    src.distinct().set_name("named").write_to(Pipeline.to_list("b"))
    planned = plan(p, PluginHost(), ProcessingGuarantee.NONE)
    with caplog.at_level(logging.WARNING, logger="sparkjet.jobs"):
        _warn_unnamed_state(planned, JobConfig(name="counts"))
    assert "job counts: stateful stage(s) 'group-aggregate' have generated names" in caplog.text
    assert "'named'" not in caplog.text


def _manifest_of(pipeline: Pipeline, tmp_path: Any) -> Any:
    """A snapshot's manifest as an export of ``pipeline`` writes it (its stages hold no keys)."""
    from sparkjet.core.host.manager import PluginHost
    from sparkjet.core.pipeline.planner import plan
    from sparkjet.core.state.snapshots import ManifestFields, SnapshotStore, StageFields
    from sparkjet.core.state.snapshots.format import (
        source_identity,
        state_signature,
        stateful_stages,
    )
    from sparkjet.testing import StoreLocation

    planned = plan(pipeline, PluginHost(), ProcessingGuarantee.NONE)
    snapshots = SnapshotStore(StoreLocation(str(tmp_path / "snapshots")).snapshot_backend())
    stages = [StageFields(name, node.op.value, state_signature(node), 0, 8)
              for name, node in stateful_stages(planned).items()]
    sources = {planned.name(n): [0] for n in planned.sources()}
    identities = {planned.name(n): source_identity(spec.source, [0])
                  for n, spec in planned.sources().items()}
    return snapshots.write("v1", ManifestFields(
        job_id="j", job_name="v1", sparkjet_version="x", spark_version="y",
        pipeline_fingerprint="f", batch_id=0, sources=sources, stages=stages,
        source_identities=identities), [])


def _two_counts(filtered_first: bool) -> Pipeline:
    """Two unnamed per-user counts: one of every item, one behind a filter."""
    p = Pipeline.create()
    src = p.read_from(StreamSource("s")).set_name("src")
    branches = [src, src.filter(lambda e: e["page"] == 1).set_name("page-1")]
    for i, branch in enumerate(branches[::-1] if filtered_first else branches):
        branch.group_by(lambda e: e["u"]).aggregate(counting()).write_to(
            Pipeline.to_map(f"m{i}"))
    return p


def test_generated_names_carry_no_state_into_a_stage_over_other_inputs(tmp_path: Any) -> None:
    """Same key, same operation, other inputs: swapping them swaps their generated names."""
    from sparkjet.core.host.manager import PluginHost
    from sparkjet.core.pipeline.planner import plan
    from sparkjet.core.state.snapshots.upgrade import check_upgrade

    manifest = _manifest_of(_two_counts(filtered_first=False), tmp_path)
    unchanged = plan(_two_counts(filtered_first=False), PluginHost(), ProcessingGuarantee.NONE)
    assert [r.refusal for r in check_upgrade(unchanged, manifest)] == ["", "", ""]
    swapped = plan(_two_counts(filtered_first=True), PluginHost(), ProcessingGuarantee.NONE)
    refused = {r.stage for r in check_upgrade(swapped, manifest) if r.refusal}
    assert refused == {"group-aggregate", "group-aggregate-2"}
