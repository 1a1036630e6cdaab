"""Issue 24, the command line: upgrades that cannot silently lose or double count.

sparkjet's options after FILE.py are refused (``--`` passes the pipeline's on),
a closed pipe ends a command quietly, ``jet.get_job`` takes a name or an id,
and the upgrade options (``--allow-dropped-state``, ``--allow-changed-state``,
``--rename``, ``--source-start``) reach the JobConfig of ``submit`` and
``check-upgrade``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.job import Job, JobConfig, JobStatus
from sparkjet.pipeline import Pipeline, StreamSource
from tests.conftest import wait_until
from tests.test_cli import no_spark, write_config

__all__ = ["no_spark"]  # the fixture, used by name

#: A pipeline that writes the ARGS it is given to args.json, then copies a list.
ARGS_PIPELINE = """
    import json

    from sparkjet.pipeline import Pipeline

    def pipeline(args):
        with open("args.json", "w") as f:
            json.dump(args, f)
        p = Pipeline.create()
        p.read_from(Pipeline.from_list("in", [1, 2])).write_to(Pipeline.to_list("out"))
        return p
"""

#: A streaming pipeline with one stateful stage that starts from the v1 snapshot of
#: tests/test_cli_snapshots: ``clicks-per-user`` renamed ``per-user``, ``uniq`` dropped.
V2_RENAMED = """
    from sparkjet.aggregate import counting
    from sparkjet.pipeline import Pipeline, StreamSource

    pipeline = Pipeline.create()
    pipeline.read_from(StreamSource("clicks")).set_name("clicks") \\
        .group_by(lambda x: x % 10).aggregate(counting()).set_name("per-user") \\
        .write_to(Pipeline.to_map("counts"))
"""


@pytest.fixture
def config_file(client: sparkjet.Client) -> Path:
    return write_config(client)


def written_args() -> Any:
    """What the pipeline function of :data:`ARGS_PIPELINE` was given."""
    return json.loads(Path("args.json").read_text(encoding="utf-8"))


# --- 3. jet.get_job(name_or_id) ----------------------------------------------------------


def batch_job(client: sparkjet.Client, name: str | None) -> Job:
    pipeline = Pipeline.create()
    pipeline.read_from(Pipeline.from_list("in", [1])).write_to(Pipeline.to_list("out"))
    job = client.get_jet().submit(pipeline, JobConfig(name=name))
    job.join(timeout=120)
    return job


def test_get_job_takes_an_id_or_a_name(client: sparkjet.Client, store_url: str) -> None:
    jet = client.get_jet()
    first = batch_job(client, "nightly")
    second = batch_job(client, "nightly")
    assert jet.get_job("ghost") is None

    # By name, no job of it active: the one submitted last.
    found = jet.get_job("nightly")
    assert found is not None and found.id == second.id
    by_id = jet.get_job(first.id)
    assert by_id is not None and by_id.id == first.id

    # An id wins over a name: a job named like another job's id.
    impostor = batch_job(client, first.id)
    by_id = jet.get_job(first.id)
    assert by_id is not None and by_id.id == first.id
    named = jet.get_job_by_name(first.id)
    assert named is not None and named.id == impostor.id

    # Another process (no runner here) finds them through the store alike.
    other = sparkjet.connect(store={"url": store_url})
    found = other.get_jet().get_job("nightly")
    assert found is not None and found.id == second.id


def test_get_job_by_a_name_shared_by_a_finished_and_a_running_job(
    client: sparkjet.Client, cancel_at_end: list[Job],
) -> None:
    jet = client.get_jet()
    finished = batch_job(client, "shared")
    assert finished.status is JobStatus.COMPLETED
    client.get_stream("events", partitions=1).publish_all([1, 2])
    p = Pipeline.create()
    p.read_from(StreamSource("events")).map(lambda x: x * 10).write_to(Pipeline.to_list("tens"))
    running = jet.submit(p, JobConfig(name="shared"))
    cancel_at_end.append(running)
    wait_until(lambda: running.status is JobStatus.RUNNING, 120, "the streaming job to run")

    found = jet.get_job("shared")
    assert found is not None and found.id == running.id  # the active one
    found = jet.get_job(finished.id)
    assert found is not None and found.id == finished.id  # the other by its id

    running.cancel()
    wait_until(running.is_terminal, 60, "the cancel")
    found = jet.get_job("shared")
    assert found is not None and found.id == running.id  # none active: the newest
    again = batch_job(client, "shared")
    found = jet.get_job("shared")
    assert found is not None and found.id == again.id
