"""peek() output reaches the console from Spark's Python workers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


@pytest.mark.slow
def test_peek_prints_from_workers(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sparkjet
        from sparkjet.pipeline import Pipeline
        client = sparkjet.connect(store={{"url": {str(tmp_path / "store")!r}}},
                                  spark={{"master": "local[1]",
                                          "conf": {{"spark.ui.enabled": "false"}}}})
        p = Pipeline.create()
        (p.read_from(Pipeline.from_list("in", ["alpha", "beta"]))
         .peek(lambda w: w.upper()).set_name("look")
         .write_to(Pipeline.to_list("out")))
        client.get_jet().submit(p).join(timeout=120)
        print("RESULT", client.get_list("out").get_all())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RESULT ['alpha', 'beta']" in done.stdout
    assert "peek [look] ALPHA" in done.stderr
    assert "peek [look] BETA" in done.stderr
