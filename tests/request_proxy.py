"""A counting HTTP proxy on 127.0.0.1 in front of moto's S3 or fake-gcs-server.

The store's own request counters (:mod:`sparkjet.core.store.requests`) are
checked against what the server was really asked: every request that passes
here is counted by kind (list, get, head, put, delete) from its method and
URL, as S3 and the GCS JSON API spell them, then forwarded unchanged.
"""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from sparkjet.testing import StoreLocation

#: Headers not passed on (hop-by-hop, or set again by the forwarding client).
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host"}


def kind_of(method: str, url: str) -> str:
    """What a request to S3 or to the GCS JSON API is, by the store's kinds."""
    parts = urlsplit(url)
    query = parse_qs(parts.query, keep_blank_values=True)
    path = parts.path
    if method == "HEAD":
        return "head"
    if method == "DELETE" or (method == "POST" and "delete" in query):
        return "delete"
    if method in ("PUT", "POST"):
        return "put"
    if path.startswith("/storage/v1/b/"):  # GCS JSON API
        if path.rstrip("/").endswith("/o"):
            return "list"
        if query.get("alt") == ["media"]:
            return "get"
        return "head"  # an object's metadata: what an S3 HEAD is
    if path.startswith("/download/"):
        return "get"
    if "list-type" in query or "prefix" in query or "delimiter" in query:
        return "list"
    if path.strip("/").count("/") == 0:
        return "list"  # a bucket-level GET (S3 ListObjects v1)
    return "get"


class CountingProxy:
    """Counts and forwards; :attr:`counts` by kind, :attr:`log` every (kind, method, path)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.counts: Counter[str] = Counter()
        self.log: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def total(self) -> int:
        """Every request forwarded so far."""
        with self._lock:
            return sum(self.counts.values())

    def snapshot(self) -> Counter[str]:
        """The counts by kind now (a copy)."""
        with self._lock:
            return Counter(self.counts)

    def _count(self, method: str, url: str) -> None:
        kind = kind_of(method, url)
        with self._lock:
            self.counts[kind] += 1
            self.log.append((kind, method, url))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self
        local = threading.local()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                proxy._count(self.command, self.path)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                headers["Host"] = proxy.upstream.netloc
                conn = getattr(local, "conn", None)
                for attempt in range(2):
                    if conn is None:
                        conn = http.client.HTTPConnection(proxy.upstream.netloc, timeout=60)
                        local.conn = conn
                    try:
                        conn.request(self.command, self.path, body=body, headers=headers)
                        response = conn.getresponse()
                        data = response.read()
                        break
                    except (ConnectionError, http.client.HTTPException):
                        conn.close()
                        conn = local.conn = None
                        if attempt:
                            raise
                self.send_response(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in _HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _forward

        return Handler

    def start(self) -> CountingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def counting(location: StoreLocation) -> Iterator[tuple[StoreLocation, CountingProxy]]:
    """``location`` reached through a counting proxy: the location to use, and the proxy."""
    proxy = CountingProxy(location.options["endpoint_url"]).start()
    try:
        yield StoreLocation(location.url, {**location.options,
                                           "endpoint_url": proxy.endpoint}), proxy
    finally:
        proxy.stop()
