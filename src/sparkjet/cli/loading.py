"""Loading the pipeline that a Python file defines (``sparkjet submit FILE.py``)."""

from __future__ import annotations

import contextlib
import inspect
import runpy
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sparkjet.cli.errors import CliError
from sparkjet.cli.output import describe
from sparkjet.pipeline import Pipeline


def _location(exc: BaseException, file: Path) -> str:
    """`` (line N)`` of the innermost frame of ``exc``'s traceback that is in ``file``."""
    target = str(file.resolve())
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        with contextlib.suppress(OSError):
            if str(Path(frame.filename).resolve()) == target:
                line = frame.lineno
    return f" (line {line})" if line is not None else ""


def _accepts_argument(fn: Callable[..., Any], shown: str) -> bool:
    """Whether ``fn`` takes the ARGS list; refuses signatures that need anything else."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = list(signature.parameters.values())
    required = [
        p for p in params
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if len(required) > 1 or any(p.kind is inspect.Parameter.KEYWORD_ONLY for p in required):
        raise CliError(
            f"{shown}: pipeline{signature} must take no parameter or one (the list of ARGS)"
        )
    return any(p.kind in positional or p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)


def load_pipeline(path: str | Path, args: Sequence[str] = ()) -> Pipeline:
    """Run the Python file ``path`` and return the pipeline it defines.

    The file is run like a script (its folder first on ``sys.path`` and
    ``sys.argv`` set to ``[path, *args]`` while it loads) under the module
    name ``__sparkjet_pipeline__``, so its ``if __name__ == "__main__"`` block
    does not run and its functions are shipped to Spark by value. Its
    module-level ``pipeline`` is either a Pipeline or a function returning
    one; a function that takes a parameter is given ``list(args)``.

    :raises CliError: the file is missing, not Python, fails to load, or
        defines no usable ``pipeline``; the message names the file.
    """
    shown = str(path)
    file = Path(path)
    if not file.exists():
        raise CliError(f"{shown}: no such file")
    if file.is_dir():
        raise CliError(f"{shown}: is a directory, expected a Python file (.py)")
    if file.suffix != ".py":
        raise CliError(f"{shown}: not a Python file (expected a .py file)")
    saved_argv, folder = sys.argv, str(file.resolve().parent)
    sys.argv = [shown, *args]
    sys.path.insert(0, folder)
    try:
        try:
            namespace = runpy.run_path(str(file), run_name="__sparkjet_pipeline__")
        except SyntaxError as exc:
            where = f" (line {exc.lineno})" if exc.lineno else ""
            raise CliError(f"{shown}: invalid Python{where}: {exc.msg}") from None
        except SystemExit as exc:
            raise CliError(f"{shown}: called sys.exit({exc.code!r}) while loading") from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise CliError(
                f"{shown}: raised {describe(exc)} while loading{_location(exc, file)}"
            ) from None
        if "pipeline" not in namespace:
            raise CliError(
                f"{shown}: defines no module-level 'pipeline' (a Pipeline, or a function "
                "returning one)"
            )
        obj = namespace["pipeline"]
        if not isinstance(obj, Pipeline) and callable(obj):
            call = "pipeline(ARGS)" if _accepts_argument(obj, shown) else "pipeline()"
            try:
                obj = obj(list(args)) if call == "pipeline(ARGS)" else obj()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                raise CliError(
                    f"{shown}: {call} raised {describe(exc)}{_location(exc, file)}"
                ) from None
            if not isinstance(obj, Pipeline):
                raise CliError(
                    f"{shown}: {call} returned {type(obj).__name__} {obj!r:.80}, not a Pipeline"
                )
        elif not isinstance(obj, Pipeline):
            raise CliError(
                f"{shown}: 'pipeline' is of type {type(obj).__name__}, expected a Pipeline or "
                "a function returning one"
            )
        return obj
    finally:
        sys.argv = saved_argv
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)  # what the file itself added to sys.path stays
