"""Results and metrics from the command line: ``get map|list|stream``, ``metrics``, ``info``.

Each prints a table for people, or with ``--json`` one JSON document (``get
map``, ``metrics``) or JSON lines (``get list``, ``get stream``) for tools.
Items that JSON cannot hold as they are (tuples, window results, objects)
are shown as JSON can: named tuples and dataclasses as objects, tuples and
sets as arrays, anything else as its ``repr``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Mapping
from typing import Any

from sparkjet import Client, __version__
from sparkjet.cli.commands import find_job
from sparkjet.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from sparkjet.cli.output import format_count, format_time_millis, out, state_line, table


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it (see the module docstring)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {k: jsonable(v) for k, v in value._asdict().items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k) if not isinstance(k, str) else k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        items = [jsonable(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    return repr(value)


def shown(value: Any) -> str:
    """One value on one line of a table: compact JSON where it can be, else ``repr``."""
    if isinstance(value, str):
        return value
    return json.dumps(jsonable(value), separators=(", ", ": "), ensure_ascii=False)


def dumps(value: Any) -> str:
    """One JSON document on one line."""
    return json.dumps(jsonable(value), ensure_ascii=False)


def get_map(args: argparse.Namespace, client: Client) -> int:
    """``get map NAME [KEY]``: every entry, or one key's value (exit 1 if it is absent)."""
    imap = client.get_map(_named(args, "map"))
    _must_exist("map", imap.name, imap.exists(), client)
    if args.key is not None:
        found, key, value = _lookup(imap.entry_set(), args.key)
        if not found:
            raise CliError(f"map '{imap.name}' has no key {args.key!r}", EXIT_FAILED)
        out(dumps({"key": key, "value": value}) if args.json else shown(value))
        return EXIT_OK
    entries = list(imap.entry_set())
    # In key order where the keys compare (a map keeps no order of its own).
    with contextlib.suppress(TypeError):
        entries.sort(key=lambda entry: entry[0])
    if args.json:
        out(dumps([{"key": k, "value": v} for k, v in entries]))
        return EXIT_OK
    for line in table(("KEY", "VALUE"), [(shown(k), shown(v)) for k, v in entries]):
        out(line)
    return EXIT_OK


def _lookup(entries: list[tuple[Any, Any]], text: str) -> tuple[bool, Any, Any]:
    """The entry whose key is ``text``, or the key ``text`` spells in JSON (``42``, ``[1]``)."""
    by_text = [(k, v) for k, v in entries if k == text]
    if not by_text:
        try:
            wanted = json.loads(text)
        except ValueError:
            wanted = None
        else:
            by_text = [(k, v) for k, v in entries if jsonable(k) == wanted]
    if not by_text:
        return False, None, None
    return True, *by_text[0]


def _must_exist(kind: str, name: str, exists: bool, client: Client) -> None:
    """CliError (exit 1) when nothing was ever written to the map or list ``name``."""
    if not exists:
        raise CliError(f"no {kind} '{name}' in store '{client.redact(client.config.store_url)}' "
                       f"(nothing was ever written to it)", EXIT_FAILED)


def get_list(args: argparse.Namespace, client: Client) -> int:
    """``get list NAME [--tail N]``: the items in order, or the last N."""
    ilist = client.get_list(_named(args, "list"))
    _must_exist("list", ilist.name, ilist.exists(), client)
    items = ilist.get_all()
    first = 0
    if args.tail is not None:
        first = max(0, len(items) - args.tail)
    for index in range(first, len(items)):
        item = items[index]
        out(dumps({"index": index, "item": item}) if args.json else f"{index}  {shown(item)}")
    return EXIT_OK


def get_stream(args: argparse.Namespace, client: Client) -> int:
    """``get stream NAME [--from OFFSET] [--partition P]``: items with their offsets."""
    name = _named(args, "stream")
    stream = client.get_stream(name)
    if not stream.exists():
        raise CliError(f"stream '{name}' does not exist in store "
                       f"'{client.redact(client.config.store_url)}'", EXIT_FAILED)
    ends = stream.end_offsets()
    partitions = range(len(ends))
    if args.partition is not None:
        if not 0 <= args.partition < len(ends):
            raise CliError(f"stream '{name}' has partitions 0 to {len(ends) - 1}, "
                           f"not {args.partition}", EXIT_FAILED)
        partitions = range(args.partition, args.partition + 1)
    # Without --from each partition is read from where it starts now (retention
    # may have trimmed it), and stderr says so; --from below that is an error.
    firsts = stream.start_offsets()
    for partition in partitions:
        if args.start is not None and args.start < firsts[partition]:
            raise CliError(
                f"stream '{name}' partition {partition}: offsets {args.start} to "
                f"{firsts[partition] - 1} were trimmed (retention); the partition starts at "
                f"offset {firsts[partition]} now (leave out --from to read from there)",
                EXIT_FAILED)
    for partition in partitions:
        start = args.start
        if start is None:
            start = firsts[partition]
            if start:
                print(f"stream '{name}' partition {partition}: offsets 0 to {start - 1} were "
                      f"trimmed ({start:,} items); reading from {start}", file=sys.stderr,
                      flush=True)
        for offset, item in enumerate(stream.read(partition, start, ends[partition]), start):
            if args.json:
                out(dumps({"partition": partition, "offset": offset, "item": item}))
            else:
                out(f"{partition}:{offset}  {shown(item)}")
    return EXIT_OK


def _named(args: argparse.Namespace, kind: str) -> str:
    if not args.name:
        raise CliError(f"'get {kind}' needs the {kind}'s NAME")
    return str(args.name)


