"""Placement policies the simulator runs in rounds.

A policy sees what a real scheduler would see: the queued jobs (with the progress they keep from earlier
attempts), the running jobs, and the live pools (``available_devices`` = free capacity now, the current
price), and answers with placements. It never sees true step times or future preemptions.

Every policy prices options with the one cost model (``trainyard.cost.quote.option_for``); the baselines
are simple rules over those options, ``trainyard`` and ``on-demand-only`` run the real scheduler.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from trainyard.catalog.pools import Pool
from trainyard.spec.models import JobSpec

if TYPE_CHECKING:
    from trainyard.cost.quote import QuoteOption


@dataclass(frozen=True)
class QueuedView:
    job_id: str
    tenant: str
    spec: JobSpec
    submit_s: float
    priority: int = 0
    progress_fraction: float = 0.0  # kept from earlier attempts (checkpointed work)
    attempts: int = 0


@dataclass(frozen=True)
class RunningView:
    job_id: str
    tenant: str
    spec: JobSpec
    submit_s: float
    pool: str
    devices: int
    market: str
    placed_s: float
    progress_fraction: float
    priority: int = 0


@dataclass(frozen=True)
class Start:
    """Start ``job_id`` on ``devices`` of ``pool`` now; ``migration`` moves a running job there."""

    job_id: str
    pool: str
    devices: int
    migration: bool = False


@dataclass(frozen=True)
class Decision:
    starts: tuple[Start, ...]
    solve_time_s: float | None = None  # the policy's own measure of its solve time, when it has one
    unplaced: int = 0


class Policy(Protocol):
    name: str
    migrates: bool  # whether the policy may move running jobs (the simulator then re-plans periodically)

    def decide(
        self,
        now_s: float,
        queued: Sequence[QueuedView],
        running: Sequence[RunningView],
        pools: Sequence[Pool],
    ) -> Decision: ...


def capacity_devices(pool: Pool, devices: int) -> int:
    """Devices an allocation takes from its pool: whole nodes when it spans nodes, else its devices."""
    n = pool.devices_per_node
    if devices > n:
        return -(-devices // n) * n
    return devices


@dataclass
class OptionBook:
    """Memo of the cost model's options per (job, pool, device count), priced on the pool as configured.

    Shared by the baselines and the lower bound. Prices used for ranking are read from the live pool;
    the option supplies feasibility, step time and expected cost. Quotes go through the scheduler's
    ``CandidateCache`` (shared with the scheduler policies of the same run): predictions are memoised per
    workload shape and pool topology, and a job that differs from an earlier one only in length gets that
    job's quote rescaled (the same numbers as ``option_for``).
    """

    counts: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    options: dict[tuple[str, str, int], QuoteOption] = field(default_factory=dict)
    base_pools: dict[str, Pool] = field(default_factory=dict)
    cache: Any = None  # trainyard.schedule.CandidateCache; None: a new one

    def __post_init__(self) -> None:
        if self.cache is None:
            from trainyard.schedule import CandidateCache

            self.cache = CandidateCache()

    def set_pools(self, pools: Sequence[Pool]) -> None:
        self.base_pools = {p.name: p.model_copy(update={"available_devices": None}) for p in pools}

    def device_counts(self, job_id: str, spec: JobSpec, pool_name: str) -> list[int]:
        from trainyard.cost.quote import candidate_device_counts

        key = (job_id, pool_name)
        hit = self.counts.get(key)
        if hit is None:
            hit = list(candidate_device_counts(spec, self.base_pools[pool_name]))
            self.counts[key] = hit
        return hit

    def option(self, job_id: str, spec: JobSpec, pool_name: str, devices: int) -> QuoteOption:
        """``option_for(spec, pool, devices, deadline_s=inf)`` on the pool as configured (through the
        scheduler's cache: the same numbers, shared with its rounds); feasible() applies the deadline."""
        from trainyard.schedule.candidates import price_option

        key = (job_id, pool_name, devices)
        hit = self.options.get(key)
        if hit is None:
            hit = price_option(spec, self.base_pools[pool_name], devices, 0.0, self.cache)
            self.options[key] = hit
        return hit

    def feasible(
        self, job_id: str, spec: JobSpec, pool_name: str, *, deadline: bool = True
    ) -> list[QuoteOption]:
        """Options of the job on the pool that the cost model accepts; with ``deadline``, only those
        whose pessimistic wall time fits the spec's deadline counted from submission (as a quote checks
        it), without, also those that would finish late."""
        allowed = {str(getattr(m, "value", m)) for m in spec.objective.markets}
        pool = self.base_pools[pool_name]
        if str(getattr(pool.market, "value", pool.market)) not in allowed:
            return []
        limit_s = _relative_deadline_s(spec) if deadline else None
        out = []
        for d in self.device_counts(job_id, spec, pool_name):
            opt = self.option(job_id, spec, pool_name, d)
            if not opt.feasible or capacity_devices(pool, d) > pool.total_devices:
                continue
            if limit_s is not None and opt.expected_hours_p90 * 3600.0 > limit_s:
                continue
            out.append(opt)
        return out

    def forget(self, job_id: str) -> None:
        for name in self.base_pools:
            counts = self.counts.pop((job_id, name), [])
            for d in counts:
                self.options.pop((job_id, name, d), None)


def _relative_deadline_s(spec: JobSpec) -> float | None:
    """The spec's deadline in seconds from submission (None without one, or for an absolute one)."""
    try:
        return spec.objective.deadline_s(None)
    except ValueError:
        return None


def _market(pool: Pool) -> str:
    return str(getattr(pool.market, "value", pool.market))


@dataclass
class _GreedyRule:
    """First-come first-served with backfilling: each queued job, oldest first, takes the best option
    (by ``key``) that fits the free capacity now; a job with nothing that fits waits."""

    name: str
    book: OptionBook
    key: Callable[[Pool, QuoteOption, float], tuple[float, ...]]
    markets: frozenset[str] | None = None
    migrates: bool = False

    def decide(
        self,
        now_s: float,
        queued: Sequence[QueuedView],
        running: Sequence[RunningView],
        pools: Sequence[Pool],
    ) -> Decision:
        free = {p.name: p.free_devices for p in pools}
        starts: list[Start] = []
        unplaced = 0
        usable = [p for p in pools if self.markets is None or _market(p) in self.markets]
        for job in sorted(queued, key=lambda j: (-j.priority, j.submit_s, j.job_id)):
            best: tuple[tuple[float | str, ...], Pool, QuoteOption] | None = None
            # a job that no option can finish by its deadline runs late rather than never
            meets = any(self.book.feasible(job.job_id, job.spec, p.name) for p in usable)
            for pool in usable:
                if free[pool.name] <= 0:
                    continue
                price = pool.price_usd_per_device_hour
                for opt in self.book.feasible(job.job_id, job.spec, pool.name, deadline=meets):
                    if capacity_devices(pool, opt.devices) > free[pool.name]:
                        continue
                    per_dev_h = price if price is not None else opt.price_usd_per_hour / opt.devices
                    k: tuple[float | str, ...] = (*self.key(pool, opt, per_dev_h), pool.name)
                    if best is None or k < best[0]:
                        best = (k, pool, opt)
            if best is None:
                unplaced += 1
                continue
            _, pool, opt = best
            free[pool.name] -= capacity_devices(pool, opt.devices)
            starts.append(Start(job.job_id, pool.name, opt.devices))
        return Decision(starts=tuple(starts), unplaced=unplaced)


def cheapest_hourly(book: OptionBook) -> _GreedyRule:
    """Lowest price per device-hour that fits (fewest devices on it): the hourly-price red flag."""
    return _GreedyRule(
        name="cheapest-hourly",
        book=book,
        key=lambda pool, opt, per_dev_h: (round(per_dev_h, 9), opt.devices, opt.step_time_s),
    )


def fastest(book: OptionBook) -> _GreedyRule:
    """Lowest predicted step time on on-demand capacity that fits."""
    return _GreedyRule(
        name="fastest",
        book=book,
        key=lambda pool, opt, per_dev_h: (opt.step_time_s, opt.price_usd_per_hour),
        markets=frozenset({"on_demand"}),
    )


@dataclass
class SchedulerPolicy:
    """The real scheduler (``trainyard.schedule.schedule_round``), one call per simulated round.

    ``markets`` restricts the pools it may use (``on-demand-only`` leaves spot out). Running jobs are
    reported with their progress floored to whole percent, as heartbeats would report it.
    """

    name: str = "trainyard"
    markets: frozenset[str] | None = None
    config: Any = None  # trainyard.schedule.SchedulerConfig; None = its defaults
    migrates: bool = True
    cache: Any = None

    def __post_init__(self) -> None:
        from trainyard.schedule import CandidateCache, SchedulerConfig

        if self.config is None:
            self.config = SchedulerConfig()
        if self.cache is None:
            self.cache = CandidateCache()
        # The solver libraries load on the scheduler's first solve; load them now so that the first
        # round's measured decision time is the round's, not the import's.
        import ortools.sat.python.cp_model  # noqa: F401
        import scipy.optimize
        import scipy.sparse  # noqa: F401

    def decide(
        self,
        now_s: float,
        queued: Sequence[QueuedView],
        running: Sequence[RunningView],
        pools: Sequence[Pool],
    ) -> Decision:
        from trainyard.schedule import QueuedJob, RunningJob, schedule_round

        if self.markets is not None:
            pools = [p for p in pools if _market(p) in self.markets]
        names = {p.name for p in pools}
        # checkpointed progress of a re-queued job, floored to whole percent like a running job's
        qjobs = [
            QueuedJob(
                q.job_id,
                q.tenant,
                q.spec,
                q.submit_s,
                q.priority,
                progress_fraction=math.floor(q.progress_fraction * 100.0) / 100.0,
            )
            for q in queued
        ]
        rjobs = [
            RunningJob(
                job_id=r.job_id,
                tenant=r.tenant,
                spec=r.spec,
                submit_s=r.submit_s,
                pool=r.pool,
                devices=r.devices,
                market=r.market,
                placed_s=r.placed_s,
                progress_fraction=math.floor(r.progress_fraction * 100.0) / 100.0,
                priority=r.priority,
            )
            for r in running
            if r.pool in names
        ]
        result = schedule_round(qjobs, pools, rjobs, now_s, self.config, cache=self.cache)
        self.cache.trim()
        starts = tuple(Start(p.job_id, p.pool, p.devices, p.migration) for p in result.placements)
        return Decision(starts=starts, solve_time_s=result.solve_time_s, unplaced=len(result.unplaced))


def make_policy(name: str, book: OptionBook, scheduler_config: Any = None) -> Policy:
    """A policy by its CLI name."""
    if name == "trainyard":
        return SchedulerPolicy(name="trainyard", config=scheduler_config, cache=book.cache)
    if name == "on-demand-only":
        return SchedulerPolicy(
            name="on-demand-only",
            markets=frozenset({"on_demand", "reserved"}),
            config=scheduler_config,
            cache=book.cache,
        )
    if name == "cheapest-hourly":
        return cheapest_hourly(book)
    if name == "fastest":
        return fastest(book)
    from trainyard.errors import InvalidInputError

    raise InvalidInputError(f"unknown policy {name!r}", hint=f"Policies: {', '.join(POLICY_NAMES)}.")


POLICY_NAMES = ("trainyard", "cheapest-hourly", "fastest", "on-demand-only")
