"""Domain objects the store returns and the services work with (plain frozen dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trainyard.services.lifecycle import JobState
from trainyard.spec.models import MAX_DEVICES


def iso(ts_s: float | None) -> str | None:
    """Unix seconds → ISO-8601 UTC text (the API's timestamp format)."""
    if ts_s is None:
        return None
    return datetime.fromtimestamp(ts_s, tz=UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Tenant:
    id: str
    name: str
    created_at_s: float
    max_queued_jobs: int | None = None
    max_active_devices: int | None = None
    storage_roots: tuple[str, ...] = ()  # further storage an admin granted (DESIGN §3.6)
    allow_user_code: bool = False  # may submit ``entrypoint`` jobs


@dataclass(frozen=True)
class TenantLimits:
    """Administration beyond the tenants table (all optional; None = no limit)."""

    max_concurrent_jobs: int | None = None
    rate_limit_rps: float | None = None
    rate_limit_burst: float | None = None
    key_rate_limit_rps: float | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant behind an API key and whether that key is an admin key."""

    tenant_id: str
    tenant_name: str
    key_id: str
    admin: bool
    max_queued_jobs: int | None = None  # the tenant's quota, carried so submissions need no extra query
    role: str = ""  # admin | member | viewer ("" = derived from ``admin``)
    max_active_devices: int | None = None
    governed: bool = False  # the tenant has a budget: submissions reserve their quoted cost
    rate_limit_rps: float | None = None  # the tenant's bucket (all its keys)
    rate_limit_burst: float | None = None
    key_rate_limit_rps: float | None = None  # each key's own bucket
    tokens_per_minute: int | None = None  # the tenant's inference-token bucket (the gateway's)

    @property
    def tenant_rps_or_key_rps(self) -> bool:
        return bool(self.rate_limit_rps) or bool(self.key_rate_limit_rps)

    @property
    def effective_role(self) -> str:
        return self.role or ("admin" if self.admin else "member")

    storage_roots: tuple[str, ...] = ()  # the tenant's granted storage roots (besides its namespace)
    allow_user_code: bool = False


@dataclass(frozen=True)
class ApiKeyRecord:
    id: str
    tenant_id: str
    prefix: str
    key_sha256: str
    admin: bool
    created_at_s: float
    revoked: bool = False
    role: str = ""
    expires_at_s: float | None = None


@dataclass(frozen=True)
class Placement:
    """Where a job runs (or ran last): chosen by one scheduling round."""

    pool: str
    devices: int
    market: str
    accelerator: str
    price_usd_per_device_hour: float
    expected_cost_usd: float | None = None
    checkpoint_interval_s: float | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "devices": self.devices,
            "market": self.market,
            "accelerator": self.accelerator,
            "price_usd_per_device_hour": self.price_usd_per_device_hour,
            "expected_cost_usd": self.expected_cost_usd,
            "checkpoint_interval_s": self.checkpoint_interval_s,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Placement:
        return cls(
            pool=str(d["pool"]),
            devices=int(d["devices"]),
            market=str(d["market"]),
            accelerator=str(d.get("accelerator", "")),
            price_usd_per_device_hour=float(d.get("price_usd_per_device_hour") or 0.0),
            expected_cost_usd=d.get("expected_cost_usd"),
            checkpoint_interval_s=d.get("checkpoint_interval_s"),
            reason=str(d.get("reason", "")),
        )


@dataclass(frozen=True)
class Job:
    id: str
    seq: int
    tenant_id: str
    name: str
    state: JobState
    spec: dict[str, Any]
    created_at_s: float
    updated_at_s: float
    attempt: int = 0
    placement: Placement | None = None
    quote: list[dict[str, Any]] | None = None
    cost_usd: float = 0.0
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    reason: str = ""
    progress: dict[str, Any] = field(default_factory=dict)
    attempt_started_at_s: float | None = None
    run_dir: str | None = None
    idempotency_key: str | None = None
    spec_sha256: str = ""

    def ranks_possible(self) -> int:
        """How many ranks the job has (its placement's devices) or, before it is placed, may get (its
        ``resources.max_devices``; without one, any count the spec allows): a follower of rank 1 of a
        queued 2-device job waits for it instead of being told it does not exist."""
        if self.placement is not None:
            return max(1, self.placement.devices)
        resources = self.spec.get("resources") or {}
        return max(1, int(resources.get("max_devices") or MAX_DEVICES))


@dataclass(frozen=True)
class JobEvent:
    id: int
    job_id: str
    kind: str
    data: dict[str, Any]
    time_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "time": iso(self.time_s), "data": self.data}


@dataclass(frozen=True)
class PoolRecord:
    """A live pool: the §3.4 pool document plus bookkeeping."""

    name: str
    doc: dict[str, Any]
    source: str  # "local" (registered by `trainyard up`) or "user"
    updated_at_s: float
