"""Concurrent governed admissions of one budget period reserved together (tenancy/admission.py), on a
real SQLite file and on PostgreSQL (127.0.0.1:5432): who leads a batch, what a batch writes (one
reservation per job, the period's total, the jobs and their first events, in the order they queued), a
batch that does not fit or fails writing nothing, and every admission then decided on its own."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from service_support import sqlite_template
from sqlalchemy import Table, event, insert, select

from controlplane_support import postgres_db as pg_database
from trainyard.services.domain import Job
from trainyard.services.lifecycle import JobState
from trainyard.store.db import Database
from trainyard.store.governance_models import BudgetPeriodRow, BudgetReservationRow, BudgetRow
from trainyard.store.models import JobEventRow, JobRow
from trainyard.tenancy import admission, ledger
from trainyard.tenancy.admission import ALONE, REFUSED, BatchedAdmissions

NOW = 1_796_083_200.0  # 2026-12-01 00:00 UTC
MONTH = "2026-12"
BUDGETS = cast(Table, BudgetRow.__table__)
PERIODS = cast(Table, BudgetPeriodRow.__table__)
RESERVATIONS = cast(Table, BudgetReservationRow.__table__)
JOBS = cast(Table, JobRow.__table__)
EVENTS = cast(Table, JobEventRow.__table__)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sqlite_template(tmp_path_factory.mktemp("admission") / "template.sqlite", [("t1", "acme")])


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, template: Path, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        shutil.copy(template, tmp_path / "db.sqlite")
        d = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
        yield d
        d.dispose()
        return
    with pg_database((("t1", "acme"),)) as d:
        yield d


@pytest.fixture
def postgres_db() -> Iterator[Database]:
    with pg_database((("t1", "acme"),)) as d:
        yield d


def budget(
    db: Database, bid: str, limit_usd: float, *, spent: float = 0.0, tag: tuple[str, str] = ("", "")
) -> ledger.Budget:
    b = ledger.Budget(bid, "t1", tag[0], tag[1], "month", limit_usd, True, 1.0, 1.0)
    with db.engine.begin() as c:
        c.execute(
            insert(BUDGETS),
            {
                "id": bid,
                "tenant_id": "t1",
                "tag_key": tag[0],
                "tag_value": tag[1],
                "period": "month",
                "limit_usd": limit_usd,
                "hard": True,
                "created_at_s": 1.0,
                "updated_at_s": 1.0,
            },
        )
        c.execute(
            insert(PERIODS),
            {"budget_id": bid, "period_key": ledger.period_key("month", NOW), "spent_usd": spent},
        )
    return b


def job(job_id: str) -> Job:
    return Job(
        id=job_id,
        seq=0,
        tenant_id="t1",
        name=job_id,
        state=JobState.PENDING,
        spec={"name": job_id},
        created_at_s=NOW,
        updated_at_s=NOW,
    )


def first_event(job_id: str) -> tuple[str, dict[str, Any], float]:
    return ("state", {"from": None, "to": "pending", "reason": f"submitted {job_id}"}, NOW + 0.5)


def reserved(db: Database, bid: str) -> float:
    with db.engine.connect() as c:
        return float(c.execute(select(PERIODS.c.reserved_usd).where(PERIODS.c.budget_id == bid)).scalar_one())


def reservations(db: Database) -> dict[str, tuple[str, str, float]]:
    with db.engine.connect() as c:
        return {
            r.job_id: (r.budget_id, r.period_key, r.remaining_usd) for r in c.execute(select(RESERVATIONS))
        }


def jobs(db: Database) -> dict[str, tuple[int, str]]:
    with db.engine.connect() as c:
        return {r.id: (r.seq, r.name) for r in c.execute(select(JOBS.c.id, JOBS.c.seq, JOBS.c.name))}


def events(db: Database) -> dict[str, list[tuple[str, dict[str, Any], float]]]:
    out: dict[str, list[tuple[str, dict[str, Any], float]]] = {}
    with db.engine.connect() as c:
        for r in c.execute(select(EVENTS).order_by(EVENTS.c.id)):
            out.setdefault(r.job_id, []).append((r.kind, r.data, r.time_s))
    return out


def admit(
    adm: BatchedAdmissions,
    b: ledger.Budget,
    job_id: str,
    amount: float,
    *,
    n_hard: int = 1,
    now_s: float = NOW,
) -> Any:
    return adm.admit(
        budget=b,
        n_hard=n_hard,
        job=job(job_id),
        first_event=first_event(job_id),
        amount_usd=amount,
        now_s=now_s,
    )


class Crowd:
    """Admissions that arrive while the first one of a period pauses alone: each on a thread of its own,
    queued behind it before it takes its batch."""

    def __init__(self, adm_of: Callable[[], BatchedAdmissions], calls: list[Callable[[], Any]]) -> None:
        self.adm_of = adm_of
        self.calls = calls
        self.results: dict[int, Any] = {}
        self.threads: list[threading.Thread] = []
        self.paused = 0

    def pause(self) -> None:
        self.paused += 1
        if self.threads:
            return
        for i, call in enumerate(self.calls):
            t = threading.Thread(target=lambda i=i, call=call: self.results.__setitem__(i, call()))
            self.threads.append(t)
            t.start()
            deadline = time.monotonic() + 30
            while self.adm_of().queued < i + 2:  # the leader and every one started so far
                assert time.monotonic() < deadline, "an admission never queued"
                time.sleep(0.001)

    def join(self) -> None:
        for t in self.threads:
            t.join(30)
            assert not t.is_alive()


def test_an_admission_alone_is_reserved_and_inserted_in_one_batch(db: Database) -> None:
    b = budget(db, "b1", 10.0, spent=2.0)
    adm = BatchedAdmissions(db, alone_pause=None)
    seq = admit(adm, b, "j1", 3.0)
    assert isinstance(seq, int) and seq is not ALONE and seq is not REFUSED
    assert jobs(db) == {"j1": (seq, "j1")}
    assert events(db) == {"j1": [first_event("j1")]}
    assert reservations(db) == {"j1": ("b1", MONTH, 3.0)}
    assert reserved(db, "b1") == 3.0
    assert adm.batches == 1 and adm.queued == 0
    # up to the limit exactly (2 spent + 3 + 5 reserved = 10), then not a cent more
    assert isinstance(admit(adm, b, "j2", 5.0), int)
    assert admit(adm, b, "j3", 0.01) is REFUSED
    assert "j3" not in jobs(db) and "j3" not in reservations(db) and "j3" not in events(db)
    assert reserved(db, "b1") == 8.0
    assert adm.batches == 3


def test_a_negative_amount_reserves_nothing(db: Database) -> None:
    b = budget(db, "b1", 1.0, spent=1.0)
    adm = BatchedAdmissions(db, alone_pause=None)
    assert isinstance(admit(adm, b, "j1", -5.0), int)
    assert reservations(db) == {"j1": ("b1", MONTH, 0.0)}
    assert reserved(db, "b1") == 0.0


def test_a_statement_that_finds_the_definitions_changed_refuses(db: Database) -> None:
    b = budget(db, "b1", 10.0)
    adm = BatchedAdmissions(db, alone_pause=None)
    assert admit(adm, b, "j1", 1.0, n_hard=2) is REFUSED  # the tenant has one hard budget, not two
    assert admit(adm, b, "j2", 1.0, now_s=NOW + 40 * 86400) is REFUSED  # a period with no row yet
    assert jobs(db) == {} and reserved(db, "b1") == 0.0


def test_admissions_queued_behind_a_lone_one_share_its_batch_in_their_order(db: Database) -> None:
    b = budget(db, "b1", 10.0)
    adm: BatchedAdmissions
    crowd = Crowd(lambda: adm, [lambda i=i: admit(adm, b, f"j{i}", 1.0 + i) for i in (1, 2, 3)])
    adm = BatchedAdmissions(db, alone_pause=crowd.pause)
    lead = admit(adm, b, "j0", 0.5)
    crowd.join()
    assert crowd.paused == 1  # only the admission that found itself alone paused
    assert adm.batches == 1 and adm.queued == 0
    seqs = [lead] + [crowd.results[i] for i in range(3)]
    assert all(isinstance(s, int) for s in seqs)
    got = jobs(db)
    assert [got[f"j{i}"][0] for i in range(4)] == seqs
    assert seqs == sorted(seqs) and len(set(seqs)) == 4  # inserted in the order they queued
    assert {k: v[1] for k, v in got.items()} == {f"j{i}": f"j{i}" for i in range(4)}
    assert events(db) == {f"j{i}": [first_event(f"j{i}")] for i in range(4)}
    assert reservations(db) == {
        "j0": ("b1", MONTH, 0.5),
        "j1": ("b1", MONTH, 2.0),
        "j2": ("b1", MONTH, 3.0),
        "j3": ("b1", MONTH, 4.0),
    }
    assert reserved(db, "b1") == 9.5


def test_a_batch_that_does_not_fit_writes_nothing_and_each_is_then_decided_alone(db: Database) -> None:
    b = budget(db, "b1", 10.0, spent=4.0)
    adm: BatchedAdmissions
    crowd = Crowd(lambda: adm, [lambda: admit(adm, b, "j1", 3.0)])
    adm = BatchedAdmissions(db, alone_pause=crowd.pause)
    assert admit(adm, b, "j0", 4.0) is ALONE  # 4 + 4 + 3 > 10
    crowd.join()
    assert crowd.results == {0: ALONE}
    assert adm.batches == 1
    assert jobs(db) == {} and reservations(db) == {} and reserved(db, "b1") == 0.0
    # alone: the first fits, the second does not any more
    seq = adm.admit_alone(
        budget=b, n_hard=1, job=job("j0"), first_event=first_event("j0"), amount_usd=4.0, now_s=NOW
    )
    assert isinstance(seq, int) and jobs(db) == {"j0": (seq, "j0")}
    refused = adm.admit_alone(
        budget=b, n_hard=1, job=job("j1"), first_event=first_event("j1"), amount_usd=3.0, now_s=NOW
    )
    assert refused is REFUSED and "j1" not in jobs(db)
    assert reservations(db) == {"j0": ("b1", MONTH, 4.0)} and reserved(db, "b1") == 4.0
    assert adm.batches == 1  # deciding alone is not a batch


def test_a_batch_exactly_at_the_limit_is_admitted(db: Database) -> None:
    b = budget(db, "b1", 10.0, spent=4.0)
    adm: BatchedAdmissions
    crowd = Crowd(lambda: adm, [lambda: admit(adm, b, "j1", 2.5)])
    adm = BatchedAdmissions(db, alone_pause=crowd.pause)
    assert isinstance(admit(adm, b, "j0", 3.5), int)
    crowd.join()
    assert isinstance(crowd.results[0], int)
    assert reserved(db, "b1") == 6.0


def test_a_batch_that_fails_writes_nothing_and_answers_alone(db: Database) -> None:
    b = budget(db, "b1", 10.0)
    adm: BatchedAdmissions
    crowd = Crowd(lambda: adm, [lambda: admit(adm, b, "j0", 2.0)])  # the same job id twice
    adm = BatchedAdmissions(db, alone_pause=crowd.pause)
    assert admit(adm, b, "j0", 1.0) is ALONE
    crowd.join()
    assert crowd.results == {0: ALONE}
    assert jobs(db) == {} and reservations(db) == {} and reserved(db, "b1") == 0.0
    assert adm.queued == 0
    assert isinstance(admit(adm, b, "j2", 1.0), int)  # and the next admission leads again


def test_batches_hold_at_most_max_batch_and_the_next_in_line_leads_the_rest(db: Database) -> None:
    b = budget(db, "b1", 100.0)
    adm: BatchedAdmissions
    crowd = Crowd(lambda: adm, [lambda i=i: admit(adm, b, f"j{i}", 1.0) for i in (1, 2, 3, 4)])
    adm = BatchedAdmissions(db, max_batch=2, alone_pause=crowd.pause)
    lead = admit(adm, b, "j0", 1.0)
    crowd.join()
    seqs = [lead] + [crowd.results[i] for i in range(4)]
    assert all(isinstance(s, int) for s in seqs) and seqs == sorted(seqs)
    assert adm.batches == 3  # 2 + 2 + 1
    assert crowd.paused == 1  # the next leaders were not alone
    assert reserved(db, "b1") == 5.0 and len(reservations(db)) == 5


def test_the_default_batch_holds_64(db: Database) -> None:
    b = budget(db, "b1", 1000.0)
    adm: BatchedAdmissions
    crowd = Crowd(lambda: adm, [lambda i=i: admit(adm, b, f"j{i}", 1.0) for i in range(1, 65)])
    adm = BatchedAdmissions(db, alone_pause=crowd.pause)
    admit(adm, b, "j0", 1.0)
    crowd.join()
    assert adm.batches == 2  # 64 and then 1
    assert len(jobs(db)) == 65 and reserved(db, "b1") == 65.0


def test_admissions_of_other_budgets_or_periods_do_not_join_a_batch(db: Database) -> None:
    b1 = budget(db, "b1", 10.0)
    b2 = budget(db, "b2", 10.0, tag=("team", "x"))
    adm = BatchedAdmissions(db)
    seen: list[int] = []
    others: dict[str, Any] = {}

    def pause() -> None:  # admissions of another budget and of another month arrive while b1's leads
        seen.append(adm.queued)
        if len(seen) > 1:
            return
        for name, call in (
            ("k1", lambda: admit(adm, b2, "k1", 1.0, n_hard=2)),
            (
                "n1",
                lambda: admit(adm, b1, "n1", 1.0, n_hard=2, now_s=NOW + 40 * 86400),
            ),  # no period row: refused
        ):
            t = threading.Thread(target=lambda name=name, call=call: others.__setitem__(name, call()))
            t.start()
            t.join(10)  # each leads a batch of its own meanwhile (one joining b1's would wait for it)
            assert not t.is_alive(), f"{name} waited for another period's batch"

    adm._alone_pause = pause
    assert isinstance(admit(adm, b1, "j1", 1.0, n_hard=2), int)
    assert seen == [1, 2, 2]  # each was alone in its own queue
    assert isinstance(others["k1"], int) and others["n1"] is REFUSED
    assert adm.batches == 3
    assert reservations(db) == {"j1": ("b1", MONTH, 1.0), "k1": ("b2", MONTH, 1.0)}


def test_a_lone_admission_on_sqlite_gives_the_other_threads_one_turn_and_no_more(db: Database) -> None:
    b = budget(db, "b1", 10.0)
    adm = BatchedAdmissions(db)
    # on PostgreSQL a batch of one is one statement already: it does not wait
    assert adm._alone_pause is (admission._yield_gil if db.dialect == "sqlite" else None)
    given = lambda: None  # noqa: E731
    assert BatchedAdmissions(db, alone_pause=given)._alone_pause is given
    started = time.monotonic()
    for i in range(5):
        assert isinstance(admit(adm, b, f"j{i}", 1.0), int)
    assert time.monotonic() - started < 2.5  # no sleep: five admissions well within their 5 x 0.5 s


@pytest.mark.postgres
def test_on_postgresql_an_admission_alone_or_in_a_batch_is_one_statement_in_autocommit(
    postgres_db: Database,
) -> None:
    """No BEGIN and COMMIT round trips around it: the reservation, the jobs and their events are one
    statement, atomic on its own (psycopg sends BEGIN only outside autocommit)."""
    db = postgres_db
    b = budget(db, "b1", 10.0)
    sent: list[tuple[str, bool]] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append((statement.split()[0], bool(conn.connection.dbapi_connection.autocommit)))

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        adm: BatchedAdmissions
        crowd = Crowd(lambda: adm, [lambda: admit(adm, b, "j1", 1.0)])
        adm = BatchedAdmissions(db, alone_pause=crowd.pause)
        assert isinstance(admit(adm, b, "j0", 1.0), int)  # leads a batch of two
        crowd.join()
        assert isinstance(crowd.results[0], int)
        assert sent == [("WITH", True)]
        sent.clear()
        assert isinstance(admit(adm, b, "j2", 1.0), int)  # alone (the crowd came already)
        assert sent == [("WITH", True)]
        sent.clear()
        assert admit(adm, b, "j3", 100.0) is REFUSED
        assert sent == [("WITH", True)]
        sent.clear()
        seq = adm.admit_alone(
            budget=b, n_hard=1, job=job("j4"), first_event=first_event("j4"), amount_usd=1.0, now_s=NOW
        )
        assert isinstance(seq, int) and sent == [("WITH", True)]
    finally:
        event.remove(db.engine, "before_cursor_execute", record)
    assert reserved(db, "b1") == 4.0


def test_the_others_in_a_batch_that_was_interrupted_are_told_to_decide_alone(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Interrupted(BaseException):  # not an Exception: the batch's own handler does not catch it
        pass

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise Interrupted()

    monkeypatch.setattr(admission, "insert_jobs", interrupted)
    monkeypatch.setattr(ledger, "reserve_and_insert_jobs", interrupted)
    b = budget(db, "b1", 10.0)
    adm: BatchedAdmissions
    crowd = Crowd(lambda: adm, [lambda: admit(adm, b, "j1", 1.0)])
    adm = BatchedAdmissions(db, alone_pause=crowd.pause)
    with pytest.raises(Interrupted):
        admit(adm, b, "j0", 1.0)
    crowd.join()
    assert crowd.results == {0: ALONE}  # an answer, not None: it is decided on its own next
    assert adm.queued == 0 and jobs(db) == {}
    assert isinstance(admit(adm, b, "j2", 1.0), int)  # the period is not left without a leader
