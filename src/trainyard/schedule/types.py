"""Value types of the scheduler: queued and running jobs, candidates, configuration and round results.

Everything here is immutable and free of I/O. Times are seconds on the caller's clock (``now_s`` is an
argument everywhere; the scheduler never reads a clock). Money is US dollars.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trainyard.catalog.pools import Pool
from trainyard.spec.models import JobSpec

#: The scheduler takes live pools exactly as the POOLS file / control plane describes them:
#: ``available_devices`` is the free capacity (running jobs already excluded), the price is the current one.
PoolState = Pool


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting for a placement."""

    job_id: str
    tenant: str
    spec: JobSpec
    submit_s: float
    priority: int = 0  # higher runs first when capacity is short; weight 2**priority (clamped to [-3, 6])
    # share of the job's steps already done and checkpointed (a job re-queued after a preemption), in
    # [0, 1): only the rest is priced
    progress_fraction: float = 0.0
    group: str | None = None  # scheduled as a group with the jobs that name the same one (:class:`JobGroup`)

    @property
    def deadline_abs_s(self) -> float | None:
        """Absolute deadline on the caller's clock, or None.

        A duration (``36h``) counts from ``submit_s``; an ISO timestamp is read with ``submit_s`` taken as
        Unix seconds.
        """
        return deadline_abs_s(self.spec, self.submit_s)


@dataclass(frozen=True)
class RunningJob:
    """A job holding an allocation; a candidate for migration or for the deadline-aware spot fallback."""

    job_id: str
    tenant: str
    spec: JobSpec
    submit_s: float
    pool: str
    devices: int
    market: str
    placed_s: float  # when the current placement started (for the minimum dwell time)
    progress_fraction: float = 0.0  # share of the job's steps already done, in [0, 1]
    priority: int = 0
    group: str | None = None  # a group's running member keeps its allocation (its group shares the pool)

    @property
    def deadline_abs_s(self) -> float | None:
        return deadline_abs_s(self.spec, self.submit_s)


def deadline_abs_s(spec: JobSpec, submit_s: float) -> float | None:
    if spec.objective.deadline is None:
        return None
    submitted = datetime.fromtimestamp(submit_s, tz=UTC) if abs(submit_s) < 1e11 else None
    rel = spec.objective.deadline_s(submitted)
    return None if rel is None else submit_s + rel


@dataclass(frozen=True)
class JobGroup:
    """Jobs scheduled as a group, such as a sweep's trials (``QueuedJob.group`` names it).

    The members a round starts all go on one pool (``pool``, once the caller has pinned it: where the
    group's earlier members ran; else the round picks one), so their results compare fairly and their
    prediction and price are shared. At most ``max_starts`` of them start in the round (the group's
    parallelism less its running members), and the expected costs of those started add up to no more than
    ``budget_usd`` (the group's budget less its spend and the rest of its running members). ``None``: no
    such limit. A group named by jobs but not given here only shares the pool.
    """

    max_starts: int | None = None
    budget_usd: float | None = None
    pool: str | None = None


