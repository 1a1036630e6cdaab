"""The source kit's checks of a job stopped and resumed: the promises a restart keeps.

:class:`StopAndResumeChecks` is a base of
:class:`~sparkjet.testing.sources.SourceConformance`, which a source's
author subclasses; it is not used on its own. Its checks stop a job at every
micro-batch boundary (suspended and resumed, cancelled with an exported
snapshot and started again from it) and SIGKILL real driver processes, once
while a planned micro-batch is held before its commit, so that a new driver
must replay it; each time every item must be read exactly once.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import cloudpickle
import pytest

from sparkjet.job import Job, JobStatus
from sparkjet.testing.source_harness import (
    SEEN,
    WAIT_SECONDS,
    SourceHarness,
    _Driver,
    _Run,
    _skip_unless,
    _wait,
    assert_exactly_once,
    describe_multiset,
)


class StopAndResumeChecks:
    """Jobs stopped at every micro-batch boundary and drivers killed: each item read once."""

    #: Items the kit gives per round; small, so a source's whole kit runs in well under a minute.
    ROUND = 30

    @staticmethod
    def _streaming_only(harness: SourceHarness) -> None:
        _skip_unless(harness, "streaming", harness.streaming,
                     "a bounded source (streaming = False): no offsets or micro-batches")

    def test_suspend_and_resume_at_every_batch_boundary(
        self, run: _Run, source_harness: SourceHarness
    ) -> None:
        """A job suspended after every micro-batch (given items while suspended) reads each once."""
        self._streaming_only(source_harness)
        run.add(self.ROUND)
        job = run.submit(source_harness.new_source())
        size = run.client.get_list(SEEN).size
        stops = 0
        while size() < run.given or stops < 1:
            done = run.committed(job)
            lost = run.watch(job, run.given, f"a job suspended {stops} times")
            _wait(lambda d=done, w=lost: (run.committed(job) > d  # type: ignore[misc]
                                          or size() >= run.given or job.is_terminal()
                                          or w()),
                  f"a micro-batch after batch {done}")
            if job.is_terminal():
                job.join(timeout=30)
            job.suspend()
            job.wait_for_status(JobStatus.SUSPENDED, timeout=WAIT_SECONDS)
            stops += 1
            if stops == 1:
                run.add(self.ROUND)  # items that land while the job is suspended
            job.resume()
            if stops > 40:
                pytest.fail(f"{stops} suspends and still not every item read: "
                            f"{describe_multiset(run.seen(), range(run.given))}")
        seen = run.wait_read(job, run.given, f"after {stops} suspends")
        assert_exactly_once(seen, range(run.given), f"a job suspended {stops} times")

    def test_cancel_and_restart_from_a_snapshot_at_every_batch_boundary(
        self, run: _Run, source_harness: SourceHarness
    ) -> None:
        """Jobs cancelled with a snapshot after each micro-batch, each the next's start."""
        self._streaming_only(source_harness)
        run.add(self.ROUND)
        size = run.client.get_list(SEEN).size
        snapshot: str | None = None
        restarts = 0
        while size() < run.given or restarts < 1:
            job = run.submit(source_harness.new_source(), snapshot)
            lost = run.watch(job, run.given, f"job {restarts + 1}, restarted from a snapshot")
            # A job started from a snapshot counts its batches on from the snapshot's:
            # wait for a micro-batch this job ran.
            _wait(lambda j=job, w=lost: (run.batches_run(j) > 0  # type: ignore[misc]
                                         or size() >= run.given or j.is_terminal() or w()),
                  lambda n=restarts + 1: (  # type: ignore[misc]
                      f"a micro-batch of job {n} (started from the last one's snapshot), or "
                      f"every item read: {describe_multiset(run.seen(), range(run.given))}"))
            if job.is_terminal():
                job.join(timeout=30)
            snapshot = f"conformance-{restarts}"
            job.cancel_and_export_snapshot(snapshot)
            restarts += 1
            if restarts == 1:
                run.add(self.ROUND)  # items that land between two jobs
            if restarts > 30:
                pytest.fail(f"{restarts} jobs, each restarted from the last one's snapshot, and "
                            f"still not every item read: "
                            f"{describe_multiset(run.seen(), range(run.given))}")
        job = run.submit(source_harness.new_source(), snapshot)
        seen = run.wait_read(job, run.given, f"after {restarts} restarts")
        assert_exactly_once(seen, range(run.given), f"{restarts} jobs restarted from snapshots")

    @pytest.mark.slow
    def test_a_killed_driver_process_resumes_exactly_once(
        self, run: _Run, source_harness: SourceHarness, tmp_path: Path
    ) -> None:
        """Drivers SIGKILLed between a batch's read and its commit, and at random: each item once.

        The first driver is killed while it holds a micro-batch it planned and
        read but did not commit (the kit's pausing sink, ``PAUSED <batch>``),
        so a later driver must replay that batch from its recorded offsets;
        the second is killed at a random moment; the third runs to the end.
        The drivers report each replay (``REPLAYING <batch>``): the held
        batch must be among them, and every item must be read exactly once.
        """
        self._streaming_only(source_harness)
        seed = int(os.environ.get("SPARKJET_FAULT_SEED", random.randrange(1 << 30)))
        rng = random.Random(seed)
        print(f"fault seed {seed} (set SPARKJET_FAULT_SEED to repeat)")
        control = tmp_path / "control"
        control.mkdir()
        config = run.client.config
        spec = tmp_path / "driver-spec.pkl"
        spec.write_bytes(cloudpickle.dumps({
            "harness": source_harness,
            "store": {"url": config.store_url, "options": dict(config.store_options)},
            # On the kit's client's Spark: its Connect server (which outlives the
            # killed drivers), or a classic session of the driver's own.
            "spark": ({"remote": config.spark_remote, "conf": dict(config.spark_conf)}
                      if config.spark_remote else
                      {"master": config.spark_master, "app_name": "sparkjet-source-driver",
                       "conf": {**config.spark_conf, "spark.driver.memory": "512m"}}),
            # The drivers run their jobs where the kit's client does (no JVM if in process).
            "engine": {"driver_only": not run.client.runs_on_spark},
            "job_name": f"conformance-kill-{run.token}",
            "pipeline": run.pipeline(source_harness.new_source(), str(control)),
        }))
        log_dir = tmp_path / "drivers"
        log_dir.mkdir()
        drivers: list[_Driver] = []
        size = run.client.get_list(SEEN).size
        job: Job | None = None
        held: int | None = None
        try:
            run.add(self.ROUND)
            # Deterministic: the first micro-batch that read items is held before its commit.
            (control / "pause").touch()
            for n in range(3):
                driver = _Driver(spec, log_dir, n + 1)
                drivers.append(driver)
                line = _wait(lambda d=driver: d.line(("SUBMITTED", "RESUMED")),  # type: ignore[misc]
                             f"driver {n + 1} to start", 180)
                job = run.client.get_jet().get_job(line.split()[1])
                if job is None:
                    pytest.fail(f"driver {n + 1} said {line!r}, but the kit finds no such job")
                if n == 2:
                    break  # the last driver runs to the end
                if n == 0:
                    paused = _wait(lambda d=driver: d.line("PAUSED"),  # type: ignore[misc]
                                   "driver 1 to hold a micro-batch before its commit")
                    held = int(paused.split()[1])
                    how = f"holding micro-batch {held} between its read and its commit"
                else:
                    time.sleep(rng.uniform(0.0, 1.0))  # at random, maybe mid-replay
                    how = "at a random moment"
                driver.kill()
                print(f"killed driver {n + 1} {how}: {size()} items read of {run.given}")
                run.add(self.ROUND)
            seen = run.wait_read(job, run.given, (
                f"by the last driver, after driver 1 was killed holding micro-batch {held} "
                f"before its commit, which a later driver had to replay (seed {seed})"))
            replays = [(i + 1, int(line.split()[1])) for i, d in enumerate(drivers)
                       for line in d.lines("REPLAYING")]
            print(f"replays seen: {len(replays)} "
                  f"({', '.join(f'driver {i}: batch {b}' for i, b in replays) or 'none'})")
            if held not in {batch for _, batch in replays}:
                pytest.fail(
                    f"micro-batch {held}, planned and read by driver 1 and killed before its "
                    f"commit, was never replayed by the drivers after it (replays seen: "
                    f"{replays}): a planned batch must be replayed with its recorded offsets")
            assert_exactly_once(seen, range(run.given),
                                f"drivers killed twice, once holding micro-batch {held} before "
                                f"its commit, and replaying it {len(replays)} time(s) in all "
                                f"(seed {seed})")
        finally:
            for driver in drivers:
                driver.kill()
