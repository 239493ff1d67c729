"""Cost governance on real SQLite and PostgreSQL: hard budgets under concurrent submissions, the usage
ledger (tags, reconciliation, stops at a budget and resumes), rate limits, roles, key rotation, quotas."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import database_url, tiny_spec
from fakes import FakeExecutor, ManualClock
from trainyard.api.app import create_app
from trainyard.errors import BudgetExceededError
from trainyard.services.domain import Principal
from trainyard.services.jobs import reservation_amount, spec_digest
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduling import GreedyCheapestRound
from trainyard.settings import Settings
from trainyard.spec.models import JobSpec
from trainyard.tenancy.ratelimit import (
    TPM_LEASE_S,
    DatabaseBuckets,
    LeasedBuckets,
    MemoryBuckets,
    TokenBuckets,
    token_store,
)

PRICE = 3600.0  # $/device-hour on the local pool: one dollar per device-second, so sums are easy by hand
ROUNDS = 5
CONCURRENT = 100


def _platform(tmp: Path, url: str, clock: Any = None, executor: Any = None) -> Platform:
    opts = PlatformOptions(
        executor=executor,
        schedule_round=GreedyCheapestRound() if executor is not None else None,
        cpu_count=4,
        with_catalog=False,
    )
    if clock is not None:
        opts.clock = clock
    p = Platform.open(Settings(home=tmp, database_url=url), opts)
    p.pools.update("local-cpu", {"price_usd_per_device_hour": PRICE})
    return p


def _principal(p: Platform, name: str) -> Principal:
    t = p.tenants.get(name)
    with p.db.session() as s:
        from trainyard.store.governance_repo import GovernanceRepo

        governed = GovernanceRepo(s).has_budget(t.id)
    return Principal(tenant_id=t.id, tenant_name=t.name, key_id="k", admin=False, governed=governed)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_url(request.param, tmp_path) as url:
        yield url


# ---- hard budget under 100 concurrent submissions -------------------------------------------------------
def _storm(
    p: Platform, who: Principal, spec: JobSpec
) -> tuple[list[str], list[BudgetExceededError], list[BaseException]]:
    """CONCURRENT threads released together, each submitting the spec once."""
    barrier = threading.Barrier(CONCURRENT)
    created: list[str] = []
    refused: list[BudgetExceededError] = []
    other: list[BaseException] = []
    lock = threading.Lock()

    def submit() -> None:
        barrier.wait()
        try:
            job, _ = p.jobs.submit(who, spec)
            with lock:
                created.append(job.id)
        except BudgetExceededError as exc:
            with lock:
                refused.append(exc)
        except BaseException as exc:
            with lock:
                other.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(CONCURRENT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return created, refused, other


def test_hard_budget_edge_under_concurrent_submissions(db_url: str, tmp_path: Path) -> None:
    p = _platform(tmp_path / "home", db_url)
    try:
        spec = JobSpec.model_validate(tiny_spec("edge", steps=200))
        doc = spec.to_document()
        amount, basis = reservation_amount(p.jobs.quote_for(doc, spec_digest(doc)))
        assert amount > 0 and basis in ("p90", "expected")
        fits = 37
        for rnd in range(ROUNDS):
            name = f"edge-{rnd}"
            p.tenants.create(name)
            p.governance.set_budget(name, usd=amount * (fits + 0.5), hard=True)
            who = _principal(p, name)
            assert who.governed
            created, refused, other = _storm(p, who, spec)
            assert not other, other[:3]
            assert len(created) == fits and len(refused) == CONCURRENT - fits, (len(created), len(refused))
            budget = p.governance.get_budget(who, name)
            assert budget["reserved_usd"] <= budget["usd"] + 1e-6  # 0 overshoot
            assert budget["reserved_usd"] == pytest.approx(fits * amount, rel=1e-9)
            d = refused[0].details
            assert d["quote_basis"] == basis and d["limit_usd"] == pytest.approx(amount * (fits + 0.5))
            assert d["spent_usd"] + d["reserved_usd"] + d["quoted_usd"] > d["limit_usd"]
            # finished jobs give their reservations back, and room for new submissions appears
            for jid in created[:5]:
                p.jobs.cancel(who, jid)
            after = p.governance.get_budget(who, name)
            assert after["reserved_usd"] == pytest.approx((fits - 5) * amount, rel=1e-9)
            p.jobs.submit(who, spec)
    finally:
        p.close()


def _budget_reads(p: Platform) -> list[int]:
    """A counter of the statements that read a tenant's budget definitions (the admission slow path)."""
    from sqlalchemy import event

    seen = [0]

    @event.listens_for(p.db.engine, "before_cursor_execute")
    def _count(_conn: Any, _cur: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().startswith("SELECT budgets.id") and "budgets.tenant_id" in statement:
            seen[0] += 1

    return seen


def test_fast_admissions_from_cached_budgets_hold_the_edge_under_concurrency(
    db_url: str, tmp_path: Path
) -> None:
    """With the tenant's budget definitions cached, admissions reserve in one conditional statement
    (no read of the budgets; on PostgreSQL, concurrent ones in batches): 100 concurrent ones, 5 rounds,
    still admit exactly what fits."""
    p = _platform(tmp_path / "home", db_url)
    try:
        spec = JobSpec.model_validate(tiny_spec("fast-edge", steps=200))
        doc = spec.to_document()
        amount, _ = reservation_amount(p.jobs.quote_for(doc, spec_digest(doc)))
        reads = _budget_reads(p)
        fits = 41
        for rnd in range(ROUNDS):
            name = f"fast-{rnd}"
            p.tenants.create(name)
            p.governance.set_budget(name, usd=amount * (fits + 0.5), hard=True)
            who = _principal(p, name)
            p.jobs.submit(who, spec)  # the first admission reads the budgets and caches them
            before = reads[0]
            created, refused, other = _storm(p, who, spec)
            assert not other, other[:3]
            assert len(created) == fits - 1 and len(refused) == CONCURRENT - fits + 1
            # the admitted ones took the fast path; only refusals (which explain themselves) read budgets
            assert reads[0] - before == len(refused), (reads[0] - before, len(refused))
            if db_url.startswith("postgresql"):  # concurrent admissions of one budget share transactions
                assert p.jobs.admissions.batches < len(created), (p.jobs.admissions.batches, len(created))
            budget = p.governance.get_budget(who, name)
            assert budget["reserved_usd"] == pytest.approx(fits * amount, rel=1e-9)
            assert budget["reserved_usd"] <= budget["usd"] + 1e-6
    finally:
        p.close()


def test_a_lone_admission_takes_those_that_queue_while_it_pauses(db_url: str, tmp_path: Path) -> None:
    """An admission that finds no other of its budget period queued runs its pause first (on SQLite a
    yield of the GIL) and then leads everything that queued meanwhile: two submissions, one batch, one
    reservation each."""
    from trainyard.tenancy.admission import BatchedAdmissions

    p = _platform(tmp_path / "home", db_url)
    try:
        spec = JobSpec.model_validate(tiny_spec("lone", steps=200))
        doc = spec.to_document()
        amount, _ = reservation_amount(p.jobs.quote_for(doc, spec_digest(doc)))
        p.tenants.create("lone")
        p.governance.set_budget("lone", usd=amount * 10.5, hard=True)
        who = _principal(p, "lone")
        p.jobs.submit(who, spec)  # reads and caches the budget definitions: the others take the fast path
        paused = threading.Event()

        def pause() -> None:  # hold the lone leader until the second submission has queued behind it
            paused.set()
            deadline = time.monotonic() + 10
            while adm.queued < 2 and time.monotonic() < deadline:
                time.sleep(0.001)

        adm = p.jobs.admissions = BatchedAdmissions(p.db, alone_pause=pause)
        jobs: list[str] = []
        first = threading.Thread(target=lambda: jobs.append(p.jobs.submit(who, spec)[0].id))
        first.start()
        assert paused.wait(10)
        second = threading.Thread(target=lambda: jobs.append(p.jobs.submit(who, spec)[0].id))
        second.start()
        first.join(30)
        second.join(30)
        assert len(jobs) == 2 and adm.batches == 1 and adm.queued == 0
        budget = p.governance.get_budget(who, "lone")
        assert budget["reserved_usd"] == pytest.approx(3 * amount, abs=1e-5)  # the document rounds
        # the default: SQLite yields, PostgreSQL (a batch of one is one statement there) does not
        assert (BatchedAdmissions(p.db)._alone_pause is not None) == (p.db.dialect == "sqlite")
    finally:
        p.close()


def test_cached_budgets_never_admit_past_a_change_made_by_another_server(db_url: str, tmp_path: Path) -> None:
    """Two platforms on one database stand for two server processes: A has the tenant's budgets cached;
    B lowers the limit, adds a hard tag budget, makes the budget soft, raises it — every admission A
    makes afterwards obeys the change at once (no cache lifetime, no overshoot)."""
    clock = ManualClock(1_801_267_200.0)  # 2027-01-30: the test steps into the next month at its end
    a = _platform(tmp_path / "a", db_url, clock=clock)
    b = _platform(tmp_path / "b", db_url, clock=clock)
    try:
        spec = JobSpec.model_validate(tiny_spec("two", steps=200))
        doc = spec.to_document()
        amount, _ = reservation_amount(a.jobs.quote_for(doc, spec_digest(doc)))
        a.tenants.create("shared")
        a.governance.set_budget("shared", usd=amount * 10.5, hard=True)
        who = _principal(a, "shared")
        for _ in range(3):
            a.jobs.submit(who, spec)
        assert a.jobs.budget_cache.get(who.tenant_id) is not None
        # B lowers the limit to what is already reserved: A refuses the next one
        b.governance.set_budget("shared", usd=amount * 3.5, hard=True)
        with pytest.raises(BudgetExceededError):
            a.jobs.submit(who, spec)
        # B raises it again: A admits at once
        b.governance.set_budget("shared", usd=amount * 5.5, hard=True)
        a.jobs.submit(who, spec)
        # B adds a hard budget for one team that the cached definitions do not know of
        b.governance.set_budget("shared", usd=amount * 0.5, hard=True, tag="team=support")
        tagged = JobSpec.model_validate({**tiny_spec("two", steps=200), "tags": {"team": "support"}})
        with pytest.raises(BudgetExceededError) as err:
            a.jobs.submit(who, tagged)
        assert err.value.details["tag"] == "team=support"
        a.jobs.submit(who, spec)  # untagged work still has room under the tenant budget (5 of 5.5)
        with pytest.raises(BudgetExceededError):
            a.jobs.submit(who, spec)
        # B makes the tenant budget soft: nothing more is reserved against it, and A admits
        b.governance.set_budget("shared", usd=amount * 5.5, hard=False)
        reserved = a.governance.get_budget(who, "shared")["reserved_usd"]
        a.jobs.submit(who, spec)
        assert a.governance.get_budget(who, "shared")["reserved_usd"] == pytest.approx(reserved)
        # a new period (no period row yet) is reserved against from zero
        b.governance.set_budget("shared", usd=amount * 1.5, hard=True)
        with pytest.raises(BudgetExceededError):
            a.jobs.submit(who, spec)
        clock.now += 4 * 86400.0  # 2027-02
        a.jobs.submit(who, spec)
        with pytest.raises(BudgetExceededError):
            a.jobs.submit(who, spec)
        reconciled = a.governance.reconcile(
            Principal(tenant_id="x", tenant_name="default", key_id="k", admin=True)
        )
        assert reconciled["mismatches"] == []
    finally:
        a.close()
        b.close()


# ---- rate limit under 100 concurrent requests ------------------------------------------------------------
@pytest.mark.parametrize("store", ["memory", "database"])
def test_rate_limit_bucket_admits_exactly_its_burst_under_concurrency(
    db_url: str, tmp_path: Path, store: str
) -> None:
    from trainyard.store.db import Database

    db = Database(db_url)
    db.upgrade()
    buckets = MemoryBuckets() if store == "memory" else DatabaseBuckets(db)
    try:
        for rnd in range(ROUNDS):
            burst = 10 + 7 * rnd
            barrier = threading.Barrier(CONCURRENT)
            allowed: list[bool] = []
            lock = threading.Lock()
            now = 1_800_000_000.0

            def take(
                barrier: threading.Barrier = barrier,
                burst: int = burst,
                rnd: int = rnd,
                now: float = now,
                lock: threading.Lock = lock,
                allowed: list[bool] = allowed,
            ) -> None:
                barrier.wait()
                d = buckets.take(f"t:round-{rnd}", rate=0.001, burst=burst, now=now)
                with lock:
                    allowed.append(d.allowed)

            threads = [threading.Thread(target=take) for _ in range(CONCURRENT)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert sum(allowed) == burst, (sum(allowed), burst)  # 0 overshoot, none lost
            refused = buckets.take(f"t:round-{rnd}", rate=0.001, burst=burst, now=now)
            assert not refused.allowed and refused.retry_after_s == pytest.approx(1000.0, rel=1e-3)
            assert buckets.take(f"t:round-{rnd}", rate=0.001, burst=burst, now=now + 1000.0).allowed
    finally:
        db.dispose()


# ---- the ledger: tags by hand, stop at a hard budget, resume when raised -----------------------------------
def test_leased_buckets_of_two_processes_admit_exactly_the_shared_burst_under_concurrency(
    db_url: str, tmp_path: Path
) -> None:
    """Two processes (two LeasedBuckets over one database), 100 threads each, the clock still: leases of
    50 tokens are served in memory, and all together admit exactly the shared bucket's burst."""
    from trainyard.store.db import Database

    dbs = [Database(db_url), Database(db_url)]
    dbs[0].upgrade()
    stores = [LeasedBuckets(DatabaseBuckets(db)) for db in dbs]
    rate, burst, now = 1000.0, 200.0, 1_800_000_000.0
    assert stores[0].lease_size(rate, burst) == 50
    statements = [0]
    from sqlalchemy import event

    for db in dbs:

        @event.listens_for(db.engine, "before_cursor_execute")
        def _count(*_: Any) -> None:
            statements[0] += 1

    try:
        for rnd in range(ROUNDS):
            barrier = threading.Barrier(2 * CONCURRENT)
            allowed: list[bool] = []
            lock = threading.Lock()
            before = statements[0]

            def take(
                store: LeasedBuckets,
                rnd: int = rnd,
                barrier: threading.Barrier = barrier,
                lock: threading.Lock = lock,
                allowed: list[bool] = allowed,
            ) -> None:
                barrier.wait()
                for _ in range(3):
                    d = store.take(f"t:lease-{rnd}", rate=rate, burst=burst, now=now)
                    with lock:
                        allowed.append(d.allowed)

            threads = [threading.Thread(target=take, args=(st,)) for st in stores for _ in range(CONCURRENT)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert len(allowed) == 600
            assert sum(allowed) == burst, (sum(allowed), burst)  # 0 overshoot, none lost
            # the admissions cost a statement per lease, not per request (refusals ask the database)
            assert statements[0] - before <= 2 * (4 + 2 * 600 - int(burst)), statements[0] - before
    finally:
        for db in dbs:
            db.dispose()


@pytest.mark.parametrize("hold", ["lease", "request-hold"])
def test_leased_buckets_stay_within_the_documented_bound_over_time(
    db_url: str, tmp_path: Path, hold: str
) -> None:
    """Two processes alternating requests every 5 ms (simulated time) for 5 s against 100 requests/s:
    admitted between burst + rate x T (less a lease left unused) and burst + rate x (T + hold_s), and
    at most burst + rate x T + one lease per process. ``lease``: a lease is served from for LEASE_S;
    ``request-hold``: for LEASE_HOLD_S, as the request buckets of a server are (make_store)."""
    from trainyard.store.db import Database
    from trainyard.tenancy.ratelimit import LEASE_HOLD_S, LEASE_S

    dbs = [Database(db_url), Database(db_url)]
    dbs[0].upgrade()
    hold_s = LEASE_S if hold == "lease" else LEASE_HOLD_S
    stores = [LeasedBuckets(DatabaseBuckets(db), hold_s=hold_s) for db in dbs]
    rate, burst, t0, duration = 100.0, 100.0, 1_800_000_000.0, 5.0
    try:
        admitted = 0
        steps = int(duration / 0.005)
        for i in range(steps):
            now = t0 + i * 0.005
            admitted += stores[i % 2].take("t:over-time", rate=rate, burst=burst, now=now).allowed
        lease = stores[0].lease_size(rate, burst)
        upper = min(burst + rate * (duration + hold_s), burst + rate * duration + 2 * lease)
        lower = burst + rate * duration - 2 * lease
        assert lower <= admitted <= upper, (lower, admitted, upper)
        # each process takes a lease and uses one token of it; 10 s later the leases are over: a burst
        # at one instant gets the full bucket, not the bucket plus what the leases had left
        later = t0 + duration + 10.0
        for st in stores:
            assert st.take("t:over-time", rate=rate, burst=burst, now=later - 5.0).allowed
        at_once = sum(
            stores[i % 2].take("t:over-time", rate=rate, burst=burst, now=later).allowed for i in range(300)
        )
        assert at_once == burst, at_once
    finally:
        for db in dbs:
            db.dispose()


def _run(p: Platform, ex: FakeExecutor, clock: ManualClock, job_id: str, seconds: float) -> None:
    """Place, start, run for ``seconds`` of the manual clock and succeed."""
    p.tick()
    ex.emit(job_id, "started", {"rank": 0, "pid": 1, "host": "h"}, time_s=clock.now)
    p.tick()
    clock.now += seconds
    ex.emit(job_id, "succeeded", {"final_step": 1}, time_s=clock.now)
    p.tick()


def test_usage_by_tag_matches_a_hand_computation_and_reconciles(db_url: str, tmp_path: Path) -> None:
    clock = ManualClock()
    ex = FakeExecutor()
    p = _platform(tmp_path / "home", db_url, clock=clock, executor=ex)
    try:
        p.tenants.create("acme")
        p.tenants.create("other")
        who = _principal(p, "acme")
        plan = [("support", 1, 30.0), ("support", 2, 45.0), ("research", 1, 100.0), (None, 1, 7.0)]
        hand: dict[str, float] = {}
        for i, (team, devices, seconds) in enumerate(plan):
            doc = tiny_spec(f"tagged-{i}")
            doc["resources"] = {"min_devices": devices, "max_devices": devices}
            if team:
                doc["tags"] = {"team": team, "run": str(i)}
            job, _ = p.jobs.submit(who, JobSpec.model_validate(doc))
            _run(p, ex, clock, job.id, seconds)
            assert p.jobs.get(who, job.id).state.value == "succeeded"
            hand[team or "(none)"] = hand.get(team or "(none)", 0.0) + devices * seconds * PRICE / 3600.0
        other, _ = p.jobs.submit(_principal(p, "other"), JobSpec.model_validate(tiny_spec("theirs")))
        _run(p, ex, clock, other.id, 11.0)

        rows = {r["group"]: r for r in p.governance.usage(who, by="tag:team")["rows"]}
        assert {g: r["usd"] for g, r in rows.items()} == pytest.approx(hand)
        assert rows["support"]["device_hours"] == pytest.approx((30.0 + 90.0) / 3600.0, abs=1e-6)
        by_accel = p.governance.usage(who, by="accelerator")["rows"]
        assert [r["group"] for r in by_accel] == ["cpu"] and by_accel[0]["usd"] == pytest.approx(
            sum(hand.values())
        )
        # the other tenant's charge is not in acme's report; an admin sees both tenants
        admin = Principal(tenant_id="x", tenant_name="default", key_id="k", admin=True)
        tenants = {r["group"]: r["usd"] for r in p.governance.usage(admin, by="tenant")["rows"]}
        assert tenants == pytest.approx({"acme": sum(hand.values()), "other": 11.0})
        day = p.governance.usage(who, by="day")["rows"]
        assert sum(r["usd"] for r in day) == pytest.approx(sum(hand.values()))
        inv = p.governance.invoice(who)
        assert inv["total_usd"] == round(sum(hand.values()), 2)
        assert inv["by_tag"]["team"] == pytest.approx({k: v for k, v in hand.items() if k != "(none)"})
        # a date range that ends before the charges has none of them
        assert p.governance.usage(who, by="tag:team", to="2000-01-01")["rows"] == []
        report = p.governance.reconcile(admin)
        assert report["mismatches"] == [] and report["jobs_checked"] == 5
    finally:
        p.close()


def test_reconcile_fails_loudly_when_a_cost_and_the_ledger_disagree(tmp_path: Path) -> None:
    from trainyard.errors import LedgerMismatchError
    from trainyard.store.repositories import JobRepo

    clock = ManualClock()
    ex = FakeExecutor()
    p = _platform(tmp_path / "home", f"sqlite:///{tmp_path / 'db.sqlite'}", clock=clock, executor=ex)
    try:
        who = _principal(p, "default")
        job, _ = p.jobs.submit(who, JobSpec.model_validate(tiny_spec("drift")))
        _run(p, ex, clock, job.id, 20.0)
        with p.db.session() as s:
            JobRepo(s).update(job.id, cost_usd=20.02)  # a cent and more off
        admin = Principal(tenant_id="x", tenant_name="default", key_id="k", admin=True)
        with pytest.raises(LedgerMismatchError) as err:
            p.governance.reconcile(admin)
        assert err.value.details["mismatches"] == [{"job_id": job.id, "cost_usd": 20.02, "ledger_usd": 20.0}]
    finally:
        p.close()


def test_job_stopped_at_its_hard_budget_resumes_when_it_is_raised(db_url: str, tmp_path: Path) -> None:
    clock = ManualClock()
    ex = FakeExecutor()
    p = _platform(tmp_path / "home", db_url, clock=clock, executor=ex)
    try:
        p.tenants.create("capped")
        spec = JobSpec.model_validate(tiny_spec("long", steps=200))
        doc = spec.to_document()
        amount, _ = reservation_amount(p.jobs.quote_for(doc, spec_digest(doc)))
        limit = amount + 100.0  # the job fits at submission; running it longer than quoted reaches the limit
        p.governance.set_budget("capped", usd=limit, hard=True)
        who = _principal(p, "capped")
        job, _ = p.jobs.submit(who, spec)
        p.tick()
        ex.emit(job.id, "started", {"rank": 0, "pid": 1, "host": "h"}, time_s=clock.now)
        p.tick()
        assert p.jobs.get(who, job.id).state.value == "running"
        stop_at = None
        for _ in range(1000):
            clock.now += 5.0
            before = len(ex.preempted)
            p.tick()
            if len(ex.preempted) > before:
                stop_at = clock.now
                break
        assert stop_at is not None, "the budget never stopped the job"
        assert ex.preempted[-1][0] == job.id
        # the workers checkpoint and exit; the job is held, not requeued
        ex.emit(job.id, "checkpoint", {"step": 50, "path": "/ck/step-50"}, time_s=clock.now + 1)
        ex.emit(job.id, "preempted", {"step": 50}, time_s=clock.now + 2)
        clock.now += 3
        for _ in range(3):
            p.tick()
        held = p.jobs.get(who, job.id)
        assert held.state.value == "preempted" and "budget" in held.reason
        budget = p.governance.get_budget(who, "capped")
        assert budget["held_jobs"] == [job.id]
        assert budget["spent_usd"] == pytest.approx(held.cost_usd) and budget["spent_usd"] <= limit
        kinds = [e["kind"] for e in p.governance.events(who, "capped")]
        assert "budget_stop" in kinds and "budget_alert" in kinds
        alerts = [
            e["data"]["threshold_pct"]
            for e in p.governance.events(who, "capped")
            if e["kind"] == "budget_alert"
        ]
        assert alerts[:2] == [50, 80]
        # raising the budget resumes it from its checkpoint on the next round
        p.governance.set_budget("capped", usd=limit * 10, hard=True)
        assert p.jobs.get(who, job.id).state.value == "queued"
        p.tick()
        resumed = p.jobs.get(who, job.id)
        assert resumed.state.value in ("starting", "running") and resumed.attempt == 2
        assert ex.launches[-1].job_id == job.id
        admin = Principal(tenant_id="x", tenant_name="default", key_id="k", admin=True)
        assert p.governance.reconcile(admin)["mismatches"] == []
    finally:
        p.close()


# ---- API: roles, rotation, rate-limit headers, cross-tenant 404s, device quota ---------------------------
@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[Platform, TestClient, ManualClock]]:
    clock = ManualClock()
    p = _platform(tmp_path / "home", f"sqlite:///{tmp_path / 'api.db'}", clock=clock)
    app = create_app(p, access_log=False)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        yield p, c, clock
    p.close()


Api = tuple[Platform, TestClient, ManualClock]


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_viewer_keys_read_but_cannot_submit(api: Api) -> None:
    p, c, _ = api
    _, member = p.tenants.create("team-a")
    made = c.post("/v1/tenants/team-a/keys", json={"role": "viewer"}, headers=_h(member))
    assert made.status_code == 201, made.text
    viewer = made.json()["api_key"]
    assert made.json()["role"] == "viewer"
    r = c.post("/v1/jobs", json={"spec": tiny_spec()}, headers=_h(viewer))
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert c.get("/v1/jobs", headers=_h(viewer)).status_code == 200
    assert c.get("/v1/whoami", headers=_h(viewer)).json()["role"] == "viewer"
    ok = c.post("/v1/jobs", json={"spec": tiny_spec()}, headers=_h(member))
    assert ok.status_code == 201
    assert c.post(f"/v1/jobs/{ok.json()['id']}/cancel", headers=_h(viewer)).status_code == 403
    # a member key cannot mint an admin key
    assert c.post("/v1/tenants/team-a/keys", json={"role": "admin"}, headers=_h(member)).status_code == 403


def test_key_rotation_keeps_the_old_key_for_the_overlap_only(
    api: tuple[Platform, TestClient, ManualClock],
) -> None:
    p, c, clock = api
    _, old = p.tenants.create("rotor")
    old_id = c.get("/v1/tenants/rotor/keys", headers=_h(old)).json()["keys"][0]["id"]
    r = c.post(f"/v1/tenants/rotor/keys/{old_id}/rotate", json={"overlap_s": 600}, headers=_h(old))
    assert r.status_code == 201, r.text
    new = r.json()["new"]["api_key"]
    assert r.json()["old"]["expires_at"] is not None
    assert c.get("/v1/whoami", headers=_h(new)).status_code == 200
    assert c.get("/v1/whoami", headers=_h(old)).status_code == 200  # within the overlap
    clock.now += 601
    p.tenants._auth_cache.clear()
    gone = c.get("/v1/whoami", headers=_h(old))
    assert gone.status_code == 401 and "rotated" in gone.json()["error"]["message"]
    assert c.get("/v1/whoami", headers=_h(new)).status_code == 200


def test_rate_limit_answers_429_with_retry_after_and_headers(
    api: tuple[Platform, TestClient, ManualClock],
) -> None:
    p, c, clock = api
    admin = p.settings.api_key_path.read_text().strip()
    _, key = p.tenants.create("chatty")
    r = c.patch("/v1/tenants/chatty", json={"rate_limit_rps": 2, "rate_limit_burst": 5}, headers=_h(admin))
    assert r.status_code == 200 and r.json()["rate_limit_rps"] == 2
    codes = []
    for _ in range(8):
        resp = c.get("/v1/jobs", headers=_h(key))
        codes.append(resp.status_code)
    assert codes == [200] * 5 + [429] * 3
    assert resp.headers["Retry-After"] == "1" and resp.headers["X-RateLimit-Limit"] == "2"
    assert resp.json()["error"]["code"] == "rate_limited"
    clock.now += 1.0  # two tokens back
    ok = c.get("/v1/jobs", headers=_h(key))
    assert ok.status_code == 200 and ok.headers["X-RateLimit-Remaining"] == "1"
    # removing the limit
    assert c.patch("/v1/tenants/chatty", json={"rate_limit_rps": None}, headers=_h(admin)).status_code == 200
    assert all(c.get("/v1/jobs", headers=_h(key)).status_code == 200 for _ in range(10))


def test_budgets_and_usage_of_another_tenant_answer_404(
    api: tuple[Platform, TestClient, ManualClock],
) -> None:
    p, c, _ = api
    admin = p.settings.api_key_path.read_text().strip()
    _, a = p.tenants.create("alpha")
    _, b = p.tenants.create("beta")
    r = c.put("/v1/budgets/beta", json={"usd": 50, "hard": True, "tag": "team=support"}, headers=_h(admin))
    assert r.status_code == 200 and r.json()["tag"] == "team=support"
    assert c.put("/v1/budgets/beta", json={"usd": 50}, headers=_h(b)).status_code == 403  # admins set budgets
    assert c.get("/v1/budgets/beta", params={"tag": "team=support"}, headers=_h(b)).status_code == 200
    for path, params in (
        ("/v1/budgets/beta", {"tag": "team=support"}),
        ("/v1/budgets/beta/events", {}),
        ("/v1/usage", {"tenant": "beta"}),
        ("/v1/usage/invoice", {"tenant": "beta"}),
        ("/v1/budgets", {"tenant": "beta"}),
    ):
        resp = c.get(path, params=params, headers=_h(a))
        assert resp.status_code == 404, (path, resp.text)
    assert c.get("/v1/budgets", headers=_h(a)).json()["budgets"] == []
    assert c.get("/v1/usage/reconcile", headers=_h(a)).status_code == 403
    assert c.get("/v1/usage", params={"by": "colour"}, headers=_h(a)).status_code == 422


def test_device_quota_is_checked_at_submission(api: Api) -> None:
    p, c, _ = api
    admin = p.settings.api_key_path.read_text().strip()
    _, key = p.tenants.create("small")
    assert c.patch("/v1/tenants/small", json={"max_active_devices": 2}, headers=_h(admin)).status_code == 200
    spec = tiny_spec("wide")
    spec["resources"] = {"min_devices": 4}
    r = c.post("/v1/jobs", json={"spec": spec}, headers=_h(key))
    assert r.status_code == 429 and r.json()["error"]["code"] == "quota_exceeded"
    assert "trainyard tenants update small --max-active-devices 4" in r.json()["error"]["hint"]
    spec["resources"] = {"min_devices": 2}
    assert c.post("/v1/jobs", json={"spec": spec}, headers=_h(key)).status_code == 201


# ---- tokens per minute: one bucket for every server process -----------------------------------------------
def _token_stores(db_url: str, n: int = 2) -> tuple[list[Any], list[TokenBuckets]]:
    """``n`` processes' tokens-per-minute buckets over one database, as a platform builds them."""
    from trainyard.store.db import Database

    dbs = [Database(db_url) for _ in range(n)]
    dbs[0].upgrade()
    return dbs, [TokenBuckets(token_store(LeasedBuckets(DatabaseBuckets(db)))) for db in dbs]


def test_token_buckets_of_two_processes_stay_within_the_documented_bound(db_url: str, tmp_path: Path) -> None:
    """Two processes alternating requests of 200 tokens every 50 ms each (simulated time; 8x what a
    limit of 60,000 tokens/minute lets through) for 70 s, settling each with half of it: the tokens
    reserved less those given back, in all and in every 60 s window, stay within burst + rate x (T +
    TPM_LEASE_S), near that bound (neither process starves), at about one statement per lease; the
    tokens given back are admitted again (the total is near the bound, not near half of it)."""
    from sqlalchemy import event

    dbs, buckets = _token_stores(db_url)
    statements = [0]
    for db in dbs:

        @event.listens_for(db.engine, "before_cursor_execute")
        def _count(*_: Any) -> None:
            statements[0] += 1

    tpm, n, step, duration, t0 = 60_000, 200, 0.025, 70.0, 1_800_000_000.0
    rate, burst = tpm / 60.0, float(tpm)
    try:
        net: list[tuple[float, float]] = []  # (time, tokens reserved less given back)
        per_process = [0.0, 0.0]
        steps = int(duration / step)
        for i in range(steps):
            now = t0 + i * step
            b = buckets[i % 2]
            d, reserved = b.reserve("tpm:t", tokens_per_minute=tpm, n=n, now=now)
            if d.allowed:
                assert reserved == n
                b.settle("tpm:t", tokens_per_minute=tpm, reserved=reserved, used=n / 2, now=now)
                net.append((now - t0, n / 2))
                per_process[i % 2] += n / 2
            else:
                assert reserved == 0 and d.retry_after_s > 0
        total = sum(x for _, x in net)
        assert total <= burst + rate * (duration + TPM_LEASE_S), total
        assert total >= 0.95 * (burst + rate * duration), total
        assert min(per_process) >= 0.2 * total, per_process
        for start in range(0, int(duration) - 59):
            window = sum(x for t, x in net if start <= t < start + 60)
            assert window <= burst + rate * (60 + TPM_LEASE_S), (start, window)
        # under the limit (10,000 tokens/s, 8,000 asked for), requests are served from leases: about
        # one statement per process and lease, not one per request
        before, big = statements[0], 600_000
        t1 = t0 + duration + 120.0
        for i in range(steps):
            d, reserved = buckets[i % 2].reserve("tpm:u", tokens_per_minute=big, n=n, now=t1 + i * step)
            assert d.allowed
            buckets[i % 2].settle(
                "tpm:u", tokens_per_minute=big, reserved=reserved, used=n, now=t1 + i * step
            )
        assert statements[0] - before <= 2 * (duration / TPM_LEASE_S + 1) + 10, (
            statements[0] - before,
            steps,
        )
    finally:
        for db in dbs:
            db.dispose()


def test_token_buckets_of_two_processes_admit_at_most_one_bucket_under_concurrency(
    db_url: str, tmp_path: Path
) -> None:
    """Two processes, 50 threads each, the clock still: the requests admitted reserve one bucket in all
    (not one per process), less at most what is left in each lease."""
    dbs, buckets = _token_stores(db_url)
    tpm, n, now = 6_000, 30, 1_800_000_000.0  # 100 tokens/s: leases of 100 tokens
    try:
        for rnd in range(ROUNDS):
            barrier = threading.Barrier(100)
            got: list[float] = []
            lock = threading.Lock()

            def take(
                b: TokenBuckets,
                rnd: int = rnd,
                barrier: threading.Barrier = barrier,
                lock: threading.Lock = lock,
                got: list[float] = got,
            ) -> None:
                barrier.wait()
                for _ in range(3):
                    _, reserved = b.reserve(f"tpm:c{rnd}", tokens_per_minute=tpm, n=n, now=now)
                    with lock:
                        got.append(reserved)

            threads = [threading.Thread(target=take, args=(b,)) for b in buckets for _ in range(50)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert len(got) == 300
            assert tpm - 3 * n <= sum(got) <= tpm, sum(got)  # never past the one shared bucket
    finally:
        for db in dbs:
            db.dispose()


def test_platforms_on_one_database_share_the_tokens_per_minute_bucket(tmp_path: Path) -> None:
    """The gateway's buckets are the rate limiter's store: with shared buckets (here the database
    backend on SQLite) two server processes draw from one bucket; in process, each from its own."""
    url = f"sqlite:///{tmp_path / 'tpm.db'}"
    shared = [
        Platform.open(
            Settings(home=tmp_path / h, database_url=url, rate_limit_backend="database"),
            PlatformOptions(with_catalog=False),
        )
        for h in ("a", "b")
    ]
    local = Platform.open(
        Settings(home=tmp_path / "c", database_url=url), PlatformOptions(with_catalog=False)
    )
    try:
        a, b = (p.serving_gateway.token_buckets for p in shared)
        assert a.store.shared and isinstance(a.store, LeasedBuckets) and a.store.lease_s == TPM_LEASE_S
        d, _ = a.reserve("tpm:x", tokens_per_minute=600, n=600)
        assert d.allowed
        d, _ = b.reserve("tpm:x", tokens_per_minute=600, n=10)
        assert not d.allowed and d.retry_after_s >= 0.5  # the other process took the minute's tokens
        d, _ = local.serving_gateway.token_buckets.reserve("tpm:x", tokens_per_minute=600, n=600)
        assert d.allowed  # the embedded default counts in process
    finally:
        for p in (*shared, local):
            p.close()


# ---- a budget set through one server process binds the others at once ----------------------------------
@pytest.mark.parametrize("queue_quota", [None, 1000])
def test_a_first_budget_set_through_another_server_binds_the_next_submission(
    db_url: str, tmp_path: Path, queue_quota: int | None
) -> None:
    """A has the tenant's principal cached from before it had any budget (``governed`` false); B sets
    a hard budget for two jobs. A's next submissions with that principal are admitted against it: two
    fit, the third is refused, and A's caches of the tenant are forgotten."""
    a = _platform(tmp_path / "a", db_url)
    b = _platform(tmp_path / "b", db_url)
    try:
        spec = JobSpec.model_validate(tiny_spec("first", steps=200))
        doc = spec.to_document()
        amount, _ = reservation_amount(a.jobs.quote_for(doc, spec_digest(doc)))
        _, key = a.tenants.create("fresh", max_queued_jobs=queue_quota)
        who = a.tenants.authenticate(key)
        assert not who.governed and a.tenants.cached_principal(key) is who
        a.jobs.submit(who, spec)  # no budget yet: admitted, nothing reserved
        b.governance.set_budget("fresh", usd=amount * 2.5, hard=True)
        a.jobs.submit(who, spec)
        assert a.tenants.cached_principal(key) is None  # read afresh from the next request on
        a.jobs.submit(who, spec)
        with pytest.raises(BudgetExceededError):
            a.jobs.submit(who, spec)
        budget = b.governance.get_budget(who, "fresh")
        assert budget["reserved_usd"] == pytest.approx(2 * amount, abs=1e-5)
        assert a.tenants.authenticate(key).governed
    finally:
        a.close()
        b.close()
