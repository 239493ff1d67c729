"""Cost governance use cases: budgets (set, read, hard-limit stops and resumes), usage reports, invoices
and the ledger reconciliation. The bookkeeping itself lives in :mod:`trainyard.tenancy.ledger`."""

from __future__ import annotations

import builtins
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import structlog
from sqlalchemy import Table, delete, select, update

from trainyard.errors import InvalidInputError, NotFoundError, PermissionDeniedError
from trainyard.services.domain import Job, Principal, iso
from trainyard.services.lifecycle import JobState
from trainyard.store.db import Database
from trainyard.store.governance_models import BudgetHoldRow, BudgetRow, GovernanceEventRow
from trainyard.store.repositories import JobRepo, TenantRepo
from trainyard.tenancy import ledger, settings_sync

if TYPE_CHECKING:
    from trainyard.services.jobs import JobService

log = structlog.get_logger("trainyard.governance")

_BUDGETS = cast(Table, BudgetRow.__table__)
_HOLDS = cast(Table, BudgetHoldRow.__table__)
_EVENTS = cast(Table, GovernanceEventRow.__table__)
MAX_EVENTS = 1000
MAX_RUNNING_SCANNED = 100_000  # running jobs a hard-budget pass reads, the oldest first


def parse_tag(tag: str | None) -> tuple[str, str]:
    if not tag:
        return "", ""
    key, sep, value = tag.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise InvalidInputError(
            f"tag {tag!r} is not KEY=VALUE",
            hint="Name one tag value, e.g. --tag team=support.",
            details={"errors": [{"field": "tag", "message": "expected KEY=VALUE"}]},
        )
    return key.strip(), value.strip()


def parse_time(text: str | None, *, field: str, end_of_day: bool = False) -> float | None:
    """A date (YYYY-MM-DD, the start of that UTC day; with ``end_of_day`` its end) or an ISO timestamp."""
    if text is None or text == "":
        return None
    try:
        if len(text) == 10:
            d = datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)
            return d.timestamp() + (86400.0 if end_of_day else 0.0)
        t = datetime.fromisoformat(text.upper())  # RFC 3339 §5.6 allows a lowercase t and z
        return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
    except ValueError:
        raise InvalidInputError(
            f"{field} {text!r} is not a date",
            hint="Use YYYY-MM-DD or an ISO-8601 timestamp such as 2026-12-01T00:00:00Z.",
            details={"errors": [{"field": field, "message": "expected YYYY-MM-DD or ISO-8601"}]},
        ) from None


