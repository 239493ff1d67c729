"""Jobs: submission (idempotent), reads, cancellation, admission and every state change.

State changes go through :meth:`JobService.transition` inside the caller's transaction, which checks
the one transition table (:mod:`trainyard.services.lifecycle`) and appends a ``state`` event, so the
event log and the job row never disagree.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import json
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog
from opentelemetry import trace
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from trainyard.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    QuotaExceededError,
    StorageNotAllowedError,
    TrainyardError,
    UserCodeNotAllowedError,
)
from trainyard.services.domain import Job, JobEvent, Principal, iso
from trainyard.services.lifecycle import TERMINAL_STATES, JobState, check_transition
from trainyard.services.quoting import QuoteFn, quote_pools, stored_quote
from trainyard.spec.models import JobSpec
from trainyard.store.db import Database
from trainyard.store.governance_repo import GovernanceRepo
from trainyard.store.repositories import EventRepo, JobRepo, TenantRepo
from trainyard.tenancy import ledger
from trainyard.tenancy.admission import ALONE, REFUSED, BatchedAdmissions
from trainyard.tenancy.quotas import check_queue_quota
from trainyard.tenancy.storage import StoragePolicy, is_model_reference, is_registered_dataset
from trainyard.tracecontext import current_traceparent

log = structlog.get_logger("trainyard.jobs")

OPEN_STATES = tuple(s.value for s in JobState if s not in TERMINAL_STATES)
MAX_PAGE = 500
QUOTE_CACHE_SIZE = 256
ADMIT_BATCH = 50
MAX_BROKEN_REPORTED = 5


def new_job_id() -> str:
    return f"job-{secrets.token_hex(6)}"


def spec_digest(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"s:{seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith("s:"):
            raise ValueError
        seq = int(raw[2:])
        if not 0 <= seq < 2**63:  # sequences are 64-bit signed integers in the database
            raise ValueError
        return seq
    except (ValueError, UnicodeDecodeError):
        raise InvalidInputError(
            "cursor is not one this server issued",
            hint="Pass the next_cursor value from the previous page unchanged.",
            details={"errors": [{"field": "cursor", "message": "invalid cursor"}]},
        ) from None


@dataclass(frozen=True)
class JobPage:
    jobs: list[Job]
    next_cursor: str | None


def job_document(
    job: Job, events: Sequence[JobEvent] | None = None, *, include_spec: bool = True
) -> dict[str, Any]:
    """The job document of DESIGN §3.3 (``jobs get --json``), plus a few descriptive extras."""
    result = None
    if job.result is not None:
        result = {
            "model_version": job.result.get("model_version"),
            "model_sha256": job.result.get("model_sha256"),
            **{k: v for k, v in job.result.items() if k not in ("model_version", "model_sha256")},
        }
    doc: dict[str, Any] = {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "placement": job.placement.to_dict() if job.placement else None,
        "cost_usd": round(job.cost_usd, 6),
        "checkpoints": [{"step": c.get("step"), "path": c.get("path")} for c in job.checkpoints],
        "workers": [{"rank": w.get("rank"), "pid": w.get("pid"), "host": w.get("host")} for w in job.workers],
        "events": [e.to_dict() for e in events] if events is not None else [],
        "result": result,
        "attempt": job.attempt,
        "reason": job.reason,
        "progress": job.progress,
        "quote": job.quote,
        "created_at": iso(job.created_at_s),
        "updated_at": iso(job.updated_at_s),
    }
    if include_spec:
        doc["spec"] = job.spec
    return doc


class _NowGoverned(Exception):
    """Raised inside a submission's transaction (rolled back) whose tenant turned out to have a budget."""