@dataclass(frozen=True)
class TenantQuota:
    """Per-tenant limits; ``None`` means unlimited. Running jobs count against them."""

    max_devices: int | None = None
    max_jobs: int | None = None


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs of one scheduling round. Defaults are documented in docs/scheduler.md."""

    time_limit_s: float = 0.1  # CP-SAT search per round (deterministic time; see wall_limit_factor)
    lp_iteration_limit: int = 50_000  # LP relaxation (HiGHS) simplex iterations: deterministic
    lp_wall_limit_s: float = 5.0  # LP safety net in wall-clock seconds
    wall_limit_factor: float = 10.0  # CP-SAT stops at its deterministic limit, or this × it in wall time
    # Skip the CP-SAT search when the LP bound already proves the rounded solution within this relative gap.
    skip_search_gap: float = 0.0005
    seed: int = 0
    num_workers: int = 1  # 1 worker + fixed seed = identical answers for identical inputs
    max_options_per_job: int = 6  # candidates kept in the model per job (cheapest first)
    max_options_per_pool: int = 2  # of those, at most this many device counts per pool
    # options the greedy seeding pass looks at per job (None: all fitting); its pick joins the model
    seed_options_per_job: int | None = None
    cost_scale: int = 1000  # objective units per dollar (integer CP-SAT coefficients)
    quotas: Mapping[str, TenantQuota] = field(default_factory=dict)
    # Reserved capacity is already paid for: its options enter the objective at this share of their price.
    reserved_cost_factor: float = 0.0
    # Jobs whose objective.minimize is "time" value an hour of wall time at this many dollars.
    time_value_usd_per_hour: float = 100.0
    # Waiting cost of leaving a job unplaced this round, in dollars:
    #   weight(priority) × urgency × (wait_base_usd + wait_cost_share × reference cost)
    #   × (1 + queued_h / wait_growth_h)
    wait_base_usd: float = 1.0
    wait_cost_share: float = 0.05
    wait_growth_h: float = 1.0
    deadline_urgency: float = 4.0  # urgency = 1 + deadline_urgency × (needed time / time left), capped
    max_urgency: float = 50.0
    # Migration: move only when savings > (1 + margin) × migration cost + min_savings_usd and dwell is met.
    migration_margin: float = 0.25
    migration_min_savings_usd: float = 1.0
    min_dwell_s: float = 1800.0
    checkpoint_save_s: float = 60.0  # write a checkpoint before moving
    transfer_gbps: float = 10.0  # checkpoint copy between pools
    conversion_s: float = 300.0  # cross-family checkpoint conversion (layout, precision, world size)
    # Deadline-aware spot (Uniform Progress): fall back to on-demand when behind, or when slack is this small.
    deadline_safety_s: float = 1800.0
    uniform_progress_tolerance: float = 0.02
    # Price each spec's pool × device-count grid as arrays (``schedule.grid``); False: one quote per option
    # (``candidates.price_option``), the reference the vectorised path equals option for option.
    vectorised_pricing: bool = True
    # Drop each job's dominated options before the model (``round.pareto_rows``: another option of the same
    # pool costs no more, finishes no later and takes no more capacity); the optimum is unchanged, and the
    # per-job option limits above then keep only options that can matter.
    pareto_pruning: bool = True


@dataclass(frozen=True)
class Candidate:
    """One way to run a job now: (pool, device count, market) with its expected price and timing."""

    job_id: str
    tenant: str
    pool: str
    accelerator: str
    devices: int
    nodes: int
    devices_per_node: int
    market: str
    expected_cost_usd: float  # dollars for the (remaining) job on this option, as the cost model quotes it
    expected_hours: float
    expected_hours_p90: float
    step_time_s: float
    price_usd_per_hour: float
    checkpoint_interval_s: float
    finish_s: float  # p90 finish if started at the now_s it was built for (per-spec lists: built at 0)
    feasible: bool
    reasons: tuple[str, ...] = ()  # why infeasible (empty when feasible)
    # Capacity this option consumes from its pool: whole nodes when it spans nodes, else its devices.
    capacity_devices: int = 0
    migration_cost_usd: float = 0.0  # > 0 only for a running job's move
    is_stay: bool = False  # a running job keeping its allocation (consumes no new capacity)
    objective_usd: float = 0.0  # dollars as the optimiser sees them (reserved discounted, migration added)

    @property
    def spans_nodes(self) -> bool:
        return self.nodes > 1

    def describe(self) -> str:
        what = f"{self.devices} × {self.accelerator} on {self.pool} ({self.market})"
        if self.is_stay:
            what = f"stay on {self.pool} ({self.devices} × {self.accelerator}, {self.market})"
        return f"{what}: ${self.expected_cost_usd:,.2f}, {self.expected_hours:.2f} h"


@dataclass(frozen=True)
class Alternative:
    pool: str
    devices: int
    market: str
    expected_cost_usd: float
    expected_hours: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "devices": self.devices,
            "market": self.market,
            "expected_cost_usd": round(self.expected_cost_usd, 6),
            "expected_hours": round(self.expected_hours, 6),
        }


@dataclass(frozen=True)
class Placement:
    job_id: str
    tenant: str
    pool: str
    accelerator: str
    devices: int
    nodes: int
    market: str
    expected_cost_usd: float
    expected_hours: float
    checkpoint_interval_s: float
    reason: str
    alternatives: tuple[Alternative, ...] = ()
    migration: bool = False  # a running job moving to a new allocation
    from_pool: str | None = None

    def to_contract(self) -> dict[str, Any]:
        """DESIGN §3.3 placement keys, plus additive detail (accelerator, nodes, hours, checkpointing)."""
        doc: dict[str, Any] = {
            "job": self.job_id,
            "pool": self.pool,
            "devices": self.devices,
            "market": self.market,
            "expected_cost_usd": round(self.expected_cost_usd, 6),
            "reason": self.reason,
            "accelerator": self.accelerator,
            "nodes": self.nodes,
            "expected_hours": round(self.expected_hours, 6),
            "checkpoint_interval_s": round(self.checkpoint_interval_s, 3),
            "alternatives": [a.to_dict() for a in self.alternatives],
        }
        if self.migration:
            doc["migration_from"] = self.from_pool
        return doc


@dataclass(frozen=True)
class Unplaced:
    job_id: str
    tenant: str
    reason: str

    def to_contract(self) -> dict[str, Any]:
        return {"job": self.job_id, "reason": self.reason}


@dataclass(frozen=True)
class RoundResult:
    """What one round decided. ``placements`` holds new starts and migrations (``migration=True``);
    running jobs that stay where they are appear in ``kept``."""

    placements: tuple[Placement, ...]
    unplaced: tuple[Unplaced, ...]
    kept: tuple[str, ...]
    solve_time_s: float
    objective_usd: float
    solver_status: str  # "optimal", "feasible" (CP-SAT), "lp" (LP rounding), "greedy" (fallback), "empty"
    greedy_objective_usd: float
    lower_bound_usd: float | None = None  # proven lower bound on objective_usd (LP / CP-SAT), if known

    def to_contract(self) -> dict[str, Any]:
        return {
            "placements": [p.to_contract() for p in self.placements],
            "unplaced": [u.to_contract() for u in self.unplaced],
            "solve_time_s": round(self.solve_time_s, 6),
        }
