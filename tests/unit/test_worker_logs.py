"""Rank logs split into attempts (local and Ray headers), scanned incrementally, tails and archives."""

from __future__ import annotations

import stat
from pathlib import Path

from trainyard.services.domain import Job
from trainyard.services.lifecycle import JobState
from trainyard.services.worker_logs import WorkerLogs, tail_start
from trainyard.tenancy.storage import StoragePolicy


def job(run_dir: Path, attempt: int) -> Job:
    return Job(
        id="job-1",
        seq=1,
        tenant_id="t1",
        name="j",
        state=JobState.RUNNING,
        spec={},
        created_at_s=0.0,
        updated_at_s=0.0,
        attempt=attempt,
        run_dir=str(run_dir),
    )


def test_attempt_sections_incremental_tail_and_archive(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    log = run / "rank-0.log"
    log.write_bytes(
        b"--- attempt 1 rank 0 ---\na1 line 1\na1 line 2\n--- attempt 2 rank 0 (Ray: pool p) ---\na2 x\n"
    )
    policy = StoragePolicy((tmp_path / "storage").as_uri())
    logs = WorkerLogs(policy, lambda _tid: "acme")
    j = job(run, 2)
    assert logs.read(j, rank=0, attempt=1, offset=0, limit_bytes=1000)["text"] == "a1 line 1\na1 line 2\n"
    assert logs.read(j, rank=0, attempt=2, offset=0, limit_bytes=1000)["text"] == "a2 x\n"
    with log.open("ab") as fh:  # the running attempt goes on; a half-written line waits
        fh.write(b"a2 y\na2 z")
    doc = logs.read(j, rank=0, attempt=2, offset=5, limit_bytes=1000)
    assert doc["text"] == "a2 y\na2 z" and doc["size"] == 14
    with log.open("ab") as fh:
        fh.write(b"\n--- attempt 3 rank 0 ---\nthree\n")
    j3 = job(run, 3)
    assert logs.read(j3, rank=0, attempt=2, offset=0, limit_bytes=1000)["text"] == "a2 x\na2 y\na2 z\n"
    assert logs.attempts(j3, 0) == [1, 2, 3]
    tail = logs.read(j3, rank=0, attempt=1, offset=0, limit_bytes=1000, tail_lines=1)
    assert tail["text"] == "a1 line 2\n" and tail["offset"] == len(b"a1 line 1\n")
    assert logs.read(j3, rank=0, attempt=None, offset=0, limit_bytes=1000)["text"] == log.read_text()
    # kept in the tenant's logs area, private; read from there once the run directory is gone
    (url,) = logs.archive(j3, 2)
    assert url.endswith("/tenants/acme/logs/job-1/attempt-2/rank-0.log")
    kept = Path(url[len("file://") :])
    assert kept.read_bytes() == b"a2 x\na2 y\na2 z\n" and stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    log.unlink()
    assert logs.read(j3, rank=0, attempt=2, offset=0, limit_bytes=1000)["text"] == "a2 x\na2 y\na2 z\n"
    assert logs.attempts(j3, 0) == [2]
    assert logs.read(j3, rank=0, attempt=None, offset=0, limit_bytes=1000)["text"] == (
        "--- attempt 2 rank 0 ---\na2 x\na2 y\na2 z\n"
    )
    assert logs.read(j3, rank=0, attempt=1, offset=0, limit_bytes=1000)["text"] == ""


def test_tail_start() -> None:
    assert tail_start(b"a\nb\nc\n", 2) == 2
    assert tail_start(b"a\nb\nc", 2) == 2
    assert tail_start(b"a\nb\n", 5) == 0
    assert tail_start(b"a\n", 0) == 2


def test_a_queued_job_may_have_every_rank_its_spec_allows_a_placed_one_its_devices() -> None:
    from dataclasses import replace

    from trainyard.services.domain import Placement
    from trainyard.spec.models import MAX_DEVICES

    queued = replace(job(Path("/x"), 0), state=JobState.QUEUED, spec={"resources": {"max_devices": 2}})
    assert queued.ranks_possible() == 2  # rank 1 of a queued 2-device job is waited for, not refused
    assert replace(queued, spec={}).ranks_possible() == MAX_DEVICES
    placed = replace(queued, placement=Placement("p", 3, "on_demand", "cpu", 1.0))
    assert placed.ranks_possible() == 3
    assert replace(queued, placement=Placement("p", 0, "on_demand", "cpu", 1.0)).ranks_possible() == 1
