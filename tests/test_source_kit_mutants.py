"""The source conformance kit catches the bugs a source's author plants: a mutation test.

tests/kit_sources.py's folder-lines source (opaque byte offsets) with each of
three planted bugs: ``plan_range`` ignoring its start, a replay (a second
read of the same range, remembered across processes) dropping a range's last
item, and a cursor moved when a range is planned, so a replayed plan reads
other items. The kit runs, as a plugin author runs it (a generated test
module, ``pytest_plugins = ["sparkjet.testing"]``, a ``client`` on the
in-process engine), in one pytest process for the sound source and every
mutant, on the checks each bug breaks. Each mutant must fail those checks
with the message of the promise it broke, and the sound source pass them.

``slow``: it runs the kill test's driver processes (about 40 s in all).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.kit_sources import BUGS

ROOT = Path(__file__).resolve().parent.parent

#: The kit's checks each planted bug must fail, and what their failure must say.
CAUGHT_BY: dict[str, dict[str, tuple[str, ...]]] = {
    "ignores-start": {
        "test_reads_every_item_once": ("not every item exactly once", "duplicated (first [("),
        "test_offsets_never_go_backwards": ("not every item exactly once",),
    },
    "replay-drops-last": {
        "test_replay_reads_the_same_items": ("the same offsets must read the same items",
                                             "2 missing"),  # a range's last line per file
        "test_a_killed_driver_process_resumes_exactly_once": (
            "every item given must be read exactly once", "had to replay", "2 missing"),
    },
    # Caught in process, by a replayed plan reading other items; its kill test is not
    # run (a driver that did not start within 180 s under CI's load once failed it
    # for that reason instead, and the replay-drops-last mutant proves the kill test).
    "cursor-at-planning": {
        "test_replay_reads_the_same_items": ("the same offsets must read the same items",),
    },
}
CHECKS = sorted({check for caught in CAUGHT_BY.values() for check in caught})
#: The checks not run on a mutant that no check of them is expected to catch (-k syntax).
UNRUN = " or ".join(
    f"({check} and {bug})" for bug, caught in CAUGHT_BY.items()
    for check in CHECKS if check not in caught
)

CONFTEST = '''
import pytest

import sparkjet

pytest_plugins = ["sparkjet.testing"]


@pytest.fixture
def client(tmp_path):
    return sparkjet.connect(store={"url": str(tmp_path / "store")},
                            engine={"driver_only": True})
'''

MODULE = '''
import pytest

from sparkjet.testing import SourceConformance
from tests.kit_sources import FolderLinesHarness


class TestFolderLines(SourceConformance):
    @pytest.fixture(params=[None, *%r], ids=["sound", *%r])
    def source_harness(self, request, tmp_path):
        return FolderLinesHarness(str(tmp_path / "inbox"), request.param)
'''


@pytest.mark.slow
def test_the_kit_fails_each_planted_bug_naming_the_promise(tmp_path: Path) -> None:
    suite = tmp_path / "kit"
    suite.mkdir()
    (suite / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (suite / "test_mutants.py").write_text(MODULE % (BUGS, BUGS))
    (suite / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    slow: starts driver processes\n")
    report = tmp_path / "report.xml"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *sys.path])
    env["SPARKJET_FAULT_SEED"] = "7"
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
         str(suite / "pytest.ini"), "--rootdir", str(suite), str(suite),
         "-m", "slow or not slow", "-k", f"({' or '.join(CHECKS)}) and not ({UNRUN})",
         f"--junitxml={report}"],
        cwd=suite, env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - began
    print(f"the kit on the sound source and {len(BUGS)} mutants: {took:.1f} s")
    if not report.exists():
        pytest.fail(f"the kit's run left no report ({done.returncode}):\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    outcomes: dict[tuple[str, str], str | None] = {}  # (check, variant) -> failure text
    for case in ET.parse(report).getroot().iter("testcase"):
        check, _, variant = case.attrib["name"].partition("[")
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        outcomes[(check, variant.rstrip("]"))] = (
            None if problem is None else f"{problem.get('message', '')}\n{problem.text or ''}")
    for check in CHECKS:
        if (check, "sound") not in outcomes:
            pytest.fail(f"{check} did not run on the sound source:\n{done.stdout[-3000:]}")
        failure = outcomes[(check, "sound")]
        if failure is not None:
            pytest.fail(f"the sound source fails {check}:\n{failure[:3000]}")
    for bug, caught in CAUGHT_BY.items():
        for check, says in caught.items():
            failure = outcomes.get((check, bug))
            if failure is None:
                pytest.fail(f"the kit let the planted bug {bug!r} through {check} "
                            f"(it {'passed' if (check, bug) in outcomes else 'did not run'})")
            for words in says:
                if words not in failure:
                    pytest.fail(f"{check} failed on the planted bug {bug!r}, but its message "
                                f"does not say {words!r}:\n{failure[:3000]}")
