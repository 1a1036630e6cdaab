"""One micro-batch of a streaming job, as Spark work.

A micro-batch is a batch run (fused passes, map-side partial aggregation,
sinks committing at the end) with three differences:

- sources read the offset range the driver planned for this batch;
- keyed stages keep state across batches: partials are shuffled to a fixed
  number of *shards* by a stable hash of the key, and each shard's reducer
  loads its state as of the last committed batch from the checkpoint, folds the
  batch in (one state update per key per batch), writes the new version and
  emits the updated results;
- sinks commit with the batch id, so a replayed batch lands once.

State versions are files ``<state root>/<stage>/<shard>/<batch>-<keys>.state``;
a reducer reads the newest version not after the last committed batch, so a
batch replayed after a crash starts from exactly the state it started from
the first time.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import cloudpickle

from sparkjet.core.contracts import JobContext
from sparkjet.core.graph import Transform
from sparkjet.core.naming import encode_name
from sparkjet.core.planner import Plan
from sparkjet.core.runtime.batch import BatchRun, Flow, _fail
from sparkjet.core.store import Store

_WIDTH = 20


def stable_hash(key: Any) -> int:
    """A hash that is the same in every process, whatever PYTHONHASHSEED says.

    Equal keys hash equally (``1``, ``1.0`` and ``True`` too): numbers use
    Python's numeric hash, which does not depend on the seed; strings and bytes
    use CRC-32; tuples and frozensets combine their elements. Other keys fall
    back to ``hash()``, which must then be stable across processes.
    """
    if key is None:
        return 0
    if isinstance(key, int | float | complex):
        return hash(key)
    if isinstance(key, str):
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if isinstance(key, bytes):
        return zlib.crc32(key) ^ 0x5BD1E995
    if isinstance(key, tuple):
        h = 0x345678
        for item in key:
            h = (h * 1000003) ^ stable_hash(item)
            h &= 0xFFFFFFFFFFFF
        return h
    if isinstance(key, frozenset):
        h = 0
        for item in key:
            h ^= stable_hash(item)
        return h
    return hash(key)


class StatePaths:
    """Where a job's keyed state lives; picklable."""

    def __init__(self, store: Store, root: str) -> None:
        self.store = store
        self.root = root

    def shard_dir(self, stage: str, shard: int) -> str:
        return f"{self.root}/{encode_name('stage', stage)}/{shard:04d}"

    def versions(self, stage: str, shard: int) -> list[tuple[int, int, str]]:
        """``(batch, keys, file name)`` of every version of a shard, oldest first."""
        out = []
        for entry in self.store.listdir(self.shard_dir(stage, shard)):
            if entry.endswith(".state"):
                batch, keys = entry[: -len(".state")].split("-")
                out.append((int(batch), int(keys), entry))
        return sorted(out)


