"""Racing writers for the conformance suites: work run on threads at once, errors reported."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable


def race(work: Callable[[int], None], writers: int) -> None:
    """Run ``work(0)`` to ``work(writers - 1)`` at once on threads; fail on any error."""
    errors: list[BaseException] = []

    def run(writer: int) -> None:
        try:
            work(writer)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), "a writer did not finish within 120 s"
    if errors:
        told = "".join(
            "".join(traceback.format_exception(error)) for error in errors
        )
        raise AssertionError(f"{len(errors)} writer(s) of {writers} failed:\n{told}")
