"""Deployments: the use cases behind ``/v1/deployments`` and the controller that keeps replicas running.

A deployment routes its traffic to model versions (weighted routes, shadow routes, a canary). Every model
version resolves to a *base* version (itself, or a LoRA adapter's base); one replica pool per tenant and
base serves every deployment and every adapter over that base, so N fine-tunes of one base cost one
replica pool. The controller (a background thread) reconciles the database with running replicas:
it resolves references (a deployment that follows an alias moves when the alias moves), starts, probes,
adopts and stops replicas, loads adapters at run time, autoscales each pool on in-flight requests, rolls
a failing canary back, and flushes metering records and shadow comparisons to the database.
"""

from __future__ import annotations

import builtins
import hashlib
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import structlog
from sqlalchemy import delete, insert, select

from trainyard.errors import ConflictError, InvalidInputError, NotFoundError
from trainyard.executors.sandbox import SandboxSpec
from trainyard.serving.autoscale import AutoscalingPolicy, ScaleState, desired_replicas, merge
from trainyard.serving.engines import DEFAULT_ENGINE, check_engine
from trainyard.serving.models import ModelSource, ResolvedModel
from trainyard.serving.quote import ServingQuote, serving_quote
from trainyard.serving.replicas import Launcher, LaunchSpec, LocalLauncher, probe
from trainyard.serving.traffic import CanaryPolicy, Route, canary_breach, routes_from_docs
from trainyard.store.db import Database
from trainyard.store.models import TenantRow
from trainyard.store.serving_models import (
    DeploymentEventRow,
    DeploymentRow,
    ServingReplicaRow,
    ServingRequestRow,
    ShadowPairRow,
)
from trainyard.tenancy import ledger

log = structlog.get_logger("trainyard.serving")

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
RESOLVE_EVERY_S = 1.0
_REQUESTS_INSERT = insert(ServingRequestRow.__table__)  # type: ignore[arg-type]
HEALTH_EVERY_S = 1.0
# the controller writes buffered metering records once this long after its last flush (every 0.2 s tick),
# or sooner once this many wait: the interval bounds what a crash of the API server loses, and a longer
# one (1 s was tried) saved no API-server CPU that a side-by-side run could tell from noise
METER_FLUSH_EVERY_S = 0.2
METER_FLUSH_BATCH = 256
START_TIMEOUT_S = 300.0


def adapter_key(version_id: str) -> str:
    """The adapter's name inside a replica (peft module keys may not contain dots)."""
    return "lora_" + hashlib.sha256(version_id.encode()).hexdigest()[:16]


# ---- views the gateway reads (rebuilt by the controller, swapped atomically) -------------------------
@dataclass
class ReplicaView:
    id: str
    url: str
    in_flight: int = 0
    adapters: set[str] = field(default_factory=set)


@dataclass
class PoolView:
    key: tuple[str, str]  # (tenant_id, base version)
    model_path: str
    tokenizer_path: str
    adapters: dict[str, str]  # adapter key -> directory
    policy: AutoscalingPolicy
    engine: str = DEFAULT_ENGINE  # the earliest deployment's over this base
    replicas: dict[str, ReplicaView] = field(default_factory=dict)  # ready ones
    in_flight: int = 0
    peak_in_flight: int = 0
    waiting: int = 0
    scale: ScaleState = field(default_factory=ScaleState)


@dataclass(frozen=True)
class RouteView:
    route: Route
    resolved: ResolvedModel
    pool_key: tuple[str, str]

    @property
    def adapter(self) -> str | None:
        return adapter_key(self.resolved.version_id) if self.resolved.adapter_path else None


@dataclass(frozen=True)
class DeploymentView:
    id: str
    tenant_id: str
    tenant: str
    name: str
    model: str
    routes: tuple[RouteView, ...]
    tags: dict[str, Any]
    created_at_s: float

    def primary(self) -> RouteView | None:
        served = [r for r in self.routes if not r.route.shadow and r.route.weight > 0]
        return max(served, key=lambda r: r.route.weight) if served else None


@dataclass
class Outcome:
    time_s: float
    ok: bool
    latency_s: float


