"""The argument types and actions the ``sparkjet`` command's parsers share.

Types that check a number of seconds, a size, an offset, a guarantee or a
``KEY=VALUE`` option; the upgrade options of ``submit`` and ``check-upgrade``
(collected in one :class:`~sparkjet.job.JobConfig`); the ARGS after FILE.py,
which are never a sparkjet option; and :data:`Handler`, what a command runs.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import Any

from sparkjet import Client
from sparkjet.cli import commands
from sparkjet.job import JobConfig, ProcessingGuarantee

#: What a command's ``handler`` default is: a function of :mod:`sparkjet.cli.commands`.
Handler = Callable[[argparse.Namespace, Client], int]


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected 0 or more seconds, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _size(text: str) -> int:
    try:
        return commands.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _offset(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an offset (0 or more), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an offset (0 or more), got {text!r}")
    return value


def _guarantee(text: str) -> ProcessingGuarantee:
    try:
        return ProcessingGuarantee.parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected none, at_least_once or exactly_once, got {text!r}"
        ) from None


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _rename(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not sep or not old or not new:
        raise argparse.ArgumentTypeError(
            f"expected OLD=NEW (a stage's name in the snapshot, '=', its name in this "
            f"pipeline), got {text!r}"
        )
    return old, new


def _source_start(text: str) -> tuple[str, str]:
    stage, sep, where = text.partition("=")
    if not sep or not stage or where not in SOURCE_STARTS:
        raise argparse.ArgumentTypeError(
            f"expected STAGE=initial or STAGE=latest (STAGE a source stage's name, or * for "
            f"every source the snapshot has no offsets for), got {text!r}"
        )
    return stage, where


#: Where a source the snapshot has no offsets for starts (``--source-start STAGE=WHERE``).
SOURCE_STARTS = ("initial", "latest")


def _upgrade(namespace: argparse.Namespace) -> JobConfig:
    """The JobConfig that collects the upgrade options given (``namespace.upgrade``)."""
    config: JobConfig | None = getattr(namespace, "upgrade", None)
    if config is None:
        config = JobConfig()
        namespace.upgrade = config
    return config


class _UpgradeFlag(argparse.Action):
    """``--allow-dropped-state`` / ``--allow-changed-state``: set the JobConfig field."""

    def __init__(self, option_strings: list[str], dest: str, field: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.field = field

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
        values: Any, option_string: str | None = None,
    ) -> None:
        setattr(_upgrade(namespace), self.field, True)


class _UpgradeEntry(argparse.Action):
    """``--rename OLD=NEW`` / ``--source-start STAGE=WHERE``: one entry of a JobConfig dict.

    A key given twice is refused (which one wins would be a guess), and so is a
    new name given to two stages (two states cannot become one).
    """

    def __init__(self, option_strings: list[str], dest: str, field: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.field = field

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
        values: Any, option_string: str | None = None,
    ) -> None:
        key, value = values
        config = _upgrade(namespace)
        entries: dict[str, str] = dict(getattr(config, self.field))
        option = option_string or self.option_strings[0]
        if key in entries:
            parser.error(
                f"argument {option}: {key!r} is given twice ({key}={entries[key]} and "
                f"{key}={value}): give it once"
            )
        if self.field == "stage_renames":
            for old, new in entries.items():
                if new == value:
                    parser.error(
                        f"argument {option}: {value!r} is the new name of both {old!r} and "
                        f"{key!r} (two stages' state cannot become one)"
                    )
        entries[key] = value
        setattr(config, self.field, entries)


def _add_upgrade_options(command: argparse.ArgumentParser, summary: str) -> None:
    """Add the upgrade options (JobConfig's upgrade fields) to ``submit`` or ``check-upgrade``.

    They are collected in one JobConfig, ``args.upgrade`` (None when none is given).
    """
    group = command.add_argument_group(
        "upgrade options", f"{summary} (see docs/snapshots.md for the upgrade rules)"
    )
    group.add_argument(
        "--allow-dropped-state", action=_UpgradeFlag, field="allow_dropped_state",
        dest="upgrade", default=None,
        help="JobConfig.allow_dropped_state: accept that the state or offsets the snapshot "
        "holds for a stage this pipeline no longer has are dropped",
    )
    group.add_argument(
        "--allow-changed-state", action=_UpgradeFlag, field="allow_changed_state",
        dest="upgrade", default=None,
        help="JobConfig.allow_changed_state: keep the state of a stage whose key function "
        "or operation changed (its state's type did not)",
    )
    group.add_argument(
        "--rename", action=_UpgradeEntry, field="stage_renames", type=_rename,
        dest="upgrade", default=None, metavar="OLD=NEW",
        help="JobConfig.stage_renames: the state (or offsets) of stage OLD in the snapshot "
        "go to stage NEW of this pipeline (repeatable)",
    )
    group.add_argument(
        "--source-start", action=_UpgradeEntry, field="source_starts", type=_source_start,
        dest="upgrade", default=None, metavar="STAGE=initial|latest",
        help="JobConfig.source_starts: where source STAGE starts when the snapshot has no "
        "offsets for it: initial (as without a snapshot) or latest (at the data's end now); "
        "STAGE * for every such source (repeatable)",
    )


class _PipelineArguments(argparse.Action):
    """The ARGS after FILE.py: passed to the pipeline, but never a sparkjet option.

    argparse hands everything after FILE.py to the pipeline, so ``submit v1.py
    -s snap`` would quietly start from scratch. An option of the command (or
    of ``sparkjet`` itself), written as argparse would take it (``-s``,
    ``-sNAME``, ``--snapshot=NAME``, an abbreviation such as ``--snap``), is
    refused there, naming it; the pipeline's own options (``--scale 3``) and
    everything after a ``--`` pass on untouched.
    """

    def __init__(
        self, option_strings: list[str], dest: str, global_options: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.global_options = global_options

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
        values: Any, option_string: str | None = None,
    ) -> None:
        arguments = list(values)
        given = getattr(parser, "given", [])
        # argparse drops a '--' right after FILE.py from the values: it was typed if the
        # token before them is one (the token before them is FILE.py otherwise).
        cut = len(given) - len(arguments) - 1
        if cut >= 0 and given[cut] == "--" and given[cut + 1:] == arguments:
            setattr(namespace, self.dest, arguments)
            return
        known = sorted({*parser._option_string_actions, *self.global_options})
        for token in arguments:
            if token == "--":
                break  # the rest is the pipeline's, whatever it looks like
            matched = _sparkjet_option(token, known)
            if matched is None:
                continue
            command = parser.prog.split()[-1]
            file = getattr(namespace, "file", "FILE.py")
            stem = token.split("=", 1)[0] if token.startswith("--") else token[:2]
            what = token if matched == stem else f"{token} (an abbreviation of {matched})"
            if matched not in parser._option_string_actions and matched in self.global_options:
                where = f"an option of sparkjet, which goes before the command: sparkjet " \
                    f"{token} {command} ... {file}"
            else:
                where = f"an option of sparkjet {command}, which goes before {file}: " \
                    f"sparkjet {command} {token} ... {file}"
            parser.error(
                f"{what} after {file} is {where}; to pass it to the pipeline, put the "
                f"pipeline's arguments after '--': sparkjet {command} {file} -- "
                f"{shlex.join(arguments)}"
            )
        setattr(namespace, self.dest, arguments)


def _sparkjet_option(token: str, known: list[str]) -> str | None:
    """The sparkjet option ``token`` would be taken as by argparse, or None.

    ``--name``, ``--name=x``, an unambiguous or ambiguous abbreviation
    (``--na``), ``-n`` and ``-nx`` all are; ``-1``, ``--scale`` and ``x`` are not.
    """
    if token.startswith("--") and len(token) > 2:
        stem = token.split("=", 1)[0]
        if stem in known:
            return stem
        candidates = [option for option in known if option.startswith(stem)]
        if candidates:
            return " or ".join(candidates) if len(candidates) > 1 else candidates[0]
        return None
    if token.startswith("-") and len(token) >= 2 and token[1] != "-":
        short = token[:2]
        return short if short in known else None
    return None
