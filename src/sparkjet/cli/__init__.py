"""The ``sparkjet`` command: submit pipeline files and manage jobs, like Jet's ``hz-cli``.

Commands::

    sparkjet --version
    sparkjet [--config FILE] [-v] submit [-n NAME] [-g GUARANTEE] [--snapshot-interval MILLIS]
                                        [--suspend-on-failure] [-s SNAPSHOT [UPGRADE...]]
                                        FILE.py [--] [ARGS...]
    sparkjet [--config FILE] list-jobs [-a]
    sparkjet [--config FILE] cancel [--timeout SECONDS] JOB
    sparkjet [--config FILE] suspend [--timeout SECONDS] JOB
    sparkjet [--config FILE] resume [--timeout SECONDS] JOB
    sparkjet [--config FILE] restart [--timeout SECONDS] JOB
    sparkjet [--config FILE] publish [--partitions N] STREAM FILE
    sparkjet [--config FILE] gc [--grace SECONDS] [--retention SECONDS] [--dry-run]
    sparkjet [--config FILE] plugins
    sparkjet [--config FILE] save-snapshot [-C] [--timeout SECONDS] JOB NAME
    sparkjet [--config FILE] list-snapshots [-F]
    sparkjet [--config FILE] delete-snapshot NAME
    sparkjet [--config FILE] inspect-snapshot [--verify] NAME
    sparkjet [--config FILE] check-upgrade -s SNAPSHOT [UPGRADE...] FILE.py [--] [ARGS...]
    sparkjet [--config FILE] migrate-snapshot SRC DST [--rename OLD=NEW]... [--drop STAGE]...
                                              [--transform STAGE=MODULE:FUNCTION]... [--force]
    sparkjet [--config FILE] copy-snapshot NAME --to URL [--as NEW] [-o KEY=VALUE]...
                                           [--to-backend KIND]
    sparkjet [--config FILE] apply FILE.toml
    sparkjet [--config FILE] get jobs [-a] | get snapshots [-F]
    sparkjet [--config FILE] get map NAME [KEY] | get list NAME [--tail N]
    sparkjet [--config FILE] metrics JOB [--json|--prometheus]
    sparkjet [--config FILE] metrics [JOB] --serve [HOST:]PORT

``UPGRADE`` is ``--allow-dropped-state``, ``--allow-changed-state``, ``--rename
OLD=NEW`` or ``--source-start STAGE=initial|latest`` (see docs/snapshots.md).
Options go before ``FILE.py``; the pipeline's own arguments after it (after
``--`` when they look like options).

The configuration is found as ``sparkjet.connect()`` finds it (``--config``,
``SPARKJET_CONFIG``, ``./sparkjet.toml``, ``[tool.sparkjet]`` in
``./pyproject.toml``). Only ``submit`` starts Spark, and ``resume`` when the
job's driver died and the job continues in this process; the other commands
read and write the store and load the plugins.

``submit`` loads ``FILE.py`` (as ``python FILE.py`` would, but without running
its ``if __name__ == "__main__"`` block) and takes its module-level
``pipeline``: a :class:`~sparkjet.pipeline.Pipeline`, or a function returning
one, which is given the list of ``ARGS`` if it takes a parameter. The job runs
in this process, in the foreground, until it ends; a streaming job runs until
it is cancelled or suspended. Interrupted (Ctrl-C, SIGTERM), ``submit``
suspends a streaming job that has a processing guarantee, so that ``sparkjet
resume`` continues it later, and cancels any other job. ``sparkjet cancel``,
``suspend`` and ``restart`` from another shell act on it through the store.

Exit status: 0 on success (also when a foreground streaming job is suspended);
1 when a job failed or was cancelled, or an action on a job, stream or
snapshot could not be done (unknown job, stream or snapshot, wrong status,
timeout, a corrupt snapshot); 2 when the command line, the configuration, a
plugin, the pipeline file or the file to publish is wrong, or the pipeline's
state is incompatible with the snapshot it would start from; 130 when
interrupted; 141 when whoever read the output stopped reading (``| head``).
Every error prints one line, ``ERROR: <message>``, on stderr, without a
traceback (an unexpected one has its traceback printed with ``-v``), and
never a configured secret.
"""

from __future__ import annotations

from sparkjet.cli.app import main
from sparkjet.cli.errors import CliError
from sparkjet.cli.loading import load_pipeline
from sparkjet.cli.output import version_text
from sparkjet.cli.parser import build_parser

__all__ = ["CliError", "build_parser", "load_pipeline", "main", "version_text"]
