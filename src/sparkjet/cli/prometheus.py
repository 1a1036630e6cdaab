"""The jobs' metrics for Prometheus: ``sparkjet metrics JOB --prometheus`` and ``--serve``.

Through ``prometheus_client``: :class:`JobsCollector` turns the jobs'
metrics (``Job.get_metrics()``, read afresh on every collection) into
metric families in a registry of its own (never the library's global one);
:func:`exposition` prints them in Prometheus's text format, and
:func:`serve_metrics` serves them with the library's WSGI app on wsgiref,
which answers in the text format or, when the scraper asks for it
(``Accept: application/openmetrics-text``), in OpenMetrics.

Imported only by the ``metrics`` command, so the other commands do not pay
for importing ``prometheus_client``.
"""

from __future__ import annotations

import re
import socket
import socketserver
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import generate_latest, make_wsgi_app
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from sparkjet import Client
from sparkjet.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from sparkjet.cli.output import out
from sparkjet.job import Job

#: Every metric's name starts with this; the rest is Jet's metric name.
PREFIX = "sparkjet_"

#: Jet's metrics that count something from the job's start and only go up (Prometheus
#: counters, exposed with ``_total`` after Jet's name); every other metric is a level, a
#: gauge. ``snapshotCount`` counts committed micro-batches (each one a checkpoint).
COUNTERS = frozenset({
    "receivedCount", "emittedCount", "deadLetters", "lateEventsDropped", "snapshotCount",
    "storeRequests",
})

#: What each of Jet's metrics is (a metric not named here is "Jet's metric <name>").
_HELP = {
    "status": "The job's status (label status), always 1",
    "receivedCount": "Items the stage received",
    "emittedCount": "Items the stage emitted",
    "deadLetters": "Items the stage sent to the dead-letter stream",
    "lateEventsDropped": "Events the stage dropped as late",
    "snapshotCount": "Micro-batches committed (each one a checkpoint)",
    "storeRequests": "Requests the job's driver made to the store, by kind",
    "snapshotKeys": "Keys in the stage's state",
    "snapshotBytes": "Bytes of the stage's state",
    "sourceLag": "Items the source has not read yet",
    "watermark": "The stage's watermark (milliseconds since the epoch)",
    "lastCommittedBatch": "The number of the last committed micro-batch",
    "lastBatchDurationMillis": "How long the last micro-batch took (milliseconds)",
    "processingRate": "Items processed per second in the last micro-batch",
    "inputRate": "Items arriving per second in the last micro-batch",
    "executionStartTime": "When the job's execution started (milliseconds since the epoch)",
    "executionCompletionTime": "When the job's execution ended (milliseconds since the epoch, "
                               "-1 while it runs)",
}

#: What Prometheus allows in a metric name; anything else becomes ``_``.
_NOT_IN_NAMES = re.compile(r"[^a-zA-Z0-9_:]")


def metric_name(name: str) -> str:
    """Jet's metric ``name`` as Prometheus's metric family: ``sparkjet_<name>``.

    A counter's samples add ``_total`` (``sparkjet_receivedCount_total``).
    """
    return PREFIX + _NOT_IN_NAMES.sub("_", name)


class JobsCollector(Collector):
    """The metrics of the jobs ``jobs()`` returns, read afresh on every :meth:`collect`.

    Jet's metric names after :data:`PREFIX`: job metrics
    (``lastCommittedBatch``, ``processingRate``, ...) labelled by ``job_id``
    and ``job_name``, stage metrics (``receivedCount``, ``emittedCount``,
    ``snapshotKeys``, ...) by ``stage`` too, ``sparkjet_status`` 1 for the
    job's status (label ``status``), and the store requests the job's driver
    made by ``kind`` (``sparkjet_storeRequests``: list, get, head, put,
    delete). :data:`COUNTERS` are counters, the rest gauges.
    """

    def __init__(self, jobs: Callable[[], Iterable[Job]]) -> None:
        self._jobs = jobs

    def collect(self) -> Iterator[Metric]:
        """One metric family per metric name, its samples those of every job."""
        families: dict[str, Metric] = {}

        def add(name: str, labels: dict[str, str], value: Any) -> None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return
            family = families.get(name)
            if family is None:
                help_text = _HELP.get(name, f"Jet's metric {name}")
                kind = CounterMetricFamily if name in COUNTERS else GaugeMetricFamily
                family = families[name] = kind(metric_name(name), help_text)
            sample = f"{family.name}_total" if family.type == "counter" else family.name
            family.add_sample(sample, labels, value)

        for job in self._jobs():
            job_labels = {"job_id": job.id, "job_name": job.name or ""}
            add("status", {**job_labels, "status": job.status.value}, 1)
            values = job.get_metrics()
            for name, value in values.items():
                add(name, job_labels, value)
            store = values.get("storeRequests")
            if isinstance(store, dict):
                for kind, count in (store.get("byKind") or {}).items():
                    add("storeRequests", {**job_labels, "kind": str(kind)}, count)
            for stage, stage_values in values.get("stages", {}).items():
                for name, value in stage_values.items():
                    add(name, {**job_labels, "stage": stage}, value)
        yield from families.values()