class StateTask:
    """Reduce side of a keyed stage in a stream: one state shard per Spark partition."""

    def __init__(
        self,
        op: str,
        stage: str,
        params: dict[str, Any],
        paths: StatePaths,
        batch: int,
        committed: int,
        now_ms: int,
        counts: Any,
    ) -> None:
        self.op, self.stage, self.params, self.paths = op, stage, params, paths
        self.batch, self.committed, self.now_ms, self.counts = batch, committed, now_ms, counts

    def __call__(self, shard: int, records: Iterator[tuple[Any, Any]]) -> Iterator[Any]:
        try:
            outputs, keys, size = self._run(shard, records)
        except Exception as exc:
            raise _fail(self.stage, None, exc) from None
        if self.counts is not None:
            self.counts.add({self.stage: len(outputs), f"{self.stage}\x00keys": keys,
                             f"{self.stage}\x00bytes": size})
        yield from outputs

    def _load(self, shard: int) -> tuple[dict[Any, Any], dict[Any, int], list[str], int]:
        usable = [v for v in self.paths.versions(self.stage, shard) if v[0] <= self.committed]
        older = [name for _, _, name in usable[:-1]]
        if not usable:
            return {}, {}, older, 0
        path = f"{self.paths.shard_dir(self.stage, shard)}/{usable[-1][2]}"
        raw = self.paths.store.read_bytes(path)
        data = cloudpickle.loads(raw)
        return data["values"], data["touched"], older, len(raw)

    def _run(self, shard: int, records: Iterator[tuple[Any, Any]]) -> tuple[list[Any], int, int]:
        groups: dict[Any, list[Any]] = {}
        for key, payload in records:
            groups.setdefault(key, []).append(payload)
        ttl = self.params.get("ttl_ms")
        if not groups and not ttl:  # nothing to fold in, nothing to expire
            versions = [v for v in self.paths.versions(self.stage, shard) if v[0] <= self.committed]
            if not versions:
                return [], 0, 0
            path = f"{self.paths.shard_dir(self.stage, shard)}/{versions[-1][2]}"
            return [], versions[-1][1], int(self.paths.store.fs.size(path))
        values, touched, older, _ = self._load(shard)
        if ttl:  # forget expired keys first, so this batch sees them as new
            horizon = self.now_ms - int(ttl)
            for key in [k for k, t in touched.items() if t < horizon]:
                values.pop(key, None)
                del touched[key]
        outputs: list[Any] = []
        for group_key, parts in groups.items():
            parts.sort(key=_position)
            self._fold(group_key, parts, values, touched, outputs)
        data = cloudpickle.dumps({"values": values, "touched": touched})
        folder = self.paths.shard_dir(self.stage, shard)
        for version, _, name in self.paths.versions(self.stage, shard):
            if version >= self.batch:  # left by a failed attempt of this batch
                self.paths.store.remove(f"{folder}/{name}")
        self.paths.store.write_bytes(f"{folder}/{self.batch:0{_WIDTH}d}-{len(values)}.state", data)
        for name in older:  # keep the version this batch started from, for a replay
            self.paths.store.remove(f"{folder}/{name}")
        return outputs, len(values), len(data)

    def _fold(
        self,
        group_key: Any,
        parts: list[Any],
        values: dict[Any, Any],
        touched: dict[Any, int],
        out: list[Any],
    ) -> None:
        op: Any = self.params.get("operation")
        if self.op == "group_aggregate" and op.combine is not None:
            key = parts[0][2]
            partial = parts[0][3]
            for part in parts[1:]:
                partial = op.combine(partial, part[3])
            old = values.get(key)
            if old is None:
                values[key] = (key, partial)
            else:
                key = old[0]
                values[key] = (key, op.combine(old[1], partial))
            out.append((key, op.finish(values[key][1])))
        elif self.op == "group_aggregate":
            key = parts[0][3]
            old = values.get(key)
            key, acc = old if old is not None else (key, op.create())
            for part in parts:
                acc = op.accumulate(acc, part[2])
            values[key] = (key, acc)
            out.append((key, op.finish(acc)))
        elif self.op == "group_apply":
            transform = self.params["transform"]
            key = parts[0][3]
            old = values.get(key)
            key, state = old if old is not None else (key, transform.create_state())
            state, outputs = transform.process(state, key, [part[2] for part in parts])
            values[key] = (key, state)
            out.extend(outputs)
        elif self.op == "map_stateful":
            key = parts[0][3]
            old = values.get(key)
            key, state = old if old is not None else (key, self.params["create_fn"]())
            map_fn = self.params["map_fn"]
            for part in parts:
                output = map_fn(state, key, part[2])
                if output is not None:
                    out.append(output)
            values[key] = (key, state)
        elif self.op == "distinct":
            key = group_key  # the item (or its key), frozen if unhashable
            if key not in values:
                values[key] = True
                out.append(parts[0][2])  # the first occurrence in this batch
        else:  # pragma: no cover - the planner allows only these in streams
            raise AssertionError(self.op)
        if self.params.get("ttl_ms"):
            touched[key] = self.now_ms


def _position(payload: tuple[Any, ...]) -> tuple[Any, Any]:
    return (payload[0], payload[1])


class StablePartition:
    """partitionFunc for the state shuffle."""

    def __call__(self, key: Any) -> int:
        return stable_hash(key)


class MicroBatch(BatchRun):
    """Runs one micro-batch of a streaming plan; see the module docstring."""

    def __init__(
        self,
        plan: Plan,
        sc: Any,
        job_context: Callable[[Transform], JobContext],
        metrics: bool,
        *,
        batch: int,
        committed: int,
        source_ranges: dict[str, tuple[Any, Any]],
        state: StatePaths,
        shards: int,
        cancelled: Callable[[], bool] = lambda: False,
        now_ms: int | None = None,
    ) -> None:
        checkpoint_id = state.root.rstrip("/").rsplit("/", 2)[-2]  # .../<checkpoint>/state

        def with_batch(node: Transform) -> JobContext:
            return dataclasses.replace(
                job_context(node), batch_id=batch, checkpoint_id=checkpoint_id
            )

        super().__init__(plan, sc, with_batch, metrics, cancelled)
        self.batch = batch
        self.committed = committed
        self.source_ranges = source_ranges
        self.state = state
        self.shards = shards
        # The batch's planned time, so a replay expires exactly what the first run did.
        self.now_ms = now_ms if now_ms is not None else int(time.time() * 1000)

    def _descriptors(self, node: Transform, source: Any, ctx: JobContext) -> Iterable[Any]:
        start, end = self.source_ranges[self.plan.name(node)]
        return source.plan_range(start, end, ctx)  # type: ignore[no-any-return]

    def _keyed(self, node: Transform, name: str, flow: Flow) -> Flow:
        mapped = self._map_side(node, name, flow)
        params = {**node.params, "key_fn": node.fn}
        task = StateTask(
            node.op, name, params, self.state, self.batch, self.committed, self.now_ms,
            self.counts,
        )
        shuffled = mapped.partitionBy(self.shards, StablePartition())
        return Flow(shuffled.mapPartitionsWithIndex(task, True))
