"""Step metrics: the worker's stream (rate bounds, batching, eval loss merged into its step) and the
store (merging upserts, the newest attempt per step, downsampling in the database)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane_support import database_url
from trainyard.runtime.metrics import MetricsStream, unpack
from trainyard.store.db import Database
from trainyard.store.metrics_repo import MetricsRepo


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def stream(every: int = 1, rate: float = 0.0) -> tuple[MetricsStream, list[dict[str, Any]], Clock]:
    sent: list[dict[str, Any]] = []
    clock = Clock()
    ms = MetricsStream(
        lambda kind, **data: sent.append({"kind": kind, **data}),
        0,
        every_steps=every,
        max_rows_per_s=rate,
        flush_s=1.0,
        clock=clock,
        wall=clock,
    )
    return ms, sent, clock


def rows(sent: list[dict[str, Any]]) -> list[int]:
    return [step for ev in sent for step, _t, _v in unpack(ev)]


def test_every_step_by_default_batched_per_second() -> None:
    ms, sent, clock = stream()
    for step in range(1, 11):
        clock.t += 0.25
        ms.record(step, loss=1.0 / step)
    ms.flush()
    assert rows(sent) == list(range(1, 11))
    assert len(sent) >= 2 and all(ev["kind"] == "metrics" for ev in sent)  # batched, not one per step
    assert len(sent) < 10


def test_every_n_steps_and_the_rate_bound_keep_first_and_last() -> None:
    ms, sent, clock = stream(every=5)
    for step in range(1, 23):
        ms.record(step, final=step == 22, loss=1.0)
    ms.flush()
    assert rows(sent) == [1, 5, 10, 15, 20, 22]
    ms, sent, clock = stream(rate=10.0)  # at most 10 rows a second
    for step in range(1, 101):
        clock.t += 0.01  # 100 steps a second
        ms.record(step, final=step == 100, loss=1.0)
    ms.flush()
    kept = rows(sent)
    assert kept[0] == 1 and kept[-1] == 100
    assert 9 <= len(kept) <= 12
    assert all(b - a >= 9 for a, b in itertools.pairwise(kept[:-1]))


def test_eval_loss_joins_its_step_and_nan_becomes_none() -> None:
    ms, sent, _clock = stream()
    ms.record(1, loss=float("nan"))
    ms.attach(1, eval_loss=2.5)
    ms.flush()
    ((step, _t, values),) = unpack(sent[0])
    assert step == 1 and values == {"loss": None, "eval_loss": 2.5}


@pytest.fixture(params=["sqlite", "postgresql"])
def repo_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    with database_url(request.param, tmp_path) as url:
        db = Database(url)
        db.upgrade()
        _job(db)
        yield db
        db.dispose()


def _job(db: Database) -> None:
    from trainyard.store.models import JobRow, TenantRow

    with db.session() as s:
        s.add(TenantRow(id="t1", name="t", created_at_s=0.0, storage_roots=[]))
        s.flush()
        s.add(
            JobRow(
                id="job-1",
                tenant_id="t1",
                name="j",
                state="running",
                spec={},
                spec_sha256="x",
                created_at_s=0.0,
                updated_at_s=0.0,
            )
        )


def test_store_merges_and_keeps_the_newest_attempt_per_step(repo_db: Database) -> None:
    with repo_db.session() as s:
        repo = MetricsRepo(s)
        repo.upsert("job-1", 1, [(i, float(i), {"loss": 10.0 - i, "lr": 0.1}) for i in range(1, 11)])
        repo.upsert("job-1", 1, [(10, 10.5, {"eval_loss": 3.0})])  # merges into step 10
        repo.upsert("job-1", 2, [(i, 100.0 + i, {"loss": 20.0 - i}) for i in range(7, 13)])  # resumed at 6
    with repo_db.session() as s:
        page = MetricsRepo(s).curve("job-1")
        assert [p["step"] for p in page.points] == list(range(1, 13))
        assert [p["attempt"] for p in page.points] == [1] * 6 + [2] * 6
        assert page.attempts == [1, 2]
        one = MetricsRepo(s).curve("job-1", attempt=1)
        p10 = one.points[-1]
        assert p10["step"] == 10 and p10["loss"] == 0.0 and p10["eval_loss"] == 3.0
        assert p10["extra"] == {"lr": 0.1}
        assert [p["step"] for p in MetricsRepo(s).curve("job-1", since_step=10).points] == [11, 12]


def test_store_downsamples_a_long_curve(repo_db: Database) -> None:
    n = 100_000
    with repo_db.session() as s:
        repo = MetricsRepo(s)
        for start in range(1, n + 1, 10_000):
            batch = [(i, float(i), {"loss": float(i % 7)}) for i in range(start, min(n, start + 9_999) + 1)]
            repo.upsert("job-1", 1, batch)
    with repo_db.session() as s:
        page = MetricsRepo(s).curve("job-1", max_points=500)
    assert page.downsampled and page.total_points == n and page.bucket_steps == 200
    assert len(page.points) == 500
    assert sum(p["count"] for p in page.points) == n
    assert page.points[-1]["step"] == n
    assert page.points[0]["loss_min"] == 0.0 and page.points[0]["loss_max"] == 6.0


def test_an_alert_fires_once_per_condition(repo_db: Database) -> None:
    from trainyard.services.alerting import AlertConfig, AlertService, Candidate

    alerts = AlertService(repo_db, AlertConfig(), tenant_name=lambda _tid: "t")
    try:
        cand = Candidate("t1", "job_stalled", "critical", "job_stalled:job-1:a1", "stalled", job_id="job-1")
        first = alerts.fire(cand)
        assert first is not None and first["rule"] == "job_stalled" and first["tenant"] == "t"
        assert alerts.fire(cand) is None  # the same condition again
        again = alerts.fire(Candidate("t1", "job_stalled", "critical", "job_stalled:job-1:a2", "stalled"))
        assert again is not None and again["id"] != first["id"]
    finally:
        alerts.close()
    with repo_db.session() as s:
        from trainyard.store.repositories import EventRepo

        kinds = [e.kind for e in EventRepo(s).list("job-1")]
    assert kinds.count("alert") == 1  # the second alert named no job: it is a tenant event
