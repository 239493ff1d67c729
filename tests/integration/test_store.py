"""The store: Alembic migrations from an empty database, model/migration agreement, SQLite settings,
concurrent writers, repositories returning domain objects. SQLite and PostgreSQL both."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane_support import database_url, tiny_spec
from trainyard.services.domain import Job, Principal
from trainyard.services.jobs import JobService
from trainyard.services.lifecycle import JobState
from trainyard.services.tenants import TenantService
from trainyard.spec import spec_from_dict
from trainyard.store.db import HEAD_REVISION, Database, current_revision, table_names, upgrade
from trainyard.store.models import Base
from trainyard.store.repositories import EventRepo, JobRepo

TABLES = {"alembic_version", "api_keys", "job_events", "jobs", "pools", "step_time_measurements", "tenants"}
TABLES |= {  # cost governance
    "usage_ledger",
    "budgets",
    "budget_periods",
    "budget_reservations",
    "budget_holds",
    "governance_events",
    "tenant_limits",
    "api_key_policies",
    "rate_buckets",
}
TABLES |= {  # model registry and evaluations
    "model_versions",
    "model_aliases",
    "model_alias_events",
    "evaluations",
}
TABLES |= {  # serving
    "deployments",
    "deployment_events",
    "serving_replicas",
    "serving_requests",
    "serving_shadow_pairs",
}
TABLES |= {"dataset_versions", "run_records"}
TABLES |= {"job_metrics", "webhooks", "webhook_secrets", "alerts"}  # telemetry and alert delivery
TABLES |= {"webhook_deliveries"}  # the webhook delivery outbox
TABLES |= {"sweeps"}  # hyperparameter sweeps
TABLES |= {"settings_version"}  # admin changes announced to every server process


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    with database_url(request.param, tmp_path) as url:
        d = Database(url)
        yield d
        d.dispose()


def test_upgrade_from_empty_then_idempotent(db: Database) -> None:
    assert table_names(db.engine) == []
    assert current_revision(db.engine) is None
    db.upgrade()
    assert set(table_names(db.engine)) == TABLES
    assert current_revision(db.engine) == HEAD_REVISION
    db.upgrade()  # every start runs it again
    assert current_revision(db.engine) == HEAD_REVISION


def test_the_migrations_have_one_head_and_it_is_the_declared_one(db: Database) -> None:
    from alembic.script import ScriptDirectory

    from trainyard.store.db import alembic_config

    assert ScriptDirectory.from_config(alembic_config(db.engine)).get_heads() == [HEAD_REVISION]


def test_downgrade_to_empty_and_back(db: Database) -> None:
    db.upgrade()
    upgrade_down = __import__("alembic.command", fromlist=["downgrade"]).downgrade
    from trainyard.store.db import alembic_config

    cfg = alembic_config(db.engine)
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        upgrade_down(cfg, "base")
    assert set(table_names(db.engine)) <= {"alembic_version"}
    upgrade(db.engine)
    assert set(table_names(db.engine)) == TABLES


def test_models_match_migrations(db: Database) -> None:
    """Autogenerate finds nothing to change: the ORM models and the migration describe the same schema."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    db.upgrade()
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_sqlite_runs_in_wal_with_busy_timeout(tmp_path: Path) -> None:
    d = Database(f"sqlite:///{tmp_path / 'x.db'}")
    with d.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 30000
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
    d.dispose()


