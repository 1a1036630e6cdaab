"""Commit logs over a long life: what folding costs the committer and saves the reader.

A streaming sink commits one small record per micro-batch (``commit_once``
with its producer and batch, as the list sink does). After ``--commits``
such batches, a new reader opens the list (``IList.get_all``, as a process
starting up or a batch job reading it does). Measured on a local folder and,
with ``--s3``, on moto's S3 server on 127.0.0.1, each twice in the same
process: with folding (a base every ``FOLD_EVERY`` = 100 records) and with
folding off (the log as it was before: every record kept). The limit for the
reader is plain Python reading the same items from one pickle file on the
same filesystem.

Printed: the median and 95th-percentile commit latency, the time to open,
and the ratios folded / unfolded and folded / plain Python.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sparkjet.core.store import commit_log as commit_log_module
from sparkjet.core.store.fs import Store
from sparkjet.core.store.structures import IList


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=3_000, help="micro-batch commits")
    parser.add_argument("--items", type=int, default=20, help="items per commit")
    parser.add_argument("--s3", action="store_true", help="also on moto's S3 server")
    return parser.parse_args()


def run(store: Store, args: argparse.Namespace, fold: bool) -> dict[str, float]:
    """Commit ``args.commits`` batches, then open the list afresh; the timings."""
    commit_log_module.FOLD_EVERY = 100 if fold else 10**12
    log = store.list_log("sink")
    latencies = []
    for batch in range(args.commits):
        items = [(batch, i) for i in range(args.items)]
        started = time.perf_counter()
        log.commit_once("append", [("items", items)], token=f"p.b{batch}", writer="w",
                        producer="p", batch=batch)
        latencies.append(time.perf_counter() - started)
    started = time.perf_counter()
    items = IList(store, "sink").get_all()
    opened = time.perf_counter() - started
    if len(items) != args.commits * args.items or items[-1] != (args.commits - 1, args.items - 1):
        raise SystemExit(f"wrong contents: {len(items)} items")
    latencies.sort()
    return {"commit_p50": statistics.median(latencies),
            "commit_p95": latencies[int(len(latencies) * 0.95)], "open": opened,
            "records": len(log.sequences()), "bases": len(log.bases())}


def plain(store: Store, args: argparse.Namespace) -> float:
    """The limit: the same items read from one pickle file through the same filesystem."""
    path = store.path("plain.pkl")
    store.write_bytes(path, pickle.dumps(
        [(b, i) for b in range(args.commits) for i in range(args.items)]))
    started = time.perf_counter()
    items = pickle.loads(store.read_bytes(path))
    elapsed = time.perf_counter() - started
    assert len(items) == args.commits * args.items
    return elapsed


def measure(label: str, new_store: Callable[[], Store], args: argparse.Namespace) -> None:
    folded = run(new_store(), args, fold=True)
    unfolded = run(new_store(), args, fold=False)
    limit = plain(new_store(), args)
    print(f"\n{label}: {args.commits:,} commits of {args.items} items")
    print(f"{'':28}{'commit p50':>12}{'commit p95':>12}{'open':>10}{'records':>9}{'bases':>7}")
    for name, result in (("sparkjet, folded", folded), ("sparkjet, never folded", unfolded)):
        p50, p95 = result["commit_p50"] * 1000, result["commit_p95"] * 1000
        print(f"{name:28}{p50:>10.2f}ms{p95:>10.2f}ms"
              f"{result['open'] * 1000:>8.0f}ms{result['records']:>9,}{result['bases']:>7}")
    print(f"{'plain Python, one pickle':28}{'':24}{limit * 1000:>8.0f}ms")
    print(f"  folded vs never folded: commit p50 "
          f"{folded['commit_p50'] / unfolded['commit_p50']:.2f}x, "
          f"p95 {folded['commit_p95'] / unfolded['commit_p95']:.2f}x, "
          f"open {folded['open'] / unfolded['open']:.2f}x")
    print(f"  folded open vs plain Python: {folded['open'] / limit:.2f}x")


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        counter = iter(range(10**6))
        measure("local folder", lambda: Store(f"{workdir}/store-{next(counter)}"), args)
        if args.s3:
            from sparkjet.testing import moto_s3_server

            with moto_s3_server(Path(workdir)) as location:
                measure("S3 (moto on 127.0.0.1)", lambda: location.fresh().store(), args)


if __name__ == "__main__":
    main()
