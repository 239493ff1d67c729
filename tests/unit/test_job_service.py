"""JobService on a real SQLite file, called directly (no server): submission (the walls, the device and
queue quotas, the Idempotency-Key digest per tenant, budget reservations on the fast and the full path),
reads and cancellation scoped to the caller's tenant, state transitions, quotes and admission, and the
module's pure helpers (cursor, digest, job document, reservation amount). Numbers are worked by hand."""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from service_support import Clock, Logged, sqlite_template
from sqlalchemy import Table, event, insert, select, text
from sqlalchemy.exc import IntegrityError

from trainyard.catalog.pools import Pool
from trainyard.cost.quote import QuoteOption
from trainyard.errors import (
    BudgetExceededError,
    ConflictError,
    IllegalTransitionError,
    InvalidInputError,
    NotFoundError,
    QuotaExceededError,
    StorageNotAllowedError,
    UserCodeNotAllowedError,
)
from trainyard.services import jobs as jobs_module
from trainyard.services.domain import Job, JobEvent, Placement, Principal
from trainyard.services.jobs import (
    JobService,
    check_device_quota,
    decode_cursor,
    encode_cursor,
    job_document,
    reservation_amount,
    spec_digest,
)
from trainyard.services.lifecycle import JobState
from trainyard.spec.loader import spec_from_dict
from trainyard.spec.models import JobSpec
from trainyard.store.db import Database
from trainyard.store.governance_models import BudgetPeriodRow, BudgetReservationRow, BudgetRow
from trainyard.store.models import JobEventRow, TenantRow
from trainyard.store.repositories import JobRepo, insert_jobs
from trainyard.tenancy import ledger
from trainyard.tenancy.admission import BatchedAdmissions
from trainyard.tenancy.storage import StoragePolicy

MID = 1796083200.0 + 14 * 86400.0  # 2026-12-15T00:00:00Z
MONTH = "2026-12"
BUDGETS = cast(Table, BudgetRow.__table__)
PERIODS = cast(Table, BudgetPeriodRow.__table__)
RESERVATIONS = cast(Table, BudgetReservationRow.__table__)
TENANTS = cast(Table, TenantRow.__table__)
JOB_ID = re.compile(r"^job-[0-9a-f]{12}$")
STORE = "s3://bucket/store"


@pytest.fixture(autouse=True)
def _statements_built_by_each_test(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger, "_BUILT", {})
    monkeypatch.setattr(ledger, "_BATCH_STATEMENTS", {})


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sqlite_template(
        tmp_path_factory.mktemp("jobs") / "template.sqlite", [("t1", "acme"), ("t2", "beta")]
    )


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Logged:
    out = Logged()
    monkeypatch.setattr(jobs_module, "log", out)
    return out


def option(
    pool: str = "cpu",
    cost: float = 2.0,
    *,
    feasible: bool = True,
    reason: str = "",
    hours: float = 1.0,
    p90_hours: float = 0.0,
    step_time_s: float = 1.0,
) -> QuoteOption:
    return QuoteOption(
        accelerator="cpu", devices=1, cloud=None, region="local", instance_type=None, market="on_demand",
        step_time_s=step_time_s, price_usd_per_hour=cost / hours, usd_per_step=0.01, expected_hours=hours,
        expected_cost_usd=cost, preemption_overhead_usd=0.0, checkpoint_interval_s=60.0, feasible=feasible,
        reason=reason, pool=pool, nodes=1, expected_hours_p90=p90_hours,
    )  # fmt: skip


def pool(name: str, price: float = 1.0) -> Pool:
    return Pool(
        name=name, accelerator="cpu", devices_per_node=4, nodes=1, market="on_demand",
        price_usd_per_device_hour=price, region="local",
    )  # fmt: skip


Quote = list[QuoteOption] | Exception | Callable[[JobSpec, list[Pool]], list[QuoteOption]]


class Env:
    def __init__(self, path: Path, **kw: Any) -> None:
        self.db = Database(f"sqlite:///{path}")
        self.clock = Clock(MID)
        self.pools = [pool("cpu")]
        self.quotes: dict[str, Quote] = {}
        self.calls: list[tuple[str, list[str]]] = []
        self.jobs = JobService(
            self.db,
            quoter=self.quoter,
            live_pools=lambda: list(self.pools),
            clock=self.clock,
            with_catalog=False,
            **kw,
        )

    def quoter(self, spec: JobSpec, pools: Any) -> list[Any]:
        self.calls.append((spec.name, [p.name for p in pools]))
        q = self.quotes.get(spec.name, [option()])
        if isinstance(q, Exception):
            raise q
        if callable(q):
            return q(spec, list(pools))
        return list(q)

    def budget(
        self, limit: float, *, tenant: str = "t1", hard: bool = True, tag: tuple[str, str] = ("", "")
    ) -> str:
        bid = f"bud-{tenant}-{tag[0]}{tag[1]}-{int(hard)}"
        with self.db.engine.begin() as c:
            c.execute(
                insert(BUDGETS),
                {
                    "id": bid, "tenant_id": tenant, "tag_key": tag[0], "tag_value": tag[1], "period": "month",
                    "limit_usd": limit, "hard": hard, "created_at_s": 1.0, "updated_at_s": 1.0,
                },
            )  # fmt: skip
        return bid

    def reserved(self, budget_id: str) -> float:
        with self.db.engine.connect() as c:
            return ledger.period_state(c, budget_id, MONTH)[1]

    def reservations(self) -> dict[str, float]:
        with self.db.engine.connect() as c:
            rows = c.execute(select(RESERVATIONS.c.job_id, RESERVATIONS.c.remaining_usd)).all()
        return {str(j): float(r) for j, r in rows}

    def events(self, job_id: str) -> list[tuple[str, dict[str, Any]]]:
        _, events = self.jobs.get_with_events(who(), job_id)
        return [(e.kind, e.data) for e in events]


@pytest.fixture
def env(template: Path, tmp_path: Path) -> Iterator[Env]:
    path = tmp_path / "db.sqlite"
    shutil.copy(template, path)
    e = Env(path)
    yield e
    e.db.dispose()


def who(tenant: str = "t1", **kw: Any) -> Principal:
    return Principal(
        tenant_id=tenant, tenant_name={"t1": "acme", "t2": "beta"}[tenant], key_id="k", admin=False, **kw
    )