class JobService:
    def __init__(
        self,
        db: Database,
        *,
        quoter: QuoteFn | None = None,
        live_pools: Callable[[], list[Any]] | None = None,
        clock: Callable[[], float] = time.time,
        with_catalog: bool = True,
        storage_policy: StoragePolicy | None = None,
        resolve_data: Callable[[Principal, dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.db = db
        self.storage_policy = storage_policy
        # pins every data reference of a spec to a version the tenant owns, or raises a 4xx (at submit)
        self.resolve_data = resolve_data
        self.clock = clock
        self._quoter = quoter
        self._live_pools = live_pools
        self.with_catalog = with_catalog
        # spec digest -> stored quote, valid while the live pools are unchanged (the catalog is static)
        self._quote_cache: dict[str, list[dict[str, Any]] | TrainyardError] = {}
        self._quote_cache_pools = ""
        self._quote_lock = threading.Lock()
        # budget definitions per tenant for the admission fast path (see ledger.BudgetCache)
        self.budget_cache = ledger.BudgetCache()
        # called with a tenant id when a submission finds a budget its principal did not know of
        self.on_governed: Callable[[str], None] | None = None
        # concurrent fast-path admissions of one budget period share one transaction
        self.admissions = BatchedAdmissions(db)
        # submission-time resolution of registry references (model.base), set by the platform
        self.spec_resolver: Callable[[Principal, JobSpec], JobSpec] | None = None
        # OpenTelemetry tracer for the ``job.submit`` span (set by observability.install_observability)
        self.tracer: Any = None

    # ---- submission ----------------------------------------------------------------------------
    def submit(
        self, principal: Principal, spec: JobSpec, idempotency_key: str | None = None
    ) -> tuple[Job, bool]:
        """Store a new job in ``pending``; returns (job, created). A repeated Idempotency-Key with the same
        spec returns the first job; with a different spec it is a conflict. With a tracer, the submission
        is the root of the job's trace (its context is kept in the first event): the request's span
        (``POST /v1/jobs``, sampled or not: a job follows its submission's sampling decision), else a
        ``job.submit`` span of its own."""
        if self.tracer is None:
            return self._submit(principal, spec, idempotency_key)
        current = trace.get_current_span()
        if current.get_span_context().is_valid:
            job, created = self._submit(principal, spec, idempotency_key)
            current.set_attribute("trainyard.job_id", job.id)
            return job, created
        with self.tracer.start_as_current_span(
            "job.submit", attributes={"trainyard.tenant": principal.tenant_name}
        ) as span:
            job, created = self._submit(principal, spec, idempotency_key)
            span.set_attribute("trainyard.job_id", job.id)
            span.set_attribute("trainyard.created", created)
            return job, created

    def _submit(
        self, principal: Principal, spec: JobSpec, idempotency_key: str | None = None
    ) -> tuple[Job, bool]:
        if self.spec_resolver is not None:
            spec = self.spec_resolver(principal, spec)
        elif spec.model.needs_base_shape:
            raise InvalidInputError(
                "model: the shape fields are missing and no model registry resolves model.base",
                details={"errors": [{"field": "model", "message": "shape fields missing"}]},
            )
        doc = self.check_walls(principal, spec)
        if self.resolve_data is not None:
            doc = self.resolve_data(principal, doc)
        digest = spec_digest(doc)
        check_device_quota(principal, spec)
        now = self.clock()
        job = Job(
            id=new_job_id(),
            seq=0,
            tenant_id=principal.tenant_id,
            name=spec.name,
            state=JobState.PENDING,
            spec=doc,
            created_at_s=now,
            updated_at_s=now,
            idempotency_key=idempotency_key,
            spec_sha256=digest,
        )
        # One transaction on the common path: insert, and let the (tenant, Idempotency-Key) unique
        # constraint detect a replay, which is then answered with the first job.
        first_event: tuple[str, dict[str, Any], float] = (
            "state",
            {"from": None, "to": "pending", "reason": "submitted"},
            now,
        )
        traceparent = current_traceparent()
        if traceparent is not None:  # later spans of the job join this trace (observability.jobtrace)
            first_event[1]["traceparent"] = traceparent
        try:
            if principal.max_queued_jobs is None and not principal.governed:
                # no quota or budget to check: the job and its first event are the only write (on
                # PostgreSQL one statement, committed on its own — see insert_job and write_connection),
                # made only while the tenant still has no budget (one set through another server
                # process since this principal was read is enforced from this submission on)
                with self.db.write_connection(single_statement=True) as conn:
                    seq = ledger.insert_job_unless_governed(conn, job, first_event)
                if seq is not None:
                    return replace(job, seq=seq), True
                principal = self._now_governed(principal)
            # a budget applies: quote now (cached by spec digest), to reserve the quoted cost in the
            # same transaction as the job
            reserve = reservation_amount(self.quote_for(doc, digest)) if principal.governed else None
            tags = dict(doc.get("tags") or {})
            if reserve is not None and principal.max_queued_jobs is None:
                fast = self._submit_reserving(principal, job, first_event, tags, reserve[0], now)
                if fast is not None:
                    return fast, True
            with self.db.session() as s:
                # One serialising point per tenant: the tenant's row, locked for the transaction
                # (SELECT … FOR UPDATE on PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises
                # writers). Concurrent submissions of one tenant count, reserve and insert one at a
                # time, so the quota and the budget hold exactly; other tenants are not blocked.
                TenantRepo(s).lock(principal.tenant_id)
                repo = JobRepo(s)
                if idempotency_key is not None:
                    # a resend of an accepted submission is answered with the original job, even
                    # when the tenant is now at its quota or budget (and reserves nothing again)
                    existing = repo.by_idempotency_key(principal.tenant_id, idempotency_key)
                    if existing is not None:
                        return self._replay(existing, digest), False
                if principal.max_queued_jobs is not None:
                    open_jobs = repo.count(tenant_id=principal.tenant_id, states=OPEN_STATES)
                    check_queue_quota(principal.tenant_name, open_jobs, principal.max_queued_jobs)
                if not principal.governed and GovernanceRepo(s).has_budget(principal.tenant_id):
                    raise _NowGoverned  # a budget set since the principal was read: quote, reserve
                if reserve is not None:
                    conn = s.connection()
                    budgets = ledger.tenant_budgets(conn, principal.tenant_id)
                    self.budget_cache.put(principal.tenant_id, budgets)
                    ledger.reserve(
                        conn,
                        tenant_id=principal.tenant_id,
                        tenant_name=principal.tenant_name,
                        job_id=job.id,
                        tags=tags,
                        amount_usd=reserve[0],
                        basis=reserve[1],
                        now_s=now,
                        budgets=budgets,
                    )
                stored = repo.add(job, first_event=first_event)
            return stored, True
        except _NowGoverned:
            return self._submit(self._now_governed(principal), spec, idempotency_key)
        except IntegrityError:
            if idempotency_key is None:
                raise
            found = self._by_key(principal, idempotency_key, digest)
            if found is None:
                raise
            return found, False

    def _now_governed(self, principal: Principal) -> Principal:
        """The principal of a tenant found to have a budget that the cached one did not know of (set
        through another server process): the caches of the tenant are forgotten, so that its next
        requests are read afresh."""
        self.budget_cache.invalidate(principal.tenant_id)
        if self.on_governed is not None:
            self.on_governed(principal.tenant_id)
        return replace(principal, governed=True)

    def _submit_reserving(
        self,
        principal: Principal,
        job: Job,
        first_event: tuple[str, dict[str, Any], float],
        tags: dict[str, Any],
        amount_usd: float,
        now: float,
    ) -> Job | None:
        """The admission fast path of a tenant with one hard budget that applies to the job: reserve
        and insert in one short Core transaction, from cached budget definitions (ledger.reserve_one
        re-reads what decides inside its statement). None, with nothing written, when the slow path
        (:func:`ledger.reserve` with fresh definitions, which also explains a refusal) has to decide."""
        cached = self.budget_cache.get(principal.tenant_id)
        pick = ledger.single_hard_budget(cached, tags) if cached is not None else None
        if pick is None:
            return None
        budget, n_hard = pick
        # concurrent admissions of one budget period share one transaction (one commit for them all)
        seq = self.admissions.admit(
            budget=budget,
            n_hard=n_hard,
            job=job,
            first_event=first_event,
            amount_usd=amount_usd,
            now_s=now,
        )
        if seq is REFUSED:
            return None
        if seq is ALONE:  # its batch wrote nothing: decided on its own
            seq = self.admissions.admit_alone(
                budget=budget,
                n_hard=n_hard,
                job=job,
                first_event=first_event,
                amount_usd=amount_usd,
                now_s=now,
            )
            if seq is REFUSED:
                return None
        return replace(job, seq=int(seq))

    def check_walls(self, principal: Principal, spec: JobSpec) -> dict[str, Any]:
        """The spec document with every storage location it names in canonical form, after the tenant
        walls (DESIGN §3.6): user code only for tenants allowed to run it; checkpoint storage, a dataset
        given as a path/URL, a base model given as a path and the code archive only under the tenant's
        roots. Every refused field is listed in one :class:`StorageNotAllowedError`."""
        doc = spec.to_document()
        if spec.entrypoint is not None and not principal.allow_user_code:
            raise UserCodeNotAllowedError(
                f"tenant {principal.tenant_name!r} may not run its own code (entrypoint)",
                details={"errors": [{"field": "entrypoint", "message": "user code is not allowed"}]},
            )
        policy = self.storage_policy
        if policy is None:
            return doc
        checks: list[tuple[str, str, tuple[str, ...]]] = []  # (purpose, value, path in doc)
        if spec.checkpoint.storage is not None:
            checks.append(("checkpoint.storage", spec.checkpoint.storage, ("checkpoint", "storage")))
        dataset = spec.workload.dataset
        if dataset is not None and not is_registered_dataset(dataset):
            checks.append(("workload.dataset", dataset, ("workload", "dataset")))
        base = spec.model.base
        if base is not None and not is_model_reference(base):
            checks.append(("model.base", base, ("model", "base")))
        if spec.entrypoint is not None and spec.entrypoint.code is not None:
            checks.append(("entrypoint.code", spec.entrypoint.code, ("entrypoint", "code")))
        errors: list[dict[str, Any]] = []
        for purpose, value, where in checks:
            try:
                norm = policy.check(
                    principal.tenant_name, value, extra_roots=principal.storage_roots, purpose=purpose
                )
            except StorageNotAllowedError as exc:
                errors.extend(exc.details.get("errors") or [{"field": purpose, "message": exc.message}])
                continue
            if where == ("checkpoint", "storage"):  # the executor writes there: the canonical form
                doc[where[0]][where[1]] = norm
        if errors:
            first = errors[0]
            raise StorageNotAllowedError(
                f"{first['field']}: {first['message']}"
                + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
                details={"errors": errors},
            )
        return doc

    def _by_key(self, principal: Principal, key: str, digest: str) -> Job | None:
        with self.db.session() as s:
            existing = JobRepo(s).by_idempotency_key(principal.tenant_id, key)
        return None if existing is None else self._replay(existing, digest)

    @staticmethod
    def _replay(existing: Job, digest: str) -> Job:
        """The job a repeated Idempotency-Key stands for; a conflict when the spec differs."""
        if existing.spec_sha256 != digest:
            raise ConflictError(
                "this Idempotency-Key was already used with a different job spec",
                hint="Use a new Idempotency-Key for a different job, or resend the original spec.",
                details={"job_id": existing.id},
            )
        return existing

    # ---- reads ---------------------------------------------------------------------------------
    def get(self, principal: Principal, job_id: str) -> Job:
        with self.db.session() as s:
            job = JobRepo(s).get(job_id, tenant_id=principal.tenant_id)
        if job is None:
            raise NotFoundError(f"no job {job_id!r}", hint="List your jobs with `trainyard jobs list`.")
        return job

    def get_with_events(
        self, principal: Principal, job_id: str, limit: int = 1000
    ) -> tuple[Job, list[JobEvent]]:
        with self.db.session() as s:
            job = JobRepo(s).get(job_id, tenant_id=principal.tenant_id)
            if job is None:
                raise NotFoundError(f"no job {job_id!r}", hint="List your jobs with `trainyard jobs list`.")
            return job, EventRepo(s).list(job_id, limit=limit)

    def list(
        self,
        principal: Principal,
        *,
        states: Sequence[str] | None = None,
        name: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> JobPage:
        limit = max(1, min(limit, MAX_PAGE))
        before = decode_cursor(cursor) if cursor else None
        with self.db.session() as s:
            jobs = JobRepo(s).list(
                tenant_id=principal.tenant_id, states=states, name=name, before_seq=before, limit=limit + 1
            )
        more = len(jobs) > limit
        jobs = jobs[:limit]
        return JobPage(jobs=jobs, next_cursor=encode_cursor(jobs[-1].seq) if more and jobs else None)

    def events(
        self, principal: Principal, job_id: str, *, after_id: int = 0, limit: int = 1000
    ) -> builtins.list[JobEvent]:
        with self.db.session() as s:
            if JobRepo(s).get(job_id, tenant_id=principal.tenant_id) is None:
                raise NotFoundError(f"no job {job_id!r}", hint="List your jobs with `trainyard jobs list`.")
            return EventRepo(s).list(job_id, after_id=after_id, limit=max(1, min(limit, 5000)))

    # ---- cancellation --------------------------------------------------------------------------
    def cancel(self, principal: Principal, job_id: str) -> Job:
        """Cancel a job that has not finished; the supervisor stops its workers on its next tick."""
        with self.db.session() as s:
            repo = JobRepo(s)
            job = repo.get(job_id, tenant_id=principal.tenant_id, for_update=True)
            if job is None:
                raise NotFoundError(f"no job {job_id!r}", hint="List your jobs with `trainyard jobs list`.")
            self.transition(s, job, JobState.CANCELLED, "cancelled by the user")
            out = repo.get(job_id)
        assert out is not None
        return out

    # ---- state changes (inside the caller's transaction) ---------------------------------------
    def transition(
        self,
        s: Session,
        job: Job,
        target: JobState,
        reason: str,
        *,
        data: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        check_transition(job.state, target, job_id=job.id)
        now = self.clock()
        JobRepo(s).update(job.id, state=target, updated_at_s=now, reason=reason, **fields)
        if target in TERMINAL_STATES:
            ledger.release(s.connection(), [job.id])
        EventRepo(s).append(
            job.id,
            "state",
            {"from": job.state.value, "to": target.value, "reason": reason, **(data or {})},
            now,
        )

    def transition_many(
        self,
        s: Session,
        job_ids: Sequence[str],
        source: JobState,
        target: JobState,
        reason: str,
        *,
        before: tuple[str, dict[str, Any]] | None = None,
        **fields: Any,
    ) -> builtins.list[str]:
        """The same state change for every job of ``job_ids`` still in ``source`` (checked against the one
        transition table, applied by one conditional UPDATE), each with its ``state`` event, preceded by
        the ``before`` (kind, data) event when given. Jobs that left ``source`` meanwhile are skipped;
        returns the ids that changed."""
        check_transition(source, target)
        now = self.clock()
        changed = JobRepo(s).update_many_if_state(
            job_ids, source, state=target, updated_at_s=now, reason=reason, **fields
        )
        if target in TERMINAL_STATES:
            ledger.release(s.connection(), changed)
        events = EventRepo(s)
        if before is not None:  # one statement per event kind: each job's ``before`` precedes its state
            events.append_to_each(changed, before[0], before[1], now)
        events.append_to_each(
            changed, "state", {"from": source.value, "to": target.value, "reason": reason}, now
        )
        return changed

    # ---- quotes -------------------------------------------------------------------------------------
    def _pools_fingerprint(self) -> builtins.list[Any]:
        live = self._live_pools() if self._live_pools is not None else []
        fingerprint = hashlib.sha256("|".join(p.model_dump_json() for p in live).encode()).hexdigest()
        with self._quote_lock:
            if fingerprint != self._quote_cache_pools:  # pools changed: old quotes are stale
                self._quote_cache.clear()
                self._quote_cache_pools = fingerprint
        return live

    def _cache_put(self, digest: str, value: builtins.list[dict[str, Any]] | TrainyardError) -> None:
        with self._quote_lock:
            while len(self._quote_cache) >= QUOTE_CACHE_SIZE:
                self._quote_cache.pop(next(iter(self._quote_cache)))
            self._quote_cache[digest] = value

    def quote_for(self, doc: dict[str, Any], digest: str) -> builtins.list[dict[str, Any]] | TrainyardError:
        """The stored quote of a spec document, cached by digest. A hit is answered without reading the
        pools: the control loop re-checks them every tick (:meth:`admit_pending`) and drops every cached
        quote when they changed, so a hit is at most one tick older than the pools."""
        hit = self._quote_cache.get(digest)
        if hit is not None:
            return hit
        live = self._pools_fingerprint()
        value = self._quote_doc(doc, quote_pools(live, with_catalog=self.with_catalog))
        self._cache_put(digest, value)
        return value

    # ---- admission: pending → queued (quoted) or failed (nothing can run it) -------------------
    def admit_pending(self, limit: int = 200) -> int:
        """Quote and admit up to ``limit`` pending jobs, oldest first; returns how many were looked at.

        Jobs with the same spec share one quote (cached by spec digest while the live pools are
        unchanged), so a batch is admitted with one conditional UPDATE per distinct spec plus the events.
        """
        with self.db.session() as s:
            pending = JobRepo(s).ids_in_state(JobState.PENDING, limit)
        if not pending:
            return 0
        live = self._pools_fingerprint()
        pools: builtins.list[Any] | None = None
        for job_id, digest in pending:
            if digest in self._quote_cache:
                continue
            with self.db.session() as s:
                doc = JobRepo(s).spec_of(job_id)
            if doc is None:
                continue
            if pools is None:
                pools = quote_pools(live, with_catalog=self.with_catalog)
            self._cache_put(digest, self._quote_doc(doc, pools))
        quotes = {d: self._quote_cache.get(d) for _, d in pending}
        # Admissions in short transactions of ADMIT_BATCH jobs: few commits, and the write lock is never
        # held long enough to stall submissions.
        for start in range(0, len(pending), ADMIT_BATCH):
            self._admit_batch(pending[start : start + ADMIT_BATCH], quotes)
        return len(pending)

    def _admit_batch(
        self,
        batch: builtins.list[tuple[str, str]],
        quotes: dict[str, builtins.list[dict[str, Any]] | TrainyardError | None],
    ) -> None:
        by_digest: dict[str, builtins.list[str]] = {}
        for job_id, digest in batch:
            by_digest.setdefault(digest, []).append(job_id)
        with self.db.session() as s:
            for digest, ids in by_digest.items():
                q = quotes.get(digest)
                if q is None:  # the job vanished before it could be quoted
                    continue
                if isinstance(q, TrainyardError):
                    self.transition_many(
                        s, ids, JobState.PENDING, JobState.FAILED, f"rejected at admission: {q.message}"
                    )
                    continue
                quote_event = ("quote", {"options": len(q), "best": q[0] if q else None})
                if any(o.get("feasible") for o in q):
                    self.transition_many(
                        s, ids, JobState.PENDING, JobState.QUEUED, "admitted", before=quote_event, quote=q
                    )
                else:
                    # the stored quote keeps the most telling distinct reasons first (``stored_quote``)
                    reasons = list(dict.fromkeys(str(o.get("reason")) for o in q if o.get("reason")))[:5]
                    self.transition_many(
                        s,
                        ids,
                        JobState.PENDING,
                        JobState.FAILED,
                        "infeasible: no option satisfies the job's constraints"
                        + (f" ({'; '.join(reasons)})" if reasons else ""),
                        before=quote_event,
                        quote=q,
                    )

    def _quote_doc(
        self, spec_doc: dict[str, Any], pools: builtins.list[Any]
    ) -> builtins.list[dict[str, Any]] | TrainyardError:
        from trainyard.services.quoting import cost_quote
        from trainyard.spec.loader import spec_from_dict

        quoter = self._quoter or cost_quote
        try:
            spec = spec_from_dict(spec_doc)
            options = quoter(spec, pools)
        except TrainyardError as exc:
            return exc
        except Exception:
            # A defect in pricing one pool must not wedge admission for everyone: price pool by pool and
            # keep the pools that can be priced; the others are recorded as infeasible with the error.
            log.exception("quote_failed_retrying_per_pool", spec_name=spec_doc.get("name"))
            options, broken = [], []
            for pool in pools:
                try:
                    options.extend(quoter(spec, [pool]))
                except TrainyardError:
                    continue
                except Exception as exc:
                    broken.append({"pool": pool.name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            options.sort(key=lambda o: (not o.feasible, o.expected_cost_usd))
            doc = stored_quote(options)
            for b in broken[:MAX_BROKEN_REPORTED]:
                doc.append(
                    {"pool": b["pool"], "feasible": False, "reason": f"could not be priced ({b['error']})"}
                )
            return doc
        return stored_quote(options)


def reservation_amount(quote: builtins.list[dict[str, Any]] | TrainyardError) -> tuple[float, str]:
    """What a submission reserves against hard budgets: the p90 cost of the best feasible option (the one
    the cost objective picks), or its expected cost when the quote has no p90; nothing when no option is
    feasible (admission will fail the job)."""
    if isinstance(quote, TrainyardError):
        return 0.0, "none"
    feasible = [o for o in quote if o.get("feasible")]
    if not feasible:
        return 0.0, "none"
    best = feasible[0]
    p90 = best.get("expected_cost_p90_usd")
    if p90 is not None and float(p90) > 0:
        return float(p90), "p90"
    return float(best.get("expected_cost_usd") or 0.0), "expected"


def check_device_quota(principal: Principal, spec: JobSpec) -> None:
    """Refuse a job that needs more devices than its tenant may ever hold (it would wait forever)."""
    cap = principal.max_active_devices
    if cap is None:
        return
    need = spec.resources.min_devices
    if need is not None and need > cap:
        raise QuotaExceededError(
            f"the job needs at least {need} devices but tenant {principal.tenant_name!r} may hold at most "
            f"{cap} (quota max_active_devices); it could never start",
            hint=(
                f"Lower resources.min_devices to {cap} or less, or ask an admin to raise the quota with "
                f"`trainyard tenants update {principal.tenant_name} --max-active-devices {need}`."
            ),
            details={"min_devices": need, "max_active_devices": cap},
        )
