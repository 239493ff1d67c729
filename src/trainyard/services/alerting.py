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
Deliveries go through an outbox: one ``webhook_deliveries`` row per alert and webhook, written in the
alert's own transaction, so that an alert is never recorded without its deliveries nor delivered
without being recorded. A delivery loop (a thread of every process that runs the control loop or fires
alerts) leases due rows, sends one attempt each on a small thread pool and writes the outcome back:
``delivered``; ``failed`` (a final answer such as 4xx); or, for timeouts, connection errors, 429 and
5xx, the next attempt's time after a backoff (:func:`~trainyard.observability.webhooks.retry_delay_s`),
until ``webhook_max_attempts`` make it ``dead`` (the dead letters stay listed with their last error).
A restart resumes every pending delivery where it was, with the same ``Trainyard-Delivery-Id``.
Deliveries only ever go to webhooks of the alert's own tenant.
"""

from __future__ import annotations

import contextlib
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
from trainyard.observability.webhooks import (
    DELIVERY_ID_HEADER,
    DeliveryPolicy,
    encode,
    retry_delay_s,
    send_once,
)
from trainyard.services.domain import Job, Principal, iso
from trainyard.services.lifecycle import JobState
from trainyard.store.alert_models import AlertRow, WebhookDeliveryRow, WebhookRow, WebhookSecretRow
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
_DELIVERIES = cast(Table, WebhookDeliveryRow.__table__)
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
MAX_LISTED_DELIVERIES = 200
DELIVERY_STATES = ("pending", "delivered", "failed", "dead")
DELIVERY_POLL_S = 1.0  # while deliveries are pending; the outbox is read at once when this process adds
DELIVERY_IDLE_POLL_S = 5.0  # with none pending (another server process may add some)
DELIVERY_BATCH = 16


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


def delivery_document(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "webhook_id": row.webhook_id,
        "alert_id": f"alr-{row.alert_id}",
        "rule": row.rule,
        "job_id": row.job_id,
        "url": row.url,
        "state": row.state,
        "attempts": row.attempts,
        "max_attempts": row.max_attempts,
        "last_status_code": row.last_status_code,
        "last_error": row.last_error,
        "next_attempt_at": iso(row.next_attempt_at_s) if row.state == "pending" else None,
        "created_at": iso(row.created_at_s),
        "delivered_at": iso(row.delivered_at_s) if row.delivered_at_s is not None else None,
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
        # set by observability.install_observability: a CLIENT span for every delivery attempt
        self.client_hook: Callable[[Any], None] | None = None
        self.tracer: Any = None
        self.networks = parse_networks(config.allowed_networks)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="trainyard-webhooks")
        self._stop = threading.Event()
        self._last_scan_s = 0.0
        self._gov_cursor: int | None = None
        self._inflight: set[Any] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
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
                if hooks:
                    self._secret(s, cand.tenant_id)  # the tenant has one from its first webhook on
                    self._enqueue(conn, doc, cand, alert_id, hooks)
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
        if hooks:
            self.start()
            self._wake.set()
        return doc

    def _enqueue(
        self, conn: Any, doc: dict[str, Any], cand: Candidate, alert_id: int, hooks: list[Any]
    ) -> None:
        """The alert's deliveries, in the alert's transaction (the outbox)."""
        now = time.time()
        for h in hooks:
            did = f"dlv-{secrets.token_hex(8)}"
            conn.execute(
                _DELIVERIES.insert(),
                {
                    "id": did,
                    "tenant_id": cand.tenant_id,
                    "webhook_id": h.id,
                    "alert_id": alert_id,
                    "job_id": cand.job_id,
                    "rule": cand.rule,
                    "url": h.url,
                    "payload": {**doc, "webhook_id": h.id, "delivery_id": did},
                    "state": "pending",
                    "attempts": 0,
                    "max_attempts": self.config.delivery.max_attempts,
                    "next_attempt_at_s": now,
                    "claimed_until_s": None,
                    "created_at_s": now,
                    "updated_at_s": now,
                },
            )

    def _record(self, s: Session, cand: Candidate, kind: str, data: dict[str, Any], now: float) -> None:
        """An event where the alert's owner sees it: the job's event log, else the tenant's."""
        if cand.job_id is not None and JobRepo(s).get(cand.job_id) is not None:
            EventRepo(s).append(cand.job_id, kind, data, now)
        else:
            ledger.append_event(s.connection(), cand.tenant_id, kind, data, now)

    # ---- the delivery loop ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the delivery loop (idempotent): pending deliveries, including those a previous process
        left waiting for a retry, are sent when due."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="trainyard-webhook-outbox", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                next_due = self.deliver_due()
            except Exception:
                log.exception("webhook_outbox_failed")
                next_due = None
            if next_due is None:
                wait = DELIVERY_IDLE_POLL_S
            else:
                wait = min(DELIVERY_POLL_S, max(0.0, next_due - time.time()))
            self._wake.wait(wait)
            self._wake.clear()

    def deliver_due(self) -> float | None:
        """Lease the deliveries that are due and hand each to the senders; returns when the next pending
        one is due (None: none pending that this process is not already sending)."""
        now = time.time()
        policy = self.config.delivery
        lease_s = policy.timeout_s + 30.0  # longer than one attempt: another process takes over after
        with self.db.session() as s:
            conn = s.connection()
            due = list(
                conn.execute(
                    select(_DELIVERIES.c.id)
                    .where(
                        _DELIVERIES.c.state == "pending",
                        _DELIVERIES.c.next_attempt_at_s <= now,
                        (_DELIVERIES.c.claimed_until_s.is_(None)) | (_DELIVERIES.c.claimed_until_s < now),
                    )
                    .order_by(_DELIVERIES.c.next_attempt_at_s)
                    .limit(DELIVERY_BATCH)
                ).scalars()
            )
            claimed = []
            for did in due:
                n = conn.execute(
                    update(_DELIVERIES)
                    .where(
                        _DELIVERIES.c.id == did,
                        _DELIVERIES.c.state == "pending",
                        (_DELIVERIES.c.claimed_until_s.is_(None)) | (_DELIVERIES.c.claimed_until_s < now),
                    )
                    .values(claimed_until_s=now + lease_s)
                ).rowcount
                if n == 1:
                    claimed.append(did)
            upcoming = conn.execute(
                select(func.min(_DELIVERIES.c.next_attempt_at_s)).where(
                    _DELIVERIES.c.state == "pending",
                    (_DELIVERIES.c.claimed_until_s.is_(None)) | (_DELIVERIES.c.claimed_until_s < now),
                )
            ).scalar()
        for did in claimed:
            if self._stop.is_set():
                break
            fut = self._pool.submit(self._attempt, did)
            with self._lock:
                self._inflight.add(fut)
            fut.add_done_callback(self._done)
        return None if upcoming is None else float(upcoming)

    def _done(self, fut: Any) -> None:
        with self._lock:
            self._inflight.discard(fut)
        self._wake.set()

    def _send(self, row: Any, payload: dict[str, Any], n: int, secret: Any) -> Any:
        return send_once(
            row.url,
            encode(payload),
            attempt=n,
            secret=str(secret or ""),
            headers={
                "Trainyard-Alert-Id": str(payload.get("id")),
                "Trainyard-Webhook-Id": row.webhook_id,
                DELIVERY_ID_HEADER: row.id,
            },
            timeout_s=self.config.delivery.timeout_s,
            check_url=self.check_url,
            transport=self.transport,
            client_hook=self.client_hook,
        )

    def _attempt(self, delivery_id: str) -> None:
        """Send one attempt of a leased delivery and write its outcome."""
        with self.db.session() as s:
            conn = s.connection()
            row = conn.execute(select(_DELIVERIES).where(_DELIVERIES.c.id == delivery_id)).first()
            if row is None or row.state != "pending":
                return
            secret = conn.execute(
                select(_SECRETS.c.secret).where(_SECRETS.c.tenant_id == row.tenant_id)
            ).scalar()
        n = int(row.attempts) + 1
        payload = dict(row.payload)
        span = (
            self.tracer.start_as_current_span(
                "webhook delivery",
                attributes={
                    "trainyard.webhook_id": row.webhook_id,
                    "trainyard.delivery_id": row.id,
                    "trainyard.delivery_attempt": n,
                },
            )
            if self.tracer is not None
            else contextlib.nullcontext()
        )
        with span:
            res = self._send(row, payload, n, secret)
        max_attempts = int(row.max_attempts)
        will_retry = res.retryable and n < max_attempts
        now = time.time()
        state = (
            "delivered" if res.ok else ("pending" if will_retry else ("dead" if res.retryable else "failed"))
        )
        values: dict[str, Any] = {
            "state": state,
            "attempts": n,
            "claimed_until_s": None,
            "last_status_code": res.status_code,
            "last_error": res.error,
            "updated_at_s": now,
        }
        if res.ok:
            values["delivered_at_s"] = now
        if will_retry:
            values["next_attempt_at_s"] = now + retry_delay_s(self.config.delivery, n)
        cand = Candidate(
            row.tenant_id, row.rule, str(payload.get("severity") or ""), "", "", job_id=row.job_id
        )
        data = {
            "alert_id": payload.get("id"),
            "delivery_id": row.id,
            "rule": row.rule,
            "webhook_id": row.webhook_id,
            "url": row.url,
            "attempt": n,
            "max_attempts": max_attempts,
            "ok": res.ok,
            "status_code": res.status_code,
            "error": res.error,
            "duration_s": res.duration_s,
            "will_retry": will_retry,
            "state": state,
        }
        with self.db.session() as s:
            s.connection().execute(update(_DELIVERIES).where(_DELIVERIES.c.id == row.id).values(**values))
            try:
                with s.begin_nested():
                    self._record(s, cand, "alert_delivery", data, self.clock())
            except Exception:
                log.exception("alert_delivery_event_failed", delivery_id=row.id)
        log.info(
            "alert_delivery",
            delivery_id=row.id,
            webhook_id=row.webhook_id,
            attempt=n,
            ok=res.ok,
            state=state,
            status_code=res.status_code,
        )

    def list_deliveries(
        self, principal: Principal, *, webhook_id: str | None = None, limit: int = MAX_LISTED_DELIVERIES
    ) -> list[dict[str, Any]]:
        """The tenant's latest deliveries, newest first (a webhook's only, when named: 404 if not theirs)."""
        q = select(_DELIVERIES).where(_DELIVERIES.c.tenant_id == principal.tenant_id)
        with self.db.session() as s:
            if webhook_id is not None:
                self._own_webhook(s, principal, webhook_id)
                q = q.where(_DELIVERIES.c.webhook_id == webhook_id)
            rows = list(
                s.connection().execute(
                    q.order_by(_DELIVERIES.c.created_at_s.desc(), _DELIVERIES.c.id.desc()).limit(
                        max(1, min(limit, MAX_LISTED_DELIVERIES))
                    )
                )
            )
        return [delivery_document(r) for r in rows]

    def pending_deliveries(self) -> int:
        with self.db.session() as s:
            return int(
                s.connection()
                .execute(
                    select(func.count()).select_from(_DELIVERIES).where(_DELIVERIES.c.state == "pending")
                )
                .scalar_one()
            )

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Block until no delivery is pending or being sent (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                busy = bool(self._inflight)
            if not busy and self.pending_deliveries() == 0:
                return True
            self._wake.set()
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
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
