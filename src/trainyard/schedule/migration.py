"""Migration economics and the deadline-aware spot fallback.

A running job moves only when the expected savings over its *remaining* work beat the cost of moving
by a margin (hysteresis), and only after a minimum dwell time on its current placement, so small price
wiggles do not make jobs flap. The cost of moving is the time the job does no useful work, paid on the
new allocation (and the checkpoint write on the old one):

    checkpoint write + checkpoint transfer + conversion (between accelerator families: precision of
    master weights and optimizer states, sharding layout, world size) + restart (provision + load) +
    recompile (compiled stacks, or when the device count changes).

Deadline-aware spot follows the Uniform Progress idea of "Can't Be Late" (Wu et al., NSDI'24): a job with
a deadline should have done at least the share of its work that the share of its time window already
spent asks for. A spot job that falls behind that line (beyond a tolerance), or whose slack before the
deadline on on-demand capacity drops under a safety margin, is moved to on-demand capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainyard.catalog.names import ACCELERATOR_FAMILY
from trainyard.cost.model import checkpoint_bytes
from trainyard.schedule.types import Candidate, RunningJob, SchedulerConfig
from trainyard.spec.models import JobSpec

GB = 1e9


@dataclass(frozen=True)
class MigrationCost:
    downtime_s: float
    usd: float
    cross_family: bool
    parts: dict[str, float]

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v:.0f} s" for k, v in self.parts.items() if v > 0)
        return f"${self.usd:,.2f} ({self.downtime_s / 60:.0f} min idle: {parts})"


def migration_cost(
    spec: JobSpec,
    *,
    from_accelerator: str,
    from_devices: int,
    from_price_usd_per_hour: float,
    to: Candidate,
    restart_s: float,
    compile_s: float,
    config: SchedulerConfig,
) -> MigrationCost:
    """Expected dollars lost by moving a running job to ``to``."""
    cross = ACCELERATOR_FAMILY.get(from_accelerator) != ACCELERATOR_FAMILY.get(to.accelerator)
    transfer_s = checkpoint_bytes(spec) * 8.0 / (config.transfer_gbps * GB)
    conversion_s = config.conversion_s if cross or to.devices != from_devices else 0.0
    recompile_s = (
        compile_s if (cross or to.devices != from_devices or to.accelerator != from_accelerator) else 0.0
    )
    parts = {
        "checkpoint": config.checkpoint_save_s,
        "transfer": transfer_s,
        "conversion": conversion_s,
        "restart": restart_s,
        "recompile": recompile_s,
    }
    after_s = transfer_s + conversion_s + restart_s + recompile_s
    usd = (
        config.checkpoint_save_s * from_price_usd_per_hour / 3600.0 + after_s * to.price_usd_per_hour / 3600.0
    )
    return MigrationCost(
        downtime_s=config.checkpoint_save_s + after_s, usd=usd, cross_family=cross, parts=parts
    )


def worth_moving(stay_usd: float, move_usd: float, cost: MigrationCost, config: SchedulerConfig) -> bool:
    """Hysteresis rule: savings over the remaining work must beat (1 + margin) × cost + a floor."""
    savings = stay_usd - move_usd
    return savings > cost.usd * (1.0 + config.migration_margin) + config.migration_min_savings_usd


def dwell_ok(job: RunningJob, now_s: float, config: SchedulerConfig) -> bool:
    return now_s - job.placed_s >= config.min_dwell_s


@dataclass(frozen=True)
class ProgressCheck:
    behind: bool
    required_fraction: float  # the Uniform Progress line at now
    slack_s: float | None  # time left minus on-demand time still needed
    reason: str


def uniform_progress(
    job: RunningJob, now_s: float, remaining_on_demand_s: float | None, config: SchedulerConfig
) -> ProgressCheck:
    """Whether a deadline job on spot has fallen behind the progress it needs (Uniform Progress)."""
    deadline = job.deadline_abs_s
    if deadline is None or job.market != "spot":
        return ProgressCheck(False, 0.0, None, "")
    window = max(deadline - job.submit_s, 1.0)
    required = min(1.0, max(0.0, (now_s - job.submit_s) / window))
    slack = None if remaining_on_demand_s is None else deadline - now_s - remaining_on_demand_s
    if slack is not None and slack < config.deadline_safety_s:
        return ProgressCheck(
            True,
            required,
            slack,
            f"deadline slack on on-demand is {slack / 60:.0f} min "
            f"(< {config.deadline_safety_s / 60:.0f} min safety)",
        )
    if job.progress_fraction + config.uniform_progress_tolerance < required:
        return ProgressCheck(
            True,
            required,
            slack,
            f"behind uniform progress: {job.progress_fraction:.0%} done, "
            f"{required:.0%} of the deadline window spent",
        )
    return ProgressCheck(False, required, slack, "")