class ServingService:
    def __init__(
        self,
        db: Database,
        model_source: ModelSource,
        *,
        home: Path,
        clock: Callable[[], float] = time.time,
        launcher: Launcher | None = None,
        placement: Callable[[], dict[str, Any]] | None = None,
        tick_s: float = 0.2,
        sandbox: SandboxSpec | None = None,
    ) -> None:
        self.db = db
        self.models = model_source
        self.home = Path(home)
        self.clock = clock
        # local replicas in the workers' sandbox (None: as the server's user, the explicit opt-out)
        local = LocalLauncher(
            self.home / "serving" / "logs", sandbox=sandbox, work_dir=self.home / "serving" / "replicas"
        )
        self.launcher: Launcher = launcher or local
        # replicas a server with another backend started are still checked and stopped by their own
        self._launchers: dict[str, Launcher] = {local.backend: local, self.launcher.backend: self.launcher}
        self.placement = placement or (lambda: {"pool": "local-cpu", "accelerator": "cpu", "devices": 1})
        self.tick_s = tick_s
        self._lock = threading.RLock()
        self._deployments: dict[tuple[str, str], DeploymentView] = {}
        self._pools: dict[tuple[str, str], PoolView] = {}
        self._outcomes: dict[tuple[str, str], list[Outcome]] = {}  # (deployment id, route model) -> recent
        self._pending_meter: list[dict[str, Any]] = []
        self._pending_pairs: list[dict[str, Any]] = []
        self._flushed_at = time.monotonic()
        self._resolve_cache: dict[tuple[str, str], tuple[float, ResolvedModel | Exception]] = {}
        self._health_at: dict[str, float] = {}
        self._http = httpx.Client(timeout=5.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick_lock = threading.Lock()
        self._quotes: dict[tuple[Any, ...], ServingQuote] = {}
        self._weight_bytes: dict[str, int] = {}
        # replica id -> (placement, model path): what a metered request's price needs of its replica row
        # (fixed for a replica's life), read from the database once per replica instead of every flush
        self._replica_pricing: dict[str, tuple[dict[str, Any], str | None]] = {}
        self.shadow_dropped: dict[str, int] = {}
        self.shadow_sent: dict[str, int] = {}

    # ======================================================================================
    # use cases (API)
    # ======================================================================================
    def create(
        self,
        tenant_id: str,
        tenant_name: str,
        name: str,
        model: str,
        *,
        policy: AutoscalingPolicy,
        tags: dict[str, str] | None = None,
        engine: str = DEFAULT_ENGINE,
    ) -> DeploymentRow:
        if not NAME_RE.match(name):
            raise InvalidInputError(
                f"{name!r} is not a deployment name",
                hint="Use lower-case letters, digits and '-', starting with a letter or digit (max 63).",
                details={"errors": [{"field": "name", "message": "must match ^[a-z0-9][a-z0-9-]{0,62}$"}]},
            )
        _check_policy(policy)
        # local replicas run in this server's environment; Ray nodes have their own
        check_engine(engine, installed=self.launcher.backend == "local")
        resolved = self.models.resolve(tenant_name, model)
        now = self.clock()
        routes = [Route(model=model, weight=100.0).doc()]
        with self.db.session() as s:
            exists = s.scalar(
                select(DeploymentRow.id).where(
                    DeploymentRow.tenant_id == tenant_id, DeploymentRow.name == name
                )
            )
            if exists:
                raise ConflictError(
                    f"deployment {name!r} already exists",
                    hint="Pick another name, or change its traffic with `trainyard deployments traffic`.",
                )
            row = DeploymentRow(
                id=f"dep-{secrets.token_hex(8)}",
                tenant_id=tenant_id,
                name=name,
                model=model,
                routes=routes,
                previous_routes=None,
                canary=None,
                autoscaling=policy.doc(),
                engine=engine,
                tags=dict(tags or {}),
                resolved={model: resolved.version_id},
                state="starting",
                created_at_s=now,
                updated_at_s=now,
            )
            s.add(row)
            s.flush()
            s.add(
                DeploymentEventRow(
                    deployment_id=row.id,
                    kind="created",
                    data={"model": model, "version": resolved.version_id},
                    time_s=now,
                )
            )
        self.tick()
        return self.get(tenant_id, name)

    def get(self, tenant_id: str, name: str) -> DeploymentRow:
        with self.db.session() as s:
            row = s.scalar(
                select(DeploymentRow).where(DeploymentRow.tenant_id == tenant_id, DeploymentRow.name == name)
            )
        if row is None:
            raise NotFoundError(f"no deployment named {name!r}")
        return row

    def list(self, tenant_id: str) -> builtins.list[DeploymentRow]:
        with self.db.session() as s:
            return list(
                s.scalars(
                    select(DeploymentRow)
                    .where(DeploymentRow.tenant_id == tenant_id)
                    .order_by(DeploymentRow.name)
                )
            )

    def events(self, deployment_id: str, limit: int = 50) -> builtins.list[DeploymentEventRow]:
        with self.db.session() as s:
            rows = list(
                s.scalars(
                    select(DeploymentEventRow)
                    .where(DeploymentEventRow.deployment_id == deployment_id)
                    .order_by(DeploymentEventRow.id.desc())
                    .limit(limit)
                )
            )
        return rows[::-1]

    def replicas_of(self, tenant_id: str, base_versions: set[str]) -> builtins.list[ServingReplicaRow]:
        with self.db.session() as s:
            return list(
                s.scalars(
                    select(ServingReplicaRow)
                    .where(ServingReplicaRow.tenant_id == tenant_id)
                    .where(ServingReplicaRow.base_version.in_(sorted(base_versions)))
                    .order_by(ServingReplicaRow.started_at_s)
                )
            )

    def set_traffic(
        self,
        tenant_id: str,
        tenant_name: str,
        name: str,
        routes: builtins.list[dict[str, Any]],
        canary: CanaryPolicy | None = None,
    ) -> DeploymentRow:
        parsed = routes_from_docs(routes)
        errors = []
        for i, r in enumerate(parsed):
            if r.weight < 0:
                errors.append({"field": f"routes[{i}].weight", "message": "must be >= 0"})
            if r.shadow and r.canary:
                errors.append({"field": f"routes[{i}]", "message": "a route is shadow or canary, not both"})
        if not any(not r.shadow and r.weight > 0 for r in parsed):
            errors.append({"field": "routes", "message": "at least one non-shadow route needs a weight > 0"})
        if sum(1 for r in parsed if r.canary) > 1:
            errors.append({"field": "routes", "message": "at most one canary route"})
        if len({r.model for r in parsed}) != len(parsed):
            errors.append({"field": "routes", "message": "each model appears once"})
        if errors:
            raise InvalidInputError(
                f"{errors[0]['field']}: {errors[0]['message']}", details={"errors": errors}
            )
        resolved = {r.model: self.models.resolve(tenant_name, r.model).version_id for r in parsed}
        has_canary = any(r.canary for r in parsed)
        now = self.clock()
        with self.db.session() as s:
            row = s.scalar(
                select(DeploymentRow).where(DeploymentRow.tenant_id == tenant_id, DeploymentRow.name == name)
            )
            if row is None:
                raise NotFoundError(f"no deployment named {name!r}")
            old = list(row.routes)
            if has_canary:
                # the routes to fall back to when the canary breaches: the last ones without a canary
                base = [d for d in old if not d.get("canary")] if any(d.get("canary") for d in old) else old
                row.previous_routes = row.previous_routes if any(d.get("canary") for d in old) else base
                row.canary = (canary or CanaryPolicy()).doc()
            else:
                row.previous_routes = None
                row.canary = None
            row.routes = [r.doc() for r in parsed]
            row.resolved = {**row.resolved, **resolved}
            row.updated_at_s = now
            s.add(
                DeploymentEventRow(
                    deployment_id=row.id,
                    kind="traffic_changed",
                    data={"from": old, "to": row.routes, "canary": row.canary},
                    time_s=now,
                )
            )
        with self._lock:
            for key in [k for k in self._outcomes if k[0] == row.id]:
                del self._outcomes[key]
        self.tick()
        return self.get(tenant_id, name)

    def delete(self, tenant_id: str, name: str) -> None:
        with self.db.session() as s:
            row = s.scalar(
                select(DeploymentRow).where(DeploymentRow.tenant_id == tenant_id, DeploymentRow.name == name)
            )
            if row is None:
                raise NotFoundError(f"no deployment named {name!r}")
            s.delete(row)
        self.tick()

    def shadow_report(self, deployment: DeploymentRow) -> dict[str, Any]:
        from trainyard.serving.report import shadow_report

        self.flush()
        with self.db.session() as s:
            pairs = list(
                s.scalars(
                    select(ShadowPairRow)
                    .where(ShadowPairRow.deployment_id == deployment.id)
                    .order_by(ShadowPairRow.id)
                )
            )
        return shadow_report(
            pairs,
            dropped=self.shadow_dropped.get(deployment.id, 0),
            sent=self.shadow_sent.get(deployment.id, 0),
        )

    # ======================================================================================
    # gateway side (called on the event loop; in-memory only)
    # ======================================================================================
    def lookup(self, tenant_id: str, name: str) -> DeploymentView | None:
        return self._deployments.get((tenant_id, name))

    def deployments_of(self, tenant_id: str) -> builtins.list[DeploymentView]:
        return sorted(
            (d for d in self._deployments.values() if d.tenant_id == tenant_id), key=lambda d: d.name
        )

    def pool(self, key: tuple[str, str]) -> PoolView | None:
        return self._pools.get(key)

    def try_acquire(self, key: tuple[str, str], adapter: str | None) -> ReplicaView | None:
        """The ready replica with the fewest in-flight requests (holding the adapter), counted in."""
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                return None
            ready = [r for r in pool.replicas.values() if adapter is None or adapter in r.adapters]
            if not ready:
                return None
            rep = min(ready, key=lambda r: r.in_flight)
            rep.in_flight += 1
            pool.in_flight += 1
            pool.peak_in_flight = max(pool.peak_in_flight, pool.in_flight)
            return rep

    def release(self, key: tuple[str, str], replica: ReplicaView) -> None:
        with self._lock:
            replica.in_flight = max(0, replica.in_flight - 1)
            pool = self._pools.get(key)
            if pool is not None:
                pool.in_flight = max(0, pool.in_flight - 1)

    def mark_waiting(self, key: tuple[str, str], delta: int) -> None:
        with self._lock:
            pool = self._pools.get(key)
            if pool is not None:
                pool.waiting = max(0, pool.waiting + delta)
                if delta > 0:
                    pool.peak_in_flight = max(pool.peak_in_flight, pool.in_flight + pool.waiting)

    def record_outcome(self, deployment_id: str, route_model: str, ok: bool, latency_s: float) -> None:
        with self._lock:
            lst = self._outcomes.setdefault((deployment_id, route_model), [])
            lst.append(Outcome(self.clock(), ok, latency_s))
            if len(lst) > 5000:
                del lst[: len(lst) - 5000]

    def meter(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._pending_meter.append(record)

    def record_pair(self, pair: dict[str, Any]) -> None:
        with self._lock:
            self._pending_pairs.append(pair)

    # ======================================================================================
    # controller
    # ======================================================================================
    def start(self) -> None:
        """Adopt replicas a previous server left running (or replace them), then build the views."""
        self.tick()

    def start_loop(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="serving-controller", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:
                log.exception("serving_tick_failed")
            self._stop.wait(max(0.0, self.tick_s - (time.monotonic() - started)))

    def stop_loop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def close(self, *, stop_replicas: bool = True) -> None:
        self.stop_loop()
        self.flush()
        if stop_replicas:
            with self.db.session() as s:
                rows = list(s.scalars(select(ServingReplicaRow)))
            for r in rows:
                self._launcher_of(r).stop(r.id, r.pid)
            with self.db.session() as s:
                s.execute(delete(ServingReplicaRow))
        self._http.close()

    def _launcher_of(self, row: ServingReplicaRow) -> Launcher:
        return self._launchers.get(row.backend, self._launchers["local"])

    def flush(self) -> None:
        """Write the buffered metering records (with their ledger charges, in one transaction) and shadow
        pairs. A flush that fails puts its records back in front of the buffer, so the next one writes
        them: a record is dropped only with the process (docs/serving.md, Metering)."""
        with self._lock:
            meter, self._pending_meter = self._pending_meter, []
            pairs, self._pending_pairs = self._pending_pairs, []
            self._flushed_at = time.monotonic()
        if not meter and not pairs:
            return
        try:
            # priced before the write transaction opens: a replica row or the pool's price read inside
            # it would wait on the transaction's own lock (SQLite)
            charges = self._token_charges(meter) if meter else []
            with self.db.session() as s:
                if meter:
                    s.execute(_REQUESTS_INSERT, meter)  # a Core executemany: no ORM bookkeeping per row
                    # the inference-token charges, in the same transaction as the requests they bill
                    ledger.charge_batch(s.connection(), charges)
                if pairs:
                    known = set(s.scalars(select(DeploymentRow.id)))
                    rows = [p for p in pairs if p["deployment_id"] in known]
                    if rows:
                        s.execute(insert(ShadowPairRow), rows)
        except BaseException:
            with self._lock:
                self._pending_meter[:0] = meter
                self._pending_pairs[:0] = pairs
            raise

    def _token_charges(
        self, meter: builtins.list[dict[str, Any]]
    ) -> builtins.list[tuple[ledger.Charge, str]]:
        """One ``inference_tokens`` ledger charge per answered request that used tokens, priced at the
        serving quote of the replica pool that answered ($/1k tokens from the predicted decode speed
        of the model's weights on the pool's accelerator and the pool's price)."""
        billed = [r for r in meter if r["status"] < 400 and r["prompt_tokens"] + r["completion_tokens"] > 0]
        if not billed:
            return []
        pricing = self._replica_pricing
        missing = {r["replica_id"] for r in billed if r.get("replica_id") and r["replica_id"] not in pricing}
        if missing:
            if len(pricing) > 10_000:
                pricing.clear()
            with self.db.session() as s:
                for row in s.scalars(select(ServingReplicaRow).where(ServingReplicaRow.id.in_(missing))):
                    pricing[row.id] = (dict(row.placement or {}), row.model_path)
        fallback: dict[str, Any] | None = None  # the pool's placement, for a replica without a row
        out: builtins.list[tuple[ledger.Charge, str]] = []
        for r in billed:
            known = pricing.get(r.get("replica_id") or "")
            if known is not None:
                placement, model_path = dict(known[0]), known[1]
            else:
                if fallback is None:
                    fallback = self.placement()
                placement, model_path = dict(fallback), None
            q = self._quote(placement, model_path)
            tokens = int(r["prompt_tokens"]) + int(r["completion_tokens"])
            unit_price = q.usd_per_1k_tokens / 1000.0 if q is not None else 0.0
            out.append(
                (
                    ledger.Charge(
                        source_key=f"tokens:{r['request_id']}:{r['route']}:{r['model_version']}",
                        tenant_id=r["tenant_id"],
                        kind=ledger.KIND_TOKENS,
                        quantity=float(tokens),
                        unit="tokens",
                        unit_price_usd=unit_price,
                        usd=tokens * unit_price,
                        time_s=float(r["created_at_s"]),
                        accelerator=q.accelerator if q is not None else placement.get("accelerator"),
                        pool=q.pool if q is not None else placement.get("pool"),
                        devices=int(placement.get("devices") or 1),
                        model=r["model_version"],
                        deployment=r["deployment"],
                        adapter=r.get("adapter"),
                        tags=dict(r.get("tags") or {}),
                    ),
                    r["tenant"],
                )
            )
        return out

    def _quote(self, placement: dict[str, Any], model_path: str | None) -> ServingQuote | None:
        """The serving quote of a pool for a model (cached; None when the accelerator is unknown)."""
        accel_name = str(placement.get("accelerator") or "cpu")
        price = float(placement.get("price_usd_per_hour") or 0.0) * int(placement.get("devices") or 1)
        weight_bytes = self._model_bytes(model_path) if model_path else 0
        key = (placement.get("pool"), accel_name, price, weight_bytes)
        q = self._quotes.get(key)
        if q is None:
            from trainyard.catalog.accelerators import get_accelerator

            try:
                accel = get_accelerator(accel_name)
            except Exception:
                return None
            q = serving_quote(str(placement.get("pool") or ""), accel, weight_bytes, price)
            if len(self._quotes) > 10_000:
                self._quotes.clear()
            self._quotes[key] = q
        return q

    def _model_bytes(self, model_path: str) -> int:
        """Bytes of a model directory's weight files (cached per directory)."""
        n = self._weight_bytes.get(model_path)
        if n is None:
            root = Path(model_path)
            files = [*root.glob("*.safetensors"), *root.glob("*.bin")] if root.is_dir() else []
            n = sum(f.stat().st_size for f in files if f.is_file())
            self._weight_bytes[model_path] = n
        return n

    def _resolve(self, tenant: str, ref: str, now: float) -> ResolvedModel:
        hit = self._resolve_cache.get((tenant, ref))
        if hit is None or now - hit[0] >= RESOLVE_EVERY_S:
            try:
                value: ResolvedModel | Exception = self.models.resolve(tenant, ref)
            except Exception as exc:
                value = exc
            hit = (now, value)
            self._resolve_cache[(tenant, ref)] = hit
        if isinstance(hit[1], Exception):
            raise hit[1]
        return hit[1]

    def tick(self) -> None:
        with self._tick_lock:
            self._tick()

    def flush_due(self) -> bool:
        """Whether the controller's tick should flush now (:data:`METER_FLUSH_EVERY_S` since the last
        flush, or :data:`METER_FLUSH_BATCH` records waiting)."""
        with self._lock:
            waiting = len(self._pending_meter) + len(self._pending_pairs)
            return waiting >= METER_FLUSH_BATCH or (
                waiting > 0 and time.monotonic() - self._flushed_at >= METER_FLUSH_EVERY_S
            )

    def _tick(self) -> None:
        now = self.clock()
        if self.flush_due():
            self.flush()
        with self.db.session() as s:
            deps = list(s.scalars(select(DeploymentRow)))
            tenants = {t.id: t.name for t in s.scalars(select(TenantRow))}
            replica_rows = list(s.scalars(select(ServingReplicaRow)))
        events: list[tuple[str, str, dict[str, Any]]] = []
        updates: dict[str, dict[str, Any]] = {}

        # 0. canary rollback first, so this tick's views already route around a breached canary
        for d in deps:
            if not d.canary or not any(rd.get("canary") for rd in d.routes):
                continue
            policy = CanaryPolicy(**d.canary)
            canary_model = next(rd["model"] for rd in d.routes if rd.get("canary"))
            with self._lock:
                outs = [(o.time_s, o.ok, o.latency_s) for o in self._outcomes.get((d.id, canary_model), [])]
            breach = canary_breach(outs, policy, now)
            if breach is not None:
                back = d.previous_routes or [rd for rd in d.routes if not rd.get("canary")]
                updates.setdefault(d.id, {}).update(routes=back, canary=None, previous_routes=None)
                d.routes, d.canary, d.previous_routes = back, None, None
                events.append((d.id, "canary_rolled_back", {"model": canary_model, **breach}))
                log.warning(
                    "canary_rolled_back", deployment=d.name, model=canary_model, reason=breach["reason"]
                )
                with self._lock:
                    self._outcomes.pop((d.id, canary_model), None)

        # 1. resolve every route; build deployment views and the pools they need
        views: dict[tuple[str, str], DeploymentView] = {}
        wanted: dict[tuple[str, str], dict[str, Any]] = {}
        for d in deps:
            tenant = tenants.get(d.tenant_id, "")
            rviews: list[RouteView] = []
            resolved_now = dict(d.resolved)
            failed: str | None = None
            for route in routes_from_docs(d.routes):
                try:
                    res = self._resolve(tenant, route.model, now)
                except Exception as exc:
                    failed = f"{route.model}: {exc}"
                    continue
                if resolved_now.get(route.model) != res.version_id:
                    events.append(
                        (
                            d.id,
                            "model_moved",
                            {"ref": route.model, "from": d.resolved.get(route.model), "to": res.version_id},
                        )
                    )
                    resolved_now[route.model] = res.version_id
                key = (d.tenant_id, res.base_version)
                rviews.append(RouteView(route, res, key))
                spec = wanted.setdefault(
                    key,
                    {
                        "model_path": res.path,
                        "tokenizer": res.path,
                        "adapters": {},
                        "policies": [],
                        "engines": [],
                        "name": res.base_version,
                    },
                )
                if res.adapter_path:
                    spec["adapters"][adapter_key(res.version_id)] = res.adapter_path
                else:
                    spec["tokenizer"] = res.tokenizer_path
                spec["policies"].append(AutoscalingPolicy.from_doc(d.autoscaling))
                spec["engines"].append((d.created_at_s, d.engine or DEFAULT_ENGINE))
            if resolved_now != d.resolved:
                updates.setdefault(d.id, {})["resolved"] = resolved_now
            if failed and d.state != "failed":
                events.append((d.id, "failed", {"reason": failed}))
            views[(d.tenant_id, d.name)] = DeploymentView(
                id=d.id,
                tenant_id=d.tenant_id,
                tenant=tenant,
                name=d.name,
                model=d.model,
                routes=tuple(rviews),
                tags=dict(d.tags or {}),
                created_at_s=d.created_at_s,
            )

        # 2. pools: keep the live objects (in-flight counters, scale state), refresh their specs
        with self._lock:
            pools: dict[tuple[str, str], PoolView] = {}
            for key, spec in wanted.items():
                pol = merge(spec["policies"])
                engine = min(spec["engines"])[1]
                pv = self._pools.get(key)
                if pv is None or pv.model_path != spec["model_path"] or pv.engine != engine:
                    pv = PoolView(
                        key, spec["model_path"], spec["tokenizer"], dict(spec["adapters"]), pol, engine
                    )
                else:
                    pv.adapters, pv.policy, pv.tokenizer_path = dict(spec["adapters"]), pol, spec["tokenizer"]
                pools[key] = pv
        # 3. replicas: probe, adopt, drop the dead and the unneeded
        by_pool: dict[tuple[str, str], list[ServingReplicaRow]] = {}
        gone: list[str] = []
        stops: list[ServingReplicaRow] = []
        became_ready: dict[str, dict[str, Any]] = {}
        for r in replica_rows:
            key = (r.tenant_id, r.base_version)
            pv = pools.get(key)
            url = f"http://{r.host}:{r.port}"
            if pv is None or pv.model_path != r.model_path:
                stops.append(r)  # stopped once the new views no longer route to it
                continue
            if r.state == "starting":
                doc = probe(self._http, url, r.id, timeout_s=0.3)
                if doc is not None:
                    became_ready[r.id] = doc
                elif not self._launcher_of(r).alive(r.id, r.pid) or now - r.started_at_s > START_TIMEOUT_S:
                    self._launcher_of(r).stop(r.id, r.pid)
                    gone.append(r.id)
                    log.warning("replica_failed_to_start", replica=r.id, base=r.base_version)
                    continue
            elif now - self._health_at.get(r.id, 0.0) >= HEALTH_EVERY_S:
                self._health_at[r.id] = now
                alive = self._launcher_of(r).alive(r.id, r.pid)
                doc = probe(self._http, url, r.id, timeout_s=1.0) if alive else None
                if doc is None and not alive:
                    gone.append(r.id)
                    log.warning("replica_lost", replica=r.id, base=r.base_version)
                    continue
                if doc is not None:
                    became_ready[r.id] = doc
            by_pool.setdefault(key, []).append(r)

        # 4. per pool: ready views, adapters, autoscaling
        starts: list[tuple[tuple[str, str], PoolView]] = []
        with self._lock:
            for key, pv in pools.items():
                rows = by_pool.get(key, [])
                live: dict[str, ReplicaView] = {}
                for r in rows:
                    if r.state != "ready" and r.id not in became_ready:
                        continue
                    rv = pv.replicas.get(r.id) or ReplicaView(r.id, f"http://{r.host}:{r.port}")
                    if r.id in became_ready:
                        rv.adapters = set(became_ready[r.id].get("adapters", []))
                    live[r.id] = rv
                pv.replicas = live
                current = len(rows)
                peak = max(pv.peak_in_flight, pv.in_flight + pv.waiting)
                pv.peak_in_flight = pv.in_flight + pv.waiting
                want = desired_replicas(
                    pv.policy, pv.scale, current=current, in_flight=peak, waiting=pv.waiting > 0, now_s=now
                )
                if want > current:
                    starts.extend([(key, pv)] * (want - current))
                elif want < current:
                    idle = sorted(
                        rows, key=lambda r: (r.state == "ready", live[r.id].in_flight if r.id in live else 0)
                    )
                    for r in idle[: current - want]:
                        if r.id in live and live[r.id].in_flight > 0:
                            continue
                        stops.append(r)
                        live.pop(r.id, None)
            self._pools = pools
            self._deployments = views

        # 5. adapters missing on ready replicas are loaded at run time (a sandboxed replica reads a
        # copy its launcher stages for it)
        backend_of = {r.id: r.backend for r in replica_rows}
        for pv in pools.values():
            for rv in list(pv.replicas.values()):
                launcher = self._launchers.get(backend_of.get(rv.id, "local"), self._launchers["local"])
                stage = getattr(launcher, "adapter_path", None)
                for name, path in pv.adapters.items():
                    if name not in rv.adapters:
                        try:
                            where = path if stage is None else str(stage(rv.id, name, path))
                            resp = self._http.post(
                                f"{rv.url}/adapters", json={"name": name, "path": where}, timeout=120
                            )
                            resp.raise_for_status()
                            with self._lock:
                                rv.adapters = set(resp.json().get("adapters", []))
                        except Exception as exc:  # the replica or its node is unreachable: next tick
                            log.warning("adapter_load_failed", replica=rv.id, adapter=name, error=str(exc))

        # 7. write: replicas gone/ready/stopped/started, deployment states, events
        for r in stops:
            self._launcher_of(r).stop(r.id, r.pid)
            gone.append(r.id)
        new_rows: list[ServingReplicaRow] = []
        for key, pv in starts:
            rid = f"rep-{secrets.token_hex(6)}"
            try:
                placement = self.placement()
                launch = LaunchSpec(
                    replica_id=rid,
                    model_path=pv.model_path,
                    tokenizer_path=pv.tokenizer_path,
                    adapters=dict(pv.adapters),
                    model_name=key[1],
                    engine=pv.engine,
                    placement=dict(placement),
                )
                started = self.launcher.start(launch)
            except Exception as exc:  # no capacity, an unreachable cluster, a full disk: next tick retries
                log.error("replica_start_failed", base=key[1], backend=self.launcher.backend, error=str(exc))
                continue
            new_rows.append(
                ServingReplicaRow(
                    id=rid,
                    tenant_id=key[0],
                    base_version=key[1],
                    model_path=pv.model_path,
                    backend=self.launcher.backend,
                    pid=started.pid,
                    host=started.host,
                    port=started.port,
                    state="starting",
                    placement={**placement, **started.placement},
                    started_at_s=now,
                )
            )
        with self._lock:
            serving_now = {
                (k, a)
                for k, p in self._pools.items()
                for r in p.replicas.values()
                for a in (None, *r.adapters)
            }
        states: dict[str, str] = {}
        for d in deps:
            v = views[(d.tenant_id, d.name)]
            served = [rv for rv in v.routes if not rv.route.shadow and rv.route.weight > 0]
            if any(e[0] == d.id and e[1] == "failed" for e in events) or (
                d.state == "failed" and len(v.routes) < len(d.routes)
            ):
                st = "failed"
            elif served and all(
                (rv.pool_key, rv.adapter) in serving_now or self._pools[rv.pool_key].policy.min_replicas == 0
                for rv in served
            ):
                st = "ready"
            else:
                st = "starting"
            if st != d.state:
                states[d.id] = st
        # a ready replica answers its health probe every second: only one that was starting has a row
        # to change (without this, every probe opened a write transaction that changed nothing)
        state_of = {r.id: r.state for r in replica_rows}
        newly_ready = [rid for rid in became_ready if state_of.get(rid) != "ready"]
        if not (gone or newly_ready or new_rows or updates or events or states):
            return
        with self.db.session() as s:
            if gone:
                s.execute(delete(ServingReplicaRow).where(ServingReplicaRow.id.in_(gone)))
            for rid in newly_ready:
                row = s.get(ServingReplicaRow, rid)
                if row is not None and row.state != "ready":
                    row.state, row.ready_at_s = "ready", now
            for row in new_rows:
                s.add(row)
            known = {d.id for d in s.scalars(select(DeploymentRow))}
            for dep_id, changes in updates.items():
                drow = s.get(DeploymentRow, dep_id)
                if drow is not None:
                    for k, v in changes.items():
                        setattr(drow, k, v)
                    drow.updated_at_s = now
            for dep_id, st in states.items():
                drow = s.get(DeploymentRow, dep_id)
                if drow is not None:
                    drow.state = st
                    if st == "ready":
                        events.append((dep_id, "ready", {}))
            for dep_id, kind, data in events:
                if dep_id in known:
                    s.add(DeploymentEventRow(deployment_id=dep_id, kind=kind, data=data, time_s=now))


def _check_policy(p: AutoscalingPolicy) -> None:
    errors = []
    if p.min_replicas < 0:
        errors.append({"field": "min_replicas", "message": "must be >= 0"})
    if p.max_replicas < max(1, p.min_replicas):
        errors.append({"field": "max_replicas", "message": "must be >= max(1, min_replicas)"})
    if p.max_replicas > 64:
        errors.append({"field": "max_replicas", "message": "must be <= 64"})
    if p.target_in_flight <= 0:
        errors.append({"field": "target_in_flight", "message": "must be > 0"})
    for f in ("scale_up_delay_s", "scale_down_delay_s"):
        if getattr(p, f) < 0:
            errors.append({"field": f, "message": "must be >= 0"})
    if p.cold_start_timeout_s <= 0:
        errors.append({"field": "cold_start_timeout_s", "message": "must be > 0"})
    if errors:
        raise InvalidInputError(f"{errors[0]['field']}: {errors[0]['message']}", details={"errors": errors})


def deployment_document(service: ServingService, row: DeploymentRow, openai_url: str) -> dict[str, Any]:
    """The deployment as the API and CLI show it (DESIGN §3.9, plus additive fields)."""
    from trainyard.services.domain import iso

    view = service.lookup(row.tenant_id, row.name)
    bases = {rv.pool_key[1] for rv in view.routes} if view is not None else set()
    replicas = service.replicas_of(row.tenant_id, bases) if bases else []
    pools = {k: service.pool((row.tenant_id, k)) for k in bases}
    in_flight: dict[str, int] = {}
    for p in pools.values():
        if p is not None:
            in_flight.update({rid: rv.in_flight for rid, rv in p.replicas.items()})
    routes_by_model = {rv.route.model: rv for rv in view.routes} if view is not None else {}
    routes = []
    for r in row.routes:
        rv = routes_by_model.get(r["model"])
        routes.append(
            {
                "model": r["model"],
                "weight": r["weight"],
                "shadow": bool(r.get("shadow", False)),
                "canary": bool(r.get("canary", False)),
                "version": row.resolved.get(r["model"]),
                "base": rv.resolved.base_ref if rv is not None else None,
            }
        )
    return {
        "id": row.id,
        "name": row.name,
        "state": row.state,
        "model": row.model,
        "version": row.resolved.get(row.model),
        "routes": routes,
        "replicas": sum(1 for r in replicas if r.state == "ready"),
        "url": openai_url,
        "min_replicas": row.autoscaling.get("min_replicas"),
        "max_replicas": row.autoscaling.get("max_replicas"),
        "autoscaling": row.autoscaling,
        "canary": row.canary,
        "tags": row.tags,
        "engine": row.engine or DEFAULT_ENGINE,
        "replica_set": [
            {
                "id": r.id,
                "base": r.base_version,
                "state": r.state,
                "pid": r.pid,
                "url": f"http://{r.host}:{r.port}",
                "backend": r.backend,
                "in_flight": in_flight.get(r.id, 0),
                "placement": r.placement,
                "started_at": iso(r.started_at_s),
                "ready_at": iso(r.ready_at_s),
            }
            for r in replicas
        ],
        "events": [
            {"kind": e.kind, "data": e.data, "time": iso(e.time_s)} for e in service.events(row.id, limit=20)
        ],
        "created_at": iso(row.created_at_s),
        "updated_at": iso(row.updated_at_s),
    }
