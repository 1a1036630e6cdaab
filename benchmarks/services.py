"""Calls to an outside service: map_using_service_async by max_concurrent_ops, and the sync kind.

The service answers each call after --latency-ms (5 ms): by default an
asyncio.sleep (async) or time.sleep (sync) in the calling process; with
--http a real HTTP server on 127.0.0.1 (the standard library's threading
server, sleeping that long per request) called through aiohttp (async,
one ClientSession per process made by the stage's ServiceFactory and
closed by its destroy_fn) and http.client (sync, one keep-alive connection).

Async (N items, best of --repeat):
- sparkjet map_using_service_async, max_concurrent_ops 1, 4 and 16:
  from_list(items) -> map_using_service_async -> list sink, on the
  in-process engine ([engine] driver_only: one task at a time, so the
  figures are per task) and, with --spark, on local[2] Spark (two tasks
  at once, each with its own window);
- plain asyncio, 16 at a time: asyncio.gather under a semaphore, the same
  calls (the ceiling).

Sync (--sync-n items): map_using_service calling the service one item at a
time, against a plain Python loop making the same calls with one service.

Every contender's output is checked against the expected items.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import sparkjet
from sparkjet.pipeline import Pipeline, ServiceFactory

GOAL_RATIO = 10.0  # max_concurrent_ops 16 vs 1, at least


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="items of the async runs")
    parser.add_argument("--sync-n", type=int, default=400, help="items of the sync runs")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="the service's latency")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per contender")
    parser.add_argument("--http", action="store_true",
                        help="a real HTTP server on 127.0.0.1 instead of sleeps")
    parser.add_argument("--spark", action="store_true",
                        help="also run the sparkjet contenders on local[2] Spark")
    return parser.parse_args()


# --- the service ------------------------------------------------------------------------------


def serve(latency_s: float) -> tuple[ThreadingHTTPServer, str]:
    """A local HTTP service answering ``GET /<n>`` with ``n + 1`` after ``latency_s``."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else a keep-alive answer waits out delayed ACKs

        def do_GET(self) -> None:  # http.server's name for GET
            time.sleep(latency_s)
            body = str(int(self.path.strip("/")) + 1).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class Sleeper:
    """The in-process service: answers ``n + 1`` after the latency."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    async def call(self, n: int) -> int:
        await asyncio.sleep(self.latency_s)
        return n + 1

    def call_sync(self, n: int) -> int:
        time.sleep(self.latency_s)
        return n + 1


def factories(args: argparse.Namespace, url: str | None) -> dict[str, Any]:
    """The async and sync service factories and call functions for the chosen service."""
    latency_s = args.latency_ms / 1000
    if url is None:
        return {
            "async": ServiceFactory.of(lambda: Sleeper(latency_s)),
            "async_fn": lambda service, n: service.call(n),
            "sync": ServiceFactory.of(lambda: Sleeper(latency_s)),
            "sync_fn": lambda service, n: service.call_sync(n),
        }

    def session() -> Any:
        import aiohttp  # made on the service loop, so the session binds to it

        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))

    async def get(client: Any, n: int) -> int:
        async with client.get(f"{url}/{n}") as response:
            return int(await response.text())

    host, port = url.removeprefix("http://").split(":")

    def connection() -> http.client.HTTPConnection:
        return http.client.HTTPConnection(host, int(port))

    def get_sync(conn: http.client.HTTPConnection, n: int) -> int:
        conn.request("GET", f"/{n}")
        return int(conn.getresponse().read())

    return {
        "async": ServiceFactory.of(session).with_destroy(lambda client: client.close()),
        "async_fn": get,
        "sync": ServiceFactory.of(connection).with_destroy(lambda conn: conn.close()),
        "sync_fn": get_sync,
    }


# --- contenders -------------------------------------------------------------------------------


def sparkjet_job(client: sparkjet.Client, items: list[int],
                 build: Callable[[Any], Any]) -> list[int]:
    out = client.get_list("out")
    out.clear()
    p = Pipeline.create()
    build(p.read_from(Pipeline.from_list("items", items))).write_to(Pipeline.to_list("out"))
    client.get_jet().submit(p).join()
    return out.get_all()


def best_of(label: str, fn: Callable[[], list[int]], expected: list[int], repeat: int,
            n: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - started)
        assert got == expected, f"{label}: wrong output ({len(got)} items)"
    best = min(times)
    print(f"  {label:<50} {best:7.3f} s  {n / best:>9,.0f} items/s", flush=True)
    return best


def main() -> None:
    args = parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    server, url = serve(args.latency_ms / 1000) if args.http else (None, None)
    made = factories(args, url)
    clients = {"driver": sparkjet.connect(store={"url": tempfile.mkdtemp(prefix="sj-svc-")},
                                          engine={"driver_only": True})}
    if args.spark:
        clients["local[2]"] = sparkjet.connect(
            store={"url": tempfile.mkdtemp(prefix="sj-svc-")},
            spark={"master": "local[2]", "conf": {"spark.ui.enabled": "false"}},
            engine={"adaptive": False})
        clients["local[2]"].spark.sparkContext.setLogLevel("ERROR")
    service = f"HTTP on {url}" if url else "asyncio.sleep / time.sleep"
    print(f"service: {service}, {args.latency_ms:g} ms a call; async n={args.n:,}, "
          f"sync n={args.sync_n:,}\n")

    items = list(range(args.n))
    expected = [n + 1 for n in items]
    async_fn, async_factory = made["async_fn"], made["async"]
    rows: list[tuple[str, str, float, int]] = []
    print("async:")
    for where, client in clients.items():
        for limit in (1, 4, 16):
            def run(client: sparkjet.Client = client, limit: int = limit) -> list[int]:
                return sparkjet_job(client, items, lambda s: s.map_using_service_async(
                    async_factory, async_fn, max_concurrent_ops=limit))
            label = f"sparkjet async, max_concurrent_ops {limit:>2} ({where})"
            rows.append((label, f"{where}:{limit}", best_of(label, run, expected, args.repeat,
                                                          args.n), args.n))

    def plain_asyncio() -> list[int]:
        async def go() -> list[int]:
            service = async_factory.create_fn()
            gate = asyncio.Semaphore(16)

            async def one(n: int) -> int:
                async with gate:
                    return int(await async_fn(service, n))
            try:
                return list(await asyncio.gather(*(one(n) for n in items)))
            finally:
                if async_factory.destroy_fn is not None:
                    await async_factory.destroy_fn(service)
        return asyncio.run(go())

    label = "plain asyncio, 16 at a time"
    rows.append((label, "asyncio", best_of(label, plain_asyncio, expected, args.repeat, args.n),
                 args.n))

    sync_items = list(range(args.sync_n))
    sync_expected = [n + 1 for n in sync_items]
    sync_fn, sync_factory = made["sync_fn"], made["sync"]
    print("sync:")
    for where, client in clients.items():
        def run_sync(client: sparkjet.Client = client) -> list[int]:
            return sparkjet_job(client, sync_items,
                                lambda s: s.map_using_service(sync_factory, sync_fn))
        label = f"sparkjet map_using_service ({where})"
        rows.append((label, f"sync:{where}", best_of(label, run_sync, sync_expected, args.repeat,
                                                    args.sync_n), args.sync_n))

    def plain_loop() -> list[int]:
        service = sync_factory.create_fn()
        try:
            return [sync_fn(service, n) for n in sync_items]
        finally:
            if sync_factory.destroy_fn is not None:
                sync_factory.destroy_fn(service)

    label = "plain python loop, the same calls"
    rows.append((label, "loop", best_of(label, plain_loop, sync_expected, args.repeat,
                                        args.sync_n), args.sync_n))

    seconds = {key: s for _, key, s, _ in rows}
    print(f"\n{'contender':<52}{'items/s':>11}{'vs':>22}")
    for label, key, s, n in rows:  # a ratio of throughputs (the same items each side)
        if key.startswith("sync:") or key == "loop":
            versus = f"{seconds['loop'] / s:.2f}x vs the loop"
        else:
            where = "driver" if key == "asyncio" else key.split(":")[0]
            versus = f"{seconds[f'{where}:1'] / s:.2f}x vs ops=1"
        print(f"{label:<52}{n / s:>11,.0f}{versus:>22}")
    print("\nchecked: every contender's output equals the expected items, in order")
    verdicts = []
    for where in clients:
        ratio = seconds[f"{where}:1"] / seconds[f"{where}:16"]
        verdicts.append(f"ops 16 vs 1 ({where}) {ratio:.2f}x "
                        f"({'met' if ratio >= GOAL_RATIO else 'MISSED'}: >= {GOAL_RATIO:g}x)")
    print("goals: " + "; ".join(verdicts))
    if server is not None:
        server.shutdown()


if __name__ == "__main__":
    main()
