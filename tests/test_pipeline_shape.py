"""What snapshots record about a pipeline stays put: stage names, kinds, fingerprint, signatures.

A snapshot's manifest holds the pipeline fingerprint, each stateful stage's
kind and state signature, and its state is matched to stages by name. A
snapshot written by an earlier sparkjet must still restore, so these values
are pinned here as an earlier release computed them; a change to how the
pipeline graph is modelled must not move them. The fingerprint was pinned
anew when it came to cover the functions' code and the sources' identities
(``sparkjet apply`` compares it). No Spark is needed.
"""

from __future__ import annotations

from typing import Any

from sparkjet.aggregate import counting, summing, to_list
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.pipeline.planner import plan
from sparkjet.core.state.snapshots.format import (
    pipeline_fingerprint,
    state_signature,
    stateful_stages,
)
from sparkjet.job import ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource, WindowDefinition
from sparkjet.plugin import ALL_GUARANTEES, StatefulTransform, hookimpl


class Highs(StatefulTransform):
    """Each key's running maximum."""

    kind = "highs"
    guarantees = ALL_GUARANTEES

    def create_state(self) -> Any:
        return None

    def process(self, state: Any, key: Any, items: list[Any]) -> tuple[Any, list[Any]]:
        state = max([*items, *([] if state is None else [state])])
        return state, [(key, state)]

    def state_signature(self) -> str:
        return "max:int"


class _Highs:
    @hookimpl
    def register_stateful_transforms(self, register):  # type: ignore[no-untyped-def]
        register(Highs)


def _streaming() -> Pipeline:
    """Every kind of stage a streaming job runs, most of them with generated names."""
    p = Pipeline.create()
    clicks = p.read_from(StreamSource("clicks")).with_timestamps(lambda x: x, 10)
    other = p.read_from(StreamSource("other")).set_name("other")
    mixed = (clicks.map(lambda x: x + 1).filter(bool).flat_map(lambda x: [x, x])
             .peek().on_error("dead-letter").merge(other.map(abs)))
    mixed.group_by(lambda x: x % 3).aggregate(counting()).write_to(Pipeline.to_map("a"))
    mixed.group_by(lambda x: x % 4).write_to(Pipeline.to_map("b"))
    (mixed.group_by(lambda x: x % 5).map_stateful(lambda: [0], lambda s, k, x: x, ttl_millis=9)
     .write_to(Pipeline.to_list("c")))
    mixed.group_by(lambda x: x % 6).apply(Highs()).write_to(Pipeline.to_map("d"))
    mixed.distinct(ttl_millis=50).write_to(Pipeline.to_list("e"))
    mixed.distinct(lambda x: x // 2).set_name("halves").write_to(Pipeline.to_list("f"))
    (clicks.window(WindowDefinition.sliding(100, 10)).group_by(lambda x: x % 7)
     .aggregate(summing()).write_to(Pipeline.to_list("g")))
    (clicks.window(WindowDefinition.session(30)).aggregate(to_list()).on_error("dead-letter")
     .write_to(Pipeline.to_list("h")))
    clicks.window(WindowDefinition.tumbling(5)).aggregate(counting()).write_to(
        Pipeline.to_list("i"))
    return p


def _batch() -> Pipeline:
    p = Pipeline.create()
    items = p.read_from(Pipeline.from_list("in", [3, 1, 2]))
    items.sort(reverse=True).write_to(Pipeline.to_list("sorted"))
    items.sort(lambda x: -x).aggregate(counting()).write_to(Pipeline.to_list("count"))
    return p


def _host() -> PluginHost:
    host = PluginHost()
    host.register(_Highs(), "highs")
    return host


def test_stage_names_kinds_and_fingerprint_are_as_snapshots_recorded_them() -> None:
    validated = plan(_streaming(), _host(), ProcessingGuarantee.AT_LEAST_ONCE)
    assert [(validated.name(n), str(n.op)) for n in validated.nodes] == [
        ("from-stream(clicks)", "source"), ("other", "source"), ("map", "map"),
        ("filter", "filter"), ("flat-map", "flat_map"), ("peek", "peek"), ("map-2", "map"),
        ("merge", "merge"), ("group-aggregate", "group_aggregate"), ("to-map(a)", "sink"),
        ("group-by", "group_aggregate"), ("to-map(b)", "sink"),
        ("map-stateful", "map_stateful"), ("to-list(c)", "sink"), ("highs", "group_apply"),
        ("to-map(d)", "sink"), ("distinct", "distinct"), ("to-list(e)", "sink"),
        ("halves", "distinct"), ("to-list(f)", "sink"),
        ("sliding-window", "window_aggregate"), ("to-list(g)", "sink"),
        ("session-window", "window_aggregate"), ("to-list(h)", "sink"),
        ("tumbling-window", "window_aggregate"), ("to-list(i)", "sink"),
    ]
    assert pipeline_fingerprint(validated) == "9a9d7a8c0f5db7f7"
    batch = plan(_batch(), _host(), ProcessingGuarantee.NONE)
    assert [(batch.name(n), str(n.op)) for n in batch.nodes] == [
        ("from-list(in)", "source"), ("sort", "sort"), ("to-list(sorted)", "sink"),
        ("sort-2", "sort"), ("aggregate", "aggregate"), ("to-list(count)", "sink"),
    ]
    assert pipeline_fingerprint(batch) == "89f061c1e72ab8e9"


def test_state_signatures_are_as_snapshots_recorded_them() -> None:
    validated = plan(_streaming(), _host(), ProcessingGuarantee.AT_LEAST_ONCE)
    signatures = {name: state_signature(node)
                  for name, node in stateful_stages(validated).items()}
    # What a restore compares as the state's shape is pinned; the identities a
    # signature carries since the upgrade rules (key, operation, upstream) are
    # not in older snapshots, and an older snapshot restores by its shape.
    identities = ("key", "operation", "upstream")
    assert all("upstream" in s for s in signatures.values())
    signatures = {name: {k: v for k, v in s.items() if k not in identities}
                  for name, s in signatures.items()}
    assert signatures == {
        "group-aggregate": {"op": "aggregate", "accumulator": "int", "combiner": True},
        "group-by": {"op": "aggregate", "accumulator": "list", "combiner": True},
        "map-stateful": {"op": "map_stateful", "state": "list"},
        "highs": {"op": "apply", "transform": "highs", "state": "max:int"},
        "distinct": {"op": "distinct"},
        "halves": {"op": "distinct"},
        "sliding-window": {"op": "window", "window": "frames", "accumulator": "int",
                           "combiner": True,
                           "definition": {"kind": "sliding", "size": 100, "slide": 10}},
        "session-window": {"op": "window", "window": "session", "accumulator": "list",
                           "combiner": True, "definition": {"kind": "session", "timeout": 30}},
        "tumbling-window": {"op": "window", "window": "frames", "accumulator": "int",
                            "combiner": True,
                            "definition": {"kind": "tumbling", "size": 5, "slide": 5}},
    }


def test_stage_error_policies_are_read_from_the_stages() -> None:
    validated = plan(_streaming(), _host(), ProcessingGuarantee.AT_LEAST_ONCE)
    letters = validated.for_job("j", "job", "fail", None).dead_letters
    assert letters is not None and letters.stages == {"peek", "session-window"}
    letters = validated.for_job("j", "job", "dead-letter", None).dead_letters
    assert letters is not None and letters.stages == {
        "map", "filter", "flat-map", "peek", "map-2", "sliding-window", "session-window",
        "tumbling-window"}