class GovernanceService:
    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock
        self.jobs: JobService | None = None  # wired by the platform (holds are released through it)
        self.on_budgets_changed: Callable[[str], None] | None = None

    # ---- budgets ---------------------------------------------------------------------------------
    def _tenant(self, s: Any, name: str) -> Any:
        t = TenantRepo(s).by_name(name)
        if t is None:
            raise NotFoundError(
                f"no tenant named {name!r}", hint="List tenants with `trainyard tenants list`."
            )
        return t

    @staticmethod
    def _visible(principal: Principal, tenant_name: str) -> None:
        if not principal.admin and principal.tenant_name != tenant_name:
            raise NotFoundError(f"no tenant named {tenant_name!r}")

    def set_budget(
        self,
        tenant_name: str,
        *,
        usd: float,
        period: str = "month",
        hard: bool = False,
        tag: str | None = None,
    ) -> dict[str, Any]:
        """Create or change a tenant's (or one tag value's) budget for a period. Raising a hard budget
        resumes the work it had stopped, as far as the new limit allows."""
        if period not in ledger.PERIODS:
            raise InvalidInputError(
                f"period {period!r} is not supported",
                hint="Use --period month or --period day.",
                details={"errors": [{"field": "period", "message": "month or day"}]},
            )
        if not usd >= 0 or usd != usd or usd == float("inf"):
            raise InvalidInputError(
                "usd must be a finite amount of dollars >= 0",
                details={"errors": [{"field": "usd", "message": "must be >= 0"}]},
            )
        tag_key, tag_value = parse_tag(tag)
        now = self.clock()
        with self.db.session() as s:
            tenant = self._tenant(s, tenant_name)
            conn = s.connection()
            row = conn.execute(
                select(_BUDGETS.c.id).where(
                    _BUDGETS.c.tenant_id == tenant.id,
                    _BUDGETS.c.tag_key == tag_key,
                    _BUDGETS.c.tag_value == tag_value,
                    _BUDGETS.c.period == period,
                )
            ).first()
            if row is None:
                budget_id = f"bud-{secrets.token_hex(6)}"
                conn.execute(
                    _BUDGETS.insert(),
                    {
                        "id": budget_id,
                        "tenant_id": tenant.id,
                        "tag_key": tag_key,
                        "tag_value": tag_value,
                        "period": period,
                        "limit_usd": float(usd),
                        "hard": hard,
                        "created_at_s": now,
                        "updated_at_s": now,
                    },
                )
            else:
                budget_id = str(row[0])
                conn.execute(
                    update(_BUDGETS)
                    .where(_BUDGETS.c.id == budget_id)
                    .values(limit_usd=float(usd), hard=hard, updated_at_s=now)
                )
            b = next(x for x in ledger.tenant_budgets(conn, tenant.id) if x.id == budget_id)
            key = ledger.period_key(b.period, now)
            ledger._ensure_period(conn, b, key)
            spent, _, alerted = ledger.period_state(conn, b.id, key)
            ledger.alert_crossings(conn, b, key, spent, alerted, now, tenant.name)
            ledger.append_event(
                conn,
                tenant.id,
                "budget_set",
                {"budget_id": b.id, "tag": b.tag, "period": period, "limit_usd": float(usd), "hard": hard},
                now,
            )
            settings_sync.bump(conn)  # other server processes drop their cached budgets and principals
        if self.on_budgets_changed is not None:
            self.on_budgets_changed(tenant.id)
        self.release_holds(budget_id)
        return self.budget_document(budget_id)

    def budget_document(self, budget_id: str) -> dict[str, Any]:
        now = self.clock()
        with self.db.session() as s:
            conn = s.connection()
            row = conn.execute(select(_BUDGETS).where(_BUDGETS.c.id == budget_id)).first()
            if row is None:
                raise NotFoundError(f"no budget {budget_id!r}")
            b = ledger._budget(row)
            tenant = TenantRepo(s).by_id(b.tenant_id)
            key = ledger.period_key(b.period, now)
            spent, reserved, alerted = ledger.period_state(conn, b.id, key)
            if not conn.execute(
                select(ledger._PERIODS.c.budget_id).where(
                    ledger._PERIODS.c.budget_id == b.id, ledger._PERIODS.c.period_key == key
                )
            ).first():
                spent = self._ledger_spent(conn, b, key)
            held = [r[0] for r in conn.execute(select(_HOLDS.c.job_id).where(_HOLDS.c.budget_id == b.id))]
        used = 100.0 * (spent / b.limit_usd) if b.limit_usd > 0 else (100.0 if spent > 0 else 0.0)
        return {
            "id": b.id,
            "tenant": tenant.name if tenant else b.tenant_id,
            "tag": b.tag,
            "period": b.period,
            "period_key": key,
            "usd": b.limit_usd,
            "hard": b.hard,
            "spent_usd": round(spent, 6),
            "reserved_usd": round(max(0.0, reserved), 6),
            "remaining_usd": round(max(0.0, b.limit_usd - spent - max(0.0, reserved)), 6),
            "used_pct": round(used, 2),
            "alerted_pct": alerted,
            "held_jobs": sorted(held),
            "created_at": iso(b.created_at_s),
            "updated_at": iso(b.updated_at_s),
        }

    @staticmethod
    def _ledger_spent(conn: Any, b: ledger.Budget, key: str) -> float:
        start, end = ledger.period_bounds_s(b.period, key)
        rows = conn.execute(
            select(ledger._LEDGER.c.usd, ledger._LEDGER.c.tags).where(
                ledger._LEDGER.c.tenant_id == b.tenant_id,
                ledger._LEDGER.c.time_s >= start,
                ledger._LEDGER.c.time_s < end,
            )
        )
        return sum(float(u) for u, tags in rows if float(u) > 0 and b.applies_to(tags))

    def all_budgets(self, limit: int = 1_000) -> builtins.list[dict[str, Any]]:
        """Every tenant's budgets (for the metrics scrape), at most ``limit``."""
        with self.db.session() as s:
            ids = [
                str(r[0])
                for r in s.connection().execute(select(_BUDGETS.c.id).order_by(_BUDGETS.c.id).limit(limit))
            ]
        return [self.budget_document(b) for b in ids]

    def list_budgets(
        self, principal: Principal, tenant_name: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        with self.db.session() as s:
            if tenant_name is not None:
                self._visible(principal, tenant_name)
                ids = [self._tenant(s, tenant_name).id]
            elif principal.admin:
                ids = [t.id for t in TenantRepo(s).list()]
            else:
                ids = [principal.tenant_id]
            budget_ids = [
                str(r[0])
                for r in s.connection().execute(
                    select(_BUDGETS.c.id)
                    .where(_BUDGETS.c.tenant_id.in_(ids))
                    .order_by(
                        _BUDGETS.c.tenant_id, _BUDGETS.c.tag_key, _BUDGETS.c.tag_value, _BUDGETS.c.period
                    )
                )
            ]
        return [self.budget_document(b) for b in budget_ids]

    def get_budget(
        self, principal: Principal, tenant_name: str, *, tag: str | None = None, period: str = "month"
    ) -> dict[str, Any]:
        self._visible(principal, tenant_name)
        tag_key, tag_value = parse_tag(tag)
        with self.db.session() as s:
            tenant = self._tenant(s, tenant_name)
            row = (
                s.connection()
                .execute(
                    select(_BUDGETS.c.id).where(
                        _BUDGETS.c.tenant_id == tenant.id,
                        _BUDGETS.c.tag_key == tag_key,
                        _BUDGETS.c.tag_value == tag_value,
                        _BUDGETS.c.period == period,
                    )
                )
                .first()
            )
        if row is None:
            scope = f"tenant {tenant_name!r}" + (f" tag {tag}" if tag else "")
            raise NotFoundError(
                f"{scope} has no {period} budget",
                hint=f"Set one with `trainyard budgets set {tenant_name} --usd N`.",
            )
        return self.budget_document(str(row[0]))

    def events(self, principal: Principal, tenant_name: str | None = None) -> builtins.list[dict[str, Any]]:
        name = tenant_name or principal.tenant_name
        self._visible(principal, name)
        with self.db.session() as s:
            tenant = self._tenant(s, name)
            rows = s.connection().execute(
                select(_EVENTS)
                .where(_EVENTS.c.tenant_id == tenant.id)
                .order_by(_EVENTS.c.id.desc())
                .limit(MAX_EVENTS)
            )
            return [
                {"id": r.id, "kind": r.kind, "time": iso(r.time_s), "data": r.data}
                for r in reversed(list(rows))
            ]

    # ---- hard limits on running work -------------------------------------------------------------
    def over_budget_running(self, notice_s: float) -> builtins.list[tuple[str, str]]:
        """(job id, budget id) of running work that must stop: for a hard budget, what its period has
        spent plus what its running jobs have accrued (plus the cost of the notice period) reaches the
        limit."""
        now = self.clock()
        out: list[tuple[str, str]] = []
        with self.db.session() as s:
            conn = s.connection()
            hard = [
                ledger._budget(r) for r in conn.execute(select(_BUDGETS).where(_BUDGETS.c.hard.is_(True)))
            ]
            if not hard:
                return []
            running = JobRepo(s).list(
                states=[JobState.STARTING.value, JobState.RUNNING.value],
                limit=MAX_RUNNING_SCANNED,
                newest_first=False,
            )
            held = {r[0] for r in conn.execute(select(_HOLDS.c.job_id))}
            for b in hard:
                mine = [
                    j
                    for j in running
                    if j.tenant_id == b.tenant_id and b.applies_to(j.spec.get("tags")) and j.id not in held
                ]
                if not mine:
                    continue
                key = ledger.period_key(b.period, now)
                spent, _, _ = ledger.period_state(conn, b.id, key)
                accrued = sum(_accrued_usd(j, now) for j in mine)
                margin = sum(_rate_usd_per_s(j) * notice_s for j in mine)
                if spent + accrued + margin >= b.limit_usd:
                    out += [(j.id, b.id) for j in mine]
        return out

    def exhausted_hard_budgets(self, tenant_id: str) -> builtins.list[dict[str, Any]]:
        """The tenant's hard budgets whose current period has nothing left (spent plus what admitted work
        holds reserved reaches the limit): ``{id, tag_key, tag_value, period, usd, spent_usd,
        reserved_usd}`` each. Inference is refused under any of them that applies to its tags."""
        now = self.clock()
        out: builtins.list[dict[str, Any]] = []
        with self.db.session() as s:
            conn = s.connection()
            rows = conn.execute(
                select(_BUDGETS).where(_BUDGETS.c.tenant_id == tenant_id, _BUDGETS.c.hard.is_(True))
            )
            for b in (ledger._budget(r) for r in rows):
                spent, reserved, _ = ledger.period_state(conn, b.id, ledger.period_key(b.period, now))
                if spent + max(0.0, reserved) >= b.limit_usd:
                    out.append(
                        {
                            "id": b.id,
                            "tag_key": b.tag_key,
                            "tag_value": b.tag_value,
                            "period": b.period,
                            "usd": b.limit_usd,
                            "spent_usd": round(spent, 6),
                            "reserved_usd": round(max(0.0, reserved), 6),
                        }
                    )
        return out

    def hold(self, job_id: str, budget_id: str) -> bool:
        """Mark a job as stopped at a budget (it stays ``preempted`` when its workers exit)."""
        with self.db.session() as s:
            conn = s.connection()
            inserted = ledger._insert_ignore(
                conn, _HOLDS, {"job_id": job_id, "budget_id": budget_id, "time_s": self.clock()}
            )
            job = JobRepo(s).get(job_id)
            if inserted and job is not None:
                ledger.append_event(
                    conn,
                    job.tenant_id,
                    "budget_stop",
                    {"job_id": job_id, "budget_id": budget_id},
                    self.clock(),
                )
        return bool(inserted)

    @staticmethod
    def is_held(s: Any, job_id: str) -> bool:
        return (
            s.connection().execute(select(_HOLDS.c.job_id).where(_HOLDS.c.job_id == job_id)).first()
            is not None
        )

    def release_holds(self, budget_id: str) -> builtins.list[str]:
        """Requeue the jobs a budget stopped, while the budget has room (they resume from their last
        checkpoint). A job also held by another budget that is still exhausted stays held."""
        if self.jobs is None:
            return []
        now = self.clock()
        released: list[str] = []
        with self.db.session() as s:
            conn = s.connection()
            row = conn.execute(select(_BUDGETS).where(_BUDGETS.c.id == budget_id)).first()
            if row is None:
                return []
            b = ledger._budget(row)
            spent, _, _ = ledger.period_state(conn, b.id, ledger.period_key(b.period, now))
            if b.hard and spent >= b.limit_usd:
                return []
            for (job_id,) in conn.execute(
                select(_HOLDS.c.job_id).where(_HOLDS.c.budget_id == budget_id)
            ).all():
                job = JobRepo(s).get(str(job_id), for_update=True)
                conn.execute(delete(_HOLDS).where(_HOLDS.c.job_id == job_id))
                if job is None or job.state != JobState.PREEMPTED:
                    continue
                self.jobs.transition(
                    s,
                    job,
                    JobState.QUEUED,
                    "budget raised: back in the queue, resumes from its last checkpoint",
                )
                ledger.append_event(
                    conn, job.tenant_id, "budget_resume", {"job_id": job.id, "budget_id": b.id}, now
                )
                released.append(job.id)
        if released:
            log.info("budget_holds_released", budget_id=budget_id, jobs=released)
        return released

    # ---- usage -----------------------------------------------------------------------------------------
    def _scope(
        self, s: Any, principal: Principal, tenant_name: str | None
    ) -> tuple[list[str] | None, dict[str, str]]:
        names = {t.id: t.name for t in TenantRepo(s).list()}
        if tenant_name is not None:
            self._visible(principal, tenant_name)
            t = self._tenant(s, tenant_name)
            return [t.id], names
        if principal.admin:
            return None, names
        return [principal.tenant_id], names

    def usage(
        self,
        principal: Principal,
        *,
        by: str = "tenant",
        from_: str | None = None,
        to: str | None = None,
        tenant_name: str | None = None,
    ) -> dict[str, Any]:
        group = ledger.parse_group(by)
        from_s = parse_time(from_, field="from")
        to_s = parse_time(to, field="to", end_of_day=True)
        with self.db.session() as s:
            ids, names = self._scope(s, principal, tenant_name)
            rows = ledger.entries(
                s.connection(), ledger.UsageQuery(by=group, tenant_ids=ids, from_s=from_s, to_s=to_s)
            )
        out = ledger.group_usage(rows, group, names)
        return {
            "by": group,
            "from": iso(from_s),
            "to": iso(to_s),
            "rows": out,
            "total_usd": round(sum(r["usd"] for r in out), 6),
        }

    def invoice(
        self, principal: Principal, tenant_name: str | None = None, month: str | None = None
    ) -> dict[str, Any]:
        name = tenant_name or principal.tenant_name
        self._visible(principal, name)
        key = month or ledger.period_key("month", self.clock())
        try:
            start, end = ledger.period_bounds_s("month", key)
        except ValueError:
            raise InvalidInputError(
                f"month {key!r} is not YYYY-MM",
                details={"errors": [{"field": "month", "message": "expected YYYY-MM"}]},
            ) from None
        with self.db.session() as s:
            tenant = self._tenant(s, name)
            rows = ledger.entries(
                s.connection(), ledger.UsageQuery(by="kind", tenant_ids=[tenant.id], from_s=start, to_s=end)
            )
        lines = ledger.invoice_lines(rows)
        return {
            "tenant": name,
            "month": key,
            "from": iso(start),
            "to": iso(end),
            "lines": lines,
            "by_tag": _tag_totals(rows),
            "total_usd": round(sum(float(r["usd"]) for r in rows), 2),
            "total_usd_exact": round(sum(float(r["usd"]) for r in rows), 6),
        }

    def reconcile(self, principal: Principal) -> dict[str, Any]:
        if not principal.admin:
            raise PermissionDeniedError("reconciling the ledger needs an admin key")
        with self.db.session() as s:
            return ledger.check_reconciled(s.connection())


def _tag_totals(rows: builtins.list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{tag key: {tag value: usd}} over the invoice's entries (cost allocation by tags)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        for k, v in (r.get("tags") or {}).items():
            per = out.setdefault(str(k), {})
            per[str(v)] = round(per.get(str(v), 0.0) + float(r["usd"]), 6)
    return out


def _rate_usd_per_s(job: Job) -> float:
    p = job.placement
    return 0.0 if p is None else p.devices * p.price_usd_per_device_hour / 3600.0


def _accrued_usd(job: Job, now_s: float) -> float:
    if job.attempt_started_at_s is None:
        return 0.0
    return max(0.0, now_s - job.attempt_started_at_s) * _rate_usd_per_s(job)


class InferenceBudgetGate:
    """Refuses inference once a hard budget that applies to it has nothing left.

    The gateway asks :meth:`refusal` before every forward; each tenant's exhausted hard budgets are read
    at most once per ``ttl_s`` (off the event loop), so the check costs a dict lookup on the hot path and
    a request admitted in the ``ttl_s`` after a budget runs out is the bound on what passes it."""

    def __init__(self, governance: GovernanceService, *, ttl_s: float = 1.0) -> None:
        self.governance = governance
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, builtins.list[dict[str, Any]]]] = {}

    async def refusal(self, tenant_id: str, tags: dict[str, Any]) -> dict[str, Any] | None:
        """The exhausted hard budget that applies to a request with ``tags``, or None."""
        import asyncio

        now = time.monotonic()
        hit = self._cache.get(tenant_id)
        if hit is None or now - hit[0] > self.ttl_s:
            exhausted = await asyncio.to_thread(self.governance.exhausted_hard_budgets, tenant_id)
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[tenant_id] = hit = (now, exhausted)
        for b in hit[1]:
            if not b["tag_key"] or (b["tag_key"] in tags and str(tags[b["tag_key"]]) == b["tag_value"]):
                return b
        return None

    def forget(self, tenant_id: str | None = None) -> None:
        """Read the budgets afresh on the next request (a budget was set or raised in this process)."""
        if tenant_id is None:
            self._cache.clear()
        else:
            self._cache.pop(tenant_id, None)
