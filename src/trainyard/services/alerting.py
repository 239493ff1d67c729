"""Alerts delivered: conditions on jobs, budgets and deployments become alerts, and every alert is POSTed,
signed, to each webhook its tenant registered for that rule.

Rules (thresholds from settings ``alert_*``):

- ``job_stalled``: a running job has not reported for ``alert_stalled_after_s`` (once per attempt).
- ``loss_nan``: an attempt failed because its loss became NaN or infinite.
- ``loss_diverging``: a logged loss exceeds ``alert_loss_divergence_factor`` × the lowest loss of the
  attempt so far, after ``alert_loss_min_steps`` steps (once per attempt).
- ``checkpoint_failed``: a checkpoint save failed, or the job stopped because its checkpoint storage did.
- ``budget_threshold``: a budget crossed 50/80/100 % (the ledger's ``budget_alert`` events).
- ``deployment_error_rate`` / ``deployment_latency``: over the last ``alert_deployment_window_s``, with at
  least ``alert_deployment_min_requests`` requests, the share of 5xx answers or the p95 latency of a
  deployment passed its threshold (once per window).
- ``job_failing_repeatedly``, ``budget_burn`` (a job's own ``objective.budget_usd``), ``stuck_starting``:
  the platform's health rules (:mod:`trainyard.observability.alerts`), once per job and severity.

Each condition fires once (``alerts.dedup_key``). An alert is a job event ``alert`` (or a tenant event
for budgets and deployments); each delivery attempt is an ``alert_delivery`` event in the same place.
Deliveries run on a small thread pool (:mod:`trainyard.observability.webhooks` retries with backoff);
they only ever go to webhooks of the alert's own tenant.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
import structlog
from sqlalchemy import Table, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from trainyard.errors import InvalidInputError, NotFoundError
from trainyard.executors.base import ExecutorEvent
from trainyard.observability.webhooks import AttemptResult, DeliveryPolicy, deliver
from trainyard.services.domain import Job, Principal, iso
from trainyard.services.lifecycle import JobState
from trainyard.store.alert_models import AlertRow, WebhookRow, WebhookSecretRow
from trainyard.store.db import Database
from trainyard.store.governance_models import GovernanceEventRow
from trainyard.store.metrics_repo import MetricsRepo
from trainyard.store.repositories import EventRepo, JobRepo
from trainyard.store.serving_models import ServingRequestRow
from trainyard.tenancy import ledger
from trainyard.tenancy.storage import check_outbound_url, parse_networks

log = structlog.get_logger("trainyard.alerts")

_WEBHOOKS = cast(Table, WebhookRow.__table__)
_SECRETS = cast(Table, WebhookSecretRow.__table__)
_ALERTS = cast(Table, AlertRow.__table__)
_GOV_EVENTS = cast(Table, GovernanceEventRow.__table__)
_REQUESTS = cast(Table, ServingRequestRow.__table__)

RULES: dict[str, str] = {
    "job_stalled": "A running job stopped reporting.",
    "loss_nan": "A job's loss became NaN or infinite.",
    "loss_diverging": "A job's loss grew far above its best value.",
    "checkpoint_failed": "A checkpoint save failed, or the job's checkpoint storage did.",
    "budget_threshold": "A budget crossed 50, 80 or 100 % of its limit.",
    "deployment_error_rate": "A deployment answers too many requests with server errors.",
    "deployment_latency": "A deployment's p95 latency is above its threshold.",
    "webhook_test": "A test delivery asked for through the API.",
    # the platform's health rules (trainyard.observability.alerts), delivered too
    "job_failing_repeatedly": "An open job keeps failing and being restarted.",
    "budget_burn": "A job's cost is close to (or over) its budget_usd.",
    "stuck_starting": "A placed job has not started its workers.",
}
HEALTH_RULES = ("job_failing_repeatedly", "budget_burn", "stuck_starting")
MAX_WEBHOOKS_PER_TENANT = 20
MAX_LISTED_ALERTS = 500


@dataclass(frozen=True)
class AlertConfig:
    stalled_after_s: float = 600.0
    loss_divergence_factor: float = 3.0
    loss_min_steps: int = 20
    deployment_window_s: float = 300.0
    deployment_min_requests: int = 20
    deployment_error_rate: float = 0.05
    deployment_p95_latency_s: float = 10.0
    scan_interval_s: float = 5.0
    allowed_networks: str = ""
    delivery: DeliveryPolicy = field(default_factory=DeliveryPolicy)

    @classmethod
    def from_settings(cls, settings: Any) -> AlertConfig:
        return cls(
            stalled_after_s=settings.alert_stalled_after_s,
            loss_divergence_factor=settings.alert_loss_divergence_factor,
            loss_min_steps=settings.alert_loss_min_steps,
            deployment_window_s=settings.alert_deployment_window_s,
            deployment_min_requests=settings.alert_deployment_min_requests,
            deployment_error_rate=settings.alert_deployment_error_rate,
            deployment_p95_latency_s=settings.alert_deployment_p95_latency_s,
            scan_interval_s=settings.alert_scan_interval_s,
            allowed_networks=settings.webhook_allowed_networks or "",
            delivery=DeliveryPolicy(
                max_attempts=settings.webhook_max_attempts,
                backoff_initial_s=settings.webhook_backoff_initial_s,
                backoff_max_s=settings.webhook_backoff_max_s,
                timeout_s=settings.webhook_timeout_s,
            ),
        )


@dataclass(frozen=True)
class Candidate:
    """A condition that holds; it becomes an alert unless its ``dedup_key`` fired already."""

    tenant_id: str
    rule: str
    severity: str
    dedup_key: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    job_id: str | None = None
    deployment: str | None = None


def webhook_document(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "url": row.url,
        "rules": list(row.rules) if row.rules else None,
        "created_at": iso(row.created_at_s),
    }


def alert_document(row: Any, tenant_name: str | None = None) -> dict[str, Any]:
    return {
        "id": f"alr-{row.id}",
        "rule": row.rule,
        "severity": row.severity,
        "message": row.message,
        "tenant": tenant_name,
        "job_id": row.job_id,
        "deployment": row.deployment,
        "data": row.data,
        "fired_at": iso(row.fired_at_s),
    }


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank) of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


class AlertService:
    def __init__(
        self,
        db: Database,
        config: AlertConfig,
        *,
        tenant_name: Callable[[str], str | None],
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.db = db
        self.config = config
        self.tenant_name = tenant_name
        self.clock = clock
        self.transport = transport
        self.networks = parse_networks(config.allowed_networks)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="trainyard-webhooks")
        self._stop = threading.Event()
        self._last_scan_s = 0.0
        self._gov_cursor: int | None = None
        self._inflight: set[Any] = set()
        self._lock = threading.Lock()
        # set by the platform: the open jobs' health (observability.snapshot), for the HEALTH_RULES
        self.health: Callable[[float], list[Any]] | None = None

    # ---- webhooks --------------------------------------------------------------------------------
    def check_url(self, url: str) -> list[str]:
        return check_outbound_url(url, allowed_networks=self.networks, purpose="url")

    def _rules(self, rules: list[str] | None) -> list[str] | None:
        if rules is None:
            return None
        unknown = [r for r in rules if r not in RULES]
        if unknown:
            raise InvalidInputError(
                f"unknown alert rules: {', '.join(unknown)}",
                hint=f"Rules: {', '.join(RULES)}.",
                details={"errors": [{"field": "rules", "message": f"unknown rule {r!r}"} for r in unknown]},
            )
        return sorted(set(rules)) or None

    def _secret(self, s: Session, tenant_id: str, *, rotate: bool = False) -> str:
        conn = s.connection()
        row = conn.execute(select(_SECRETS.c.secret).where(_SECRETS.c.tenant_id == tenant_id)).first()
        if row is not None and not rotate:
            return str(row[0])
        secret = "whsec_" + secrets.token_urlsafe(32)
        if row is None:
            conn.execute(
                _SECRETS.insert(), {"tenant_id": tenant_id, "secret": secret, "created_at_s": self.clock()}
            )
        else:
            conn.execute(
                update(_SECRETS)
                .where(_SECRETS.c.tenant_id == tenant_id)
                .values(secret=secret, created_at_s=self.clock())
            )
        return secret

    def create_webhook(
        self, principal: Principal, url: str, rules: list[str] | None = None
    ) -> dict[str, Any]:
        """Register ``url`` for the caller's tenant; the answer carries the tenant's signing secret."""
        errors: list[dict[str, Any]] = []
        try:
            self.check_url(url)
        except InvalidInputError as exc:
            errors += list(exc.details.get("errors") or [])
        try:
            rules = self._rules(rules)
        except InvalidInputError as exc:
            errors += list(exc.details.get("errors") or [])
        if errors:
            from trainyard.errors import UrlNotAllowedError

            first = errors[0]
            cls = UrlNotAllowedError if first["field"] == "url" else InvalidInputError
            raise cls(f"{first['field']}: {first['message']}", details={"errors": errors})
        with self.db.session() as s:
            conn = s.connection()
            count = conn.execute(
                select(func.count())
                .select_from(_WEBHOOKS)
                .where(_WEBHOOKS.c.tenant_id == principal.tenant_id)
            ).scalar_one()
            if count >= MAX_WEBHOOKS_PER_TENANT:
                raise InvalidInputError(
                    f"a tenant may register at most {MAX_WEBHOOKS_PER_TENANT} webhooks",
                    hint="Delete one with DELETE /v1/webhooks/{id} first.",
                    details={"errors": [{"field": "url", "message": "too many webhooks"}]},
                )
            wid = f"whk-{secrets.token_hex(6)}"
            conn.execute(
                _WEBHOOKS.insert(),
                {
                    "id": wid,
                    "tenant_id": principal.tenant_id,
                    "url": url,
                    "rules": rules,
                    "created_at_s": self.clock(),
                    "disabled": False,
                },
            )
            secret = self._secret(s, principal.tenant_id)
            row = conn.execute(select(_WEBHOOKS).where(_WEBHOOKS.c.id == wid)).one()
        return {**webhook_document(row), "signing_secret": secret}

    def list_webhooks(self, principal: Principal) -> list[dict[str, Any]]:
        with self.db.session() as s:
            rows = s.connection().execute(
                select(_WEBHOOKS)
                .where(_WEBHOOKS.c.tenant_id == principal.tenant_id)
                .order_by(_WEBHOOKS.c.created_at_s, _WEBHOOKS.c.id)
            )
            return [webhook_document(r) for r in rows]

    def _own_webhook(self, s: Session, principal: Principal, webhook_id: str) -> Any:
        row = (
            s.connection()
            .execute(
                select(_WEBHOOKS).where(
                    _WEBHOOKS.c.id == webhook_id, _WEBHOOKS.c.tenant_id == principal.tenant_id
                )
            )
            .first()
        )
        if row is None:
            raise NotFoundError(f"no webhook {webhook_id!r}", hint="List yours with GET /v1/webhooks.")
        return row

    def delete_webhook(self, principal: Principal, webhook_id: str) -> None:
        with self.db.session() as s:
            self._own_webhook(s, principal, webhook_id)
            s.connection().execute(delete(_WEBHOOKS).where(_WEBHOOKS.c.id == webhook_id))

    def rotate_secret(self, principal: Principal) -> dict[str, Any]:
        with self.db.session() as s:
            return {"signing_secret": self._secret(s, principal.tenant_id, rotate=True)}

    def test_webhook(self, principal: Principal, webhook_id: str) -> dict[str, Any]:
        """Send a ``webhook_test`` alert to one webhook now (not deduplicated)."""
        with self.db.session() as s:
            self._own_webhook(s, principal, webhook_id)
        cand = Candidate(
            tenant_id=principal.tenant_id,
            rule="webhook_test",
            severity="info",
            dedup_key=f"webhook_test:{webhook_id}:{secrets.token_hex(6)}",
            message=f"test delivery to webhook {webhook_id}",
            data={"webhook_id": webhook_id},
        )
        doc = self.fire(cand, only_webhook=webhook_id)
        assert doc is not None
        return doc

    def list_alerts(self, principal: Principal, *, job_id: str | None = None) -> list[dict[str, Any]]:
        q = select(_ALERTS).where(_ALERTS.c.tenant_id == principal.tenant_id)
        if job_id is not None:
            q = q.where(_ALERTS.c.job_id == job_id)
        with self.db.session() as s:
            rows = list(s.connection().execute(q.order_by(_ALERTS.c.id.desc()).limit(MAX_LISTED_ALERTS)))
        return [alert_document(r, principal.tenant_name) for r in reversed(rows)]

    # ---- firing ----------------------------------------------------------------------------------
    def fire(self, cand: Candidate, *, only_webhook: str | None = None) -> dict[str, Any] | None:
        """Record ``cand`` as an alert (None when its condition fired before) and deliver it."""
        now = self.clock()
        tenant = self.tenant_name(cand.tenant_id)
        try:
            with self.db.session() as s:
                conn = s.connection()
                with s.begin_nested():
                    alert_id = conn.execute(
                        _ALERTS.insert().returning(_ALERTS.c.id),
                        {
                            "tenant_id": cand.tenant_id,
                            "job_id": cand.job_id,
                            "deployment": cand.deployment,
                            "rule": cand.rule,
                            "severity": cand.severity,
                            "dedup_key": cand.dedup_key[:200],
                            "message": cand.message[:2000],
                            "data": cand.data,
                            "fired_at_s": now,
                        },
                    ).scalar_one()
                row = conn.execute(select(_ALERTS).where(_ALERTS.c.id == alert_id)).one()
                doc = alert_document(row, tenant)
                q = select(_WEBHOOKS).where(
                    _WEBHOOKS.c.tenant_id == cand.tenant_id, _WEBHOOKS.c.disabled.is_(False)
                )
                if only_webhook is not None:
                    q = q.where(_WEBHOOKS.c.id == only_webhook)
                hooks = [
                    h
                    for h in conn.execute(q)
                    if only_webhook is not None or not h.rules or cand.rule in h.rules
                ]
                secret = self._secret(s, cand.tenant_id) if hooks else ""
                self._record(
                    s,
                    cand,
                    "alert",
                    {
                        "alert_id": doc["id"],
                        "rule": cand.rule,
                        "severity": cand.severity,
                        "message": cand.message[:500],
                        "webhooks": [h.id for h in hooks],
                    },
                    now,
                )
        except IntegrityError:
            return None  # fired before (dedup_key)
        log.info("alert", rule=cand.rule, tenant=tenant, job_id=cand.job_id, webhooks=len(hooks))
        for h in hooks:
            self._submit(doc, cand, h.id, h.url, secret)
        return doc

    def _record(self, s: Session, cand: Candidate, kind: str, data: dict[str, Any], now: float) -> None:
        """An event where the alert's owner sees it: the job's event log, else the tenant's."""
        if cand.job_id is not None and JobRepo(s).get(cand.job_id) is not None:
            EventRepo(s).append(cand.job_id, kind, data, now)
        else:
            ledger.append_event(s.connection(), cand.tenant_id, kind, data, now)

    def _submit(self, doc: dict[str, Any], cand: Candidate, webhook_id: str, url: str, secret: str) -> None:
        if self._stop.is_set():
            return
        fut = self._pool.submit(self._deliver, doc, cand, webhook_id, url, secret)
        with self._lock:
            self._inflight.add(fut)
        fut.add_done_callback(self._done)

    def _done(self, fut: Any) -> None:
        with self._lock:
            self._inflight.discard(fut)

    def _deliver(self, doc: dict[str, Any], cand: Candidate, webhook_id: str, url: str, secret: str) -> None:
        policy = self.config.delivery

        def on_attempt(res: AttemptResult) -> None:
            data = {
                "alert_id": doc["id"],
                "rule": cand.rule,
                "webhook_id": webhook_id,
                "url": url,
                "attempt": res.attempt,
                "max_attempts": policy.max_attempts,
                "ok": res.ok,
                "status_code": res.status_code,
                "error": res.error,
                "duration_s": res.duration_s,
                "will_retry": res.retryable and res.attempt < policy.max_attempts,
            }
            try:
                with self.db.session() as s:
                    self._record(s, cand, "alert_delivery", data, self.clock())
            except Exception:
                log.exception("alert_delivery_event_failed", webhook_id=webhook_id)

        try:
            result = deliver(
                url,
                {**doc, "webhook_id": webhook_id},
                secret=secret,
                headers={"Trainyard-Alert-Id": doc["id"], "Trainyard-Webhook-Id": webhook_id},
                policy=policy,
                check_url=self.check_url,
                on_attempt=on_attempt,
                sleep=self._sleep,
                transport=self.transport,
            )
            log.info("alert_delivered" if result.ok else "alert_undelivered", webhook_id=webhook_id, url=url)
        except Exception:
            log.exception("alert_delivery_failed", webhook_id=webhook_id)

    def _sleep(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise RuntimeError("shutting down: delivery abandoned")

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Block until no delivery is in flight (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._inflight:
                    return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ---- conditions seen in executor events (called after the supervisor applied them) -----------
    def observe(self, ev: ExecutorEvent, job: Job) -> None:
        for cand in self.candidates_for_event(ev, job):
            self.fire(cand)

    def candidates_for_event(self, ev: ExecutorEvent, job: Job) -> list[Candidate]:
        key = f"{job.id}:a{ev.attempt}"
        data = ev.data
        out: list[Candidate] = []
        if ev.kind == "failed":
            reason = str(data.get("reason") or "")
            if "TrainingDiverged" in reason or "loss became" in reason:
                out.append(
                    Candidate(
                        job.tenant_id,
                        "loss_nan",
                        "critical",
                        f"loss_nan:{key}",
                        f"{job.name} ({job.id}) stopped: {reason[:300]}",
                        {"attempt": ev.attempt, "reason": reason[:500]},
                        job_id=job.id,
                    )
                )
            if data.get("classification") == "storage" or "checkpoint storage failed" in reason:
                out.append(
                    Candidate(
                        job.tenant_id,
                        "checkpoint_failed",
                        "critical",
                        f"checkpoint_failed:{key}:stopped",
                        f"{job.name} ({job.id}) stopped because its checkpoint storage failed: "
                        f"{reason[:300]}",
                        {"attempt": ev.attempt, "reason": reason[:500]},
                        job_id=job.id,
                    )
                )
        elif ev.kind == "log" and data.get("checkpoint_failed"):
            n = int(data.get("failures") or 1)
            out.append(
                Candidate(
                    job.tenant_id,
                    "checkpoint_failed",
                    "warning",
                    f"checkpoint_failed:{key}",  # the first failure of the attempt (an outage retries)
                    f"{job.name} ({job.id}): {str(data.get('message'))[:400]}",
                    {"attempt": ev.attempt, "error": str(data.get("error"))[:500], "failures": n},
                    job_id=job.id,
                )
            )
        elif ev.kind == "metrics":
            out += self._divergence(ev, job, key)
        return out

    def _divergence(self, ev: ExecutorEvent, job: Job, key: str) -> list[Candidate]:
        from trainyard.runtime.metrics import unpack

        rows = [(step, v["loss"]) for step, _t, v in unpack(ev.data) if v.get("loss") is not None]
        late = [(step, loss) for step, loss in rows if step >= self.config.loss_min_steps]
        if not late:
            return []
        with self.db.session() as s:
            best = MetricsRepo(s).min_loss(job.id, ev.attempt)
        if best is None or best <= 0:
            return []
        step, loss = max(late, key=lambda r: r[1] or 0.0)
        assert loss is not None
        if loss <= self.config.loss_divergence_factor * best:
            return []
        return [
            Candidate(
                job.tenant_id,
                "loss_diverging",
                "warning",
                f"loss_diverging:{key}",
                f"{job.name} ({job.id}): loss {loss:.4g} at step {step} is {loss / best:.1f}x its best "
                f"({best:.4g})",
                {"attempt": ev.attempt, "step": step, "loss": loss, "best_loss": best},
                job_id=job.id,
            )
        ]

    # ---- conditions found by looking (a phase of the control loop) -------------------------------
    def scan(self) -> int:
        """Stalled jobs, budget thresholds, deployments; at most every ``scan_interval_s``."""
        now = self.clock()
        if now - self._last_scan_s < self.config.scan_interval_s:
            return 0
        self._last_scan_s = now
        fired = 0
        for cand in [*self._stalled(now), *self._budgets(), *self._deployments(now), *self._health(now)]:
            fired += self.fire(cand) is not None
        return fired

    def _stalled(self, now: float) -> list[Candidate]:
        out = []
        with self.db.session() as s:
            running = JobRepo(s).list(states=[JobState.RUNNING.value], limit=100_000)
        for job in running:
            last = float(job.progress.get("time_s") or job.attempt_started_at_s or job.updated_at_s)
            silent = now - last
            if silent > self.config.stalled_after_s:
                out.append(
                    Candidate(
                        job.tenant_id,
                        "job_stalled",
                        "critical",
                        f"job_stalled:{job.id}:a{job.attempt}",
                        f"{job.name} ({job.id}) has not reported for {silent:.0f} s "
                        f"(step {job.progress.get('step')})",
                        {
                            "attempt": job.attempt,
                            "silent_s": round(silent, 1),
                            "step": job.progress.get("step"),
                        },
                        job_id=job.id,
                    )
                )
        return out

    def _health(self, now: float) -> list[Candidate]:
        """The health rules' alerts on open jobs, each once per job and severity."""
        if self.health is None:
            return []
        from trainyard.observability.alerts import evaluate

        out = []
        for a in evaluate(self.health(now)):
            if a.rule not in HEALTH_RULES or a.tenant_id is None:
                continue
            out.append(
                Candidate(
                    a.tenant_id,
                    a.rule,
                    a.severity,
                    f"{a.rule}:{a.job_id}:{a.severity}",
                    a.message,
                    {"value": a.value, "threshold": a.threshold},
                    job_id=a.job_id,
                )
            )
        return out

    def _budgets(self) -> list[Candidate]:
        with self.db.session() as s:
            conn = s.connection()
            if self._gov_cursor is None:  # from the recent past: alerts already fired are skipped by key
                top = conn.execute(select(func.max(_GOV_EVENTS.c.id))).scalar() or 0
                self._gov_cursor = max(0, int(top) - 1000)
            rows = list(
                conn.execute(
                    select(_GOV_EVENTS)
                    .where(_GOV_EVENTS.c.id > self._gov_cursor, _GOV_EVENTS.c.kind == "budget_alert")
                    .order_by(_GOV_EVENTS.c.id)
                    .limit(1000)
                )
            )
            top_now = conn.execute(select(func.max(_GOV_EVENTS.c.id))).scalar() or 0
        self._gov_cursor = int(top_now) if len(rows) < 1000 else int(rows[-1].id)
        out = []
        for r in rows:
            d = dict(r.data or {})
            pct = d.get("threshold_pct")
            out.append(
                Candidate(
                    r.tenant_id,
                    "budget_threshold",
                    "critical" if (pct or 0) >= 100 else "warning",
                    f"budget_threshold:{d.get('budget_id')}:{d.get('period_key')}:{pct}",
                    f"budget {d.get('tag') or 'tenant'} ({d.get('period')}) crossed {pct} %: "
                    f"${float(d.get('spent_usd') or 0):.2f} of ${float(d.get('limit_usd') or 0):.2f}",
                    d,
                )
            )
        return out

    def _deployments(self, now: float) -> list[Candidate]:
        window = self.config.deployment_window_s
        since = now - window
        with self.db.session() as s:
            rows = list(
                s.connection().execute(
                    select(
                        _REQUESTS.c.tenant_id,
                        _REQUESTS.c.deployment,
                        _REQUESTS.c.status,
                        _REQUESTS.c.latency_s,
                    )
                    .where(_REQUESTS.c.created_at_s >= since, _REQUESTS.c.route != "shadow")
                    .limit(200_000)
                )
            )
        groups: dict[tuple[str, str], list[Any]] = {}
        for r in rows:
            groups.setdefault((r.tenant_id, r.deployment), []).append(r)
        bucket = int(now // window)
        out = []
        for (tenant_id, dep), reqs in groups.items():
            if len(reqs) < self.config.deployment_min_requests:
                continue
            errors = sum(1 for r in reqs if int(r.status) >= 500)
            rate = errors / len(reqs)
            if rate > self.config.deployment_error_rate:
                out.append(
                    Candidate(
                        tenant_id,
                        "deployment_error_rate",
                        "critical",
                        f"deployment_error_rate:{dep}:{bucket}",
                        f"deployment {dep}: {rate:.1%} of {len(reqs)} requests failed "
                        f"in the last {window:.0f} s",
                        {"requests": len(reqs), "errors": errors, "error_rate": rate, "window_s": window},
                        deployment=dep,
                    )
                )
            latency = p95([float(r.latency_s) for r in reqs])
            if latency > self.config.deployment_p95_latency_s:
                out.append(
                    Candidate(
                        tenant_id,
                        "deployment_latency",
                        "warning",
                        f"deployment_latency:{dep}:{bucket}",
                        f"deployment {dep}: p95 latency {latency:.2f} s over {len(reqs)} requests "
                        f"in the last {window:.0f} s",
                        {"requests": len(reqs), "p95_latency_s": latency, "window_s": window},
                        deployment=dep,
                    )
                )
        return out
