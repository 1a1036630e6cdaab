"""What a failed Spark job's error says, in one line (classic Spark and Spark Connect alike).

Spark's message starts with a generic line and buries the Python worker's own
traceback in a JVM stack trace (classic) or a long server error (Connect).
"""

from __future__ import annotations

import re

__all__ = ["spark_failure_summary"]

_PYTHON_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.*)$")


def spark_failure_summary(exc: BaseException) -> str:
    """The Python error a Spark worker raised outside sparkjet's tasks, in one line.

    Spark's message starts with a generic line and buries the worker's own
    traceback in a JVM stack trace; its last ``SomethingError: ...`` line is
    what a user needs (typically a module the workers cannot import).
    """
    text = str(exc)
    found = None
    for line in text.splitlines():
        match = _PYTHON_ERROR_LINE.match(line.strip())
        if match and not match.group(1).startswith(("org.", "java.", "py4j.", "scala.")):
            found = line.strip()
    if found is None:
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        return first
    if found.startswith("ModuleNotFoundError"):
        found += (
            " (Spark's Python workers cannot import it: install the module where the "
            "workers run, or define the function in the submitted script)"
        )
    return found
