"""One scheduling round as an injectable call: queued jobs + live pools in, placements out.

:class:`GreedyCheapestRound` places each queued job (oldest first) on the cheapest feasible option of
its stored quote whose pool has the devices free now. ``trainyard.schedule`` provides the
queue-wide optimiser behind the same :class:`ScheduleRound` protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainyard.catalog.pools import Pool
from trainyard.services.domain import Placement


@dataclass(frozen=True)
class QueuedJobView:
    """What a round needs to know about one queued job."""

    job_id: str
    tenant_id: str
    spec: dict[str, Any]  # JobSpec document
    submitted_at_s: float
    quote: list[dict[str, Any]] = field(default_factory=list)  # stored options, best first
    attempt: int = 0
    tenant_devices_in_use: int = 0
    tenant_max_active_devices: int | None = None
    progress_fraction: float = 0.0  # share of the steps done and checkpointed (a re-queued job)


@dataclass(frozen=True)
class RunningJobView:
    """What a round needs to know about one job holding an allocation (for migration)."""

    job_id: str
    tenant_id: str
    spec: dict[str, Any]  # JobSpec document
    submitted_at_s: float
    pool: str
    devices: int
    market: str
    placed_s: float  # when the current attempt started
    progress_fraction: float = 0.0  # latest heartbeat step / total steps


@dataclass(frozen=True)
class Migration:
    """A running job the round moves: checkpoint now, resume on ``placement.pool``."""

    job_id: str
    from_pool: str
    placement: Placement
    savings_usd: float  # remaining work on the current allocation minus on the new one
    cost_usd: float  # the move itself: checkpoint, transfer, conversion, restart, recompile
    reason: str


@dataclass(frozen=True)
class RoundResult:
    placements: dict[str, Placement]  # job id -> placement
    unplaced: dict[str, str]  # job id -> reason
    migrations: dict[str, Migration] = field(default_factory=dict)  # job id -> move of a running job


class ScheduleRound(Protocol):
    """``pools`` carry the capacity free right now in ``available_devices``."""

    def __call__(self, jobs: Sequence[QueuedJobView], pools: Sequence[Pool], now_s: float) -> RoundResult: ...


def per_device_price(option: dict[str, Any], pool: Pool) -> float:
    if pool.price_usd_per_device_hour is not None:
        return float(pool.price_usd_per_device_hour)
    devices = int(option.get("devices") or 1)
    return float(option.get("price_usd_per_hour") or 0.0) / max(1, devices)


class GreedyCheapestRound:
    """Oldest job first; each takes the cheapest feasible quoted option that fits the free capacity."""

    def __call__(self, jobs: Sequence[QueuedJobView], pools: Sequence[Pool], now_s: float) -> RoundResult:
        free = {p.name: p.free_devices for p in pools}
        by_name = {p.name: p for p in pools}
        tenant_used: dict[str, int] = {}
        placements: dict[str, Placement] = {}
        unplaced: dict[str, str] = {}
        for job in sorted(jobs, key=lambda j: (j.submitted_at_s, j.job_id)):
            used = tenant_used.get(job.tenant_id, job.tenant_devices_in_use)
            options = [o for o in job.quote if o.get("feasible") and o.get("pool") in by_name]
            if not options:
                unplaced[job.job_id] = (
                    "no live pool can run this job (its feasible options are catalog offers only)"
                )
                continue
            chosen = None
            for opt in options:
                devices = int(opt.get("devices") or 1)
                if free[opt["pool"]] < devices:
                    continue
                if (
                    job.tenant_max_active_devices is not None
                    and used + devices > job.tenant_max_active_devices
                ):
                    continue
                chosen = opt
                break
            if chosen is None:
                unplaced[job.job_id] = "waiting for capacity"
                continue
            pool = by_name[chosen["pool"]]
            devices = int(chosen.get("devices") or 1)
            free[pool.name] -= devices
            tenant_used[job.tenant_id] = used + devices
            placements[job.job_id] = Placement(
                pool=pool.name,
                devices=devices,
                market=str(chosen.get("market") or pool.market),
                accelerator=pool.accelerator,
                price_usd_per_device_hour=per_device_price(chosen, pool),
                expected_cost_usd=chosen.get("expected_cost_usd"),
                checkpoint_interval_s=chosen.get("checkpoint_interval_s"),
                reason="cheapest feasible option with free capacity",
            )
        return RoundResult(placements=placements, unplaced=unplaced)