def test_concurrent_submissions_all_land(db: Database) -> None:
    db.upgrade()
    tenants = TenantService(db)
    tenant, _key = tenants.create("t1")
    who = Principal(tenant_id=tenant.id, tenant_name="t1", key_id="k", admin=False)
    jobs = JobService(db)
    spec = spec_from_dict(tiny_spec("conc"))
    errors: list[BaseException] = []
    ids: list[str] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        try:
            for i in range(15):
                job, created = jobs.submit(who, spec, idempotency_key=f"w{w}-{i % 10}")
                with lock:
                    if created:
                        ids.append(job.id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(ids) == len(set(ids)) == 8 * 10  # replays of a key return the first job
    with db.session() as s:
        assert JobRepo(s).count(tenant_id=tenant.id) == 80


def test_repositories_return_domain_objects(db: Database) -> None:
    db.upgrade()
    tenant, _ = TenantService(db).create("t2")
    who = Principal(tenant_id=tenant.id, tenant_name="t2", key_id="k", admin=False)
    job, _ = JobService(db).submit(who, spec_from_dict(tiny_spec("dom")))
    with db.session() as s:
        got = JobRepo(s).get(job.id)
        events = EventRepo(s).list(job.id)
    assert isinstance(got, Job) and got.state is JobState.PENDING and got.spec["name"] == "dom"
    assert [e.kind for e in events] == ["state"]
    with db.session() as s:
        assert JobRepo(s).get(job.id, tenant_id="someone-else") is None


def test_tenant_deletion_cascades(db: Database) -> None:
    db.upgrade()
    tenant, _ = TenantService(db).create("t3")
    who = Principal(tenant_id=tenant.id, tenant_name="t3", key_id="k", admin=False)
    JobService(db).submit(who, spec_from_dict(tiny_spec("gone")))
    with db.session() as s:
        s.execute(text("DELETE FROM tenants WHERE id = :i"), {"i": tenant.id})
    with db.session() as s:
        assert JobRepo(s).count(tenant_id=tenant.id) == 0
        assert s.execute(text("SELECT count(*) FROM job_events")).scalar() == 0


def test_batched_admission_keeps_the_state_machine_and_event_order(db: Database) -> None:
    """Admission changes many jobs per statement: jobs of the same spec share one quote, a job cancelled
    before admission is left alone, every admitted job has its events in order, and an edge missing from
    the transition table is refused before anything is written."""
    from trainyard.errors import IllegalTransitionError
    from trainyard.services.pools import local_cpu_pool

    db.upgrade()
    tenant, _ = TenantService(db).create("t4")
    who = Principal(tenant_id=tenant.id, tenant_name="t4", key_id="k", admin=False)
    jobs = JobService(db, live_pools=lambda: [local_cpu_pool(4)], with_catalog=False)
    small = spec_from_dict(tiny_spec("many"))
    huge_doc = tiny_spec("huge")
    huge_doc["model"] = {"architecture": "custom", "params_b": 70.0}
    huge_doc["resources"] = {"max_devices": 1}
    huge = spec_from_dict(huge_doc)
    ids = [jobs.submit(who, small)[0].id for _ in range(7)]
    big = [jobs.submit(who, huge)[0].id for _ in range(2)]
    cancelled = jobs.cancel(who, ids[3]).id
    with db.session() as s, pytest.raises(IllegalTransitionError):
        jobs.transition_many(s, ids, JobState.PENDING, JobState.RUNNING, "skipping the queue")
    assert jobs.admit_pending() == 8  # the cancelled job is no longer pending
    assert jobs.admit_pending() == 0
    with db.session() as s:
        repo, events = JobRepo(s), EventRepo(s)
        for job_id in ids + big:
            job = repo.get(job_id)
            assert job is not None
            kinds = [(e.kind, e.data.get("to")) for e in events.list(job_id)]
            if job_id == cancelled:
                assert job.state is JobState.CANCELLED
                assert kinds == [("state", "pending"), ("state", "cancelled")]
                continue
            want = JobState.QUEUED if job_id in ids else JobState.FAILED
            assert job.state is want, job.reason
            assert job.quote, "the quote is stored with the job"
            assert kinds == [("state", "pending"), ("quote", None), ("state", want.value)]
        # a batch transition applies only to jobs still in the source state
        assert jobs.transition_many(s, ids, JobState.QUEUED, JobState.CANCELLED, "drained") == [
            i for i in ids if i != cancelled
        ]


@pytest.mark.postgres
def test_postgres_replaces_a_pooled_connection_the_server_closed(tmp_path: Path) -> None:
    """No ping per transaction, but a pooled connection that sat idle is checked before use: after the
    server terminated every connection of the database, the next transaction still succeeds."""
    import time

    import psycopg

    from controlplane_support import PG_ADMIN_DSN
    from trainyard.store.db import PING_IF_IDLE_S

    with database_url("postgresql", tmp_path) as url:
        d = Database(url)
        try:
            d.upgrade()
            with d.session() as s:
                assert s.execute(text("SELECT 1")).scalar() == 1
            name = d.engine.url.database
            with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s",
                    (name,),
                ).fetchone()
            assert killed is not None and killed[0] >= 1
            time.sleep(PING_IF_IDLE_S + 0.2)
            with d.session() as s:
                assert s.execute(text("SELECT 2")).scalar() == 2
        finally:
            d.dispose()