def spec(name: str = "tiny", **over: Any) -> JobSpec:
    doc: dict[str, Any] = {
        "apiVersion": "trainyard/v1",
        "kind": "TrainingJob",
        "name": name,
        "model": {"architecture": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 256},
        "workload": {"seq_len": 64, "global_batch": 4, "steps": 20, "precision": "fp32"},
        "requirements": {"allow": ["cpu"]},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return spec_from_dict(doc)


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


# ---- pure helpers ------------------------------------------------------------------------------------
def test_the_spec_digest_is_the_sha256_of_the_sorted_compact_json() -> None:
    assert spec_digest({"b": 1, "a": [1, "x"]}) == hashlib.sha256(b'{"a":[1,"x"],"b":1}').hexdigest()
    assert spec_digest({"a": [1, "x"], "b": 1}) == spec_digest({"b": 1, "a": [1, "x"]})
    assert spec_digest({"a": 1}) != spec_digest({"a": 2})


def test_a_cursor_is_the_unpadded_base64url_of_its_sequence() -> None:
    assert encode_cursor(5) == "czo1"  # "s:5", no padding needed
    assert encode_cursor(10) == "czoxMA"  # "s:10" is "czoxMA==" padded
    assert encode_cursor(1234) == "czoxMjM0"
    for seq in (0, 5, 10, 12345, 2**63 - 1):
        assert decode_cursor(encode_cursor(seq)) == seq
    assert decode_cursor("czoxMA") == 10


@pytest.mark.parametrize(
    "cursor",
    [b64("x:5"), b64("s:-1"), b64(f"s:{2**63}"), b64("s:abc"), b64("s:"), "__4", "", b64("S:5")],
)
def test_a_cursor_this_server_did_not_issue_is_refused(cursor: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        decode_cursor(cursor)
    assert err.value.message == "cursor is not one this server issued"
    assert err.value.hint == "Pass the next_cursor value from the previous page unchanged."
    assert err.value.details == {"errors": [{"field": "cursor", "message": "invalid cursor"}]}
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_the_job_document_names_each_field_of_the_contract() -> None:
    job = Job(
        id="job-1", seq=3, tenant_id="t1", name="tiny", state=JobState.RUNNING, spec={"name": "tiny"},
        created_at_s=MID, updated_at_s=MID + 1.5, attempt=2,
        placement=Placement(
            pool="cpu", devices=2, market="spot", accelerator="cpu", price_usd_per_device_hour=0.5
        ),
        quote=[{"pool": "cpu"}], cost_usd=1.23456789,
        checkpoints=[{"step": 10, "path": "s3://b/c", "bytes": 99}],
        workers=[{"rank": 0, "pid": 42, "host": "h", "port": 1}],
        result={"loss": 1.5, "model_sha256": "abc", "model_version": "v3"},
        reason="why", progress={"step": 10},
    )  # fmt: skip
    events = [JobEvent(id=7, job_id="job-1", kind="state", data={"to": "running"}, time_s=MID)]
    doc = job_document(job, events)
    assert doc == {
        "id": "job-1",
        "name": "tiny",
        "state": "running",
        "placement": {
            "pool": "cpu",
            "devices": 2,
            "market": "spot",
            "accelerator": "cpu",
            "price_usd_per_device_hour": 0.5,
            "expected_cost_usd": None,
            "checkpoint_interval_s": None,
            "reason": "",
        },
        "cost_usd": 1.234568,
        "checkpoints": [{"step": 10, "path": "s3://b/c"}],
        "workers": [{"rank": 0, "pid": 42, "host": "h"}],
        "events": [{"id": 7, "kind": "state", "time": "2026-12-15T00:00:00Z", "data": {"to": "running"}}],
        "result": {"model_version": "v3", "model_sha256": "abc", "loss": 1.5},
        "attempt": 2,
        "reason": "why",
        "progress": {"step": 10},
        "quote": [{"pool": "cpu"}],
        "created_at": "2026-12-15T00:00:00Z",
        "updated_at": "2026-12-15T00:00:01.500000Z",
        "spec": {"name": "tiny"},
    }
    assert list(doc["result"]) == ["model_version", "model_sha256", "loss"]
    bare = Job(id="j", seq=1, tenant_id="t1", name="n", state=JobState.PENDING, spec={}, created_at_s=0.0,
               updated_at_s=0.0, result={"loss": 2.0})  # fmt: skip
    short = job_document(bare, include_spec=False)
    assert "spec" not in short
    assert short["events"] == [] and short["placement"] is None
    assert short["result"] == {"model_version": None, "model_sha256": None, "loss": 2.0}
    assert job_document(replace_result(bare, None))["result"] is None


def replace_result(job: Job, result: dict[str, Any] | None) -> Job:
    from dataclasses import replace

    return replace(job, result=result)


def test_a_reservation_is_the_p90_cost_of_the_best_feasible_option_else_its_expected_cost() -> None:
    assert reservation_amount(InvalidInputError("x")) == (0.0, "none")
    assert reservation_amount([]) == (0.0, "none")
    assert reservation_amount([{"feasible": False, "expected_cost_p90_usd": 5.0}]) == (0.0, "none")
    q = [
        {"feasible": False, "expected_cost_usd": 1.0, "expected_cost_p90_usd": 1.5},
        {"feasible": True, "expected_cost_usd": 2.0, "expected_cost_p90_usd": 3.0},
        {"feasible": True, "expected_cost_usd": 9.0, "expected_cost_p90_usd": 10.0},
    ]
    assert reservation_amount(q) == (3.0, "p90")
    assert reservation_amount(
        [{"feasible": True, "expected_cost_usd": 2.0, "expected_cost_p90_usd": None}]
    ) == (
        2.0,
        "expected",
    )
    assert reservation_amount(
        [{"feasible": True, "expected_cost_usd": 2.0, "expected_cost_p90_usd": 0.0}]
    ) == (
        2.0,
        "expected",
    )
    assert reservation_amount([{"feasible": True, "expected_cost_usd": "2.5"}]) == (2.5, "expected")
    assert reservation_amount([{"feasible": True, "expected_cost_usd": None}]) == (0.0, "expected")
    assert reservation_amount([{"feasible": True, "expected_cost_p90_usd": "0.25"}]) == (0.25, "p90")


def test_the_device_quota_refuses_a_job_that_could_never_start() -> None:
    capped = who(max_active_devices=2)
    check_device_quota(capped, spec(resources={"min_devices": 2}))
    check_device_quota(capped, spec())  # no minimum
    check_device_quota(who(), spec(resources={"min_devices": 64}))  # no quota
    with pytest.raises(QuotaExceededError) as err:
        check_device_quota(capped, spec(resources={"min_devices": 3}))
    assert err.value.message == (
        "the job needs at least 3 devices but tenant 'acme' may hold at most 2 (quota max_active_devices); "
        "it could never start"
    )
    assert err.value.hint == (
        "Lower resources.min_devices to 2 or less, or ask an admin to raise the quota with "
        "`trainyard tenants update acme --max-active-devices 3`."
    )
    assert err.value.details == {"min_devices": 3, "max_active_devices": 2}


# ---- submission ----------------------------------------------------------------------------------------
def test_a_submission_is_stored_pending_with_its_first_event(env: Env) -> None:
    s = spec()
    told: list[str] = []
    env.jobs.on_governed = told.append
    job, created = env.jobs.submit(who(), s, "key-1")
    assert created is True
    assert env.calls == [] and told == []  # no budget: not quoted, and no budget was found
    assert JOB_ID.match(job.id), job.id
    assert (job.tenant_id, job.name, job.state, job.idempotency_key) == (
        "t1",
        "tiny",
        JobState.PENDING,
        "key-1",
    )
    assert job.spec == s.to_document()
    assert job.spec_sha256 == spec_digest(s.to_document())
    assert job.created_at_s == job.updated_at_s == MID
    assert job.seq > 0
    stored, events = env.jobs.get_with_events(who(), job.id)
    assert stored == job
    assert [(e.kind, e.data, e.time_s) for e in events] == [
        ("state", {"from": None, "to": "pending", "reason": "submitted"}, MID)
    ]
    env.clock.now += 5
    second, _ = env.jobs.submit(who(), s)
    assert second.seq > job.seq and second.id != job.id
    assert second.created_at_s == MID + 5 and second.idempotency_key is None


def test_the_spec_resolver_fills_in_a_base_model_and_without_one_a_bare_base_is_refused(env: Env) -> None:
    bare = spec(model={"architecture": "decoder", "base": "llama@1", "n_layers": None, "d_model": None,
                       "n_heads": None, "vocab_size": None})  # fmt: skip
    assert bare.model.needs_base_shape
    with pytest.raises(InvalidInputError) as err:
        env.jobs.submit(who(), bare)
    assert (
        err.value.message == "model: the shape fields are missing and no model registry resolves model.base"
    )
    assert err.value.details == {"errors": [{"field": "model", "message": "shape fields missing"}]}
    seen: list[tuple[str, str]] = []

    def resolver(p: Principal, s: JobSpec) -> JobSpec:
        seen.append((p.tenant_id, s.name))
        return spec("resolved")

    env.jobs.spec_resolver = resolver
    job, _ = env.jobs.submit(who(), bare)
    assert seen == [("t1", "tiny")]
    assert job.name == "resolved" and job.spec == spec("resolved").to_document()
    # a full spec goes through the resolver too
    env.jobs.submit(who("t2"), spec("full"))
    assert seen[-1] == ("t2", "full")


def test_the_data_resolver_pins_the_document_that_is_stored_and_digested(
    template: Path, tmp_path: Path
) -> None:
    def pin(p: Principal, doc: dict[str, Any]) -> dict[str, Any]:
        return {**doc, "tags": {"pinned-for": p.tenant_name}}

    shutil.copy(template, tmp_path / "db.sqlite")
    env = Env(tmp_path / "db.sqlite", resolve_data=pin)
    try:
        job, _ = env.jobs.submit(who(), spec())
        assert job.spec["tags"] == {"pinned-for": "acme"}
        assert job.spec_sha256 == spec_digest(job.spec) != spec_digest(spec().to_document())
    finally:
        env.db.dispose()


def test_the_same_idempotency_key_and_spec_answers_the_first_job(env: Env) -> None:
    first, created = env.jobs.submit(who(), spec(), "k")
    again, created_again = env.jobs.submit(who(), spec(), "k")
    assert (created, created_again) == (True, False)
    assert again == first
    assert [j.id for j in env.jobs.list(who()).jobs] == [first.id]


def test_the_same_idempotency_key_with_another_spec_is_a_conflict(env: Env) -> None:
    first, _ = env.jobs.submit(who(), spec(), "k")
    with pytest.raises(ConflictError) as err:
        env.jobs.submit(who(), spec(workload={"steps": 21}), "k")
    assert err.value.message == "this Idempotency-Key was already used with a different job spec"
    assert err.value.hint == "Use a new Idempotency-Key for a different job, or resend the original spec."
    assert err.value.details == {"job_id": first.id}
    assert len(env.jobs.list(who()).jobs) == 1


def test_an_idempotency_key_belongs_to_its_tenant(env: Env) -> None:
    mine, _ = env.jobs.submit(who(), spec(), "k")
    theirs, created = env.jobs.submit(who("t2"), spec(workload={"steps": 99}), "k")
    assert created and theirs.id != mine.id and theirs.tenant_id == "t2"
    # without a key, each submission is a new job
    a, _ = env.jobs.submit(who(), spec())
    b, _ = env.jobs.submit(who(), spec())
    assert a.id != b.id


def test_a_failed_insert_that_is_not_a_replay_is_not_swallowed(env: Env) -> None:
    ghost = Principal(tenant_id="t9", tenant_name="ghost", key_id="k", admin=False)  # no such tenant row
    with pytest.raises(IntegrityError):
        env.jobs.submit(ghost, spec())
    with pytest.raises(IntegrityError):
        env.jobs.submit(ghost, spec(), "k")  # no job holds the key: not a replay


def test_a_resend_is_answered_even_at_the_queue_quota_and_a_changed_spec_is_still_a_conflict(
    env: Env,
) -> None:
    capped = who(max_queued_jobs=1)
    first, _ = env.jobs.submit(capped, spec(), "k")
    assert env.jobs.submit(capped, spec(), "k") == (first, False)
    with pytest.raises(ConflictError) as err:
        env.jobs.submit(capped, spec(workload={"steps": 21}), "k")
    assert err.value.details == {"job_id": first.id}
    with pytest.raises(QuotaExceededError):
        env.jobs.submit(capped, spec(), "other-key")
    # another tenant's key of the same name is its own
    theirs, created = env.jobs.submit(who("t2", max_queued_jobs=1), spec(), "k")
    assert created and theirs.id != first.id


def test_the_queue_quota_counts_the_tenants_open_jobs_only(env: Env) -> None:
    for _ in range(3):
        env.jobs.submit(who("t2"), spec())
    capped = who(max_queued_jobs=2)
    a, _ = env.jobs.submit(capped, spec())
    assert env.calls == []  # no budget applies: nothing is quoted at submission
    b, _ = env.jobs.submit(capped, spec())
    with pytest.raises(QuotaExceededError) as err:
        env.jobs.submit(capped, spec())
    assert err.value.message == "tenant 'acme' already has 2 unfinished jobs (quota 2)"
    assert env.events(a.id) == [("state", {"from": None, "to": "pending", "reason": "submitted"})]
    env.jobs.cancel(capped, a.id)  # a finished job holds no place in the queue
    c, created = env.jobs.submit(capped, spec())
    assert created
    with env.db.session() as s:  # queued, starting, running and preempted jobs count as open
        env.jobs.transition(s, env.jobs.get(capped, b.id), JobState.QUEUED, "admitted")
    with pytest.raises(QuotaExceededError):
        env.jobs.submit(capped, spec())
    assert {j.id for j in env.jobs.list(capped).jobs} == {a.id, b.id, c.id}


def test_the_device_quota_is_checked_at_submission_and_nothing_is_stored(env: Env) -> None:
    with pytest.raises(QuotaExceededError):
        env.jobs.submit(who(max_active_devices=2), spec(resources={"min_devices": 3}))
    assert env.jobs.list(who()).jobs == []
    job, _ = env.jobs.submit(who(max_active_devices=2), spec(resources={"min_devices": 2}))
    assert job.spec["resources"]["min_devices"] == 2


def test_user_code_runs_only_for_tenants_allowed_to(env: Env) -> None:
    code = spec(entrypoint={"command": ["python", "train.py"]})
    with pytest.raises(UserCodeNotAllowedError) as err:
        env.jobs.submit(who(), code)
    assert err.value.message == "tenant 'acme' may not run its own code (entrypoint)"
    assert err.value.details == {"errors": [{"field": "entrypoint", "message": "user code is not allowed"}]}
    assert env.jobs.list(who()).jobs == []
    job, _ = env.jobs.submit(who(allow_user_code=True), code)
    assert job.spec["entrypoint"]["command"] == ["python", "train.py"]


def test_storage_outside_the_tenants_roots_is_refused_field_by_field_in_one_error(
    template: Path, tmp_path: Path
) -> None:
    shutil.copy(template, tmp_path / "db.sqlite")
    env = Env(tmp_path / "db.sqlite", storage_policy=StoragePolicy(STORE))
    try:
        everything = spec(
            checkpoint={"storage": f"{STORE}/tenants/beta/ckpt"},
            workload={"dataset": "s3://elsewhere/data.jsonl"},
            model={"base": "s3://elsewhere/model"},
            entrypoint={"command": ["python"], "code": "s3://elsewhere/code.tar"},
        )
        why = "outside the storage this tenant may use"
        with pytest.raises(StorageNotAllowedError) as err:
            env.jobs.submit(who(allow_user_code=True), everything)
        assert err.value.message == f"checkpoint.storage: {why} (and 3 more)"
        assert err.value.details == {
            "errors": [
                {"field": "checkpoint.storage", "message": why},
                {"field": "workload.dataset", "message": why},
                {"field": "model.base", "message": why},
                {"field": "entrypoint.code", "message": why},
            ]
        }
        with pytest.raises(StorageNotAllowedError) as one:
            env.jobs.submit(who(), spec(workload={"dataset": "s3://elsewhere/data.jsonl"}))
        assert one.value.message == f"workload.dataset: {why}"
        with pytest.raises(StorageNotAllowedError) as two:
            env.jobs.submit(who(), spec(workload={"dataset": "s3://elsewhere/d"}, model={"base": "s3://e/m"}))
        assert two.value.message == f"workload.dataset: {why} (and 1 more)"
        assert env.jobs.list(who()).jobs == []
        # inside its namespace or a granted root: accepted, the checkpoint storage in canonical form
        fine = spec(
            checkpoint={"storage": f"{STORE}/tenants/acme//ckpt/run/"},
            workload={"dataset": "s3://granted/data.jsonl"},
            model={"base": f"{STORE}/tenants/acme/models/base"},
            entrypoint={"command": ["python"], "code": f"{STORE}/tenants/acme/code/a.tar"},
        )
        job, _ = env.jobs.submit(who(allow_user_code=True, storage_roots=("s3://granted",)), fine)
        assert job.spec["checkpoint"]["storage"] == f"{STORE}/tenants/acme/ckpt/run"
        assert job.spec["workload"]["dataset"] == "s3://granted/data.jsonl"
        # a registered dataset and a registered model are named by id, not checked as storage
        named, _ = env.jobs.submit(
            who(), spec(workload={"dataset": "ds://chat@3"}, model={"base": "llama@1"})
        )
        assert named.spec["workload"]["dataset"] == "ds://chat@3" and named.spec["model"]["base"] == "llama@1"
        # no storage named at all: the document as it is
        plain, _ = env.jobs.submit(who(), spec())
        assert plain.spec == spec().to_document()
    finally:
        env.db.dispose()


def test_a_refusal_without_field_details_is_reported_under_its_field(env: Env) -> None:
    class Terse:  # a storage policy whose refusals name no field
        def check(self, tenant: str, url: str, *, extra_roots: Any = (), purpose: str) -> str:
            raise StorageNotAllowedError("not here")

    env.jobs.storage_policy = cast(StoragePolicy, Terse())
    with pytest.raises(StorageNotAllowedError) as err:
        env.jobs.submit(who(), spec(checkpoint={"storage": "s3://x/y"}))
    assert err.value.message == "checkpoint.storage: not here"
    assert err.value.details == {"errors": [{"field": "checkpoint.storage", "message": "not here"}]}


def test_a_submission_without_a_span_is_the_root_of_its_trace(env: Env) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    env.jobs.tracer = provider.get_tracer("t")
    job, created = env.jobs.submit(who(), spec(), "k")
    assert created
    (span,) = exporter.get_finished_spans()
    assert span.name == "job.submit"
    assert dict(span.attributes or {}) == {
        "trainyard.tenant": "acme",
        "trainyard.job_id": job.id,
        "trainyard.created": True,
    }
    ctx = span.get_span_context()
    (event,) = env.events(job.id)
    assert event[1]["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    exporter.clear()
    again, created = env.jobs.submit(who(), spec(), "k")
    assert (again.id, created) == (job.id, False)
    assert dict(exporter.get_finished_spans()[0].attributes or {})["trainyard.created"] is False


def test_a_submission_inside_a_request_span_joins_it(env: Env) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    env.jobs.tracer = tracer
    with tracer.start_as_current_span("POST /v1/jobs"):
        job, created = env.jobs.submit(who(), spec(), "k")
    assert created
    (span,) = exporter.get_finished_spans()
    assert span.name == "POST /v1/jobs"
    assert dict(span.attributes or {}) == {"trainyard.job_id": job.id}
    ctx = span.get_span_context()
    assert (
        env.events(job.id)[0][1]["traceparent"]
        == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    )
    with tracer.start_as_current_span("POST /v1/jobs"):  # a resend inside its own request span
        assert env.jobs.submit(who(), spec(), "k") == (job, False)


def test_without_a_tracer_or_a_span_the_first_event_has_no_traceparent(env: Env) -> None:
    job, _ = env.jobs.submit(who(), spec())
    assert env.events(job.id) == [("state", {"from": None, "to": "pending", "reason": "submitted"})]


# ---- budgets -------------------------------------------------------------------------------------------
def test_a_governed_submission_reserves_its_p90_cost_and_is_refused_past_a_hard_budget(env: Env) -> None:
    bid = env.budget(10.0)
    env.quotes["tiny"] = [option(cost=2.0, hours=1.0, p90_hours=1.5)]  # p90 cost 3.0
    governed = who(governed=True)
    first, _ = env.jobs.submit(governed, spec())  # full path: reads and caches the budgets
    assert env.reserved(bid) == pytest.approx(3.0)
    assert env.jobs.admissions.batches == 0
    second, _ = env.jobs.submit(governed, spec())  # fast path from the cached budgets
    assert env.jobs.admissions.batches == 1
    third, _ = env.jobs.submit(governed, spec())
    assert env.reserved(bid) == pytest.approx(9.0)
    assert env.reservations() == pytest.approx({first.id: 3.0, second.id: 3.0, third.id: 3.0})
    assert env.calls == [("tiny", ["cpu"])]  # one quote for the one spec
    with pytest.raises(BudgetExceededError) as err:
        env.jobs.submit(governed, spec())
    assert err.value.message == (
        "the job's quoted cost $3.00 (p90) would pass the month budget of tenant 'acme': "
        "$0.00 spent + $9.00 reserved of $10.00"
    )
    assert len(env.jobs.list(governed).jobs) == 3
    # a job that ends gives its reservation back
    env.jobs.cancel(governed, first.id)
    assert env.reserved(bid) == pytest.approx(6.0)
    assert first.id not in env.reservations()


def test_without_a_p90_the_expected_cost_is_reserved_each_spec_its_own(env: Env) -> None:
    bid = env.budget(10.0)
    env.quotes["tiny"] = [option(cost=2.5)]
    env.quotes["big"] = [option(cost=5.0)]
    small, _ = env.jobs.submit(who(governed=True), spec())
    big, _ = env.jobs.submit(who(governed=True), spec("big"))
    assert env.reservations() == pytest.approx({small.id: 2.5, big.id: 5.0})
    assert env.reserved(bid) == pytest.approx(7.5)


def test_a_resend_to_a_governed_tenant_reserves_nothing_again(env: Env) -> None:
    bid = env.budget(6.0)
    env.quotes["tiny"] = [option(cost=3.0)]
    governed = who(governed=True)
    first, _ = env.jobs.submit(governed, spec(), "k")
    assert env.jobs.submit(governed, spec(), "k") == (first, False)  # fast path: its insert is the replay
    assert env.reserved(bid) == pytest.approx(3.0)
    second, _ = env.jobs.submit(governed, spec(), "k2")
    assert env.reserved(bid) == pytest.approx(6.0)
    # the budget is full now: a resend is still answered with its job
    assert env.jobs.submit(governed, spec(), "k2") == (second, False)
    with pytest.raises(ConflictError):
        env.jobs.submit(governed, spec(workload={"steps": 21}), "k")
    assert env.reserved(bid) == pytest.approx(6.0)
    assert set(env.reservations()) == {first.id, second.id}


def test_a_tagged_budget_reserves_only_for_the_jobs_with_its_tag(env: Env) -> None:
    bid = env.budget(4.0, tag=("team", "a"))
    env.quotes["tiny"] = [option(cost=3.0)]
    governed = who(governed=True)
    other, _ = env.jobs.submit(governed, spec(tags={"team": "b"}))
    mine, _ = env.jobs.submit(governed, spec(tags={"team": "a"}))
    assert env.reservations() == pytest.approx({mine.id: 3.0})
    with pytest.raises(BudgetExceededError):
        env.jobs.submit(governed, spec(tags={"team": "a"}))
    env.jobs.submit(governed, spec(tags={"team": "b"}))  # the budget does not apply
    assert env.reserved(bid) == pytest.approx(3.0)
    assert other.id not in env.reservations()


class Transactions:
    """Counts the transactions begun on an engine, and the calls of the full reservation path."""

    def __init__(self, env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
        self.begun = 0
        self.full_path = 0
        event.listen(env.db.engine, "begin", self._begin)
        real = ledger.reserve

        def reserve(*args: Any, **kw: Any) -> Any:
            self.full_path += 1
            return real(*args, **kw)

        monkeypatch.setattr(ledger, "reserve", reserve)

    def _begin(self, _conn: Any) -> None:
        self.begun += 1

    def reset(self) -> None:
        self.begun = self.full_path = 0


def test_an_admission_from_cached_budgets_is_one_transaction_without_the_full_path(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    bid = env.budget(10.0, tag=("team", "a"))
    env.quotes["tiny"] = [option(cost=3.0)]
    governed = who(governed=True)
    tx = Transactions(env, monkeypatch)
    first, _ = env.jobs.submit(governed, spec(tags={"team": "a"}))  # reads the budgets, opens the period
    assert tx.full_path == 1
    tx.reset()
    second, created = env.jobs.submit(governed, spec(tags={"team": "a"}))
    assert created
    assert (tx.begun, tx.full_path) == (1, 0)
    assert env.reservations() == pytest.approx({first.id: 3.0, second.id: 3.0})
    assert env.reserved(bid) == pytest.approx(6.0)
    assert env.events(second.id) == [("state", {"from": None, "to": "pending", "reason": "submitted"})]


def test_admissions_that_queue_together_but_do_not_fit_together_are_decided_one_by_one(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    bid = env.budget(8.0)
    env.quotes["tiny"] = [option(cost=3.0)]
    governed = who(governed=True)
    env.jobs.submit(governed, spec())  # 3 of 8 reserved; the budgets cached
    results: list[Any] = []

    def submit_another() -> None:
        try:
            results.append(env.jobs.submit(governed, spec())[0])
        except Exception as exc:
            results.append(exc)

    other = threading.Thread(target=submit_another)

    def let_the_other_queue() -> None:  # the first admission waits for the second to queue behind it
        if other.ident is not None:
            return
        other.start()
        deadline = time.monotonic() + 30
        while env.jobs.admissions.queued < 2:
            assert time.monotonic() < deadline, "the second admission never queued"
            time.sleep(0.001)

    env.jobs.admissions = BatchedAdmissions(env.db, alone_pause=let_the_other_queue)
    tx = Transactions(env, monkeypatch)
    submit_another()
    other.join(30)
    # together 3 + 6 > 8: the batch writes nothing; alone, one fits and the other is refused (and told why
    # by the full path)
    assert env.jobs.admissions.batches == 1
    jobs = [r for r in results if isinstance(r, Job)]
    refused = [r for r in results if isinstance(r, BudgetExceededError)]
    assert (len(jobs), len(refused)) == (1, 1), results
    assert tx.full_path == 1
    assert env.reserved(bid) == pytest.approx(6.0)
    assert env.events(jobs[0].id) == [("state", {"from": None, "to": "pending", "reason": "submitted"})]
    assert len(env.jobs.list(governed).jobs) == 2


def test_a_budget_set_since_the_principal_was_read_binds_the_submission(env: Env) -> None:
    bid = env.budget(10.0)
    env.quotes["tiny"] = [option(cost=4.0)]
    unseen, _ = env.jobs.submit(who(), spec())  # found governed with nobody to tell: reserved all the same
    assert env.reservations() == pytest.approx({unseen.id: 4.0})
    told: list[tuple[str, Any]] = []
    env.jobs.on_governed = lambda tenant_id: told.append((tenant_id, env.jobs.budget_cache.get(tenant_id)))
    env.jobs.budget_cache.put("t1", [])
    job, created = env.jobs.submit(who(), spec())  # the principal still says: no budget
    assert created
    assert told == [("t1", None)]  # the tenant's cached budgets were forgotten before it was told
    assert env.reservations() == pytest.approx({unseen.id: 4.0, job.id: 4.0})
    assert env.reserved(bid) == pytest.approx(8.0)


def test_a_budget_set_since_the_principal_was_read_binds_a_quota_checked_submission(env: Env) -> None:
    bid = env.budget(5.0)
    env.quotes["tiny"] = [option(cost=4.0)]
    told: list[str] = []
    env.jobs.on_governed = told.append
    capped = who(max_queued_jobs=5)
    job, _ = env.jobs.submit(capped, spec(), "k")
    assert told == ["t1"]
    assert env.reserved(bid) == pytest.approx(4.0)
    assert job.idempotency_key == "k"  # the key is kept when the submission is taken again, governed
    assert env.jobs.submit(capped, spec(), "k") == (job, False)
    with pytest.raises(BudgetExceededError):
        env.jobs.submit(capped, spec())
    assert [j.id for j in env.jobs.list(capped).jobs] == [job.id]


def test_a_quota_checked_governed_submission_reserves_on_the_full_path(env: Env) -> None:
    bid = env.budget(5.0)
    env.quotes["tiny"] = [option(cost=2.0)]
    capped = who(max_queued_jobs=2, governed=True)
    env.jobs.submit(capped, spec())
    env.jobs.submit(capped, spec())
    assert env.jobs.admissions.batches == 0  # the quota needs the tenant's lock
    assert env.reserved(bid) == pytest.approx(4.0)
    with pytest.raises(QuotaExceededError):
        env.jobs.submit(capped, spec())
    assert env.reserved(bid) == pytest.approx(4.0)


def test_a_soft_budget_reserves_nothing(env: Env) -> None:
    env.budget(1.0, hard=False)
    env.quotes["tiny"] = [option(cost=4.0)]
    _, created = env.jobs.submit(who(governed=True), spec())
    assert created and env.reservations() == {}


# ---- reads and cancellation, within the caller's tenant -----------------------------------------------
def test_another_tenants_job_is_not_found_by_any_read_or_cancel(env: Env) -> None:
    job, _ = env.jobs.submit(who(), spec())
    message = f"no job {job.id!r}"
    for read in (
        lambda: env.jobs.get(who("t2"), job.id),
        lambda: env.jobs.get_with_events(who("t2"), job.id),
        lambda: env.jobs.events(who("t2"), job.id),
        lambda: env.jobs.cancel(who("t2"), job.id),
    ):
        with pytest.raises(NotFoundError) as err:
            read()
        assert err.value.message == message
        assert err.value.hint == "List your jobs with `trainyard jobs list`."
    assert env.jobs.get(who(), job.id).state == JobState.PENDING
    assert env.jobs.list(who("t2")).jobs == []
    with pytest.raises(NotFoundError):
        env.jobs.get(who(), "job-000000000000")


def test_events_page_after_an_id_and_within_their_limit(env: Env) -> None:
    job, _ = env.jobs.submit(who(), spec())
    env.clock.now += 1
    env.jobs.cancel(who(), job.id)
    events = env.jobs.events(who(), job.id)
    assert [e.data["to"] for e in events] == ["pending", "cancelled"]
    assert [e.data["to"] for e in env.jobs.events(who(), job.id, after_id=events[0].id)] == ["cancelled"]
    assert len(env.jobs.events(who(), job.id, limit=0)) == 1
    assert len(env.jobs.events(who(), job.id, limit=1)) == 1
    _, first = env.jobs.get_with_events(who(), job.id, limit=1)
    assert [e.id for e in first] == [events[0].id]


def test_jobs_are_listed_newest_first_a_page_at_a_time(env: Env) -> None:
    ids = [env.jobs.submit(who(), spec(f"j{i}"))[0].id for i in range(5)]
    env.jobs.submit(who("t2"), spec("theirs"))
    page = env.jobs.list(who(), limit=2)
    assert [j.id for j in page.jobs] == [ids[4], ids[3]]
    assert page.next_cursor == encode_cursor(page.jobs[-1].seq)
    page2 = env.jobs.list(who(), limit=2, cursor=page.next_cursor)
    assert [j.id for j in page2.jobs] == [ids[2], ids[1]]
    last = env.jobs.list(who(), limit=2, cursor=page2.next_cursor)
    assert [j.id for j in last.jobs] == [ids[0]] and last.next_cursor is None
    exact = env.jobs.list(who(), limit=5)
    assert len(exact.jobs) == 5 and exact.next_cursor is None
    assert [j.id for j in env.jobs.list(who(), limit=0).jobs] == [ids[4]]
    assert [j.id for j in env.jobs.list(who(), name="j2").jobs] == [ids[2]]
    env.jobs.cancel(who(), ids[1])
    assert [j.id for j in env.jobs.list(who(), states=["cancelled"]).jobs] == [ids[1]]
    assert env.jobs.list(who(), cursor="").jobs[0].id == ids[4]
    with pytest.raises(InvalidInputError):
        env.jobs.list(who(), cursor="nonsense")


def test_a_page_holds_at_most_500_jobs_and_50_unless_asked(env: Env) -> None:
    jobs = [
        Job(
            id=f"job-{i:012x}",
            seq=0,
            tenant_id="t1",
            name="bulk",
            state=JobState.PENDING,
            spec={},
            created_at_s=MID,
            updated_at_s=MID,
            spec_sha256="d",
        )
        for i in range(502)
    ]
    with env.db.engine.begin() as c:
        insert_jobs(c, [(j, ("state", {}, MID)) for j in jobs])
    page = env.jobs.list(who(), limit=10_000)
    assert len(page.jobs) == 500 and page.next_cursor is not None
    assert len(env.jobs.list(who(), limit=501).jobs) == 500
    assert len(env.jobs.list(who(), cursor=page.next_cursor, limit=500).jobs) == 2
    assert len(env.jobs.list(who()).jobs) == 50


def test_events_come_1000_at_a_time_unless_asked_and_at_most_5000(env: Env) -> None:
    job, _ = env.jobs.submit(who(), spec())
    with env.db.engine.begin() as c:
        c.execute(
            insert(cast(Table, JobEventRow.__table__)),
            [{"job_id": job.id, "kind": "log", "data": {"i": i}, "time_s": MID} for i in range(5001)],
        )
    assert len(env.jobs.events(who(), job.id)) == 1000
    assert len(env.jobs.events(who(), job.id, limit=10_000)) == 5000
    assert len(env.jobs.events(who(), job.id, limit=5001)) == 5000
    assert len(env.jobs.get_with_events(who(), job.id)[1]) == 1000


def test_a_cancelled_job_is_told_why_and_cannot_be_cancelled_twice(env: Env) -> None:
    job, _ = env.jobs.submit(who(), spec())
    env.clock.now += 7
    out = env.jobs.cancel(who(), job.id)
    assert (out.id, out.state, out.reason, out.updated_at_s) == (
        job.id,
        JobState.CANCELLED,
        "cancelled by the user",
        MID + 7,
    )
    assert env.events(job.id)[-1] == (
        "state",
        {"from": "pending", "to": "cancelled", "reason": "cancelled by the user"},
    )
    with pytest.raises(IllegalTransitionError):
        env.jobs.cancel(who(), job.id)


# ---- transitions -----------------------------------------------------------------------------------------
def test_a_transition_updates_the_row_appends_its_event_and_releases_only_when_terminal(env: Env) -> None:
    env.budget(10.0)
    env.quotes["tiny"] = [option(cost=2.0)]
    job, _ = env.jobs.submit(who(governed=True), spec())
    env.clock.now += 3
    with env.db.session() as s:
        env.jobs.transition(s, job, JobState.QUEUED, "admitted", data={"note": 1}, attempt=4)
    queued = env.jobs.get(who(), job.id)
    assert (queued.state, queued.reason, queued.attempt, queued.updated_at_s) == (
        JobState.QUEUED, "admitted", 4, MID + 3,
    )  # fmt: skip
    assert env.events(job.id)[-1] == (
        "state",
        {"from": "pending", "to": "queued", "reason": "admitted", "note": 1},
    )
    assert job.id in env.reservations()  # still waiting to run: still reserved
    with env.db.session() as s:
        env.jobs.transition(s, queued, JobState.FAILED, "gone")
    assert env.reservations() == {}
    assert env.events(job.id)[-1] == ("state", {"from": "queued", "to": "failed", "reason": "gone"})
    with env.db.session() as s, pytest.raises(IllegalTransitionError) as err:
        env.jobs.transition(s, env.jobs.get(who(), job.id), JobState.QUEUED, "again")
    assert err.value.details["job_id"] == job.id


def test_transition_many_changes_the_jobs_still_in_the_source_state_each_with_its_events(env: Env) -> None:
    env.budget(100.0)
    env.quotes["tiny"] = [option(cost=2.0)]
    a, b, c = (env.jobs.submit(who(governed=True), spec())[0] for _ in range(3))
    env.jobs.cancel(who(), b.id)
    env.clock.now += 2
    with env.db.session() as s:
        changed = env.jobs.transition_many(
            s,
            [c.id, b.id, a.id],
            JobState.PENDING,
            JobState.QUEUED,
            "admitted",
            before=("quote", {"n": 1}),
            attempt=1,
        )
    assert changed == [c.id, a.id]
    for j in (a, c):
        got = env.jobs.get(who(), j.id)
        assert (got.state, got.reason, got.attempt, got.updated_at_s) == (
            JobState.QUEUED,
            "admitted",
            1,
            MID + 2,
        )
        assert env.events(j.id)[-2:] == [
            ("quote", {"n": 1}),
            ("state", {"from": "pending", "to": "queued", "reason": "admitted"}),
        ]
    assert env.events(b.id)[-1][1]["to"] == "cancelled"
    assert set(env.reservations()) == {a.id, c.id}
    with env.db.session() as s:
        done = env.jobs.transition_many(s, [a.id, c.id], JobState.QUEUED, JobState.FAILED, "gone")
    assert done == [a.id, c.id] and env.reservations() == {}
    assert env.events(a.id)[-1] == ("state", {"from": "queued", "to": "failed", "reason": "gone"})
    assert env.events(a.id)[-2][0] == "state"  # no ``before`` event this time
    with env.db.session() as s, pytest.raises(IllegalTransitionError):
        env.jobs.transition_many(s, [a.id], JobState.FAILED, JobState.QUEUED, "back")


# ---- quotes and admission ----------------------------------------------------------------------------
def test_a_quote_is_cached_by_digest_until_the_live_pools_change(env: Env, logged: Logged) -> None:
    env.pools = [pool("cpu"), pool("gpu-less")]
    doc = spec().to_document()
    q = env.jobs.quote_for(doc, spec_digest(doc))
    assert isinstance(q, list) and q[0]["pool"] == "cpu" and q[0]["feasible"] is True
    assert env.jobs.quote_for(doc, spec_digest(doc)) == q
    assert env.calls == [("tiny", ["cpu", "gpu-less"])]  # one call with every pool
    assert logged.take() == []
    env.pools = [pool("cpu", price=2.0)]
    other = spec("other").to_document()
    env.jobs.quote_for(other, spec_digest(other))  # a miss reads the pools: they changed
    env.jobs.quote_for(doc, spec_digest(doc))
    assert env.calls[1:] == [("other", ["cpu"]), ("tiny", ["cpu"])]
    env.jobs.quote_for(doc, spec_digest(doc))
    assert len(env.calls) == 3


def test_the_quote_cache_forgets_its_oldest_entry_past_256(env: Env) -> None:
    docs = [spec(f"s{i}").to_document() for i in range(257)]
    for d in docs:
        env.jobs.quote_for(d, spec_digest(d))
    assert len(env.calls) == 257
    env.jobs.quote_for(docs[1], spec_digest(docs[1]))
    env.jobs.quote_for(docs[256], spec_digest(docs[256]))
    assert len(env.calls) == 257  # still cached
    env.jobs.quote_for(docs[0], spec_digest(docs[0]))
    assert env.calls[-1][0] == "s0"  # the oldest was dropped


def test_admission_queues_feasible_jobs_with_their_quote_sharing_one_quote_per_spec(env: Env) -> None:
    env.quotes["tiny"] = [option("a", 2.0), option("b", 1.0, feasible=False, reason="too slow")]
    ids = [env.jobs.submit(who(), spec())[0].id for _ in range(3)]
    env.clock.now += 1
    assert env.jobs.admit_pending() == 3
    assert env.calls == [("tiny", ["cpu"])]
    for job_id in ids:
        job = env.jobs.get(who(), job_id)
        assert (job.state, job.reason, job.updated_at_s) == (JobState.QUEUED, "admitted", MID + 1)
        assert job.quote is not None and [o["pool"] for o in job.quote] == ["a", "b"]
        events = env.events(job_id)
        assert events[1] == ("quote", {"options": 2, "best": job.quote[0]})
        assert events[2] == ("state", {"from": "pending", "to": "queued", "reason": "admitted"})
    assert env.jobs.admit_pending() == 0


def test_admission_quotes_every_spec_not_yet_cached(env: Env) -> None:
    cached = spec("cached").to_document()
    env.jobs.quote_for(cached, spec_digest(cached))
    a, _ = env.jobs.submit(who(), spec("cached"))
    b, _ = env.jobs.submit(who(), spec("new"))
    assert env.jobs.admit_pending() == 2
    assert [env.jobs.get(who(), j.id).state for j in (a, b)] == [JobState.QUEUED, JobState.QUEUED]
    assert [name for name, _ in env.calls] == ["cached", "new"]


def test_a_job_that_vanishes_before_it_is_quoted_is_skipped_and_the_others_admitted(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone, _ = env.jobs.submit(who(), spec("gone"))
    kept, _ = env.jobs.submit(who(), spec("kept"))
    real = JobRepo.spec_of

    def deleted_meanwhile(self: JobRepo, job_id: str) -> dict[str, Any] | None:
        if job_id == gone.id:  # its tenant was removed while admission was reading
            self.s.connection().execute(text("DELETE FROM jobs WHERE id = :id"), {"id": job_id})
        return real(self, job_id)

    monkeypatch.setattr(JobRepo, "spec_of", deleted_meanwhile)
    assert env.jobs.admit_pending() == 2
    assert env.jobs.get(who(), kept.id).state == JobState.QUEUED
    with pytest.raises(NotFoundError):
        env.jobs.get(who(), gone.id)
    assert [name for name, _ in env.calls] == ["kept"]


def test_admission_fails_a_job_nothing_can_run_naming_the_reasons(env: Env) -> None:
    env.quotes["none"] = [
        option("a", 1.0, feasible=False, reason="too slow"),
        option("b", 2.0, feasible=False, reason="too slow"),
        option("c", 3.0, feasible=False, reason="over budget"),
    ]
    env.quotes["empty"] = []
    env.quotes["bad"] = InvalidInputError("no such accelerator")
    bad, _ = env.jobs.submit(who(), spec("bad"))  # first: a rejection does not stop the batch
    none, _ = env.jobs.submit(who(), spec("none"))
    empty, _ = env.jobs.submit(who(), spec("empty"))
    assert env.jobs.admit_pending() == 3
    got = env.jobs.get(who(), none.id)
    assert got.state == JobState.FAILED
    assert got.reason == "infeasible: no option satisfies the job's constraints (too slow; over budget)"
    assert env.events(none.id)[1] == ("quote", {"options": 2, "best": got.quote[0] if got.quote else None})
    got_empty = env.jobs.get(who(), empty.id)
    assert got_empty.reason == "infeasible: no option satisfies the job's constraints"
    assert got_empty.quote == []
    assert env.events(empty.id)[1] == ("quote", {"options": 0, "best": None})
    got_bad = env.jobs.get(who(), bad.id)
    assert (got_bad.state, got_bad.reason) == (JobState.FAILED, "rejected at admission: no such accelerator")
    assert [k for k, _ in env.events(bad.id)] == ["state", "state"]  # no quote event


def test_admission_looks_at_the_oldest_pending_jobs_up_to_its_limit_in_batches(env: Env) -> None:
    ids = [env.jobs.submit(who(), spec())[0].id for _ in range(3)]
    assert env.jobs.admit_pending(limit=2) == 2
    assert [env.jobs.get(who(), i).state for i in ids] == [JobState.QUEUED, JobState.QUEUED, JobState.PENDING]
    jobs = [
        Job(
            id=f"job-{i:012x}",
            seq=0,
            tenant_id="t1",
            name="tiny",
            state=JobState.PENDING,
            spec=spec().to_document(),
            created_at_s=MID,
            updated_at_s=MID,
            spec_sha256=spec_digest(spec().to_document()),
        )
        for i in range(250)
    ]
    with env.db.engine.begin() as c:
        insert_jobs(c, [(j, ("state", {}, MID)) for j in jobs])
    assert env.jobs.admit_pending() == 200  # 200 at a time, in batches of 50
    assert env.jobs.get(who(), ids[2]).state == JobState.QUEUED  # the oldest first
    assert len(env.jobs.list(who(), states=["pending"], limit=100).jobs) == 51
    assert env.jobs.admit_pending() == 51
    assert env.jobs.list(who(), states=["pending"]).jobs == []
    assert len(env.calls) == 1


def test_a_service_quotes_the_catalog_too_unless_told_not_to(template: Path, tmp_path: Path) -> None:
    shutil.copy(template, tmp_path / "db.sqlite")
    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    seen: list[list[str]] = []

    def quoter(s: JobSpec, pools: Any) -> list[Any]:
        seen.append([p.name for p in pools])
        return [option()]

    try:
        JobService(db, quoter=quoter, live_pools=lambda: [pool("cpu")]).quote_for(
            {**spec().to_document()}, "d1"
        )
        assert seen[0][0] == "cpu" and len(seen[0]) > 1
        JobService(db, quoter=quoter, live_pools=lambda: [pool("cpu")], with_catalog=False).quote_for(
            spec().to_document(), "d2"
        )
        assert seen[1] == ["cpu"]
        JobService(db, quoter=quoter, with_catalog=False).quote_for(spec().to_document(), "d3")
        assert seen[2] == []
        admitting = JobService(db, quoter=quoter, live_pools=lambda: [pool("cpu")])
        admitting.submit(who(), spec())
        assert admitting.admit_pending() == 1
        assert seen[3][0] == "cpu" and len(seen[3]) > 1
    finally:
        db.dispose()


def test_a_pool_that_cannot_be_priced_is_recorded_and_the_others_are_quoted(env: Env, logged: Logged) -> None:
    env.pools = [pool("dear"), pool("cheap"), pool("slow"), pool("err")] + [pool(f"bad{i}") for i in range(7)]

    def per_pool(s: JobSpec, pools: list[Pool]) -> list[QuoteOption]:
        if len(pools) > 1:
            raise RuntimeError("one pool broke the batch")
        name = pools[0].name
        if name.startswith("bad"):
            raise ValueError(f"{name} " + "x" * 400)
        if name == "err":
            raise InvalidInputError("cannot run there")
        return [
            option(
                name, {"dear": 5.0, "cheap": 1.0, "slow": 0.5}[name], feasible=name != "slow", reason="slow"
            )
        ]

    env.quotes["tiny"] = per_pool
    doc = spec().to_document()
    logged.take()
    q = env.jobs.quote_for(doc, spec_digest(doc))
    logs = logged.take()
    assert [(e["event"], e["spec_name"], e["log_level"]) for e in logs] == [
        ("quote_failed_retrying_per_pool", "tiny", "error")
    ]
    assert isinstance(q, list)
    assert [(o["pool"], o["feasible"]) for o in q[:3]] == [("cheap", True), ("dear", True), ("slow", False)]
    broken = q[3:]
    assert [b["pool"] for b in broken] == ["bad0", "bad1", "bad2", "bad3", "bad4"]
    text = ("ValueError: bad0 " + "x" * 400)[:300]
    assert broken[0] == {"pool": "bad0", "feasible": False, "reason": f"could not be priced ({text})"}
    job, _ = env.jobs.submit(who(), spec())
    env.jobs.admit_pending()
    assert env.jobs.get(who(), job.id).state == JobState.QUEUED


def test_a_job_nothing_can_run_is_told_at_most_five_reasons(env: Env) -> None:
    env.pools = [pool(f"slow{i}") for i in range(4)] + [pool(f"bad{i}") for i in range(7)]

    def per_pool(s: JobSpec, pools: list[Pool]) -> list[QuoteOption]:
        if len(pools) > 1:
            raise RuntimeError("one pool broke the batch")
        name = pools[0].name
        if name.startswith("bad"):
            raise RuntimeError(name)
        return [option(name, float(name[-1]), feasible=False, reason=f"r{name[-1]}")]

    env.quotes["tiny"] = per_pool
    job, _ = env.jobs.submit(who(), spec())
    env.jobs.admit_pending()
    got = env.jobs.get(who(), job.id)
    assert got.state == JobState.FAILED
    assert got.reason == (
        "infeasible: no option satisfies the job's constraints "
        "(r0; r1; r2; r3; could not be priced (RuntimeError: bad0))"
    )
    assert got.quote is not None
    assert [o["pool"] for o in got.quote] == ["slow0", "slow1", "slow2", "slow3"] + [
        f"bad{i}" for i in range(5)
    ]


def test_an_invalid_stored_spec_is_rejected_at_admission(env: Env) -> None:
    bogus = Job(id="job-bogus0000000", seq=0, tenant_id="t1", name="x", state=JobState.PENDING,
                spec={"name": "x"}, created_at_s=MID, updated_at_s=MID, spec_sha256="bogus")  # fmt: skip
    with env.db.engine.begin() as c:
        insert_jobs(c, [(bogus, ("state", {}, MID))])
    env.jobs.admit_pending()
    got = env.jobs.get(who(), bogus.id)
    assert got.state == JobState.FAILED and got.reason.startswith("rejected at admission: ")
    assert env.calls == []