def metrics(args: argparse.Namespace, client: Client) -> int:
    """``metrics JOB [--json|--prometheus]``, or ``metrics [JOB] --serve [HOST:]PORT``."""
    if args.serve is not None:
        from sparkjet.cli import prometheus  # only here: the library takes a while to import

        host, port = listen_address(args.serve)
        only = find_job(client, args.job) if args.job is not None else None
        return prometheus.serve_metrics(client, host, port, only)
    if args.job is None:
        raise CliError("'metrics' needs a JOB (or --serve [HOST:]PORT)")
    job = find_job(client, args.job)
    values = job.get_metrics()
    if args.json:
        out(dumps(values))
        return EXIT_OK
    if args.prometheus:
        from sparkjet.cli import prometheus

        sys.stdout.write(prometheus.exposition([job]))
        sys.stdout.flush()
        return EXIT_OK
    out(state_line(job, client))
    times = [("Execution start", values.get("executionStartTime", -1)),
             ("Execution completion", values.get("executionCompletionTime", -1))]
    for label, millis in times:
        out(f"{label}: {format_time_millis(int(millis))}")
    store = values.get("storeRequests")
    if isinstance(store, Mapping):
        by_kind = store.get("byKind") or {}
        kinds = ", ".join(f"{kind} {_metric(by_kind[kind])}"
                          for kind in sorted(by_kind, key=_kind_order))
        out(f"Store requests: {_metric(store.get('total'))} ({kinds})")
    for key, value in values.items():
        if key not in ("executionStartTime", "executionCompletionTime", "stages",
                       "storeRequests"):
            out(f"{key}: {shown(value)}")
    stages: Mapping[str, Mapping[str, Any]] = values.get("stages", {})
    if stages:
        first = {"receivedCount": 0, "emittedCount": 1}
        columns = sorted({c for stage in stages.values() for c in stage},
                         key=lambda c: (first.get(c, 2), c))
        rows = [(name, *(_metric(stage.get(c)) for c in columns))
                for name, stage in stages.items()]
        for line in table(("STAGE", *columns), rows):
            out(line)
    return EXIT_OK


#: The kinds of store request, in the order the store's metrics list them.
_KINDS = ("list", "get", "head", "put", "delete")


def _kind_order(kind: str) -> tuple[int, str]:
    """Store request kinds as the store lists them (list, get, head, put, delete)."""
    return (_KINDS.index(kind) if kind in _KINDS else len(_KINDS), kind)


def _metric(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return format_count(value)
    return shown(value)


def info(args: argparse.Namespace, client: Client) -> int:
    """``info``: which configuration and store this command uses, and what the store holds."""
    config = client.config
    out(f"sparkjet {__version__}")
    out(f"Configuration: {config.source or 'none (defaults)'}")
    out(f"Store: {client.redact(config.store_url)} (from {config.store_source})")
    if config.snapshots_url is None:
        out(f"Snapshots: {client.redact(config.store_url.rstrip('/'))}/snapshots (beside the "
            "store)")
    else:
        out(f"Snapshots: {client.redact(config.snapshots_url)} "
            f"({config.snapshots_backend} backend)")
    if config.spark_remote:
        out(f"Spark: {client.redact(config.spark_remote)} (Spark Connect, from "
            f"{config.spark_remote_source})")
    else:
        out(f"Spark: {config.spark_master}")
    jobs = client.get_jet().get_jobs()
    active = sum(1 for job in jobs if not job.status.is_terminal())
    out(f"Jobs: {active} active, {len(jobs)} in all")
    return EXIT_OK


# --- metrics --serve: the address (the exporter is sparkjet.cli.prometheus) ---------------

#: The TCP ports ``--serve`` can listen on (0: any free port, printed).
PORTS = range(0, 65536)


def listen_address(where: str) -> tuple[str, int]:
    """``[HOST:]PORT`` as ``(host, port)``; CliError (exit 2) naming what is allowed.

    HOST defaults to 127.0.0.1; an IPv6 address is written in brackets
    (``[::1]:9464``).
    """
    host, _, port_text = where.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    allowed = (f"expected [HOST:]PORT with PORT a number from {PORTS.start} to "
               f"{PORTS.stop - 1} (0: any free port), got {where!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise CliError(f"--serve: {allowed}") from None
    if port not in PORTS:
        raise CliError(f"--serve: port {port} is out of range; {allowed}")
    return host or "127.0.0.1", port


def trim(args: argparse.Namespace, client: Client) -> int:
    """``trim STREAM``: remove the stream's oldest items; a line per partition."""
    try:
        report = client.trim_stream(
            args.stream, keep_items=args.keep_items, keep_seconds=args.keep_seconds,
            keep_bytes=args.keep_bytes, dry_run=args.dry_run,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    verb = "would remove" if report.dry_run else "removed"
    for part in report.partitions:
        line = f"partition {part.partition}: "
        if part.trimmed:
            line += (f"{verb} offsets {part.start_before} to {part.start_after - 1} "
                     f"({part.trimmed:,} items); starts at {part.start_after}")
        else:
            line += f"nothing to remove; starts at {part.start_after}"
        if part.held_by is not None:
            line += f"; held back at offset {part.held_at} by {client.redact(part.held_by)}"
        out(line)
    total = "Would remove" if report.dry_run else "Removed"
    out(f"{total} {report.trimmed:,} items of stream '{report.stream}' "
        f"({report.retention.describe()}).")
    return EXIT_OK
