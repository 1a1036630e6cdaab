"""``sparkjet migrate-snapshot SRC DST``: a new snapshot from an old one, stages renamed or changed.

The command's parser (:func:`add_command`) and handler (:func:`migrate_snapshot`)
live here; :mod:`sparkjet.cli.parser` only registers them. A ``--transform``
function is imported from a module (the current directory first on
``sys.path``, as ``submit FILE.py`` loads a file from its folder); a spec that
cannot be imported, or a malformed option, exits 2 naming it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from sparkjet import Client
from sparkjet.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from sparkjet.cli.output import describe, format_count, out


def add_command(subcommands: Any) -> None:
    """Add ``migrate-snapshot`` to the ``sparkjet`` command's subcommands."""
    command = subcommands.add_parser(
        "migrate-snapshot",
        help="write a new snapshot from an old one: stages renamed, dropped or transformed",
        description="Write the snapshot DST from the exported snapshot SRC, which is left as "
        "it is. --rename OLD=NEW moves a stateful stage's state or a source's offsets to a "
        "new name; --drop leaves a stage or source out; --transform STAGE=module:function "
        "calls function(key, value) for every key of the stage's state (the value as "
        "Snapshot.read_state shows it) and keeps the (key, value) pair it returns, or "
        "deletes the key on None. Names are SRC's. The new snapshot is verified and signed "
        "like an export and records what was done; nothing is written when anything fails.",
    )
    command.add_argument("src", metavar="SRC", help="the snapshot to read")
    command.add_argument("dst", metavar="DST", help="the snapshot to write")
    command.add_argument("--rename", dest="renames", action="append", default=[],
                         metavar="OLD=NEW", help="rename a stage or source (repeatable)")
    command.add_argument("--drop", dest="drops", action="append", default=[],
                         metavar="STAGE", help="leave a stage or source out (repeatable)")
    command.add_argument("--transform", dest="transforms", action="append", default=[],
                         metavar="STAGE=module:function",
                         help="rewrite a stage's state key by key (repeatable)")
    command.add_argument("-f", "--force", action="store_true",
                         help="replace DST if it exists")
    command.set_defaults(handler=migrate_snapshot)


def _pair(option: str, text: str, right: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise CliError(f"migrate-snapshot {option} {text!r}: expected {right}")
    return name.strip(), value.strip()


def load_function(spec: str, stage: str) -> Callable[..., Any]:
    """Import ``module:function`` (the current directory first on ``sys.path``).

    :raises CliError: (exit 2) a malformed spec, a module that is missing or
        fails to import, a missing or uncallable attribute; the message names
        the spec and the stage.
    """
    where = f"migrate-snapshot --transform {stage}={spec}"
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise CliError(f"{where}: expected module:function")
    folder = os.getcwd()
    sys.path.insert(0, folder)
    try:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                raise CliError(f"{where}: no module named {module_name!r} (looked in the "
                               "current directory and sys.path)") from None
            raise CliError(f"{where}: importing {module_name!r} raised {describe(exc)}") from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise CliError(f"{where}: importing {module_name!r} raised {describe(exc)}") from None
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
    fn: Any = module
    for part in attribute.split("."):
        if not hasattr(fn, part):
            raise CliError(f"{where}: module {module_name!r} has no {attribute!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise CliError(f"{where}: {attribute!r} is a {type(fn).__name__}, not a function")
    return fn  # type: ignore[no-any-return]


def migrate_snapshot(args: argparse.Namespace, client: Client) -> int:
    """``migrate-snapshot SRC DST [--rename OLD=NEW]... [--drop S]... [--transform S=m:f]...``."""
    renames: dict[str, str] = {}
    for text in args.renames:
        old, new = _pair("--rename", text, "OLD=NEW")
        if old in renames:
            raise CliError(f"migrate-snapshot --rename: {old!r} is renamed twice")
        renames[old] = new
    transforms: dict[str, Callable[..., Any]] = {}
    for text in args.transforms:
        stage, spec = _pair("--transform", text, "STAGE=module:function")
        if stage in transforms:
            raise CliError(f"migrate-snapshot --transform: stage {stage!r} is given twice")
        transforms[stage] = load_function(spec, stage)
    jet = client.get_jet()
    source = jet.get_snapshot(args.src)
    if not args.force and args.src != args.dst and jet.find_snapshot(args.dst) is not None:
        raise CliError(f"migrate-snapshot: snapshot '{args.dst}' exists: give --force to "
                       "replace it", EXIT_FAILED)
    made = jet.migrate_snapshot(args.src, args.dst, renames=renames, drop=args.drops,
                                transforms=transforms, overwrite=args.force)
    new_stages = {s.name: s for s in made.manifest.stages}
    out(f"Migrated snapshot '{args.src}' (batch {source.manifest.batch_id}) to "
        f"'{args.dst}': {format_count(made.payload_size)} bytes")
    for entry in source.manifest.stages:
        new_name = renames.get(entry.name, entry.name)
        keys_in = f"{format_count(entry.key_count)} keys in"
        if entry.name in args.drops:
            out(f"  stage '{entry.name}': dropped ({keys_in})")
            continue
        done = [f"renamed to '{new_name}'"] if new_name != entry.name else []
        if entry.name in transforms:
            done.append("transformed")
        keys_out = new_stages[new_name].key_count
        out(f"  stage '{entry.name}': {keys_in}, {format_count(keys_out)} keys out"
            + (f" ({', '.join(done)})" if done else ""))
    for name in source.manifest.sources:
        if name in args.drops:
            out(f"  source '{name}': dropped (its offsets left out)")
        elif name in renames:
            out(f"  source '{name}': offsets renamed to '{renames[name]}'")
        else:
            out(f"  source '{name}': offsets kept")
    return EXIT_OK