def test_a_submission_leaves_pooled_connections_transactional(db: Database) -> None:
    """A submission commits on its own (on PostgreSQL in autocommit); the pooled connection it used
    still runs the next session as one transaction, so a failing use case rolls back everything."""
    db.upgrade()
    tenant, _ = TenantService(db).create("t5")
    who = Principal(tenant_id=tenant.id, tenant_name="t5", key_id="k", admin=False)
    jobs = JobService(db)
    first, created = jobs.submit(who, spec_from_dict(tiny_spec("kept")))
    assert created
    doomed = Job(
        id="job-000000000001",
        seq=0,
        tenant_id=tenant.id,
        name="doomed",
        state=JobState.PENDING,
        spec=tiny_spec("doomed"),
        created_at_s=1.0,
        updated_at_s=1.0,
        spec_sha256="x" * 64,
    )
    with pytest.raises(RuntimeError), db.session() as s:
        JobRepo(s).add(doomed, first_event=("state", {"to": "pending"}, 1.0))
        raise RuntimeError("the use case fails after its insert")
    with db.session() as s:
        assert JobRepo(s).get(doomed.id) is None
        assert EventRepo(s).list(doomed.id) == []
        assert [e.kind for e in EventRepo(s).list(first.id)] == ["state"]
        assert JobRepo(s).count(tenant_id=tenant.id) == 1


def test_devices_in_use_sums_placed_active_jobs_per_pool_and_tenant(db: Database) -> None:
    """What the scheduler's capacity and tenant device quota, the pools API and the dashboard read: only
    starting/running jobs hold devices; a queued job's old placement or a finished job's does not."""
    from trainyard.services.domain import Placement

    db.upgrade()
    tenants = TenantService(db)
    a, _ = tenants.create("ta")
    b, _ = tenants.create("tb")
    who = {t.id: Principal(tenant_id=t.id, tenant_name=t.name, key_id="k", admin=False) for t in (a, b)}
    jobs = JobService(db)
    layout = [  # (tenant, state, pool, devices)
        (a, JobState.RUNNING, "p1", 2),
        (a, JobState.STARTING, "p2", 4),
        (b, JobState.RUNNING, "p1", 8),
        (b, JobState.QUEUED, "p1", 16),  # requeued after a preemption: holds nothing
        (b, JobState.SUCCEEDED, "p2", 32),
    ]
    ids = [
        jobs.submit(who[t.id], spec_from_dict(tiny_spec(f"j{i}")))[0].id for i, (t, *_) in enumerate(layout)
    ]
    with db.session() as s:
        repo = JobRepo(s)
        assert repo.devices_in_use(by="pool") == {}
        for job_id, (_, state, pool, n) in zip(ids, layout, strict=True):
            placement = Placement(pool=pool, devices=n, market="on_demand", accelerator="cpu",
                                  price_usd_per_device_hour=1.0)  # fmt: skip
            repo.update(job_id, state=state, placement=placement)
    with db.session() as s:
        assert JobRepo(s).devices_in_use(by="pool") == {"p1": 10, "p2": 4}
        assert JobRepo(s).devices_in_use(by="tenant") == {a.id: 6, b.id: 8}