def registry(jobs: Callable[[], Iterable[Job]]) -> CollectorRegistry:
    """A registry of its own holding a :class:`JobsCollector` of ``jobs``."""
    found = CollectorRegistry(auto_describe=False)
    found.register(JobsCollector(jobs))
    return found


def exposition(jobs: Iterable[Job]) -> str:
    """The jobs' metrics in Prometheus's text exposition format (version 0.0.4)."""
    listed = list(jobs)
    return generate_latest(registry(lambda: listed)).decode()


# --- the exporter -----------------------------------------------------------------------

#: A WSGI application: ``(environ, start_response) -> body``.
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def metrics_app(found: CollectorRegistry, redact: Callable[[str], str]) -> WsgiApp:
    """prometheus_client's WSGI app for ``found``, at ``/metrics`` only.

    Another path is a 404; a collection that fails (the store cannot be
    read) a 503 saying why, ``redact`` masking secrets, and the exporter
    serves on.
    """
    app = make_wsgi_app(found)

    def answer(start_response: Callable[..., Any], status: str, text: str) -> list[bytes]:
        body = text.encode()
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                                ("Content-Length", str(len(body)))])
        return [body]

    def metrics_only(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") != "/metrics":
            return answer(start_response, "404 Not Found", "only /metrics is served\n")
        try:
            # The app collects before it starts the response: a failure is ours to answer.
            return app(environ, start_response)
        except Exception as exc:
            return answer(start_response, "503 Service Unavailable",
                          redact(f"cannot read the jobs: {type(exc).__name__}: {exc}") + "\n")

    return metrics_only


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server, a thread per scrape (threads never waited for at the end)."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    """wsgiref's request handler, no line per scrape: scrapes are not news."""

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing."""


def serve_metrics(client: Client, host: str, port: int, only: Job | None = None) -> int:
    """Serve the active jobs' metrics (``only`` that job's) at ``http://HOST:PORT/metrics``.

    Until interrupted (Ctrl-C: exit 0). The address family follows the
    host (an IPv6 address or a name that resolves to one listens on IPv6).
    A host that does not resolve is a CliError (exit 2); a port that is
    taken or not allowed to this user, exit 1.
    """
    jet = client.get_jet()
    what = f"job {only.label}'s metrics" if only is not None else "the active jobs' metrics"

    def jobs() -> list[Job]:
        if only is not None:
            return [job for job in [jet.get_job(only.id)] if job is not None]
        return [job for job in jet.get_jobs() if not job.status.is_terminal()]

    shown_host = f"[{host}]" if ":" in host else host
    try:
        family, *_, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise CliError(f"--serve: cannot listen on host {host!r}: it does not resolve "
                       f"({exc.strerror or exc}); give an address or a known host name") from None

    class Server(_Server):
        address_family = family

    try:
        server = make_server(str(address[0]), port, metrics_app(registry(jobs), client.redact),
                             Server, _QuietHandler)
    except OSError as exc:
        raise CliError(f"--serve: cannot listen on {shown_host}:{port}: "
                       f"{exc.strerror or exc}", EXIT_FAILED) from None
    bound_port = server.server_address[1]
    out(f"Serving {what} at http://{shown_host}:{bound_port}/metrics (Ctrl-C stops)")
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return EXIT_OK
