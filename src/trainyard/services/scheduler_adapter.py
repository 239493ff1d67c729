"""The queue-wide optimiser (:func:`trainyard.schedule.schedule_round`) behind the ScheduleRound protocol.

Live pools go in with their free capacity; tenant device quotas go in as what is left after the
devices their running jobs already hold. Jobs the optimiser cannot place keep waiting with its reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainyard.catalog.pools import Pool
from trainyard.errors import TrainyardError
from trainyard.schedule import CandidateCache, QueuedJob, SchedulerConfig, TenantQuota, schedule_round
from trainyard.services.domain import Placement
from trainyard.services.scheduling import QueuedJobView, RoundResult
from trainyard.spec.loader import spec_from_dict


class OptimizerRound:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.cache = CandidateCache()

    def __call__(self, jobs: Sequence[QueuedJobView], pools: Sequence[Pool], now_s: float) -> RoundResult:
        queued: list[QueuedJob] = []
        unplaced: dict[str, str] = {}
        quotas: dict[str, TenantQuota] = {}
        for view in jobs:
            try:
                spec = spec_from_dict(view.spec)
            except TrainyardError as exc:
                unplaced[view.job_id] = f"stored spec no longer validates: {exc.message}"
                continue
            queued.append(
                QueuedJob(job_id=view.job_id, tenant=view.tenant_id, spec=spec, submit_s=view.submitted_at_s)
            )
            if view.tenant_max_active_devices is not None:
                left = max(0, view.tenant_max_active_devices - view.tenant_devices_in_use)
                quotas[view.tenant_id] = TenantQuota(max_devices=left)
        if not queued:
            return RoundResult(placements={}, unplaced=unplaced)
        cfg = self.config
        if quotas:
            from dataclasses import replace

            cfg = replace(cfg, quotas={**dict(cfg.quotas), **quotas})
        result = schedule_round(queued, list(pools), (), now_s, cfg, cache=self.cache)
        by_name = {p.name: p for p in pools}
        placements: dict[str, Placement] = {}
        for pl in result.placements:
            if pl.migration:
                continue
            pool = by_name[pl.pool]
            price = pool.price_usd_per_device_hour
            if price is None:
                price = 0.0
            placements[pl.job_id] = Placement(
                pool=pl.pool,
                devices=pl.devices,
                market=pl.market,
                accelerator=pl.accelerator,
                price_usd_per_device_hour=float(price),
                expected_cost_usd=pl.expected_cost_usd,
                checkpoint_interval_s=pl.checkpoint_interval_s,
                reason=pl.reason,
            )
        for u in result.unplaced:
            unplaced[u.job_id] = u.reason
        return RoundResult(placements=placements, unplaced=unplaced)
