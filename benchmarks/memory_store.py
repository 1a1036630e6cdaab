"""The memory store's thread-safe filesystem against fsspec's own memory filesystem.

A ``memory://`` store runs on ``sparkjet.core.store.memoryfs.ThreadSafeMemoryFileSystem``
(atomic listings, create-only writes and tree deletes). The baseline is
fsspec's ``MemoryFileSystem`` doing the same calls in the same process on the
same shared dict: listing one folder of ``--files / --folders`` files among
``--files`` keys, listing the folders, and ``--creates`` create-only writes.

Printed: milliseconds (microseconds for a create) per call for each, and the
ratio fsspec / thread-safe (above 1.00x means the thread-safe one is faster).
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from typing import Any

from fsspec.implementations.memory import MemoryFileSystem

from sparkjet.core.store.memoryfs import ThreadSafeMemoryFileSystem


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000, help="files in the store")
    parser.add_argument("--folders", type=int, default=100, help="folders they are in")
    parser.add_argument("--listings", type=int, default=200, help="timed listings per kind")
    parser.add_argument("--creates", type=int, default=1_000, help="timed create-only writes")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the best counts")
    return parser.parse_args()


def per_call(fn: Callable[[int], Any], calls: int) -> float:
    """Seconds per call of ``fn(i)``, over ``calls`` calls."""
    started = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - started) / calls


def measure(fs: Any, root: str, folder: str, label: str, round_: int,
            args: argparse.Namespace) -> dict[str, float]:
    """One round of each call on ``fs``: per-call times in ms (us for a create)."""
    created = f"{root}/c-{label}-{round_}"
    times = {
        "one folder (ms)": 1e3 * per_call(lambda _: fs.ls(folder, detail=False), args.listings),
        "all folders (ms)": 1e3 * per_call(lambda _: fs.ls(root, detail=False), args.listings),
        "create-only (us)": 1e6 * per_call(
            lambda i: fs.pipe_file(f"{created}/{i}", b"y", mode="create"), args.creates),
    }
    assert len(fs.ls(created, detail=False)) == args.creates, f"{label} lost a create"
    fs.rm(created, recursive=True)
    return times


def main() -> None:
    args = parse_args()
    root = f"/sparkjet-bench-{uuid.uuid4().hex[:8]}"
    contenders = {"fsspec": MemoryFileSystem(), "thread-safe": ThreadSafeMemoryFileSystem()}
    for i in range(args.files):
        contenders["fsspec"].pipe_file(f"{root}/d{i % args.folders}/f{i}", b"x")
    folder = f"{root}/d7"
    want = sorted(contenders["fsspec"].ls(folder, detail=False))
    best: dict[str, dict[str, float]] = {name: {} for name in contenders}
    try:
        for round_ in range(args.rounds):  # alternating, the best round of each counts
            for name, fs in contenders.items():
                assert sorted(fs.ls(folder, detail=False)) == want, f"{name} listed other files"
                for call, took in measure(fs, root, folder, name, round_, args).items():
                    best[name][call] = min(took, best[name].get(call, took))
    finally:
        contenders["thread-safe"].rm(root, recursive=True)
    print(f"{args.files:,} files in {args.folders} folders; per round {args.listings} listings "
          f"and {args.creates:,} creates each; best of {args.rounds} rounds")
    print(f"{'call':<18} {'fsspec':>10} {'thread-safe':>12} {'vs ':>8}")
    for call in best["fsspec"]:
        plain, ours = best["fsspec"][call], best["thread-safe"][call]
        print(f"{call:<18} {plain:>10.2f} {ours:>12.2f} {plain / ours:>7.2f}x")


if __name__ == "__main__":
    main()
