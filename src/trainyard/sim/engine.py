"""The discrete-event cluster simulator.

Events: arrivals, round decisions (starts and migrations), completions, preemption notices and reclaims
(Poisson per node, or replayed availability traces), capacity changes, spot price changes and periodic
samples for the report. Between events a running attempt follows a closed form, so checkpoints and
progress cost no events:

    attempt = startup (restart_s: provision + load + compile) then cycles of
              [checkpoint_interval_s of training, checkpoint_write_s writing a checkpoint]

Truth vs belief: the policy is shown the cost model's predicted step time; the attempt runs at the *true*
step time, which is ``measured.step_time_s`` when the spec gives it for that accelerator and otherwise the
prediction times a seeded log-normal error per (job, accelerator).

A preemption notice stops training; the job writes an emergency checkpoint if it fits in the notice
(then nothing is lost and the devices are released when it is written), otherwise the work since the last
periodic checkpoint is lost and the devices are held until the reclaim. Either way the job goes back to
the queue with its durable progress and pays the startup again on its next attempt.

Billing: every attempt is charged devices × seconds held × the pool's price per device-hour at each
moment (price changes settle the running attempts first).

The core is pure: no clock, no files. A wall-clock ``timer`` may be injected to measure the policy's solve
time; it never influences the simulation.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainyard.catalog.pools import Pool
from trainyard.sim.policy import Decision, OptionBook, Policy, QueuedView, RunningView, capacity_devices
from trainyard.sim.spot import SpotTrace, interruption_delay_s, stream
from trainyard.sim.trace import TraceJob

if TYPE_CHECKING:
    from trainyard.cost.quote import QuoteOption

# Event kinds, in the order they are handled at equal times.
_RELEASE, _COMPLETE, _CAPACITY, _PRICE, _NOTICE, _ARRIVAL, _ROUND, _SAMPLE = range(8)


@dataclass(frozen=True)
class PoolChange:
    """A scheduled change of a pool at ``time_s``: capacity (devices usable), price, or both."""

    time_s: float
    pool: str
    available_devices: int | None = None
    price_usd_per_device_hour: float | None = None


@dataclass(frozen=True)
class SimConfig:
    seed: int = 0
    # Truth vs belief: true step time = predicted × exp(N(mu, sigma)), per (job, accelerator).
    step_time_error_sigma: float = 0.15
    step_time_error_mu: float = 0.0
    # Rounds: a state change asks for a round, at most one every round_gap_s (debounce); while jobs wait
    # (or, for a policy that migrates, while jobs run) a round also happens every periodic_round_s.
    round_gap_s: float = 300.0
    periodic_round_s: float = 3600.0
    # Running jobs are offered to the policy (for migration and the deadline-aware spot fallback) in rounds
    # at least this far apart; rounds in between place queued jobs only. 0 = every round.
    replan_running_s: float = 3600.0
    # Checkpoint write time; None = the cost model's figure for the job when it gives one, else 60 s.
    checkpoint_write_s: float | None = None
    conversion_s: float = 300.0  # extra start-up after a move between accelerator families
    # Spot price process: every spot_price_interval_s the log price multiplier follows
    # m' = reversion·m + volatility·N(0, 1) (mean-reverting around the configured price).
    spot_price_volatility: float = 0.0
    spot_price_reversion: float = 0.7
    spot_price_interval_s: float = 6 * 3600.0
    sample_interval_s: float | None = None  # None: about 400 samples over the run
    max_sim_s: float | None = None  # None: last arrival + 30 days
    # Stop early when jobs wait on an idle, unchanging cluster and the policy declines them this many
    # rounds in a row (they are reported as not completed).
    give_up_after_idle_rounds: int = 24
    trace_offset_s: float = 0.0  # where in a spot trace the simulation starts
    # Poisson interruptions hit each node of an allocation (True) or the allocation as a whole (False).
    per_node_interruptions: bool = True
    changes: tuple[PoolChange, ...] = ()
    # Reserved capacity is a commitment bought for a term, paid for whether used or not. None: bill it (and
    # bound every pool's capacity) over this run's own span. A span set here bills at least that long, at
    # each pool's capacity when the run ended, so policies compared on one workload pay the same committed
    # spend however soon each one finishes (``run.simulate_policies`` sets it to their longest span).
    committed_span_s: float | None = None


@dataclass
class _Attempt:
    job_id: str
    pool: str
    devices: int
    capacity: int
    market: str
    accelerator: str
    start_s: float
    startup_s: float
    interval_s: float  # training seconds between periodic checkpoints (inf: none)
    write_s: float
    step_s: float  # true step time
    steps_at_start: float
    steps_to_go: float
    token: int
    billed_until_s: float
    predicted_step_s: float
    cost_usd: float = 0.0
    billed_device_s: float = 0.0
    stopping: bool = False  # notice received (or migrating): no more training

    @property
    def work_s(self) -> float:
        return self.steps_to_go * self.step_s

    def finish_s(self) -> float:
        work = self.work_s
        ckpts = (
            0
            if not math.isfinite(self.interval_s) or work <= 0
            else max(0, math.ceil(work / self.interval_s) - 1)
        )
        return self.start_s + self.startup_s + work + ckpts * self.write_s

    def trained_s(self, t: float) -> tuple[float, float]:
        """(training seconds done by ``t``, training seconds covered by a finished checkpoint)."""
        e = t - self.start_s - self.startup_s
        if e <= 0:
            return 0.0, 0.0
        if not math.isfinite(self.interval_s):
            done = min(e, self.work_s)
            return done, 0.0
        cycle = self.interval_s + self.write_s
        k = math.floor(e / cycle)
        r = e - k * cycle
        done = min(k * self.interval_s + min(r, self.interval_s), self.work_s)
        durable = min(k * self.interval_s, self.work_s)
        return done, durable


@dataclass
class _Job:
    job_id: str
    tenant: str
    spec: Any
    submit_s: float
    priority: int
    total_steps: float
    deadline_abs_s: float | None
    state: str = "future"  # future | queued | running | stopping | done | rejected
    durable_steps: float = 0.0
    attempts: int = 0
    attempt: _Attempt | None = None
    completion_s: float | None = None
    cost_usd: float = 0.0
    billed_device_s: float = 0.0
    held_device_s: float = 0.0
    preemptions: int = 0
    migrations: int = 0
    lost_work_device_s: float = 0.0
    pools_used: list[str] = field(default_factory=list)
    first_start_s: float | None = None
    next_start: tuple[str, int, float] | None = None  # (pool, devices, extra startup) after a migration


@dataclass
class _PoolState:
    base: Pool
    capacity: int  # devices usable now
    used: int = 0
    price_mult: float = 1.0
    log_mult: float = 0.0
    base_price: float | None = None  # per device-hour
    held_device_s: float = 0.0
    capacity_device_s: float = 0.0
    capacity_since_s: float = 0.0
    preemptions: int = 0
    trace: SpotTrace | None = None
    rate_per_hour: float = 0.0  # Poisson interruptions (spot pools without a trace)
    notice_s: float = 0.0
    _live: tuple[tuple[int, float | None], Pool] | None = None

    @property
    def market(self) -> str:
        return str(getattr(self.base.market, "value", self.base.market))

    def price(self) -> float:
        assert self.base_price is not None
        return self.base_price * self.price_mult

    def live(self) -> Pool:
        update: dict[str, Any] = {
            "available_devices": max(0, min(self.capacity - self.used, self.base.total_devices))
        }
        if self.base_price is not None:
            update["price_usd_per_device_hour"] = self.price()
        return self.base.model_copy(update=update)


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    tenant: str
    submit_s: float
    completion_s: float | None
    cost_usd: float
    preemptions: int
    migrations: int
    attempts: int
    lost_work_device_s: float
    deadline_abs_s: float | None
    missed_deadline: bool
    pools: tuple[str, ...]
    lower_bound_cost_usd: float

    @property
    def jct_s(self) -> float | None:
        return None if self.completion_s is None else self.completion_s - self.submit_s


@dataclass(frozen=True)
class Sample:
    time_s: float
    cost_usd: float
    queued: int
    running: int
    used_devices: Mapping[str, int]
    preemptions: int


@dataclass(frozen=True)
class PoolStats:
    name: str
    market: str
    accelerator: str
    held_device_s: float
    capacity_device_s: float
    preemptions: int

    @property
    def utilisation(self) -> float:
        return self.held_device_s / self.capacity_device_s if self.capacity_device_s > 0 else 0.0


@dataclass(frozen=True)
class SimResult:
    policy: str
    seed: int
    jobs: tuple[JobOutcome, ...]
    samples: tuple[Sample, ...]
    pools: tuple[PoolStats, ...]
    round_solve_times_s: tuple[float, ...]
    rounds: int
    end_s: float
    billed_device_s: float
    held_device_s: float
    total_cost_usd: float  # usage spend plus committed spend
    starts: int
    rejected_starts: int
    committed_cost_usd: float = 0.0  # reserved pools' capacity over the simulated span, used or not
    usage_cost_usd: float = 0.0  # on-demand and spot allocations as held (reserved use is committed)
    lower_bound_cost_usd: float = 0.0  # committed + the capacity-aware LP bound on usage (sim.bound)
    per_job_lower_bound_usd: float = 0.0  # committed + each job alone on its cheapest option
    lower_bound_status: str = ""  # the LP's status ("optimal", or why the per-job bound stands in)
    committed_span_s: float = 0.0  # the span committed spend and the bound's capacities are over

    def summary(self) -> dict[str, Any]:
        from trainyard.sim.metrics import summarize

        return summarize(self)


def _checkpoint_load_s(spec: Any, nodes: int, ckpt_bytes: float | None = None) -> float:
    from trainyard.cost import model as cm

    size = cm.checkpoint_bytes(spec) if ckpt_bytes is None else ckpt_bytes
    return cm.checkpoint_load_s(size, nodes, cm.storage_read_gb_per_s(spec.checkpoint.storage))


def _true_step_factor(seed: int, job_id: str, accelerator: str, config: SimConfig) -> float:
    if config.step_time_error_sigma <= 0 and config.step_time_error_mu == 0:
        return 1.0
    rng = stream(seed, "step-error", job_id, accelerator)
    return math.exp(rng.gauss(config.step_time_error_mu, config.step_time_error_sigma))


class Simulator:
    def __init__(
        self,
        jobs: Sequence[TraceJob],
        pools: Sequence[Pool],
        policy: Policy,
        config: SimConfig | None = None,
        *,
        spot_traces: Mapping[str, SpotTrace] | None = None,
        book: OptionBook | None = None,
        timer: Callable[[], float] | None = None,
    ) -> None:
        from trainyard.sim.trace import TraceError

        self.config = config or SimConfig()
        self._start_s = 0.0
        self._end_s: float | None = None
        self._results: dict[float, SimResult] = {}  # by seconds billed past the run's end
        self.policy = policy
        self.timer = timer
        self.book = book if book is not None else OptionBook()
        self.book.set_pools(pools)
        names = [p.name for p in pools]
        if len(set(names)) != len(names):
            raise TraceError("pool names must be unique")
        traces = dict(spot_traces or {})
        for name in traces:
            if name not in names:
                raise TraceError(
                    f"spot trace given for unknown pool {name!r}", hint=f"Pools: {', '.join(names)}"
                )
        self.pools: dict[str, _PoolState] = {}
        from trainyard.catalog.offers import pool_interruption_rate_per_hour, pool_notice_s

        for p in pools:
            self.pools[p.name] = _PoolState(
                base=p,
                capacity=p.free_devices,
                base_price=p.price_usd_per_device_hour,
                trace=traces.get(p.name),
                rate_per_hour=pool_interruption_rate_per_hour(p),
                notice_s=pool_notice_s(p),
            )
        self.jobs: dict[str, _Job] = {}
        for tj in jobs:
            if tj.job_id in self.jobs:
                raise TraceError(f"job_id {tj.job_id!r} appears twice")
            from trainyard.schedule.types import deadline_abs_s

            self.jobs[tj.job_id] = _Job(
                job_id=tj.job_id,
                tenant=tj.tenant,
                spec=tj.spec,
                submit_s=tj.submit_s,
                priority=tj.priority,
                total_steps=float(tj.spec.total_steps),
                deadline_abs_s=deadline_abs_s(tj.spec, tj.submit_s),
            )
        self.order = [tj.job_id for tj in jobs]
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._token = 0
        self.now = 0.0
        self._round_at = math.inf  # time of the earliest pending round
        self._last_round_s = -math.inf
        self._last_replan_s = -math.inf
        self._arrived = 0
        self._idle_rounds = 0
        self._give_up = False  # the waiting jobs can never be placed (see _stuck)
        self._queue: dict[str, None] = {}  # insertion-ordered set of queued job ids
        self._running: dict[str, None] = {}
        self._done = 0
        self._total_cost = 0.0
        self._billed_device_s = 0.0
        self._held_device_s = 0.0
        self._preemptions = 0
        self._solve_times: list[float] = []
        self._rounds = 0
        self._starts = 0
        self._rejected = 0
        self._samples: list[Sample] = []
        self._lower_bounds: dict[str, float] = {}
        self._bound_options: dict[str, list[Any]] = {}  # job -> sim.bound.BoundOption (every feasible one)
        self._trace_iters: dict[str, Any] = {}
        self._truth: dict[tuple[str, str], float] = {}  # true / predicted step time per (job, accelerator)
        self._detached: dict[int, _Attempt] = {}  # old allocations of migrating jobs, until released

    # ---- event queue ------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, payload))

    # ---- setup -------------------------------------------------------------------------------------
    def _resolve_prices(self) -> None:
        from trainyard.catalog.offers import price_usd_per_device_hour_for

        for ps in self.pools.values():
            if ps.base_price is None:
                ps.base_price = price_usd_per_device_hour_for(ps.base)

    def _lower_bound(self, job: _Job) -> float:
        """The job alone on its cheapest option at true speed: no preemption, no capacity limit, no
        checkpoints, one start-up; reserved capacity at marginal cost zero (it is committed spend). Also
        records every feasible option (deadline relaxed) for the capacity-aware bound (``sim.bound``)."""
        from trainyard.sim.bound import BoundOption

        best = {True: math.inf, False: math.inf}
        ckpt_bytes = self.book.cache.facts(job.spec).checkpoint_bytes  # cost.model.checkpoint_bytes(spec)
        options: list[BoundOption] = []
        # options that meet the deadline; for a job none can finish in time, its cheapest late option
        for deadline in (True, False):
            for ps in self.pools.values():
                for opt in self.book.feasible(job.job_id, job.spec, ps.base.name, deadline=deadline):
                    step = opt.step_time_s * self._truth_factor(job, opt)
                    price = 0.0 if ps.market == "reserved" else ps.price()
                    startup = max(0.0, opt.restart_s - _checkpoint_load_s(job.spec, opt.nodes, ckpt_bytes))
                    busy_s = startup + job.total_steps * step
                    cost = busy_s * price * opt.devices / 3600.0
                    best[deadline] = min(best[deadline], cost)
                    if not deadline:
                        held = capacity_devices(ps.base, opt.devices) * busy_s
                        options.append(BoundOption(pool=ps.base.name, cost_usd=cost, device_s=held))
        self._bound_options[job.job_id] = options
        value = best[True] if math.isfinite(best[True]) else best[False]
        return value if math.isfinite(value) else 0.0

    def _truth_factor(self, job: _Job, opt: QuoteOption) -> float:
        if opt.accelerator in job.spec.measured.step_time_s or opt.step_time_source.startswith("measured"):
            return 1.0  # a measured step time is the truth; the error models the predictor only
        key = (job.job_id, opt.accelerator)
        hit = self._truth.get(key)
        if hit is None:
            hit = _true_step_factor(self.config.seed, job.job_id, opt.accelerator, self.config)
            self._truth[key] = hit
        return hit

    # ---- main loop ---------------------------------------------------------------------------------
    def run(self) -> SimResult:
        cfg = self.config
        self._resolve_prices()
        for job_id in self.order:
            job = self.jobs[job_id]
            self._push(job.submit_s, _ARRIVAL, job_id)
        last_arrival = max((j.submit_s for j in self.jobs.values()), default=0.0)
        first_arrival = min((j.submit_s for j in self.jobs.values()), default=0.0)
        self.now = min(0.0, first_arrival)
        self._start_s = self.now
        max_s = cfg.max_sim_s if cfg.max_sim_s is not None else last_arrival + 30 * 86400.0
        sample_every = cfg.sample_interval_s or max(600.0, (last_arrival - self.now + 2 * 86400.0) / 400.0)
        for ps in self.pools.values():
            ps.capacity_since_s = self.now
            if ps.trace is not None:
                frac = ps.trace.fraction_at(self.now, cfg.trace_offset_s)
                ps.capacity = self._trace_capacity(ps, frac)
                self._trace_iters[ps.base.name] = ps.trace.changes(self.now, cfg.trace_offset_s)
                self._next_trace_change(ps.base.name)
            if ps.market == "spot" and cfg.spot_price_volatility > 0:
                self._push(self.now + cfg.spot_price_interval_s, _PRICE, (ps.base.name, None))
        for ch in cfg.changes:
            if ch.pool not in self.pools:
                from trainyard.sim.trace import TraceError

                raise TraceError(f"change at {ch.time_s} s names unknown pool {ch.pool!r}")
            self._push(ch.time_s, _CAPACITY, ch)
        self._push(self.now, _SAMPLE, None)
        for job in self.jobs.values():
            self._lower_bounds[job.job_id] = self._lower_bound(job)

        while self._events:
            t, kind, _, payload = heapq.heappop(self._events)
            if t > max_s:
                break
            self.now = t
            if kind == _ARRIVAL:
                self._on_arrival(payload)
            elif kind == _COMPLETE:
                self._on_complete(*payload)
            elif kind == _NOTICE:
                self._on_notice(*payload)
            elif kind == _RELEASE:
                self._on_release(*payload)
            elif kind == _CAPACITY:
                self._on_change(payload)
            elif kind == _PRICE:
                self._on_price(*payload)
            elif kind == _ROUND:
                self._on_round(payload)
            elif kind == _SAMPLE:
                self._sample()
                if not self._finished():
                    self._push(t + sample_every, _SAMPLE, None)
            if self._finished():
                break
        end = self.now
        for att in self._all_attempts():
            self._settle(att, end)
            self._account_hold(self.jobs[att.job_id], att, end)
        self._sample()
        for ps in self.pools.values():
            self._close_capacity_window(ps)
        self._end_s = end
        return self.result(cfg.committed_span_s)

    @property
    def span_s(self) -> float:
        """The finished run's span, or the configured committed span when that is longer."""
        if self._end_s is None:
            raise RuntimeError("the simulation has not run yet")
        return max(self._end_s - self._start_s, self.config.committed_span_s or 0.0)

    def result(self, committed_span_s: float | None) -> SimResult:
        """The finished run's result with committed spend (and the capacity-aware bound) over at least
        ``committed_span_s`` seconds; the run itself does not change."""
        if self._end_s is None:
            raise RuntimeError("the simulation has not run yet")
        # one result (and one bound LP) per distinct span past the run's end
        beyond_s = max(0.0, (committed_span_s or 0.0) - (self._end_s - self._start_s))
        got = self._results.get(beyond_s)
        if got is None:
            got = self._results[beyond_s] = self._result(self._end_s, beyond_s)
        return got

    def _finished(self) -> bool:
        return self._done == len(self.jobs) or self._give_up

    # ---- handlers ----------------------------------------------------------------------------------
    def _on_arrival(self, job_id: str) -> None:
        job = self.jobs[job_id]
        self._arrived += 1
        # a deadline no option can meet is a miss, not a reason to reject: the job still runs (late)
        if not any(self.book.feasible(job.job_id, job.spec, name, deadline=False) for name in self.pools):
            job.state = "rejected"
            self._done += 1
            return
        job.state = "queued"
        self._queue[job_id] = None
        self._want_round()

    def _want_round(self, at_s: float | None = None) -> None:
        """Ask for a round (debounced: one per ``round_gap_s``); an earlier request wins."""
        t = max(self.now, self._last_round_s + self.config.round_gap_s) if at_s is None else at_s
        if self._round_at <= t:
            return
        self._round_at = t
        self._push(t, _ROUND, t)

    def _on_round(self, at_s: float) -> None:
        if at_s != self._round_at:
            return  # superseded by an earlier round
        self._round_at = math.inf
        self._last_round_s = self.now
        if not self._queue and not (self.policy.migrates and self._running):
            return
        queued = [self._queued_view(self.jobs[j]) for j in self._queue]
        running: list[RunningView] = []
        if self.policy.migrates and self.now - self._last_replan_s >= self.config.replan_running_s:
            self._last_replan_s = self.now
            running = [
                self._running_view(self.jobs[j]) for j in self._running if self.jobs[j].state == "running"
            ]
        if not queued and not running:
            self._schedule_periodic()
            return
        live = [ps.live() for ps in self.pools.values()]
        t0 = self.timer() if self.timer is not None else None
        decision: Decision = self.policy.decide(self.now, queued, running, live)
        elapsed = (self.timer() - t0) if self.timer is not None and t0 is not None else None
        solve = elapsed if elapsed is not None else decision.solve_time_s
        self._rounds += 1
        if solve is not None:
            self._solve_times.append(solve)
        for st in decision.starts:
            self._apply_start(st.job_id, st.pool, st.devices, st.migration)
        if self._stuck(bool(decision.starts)):
            self._give_up = True
            return
        self._schedule_periodic()

    def _stuck(self, placed: bool) -> bool:
        """Whether the waiting jobs can never be placed: the cluster is idle, nothing more will arrive or
        change (no spot traces, price moves or scheduled changes ahead), and the policy has declined them
        for ``give_up_after_idle_rounds`` rounds in a row."""
        static = (
            not self._running
            and not self._detached
            and self._arrived == len(self.jobs)
            and not any(ps.trace is not None for ps in self.pools.values())
            and self.config.spot_price_volatility == 0
            and all(ch.time_s <= self.now for ch in self.config.changes)
        )
        self._idle_rounds = self._idle_rounds + 1 if static and not placed else 0
        return self._idle_rounds >= self.config.give_up_after_idle_rounds

    def _schedule_periodic(self) -> None:
        if self._queue or (self.policy.migrates and self._running):
            self._want_round(self.now + self.config.periodic_round_s)

    def _apply_start(self, job_id: str, pool_name: str, devices: int, migration: bool) -> None:
        job = self.jobs.get(job_id)
        ps = self.pools.get(pool_name)
        if job is None or ps is None:
            self._rejected += 1
            return
        need = capacity_devices(ps.base, devices)
        if ps.capacity - ps.used < need:
            self._rejected += 1
            return
        if job.state == "queued":
            del self._queue[job_id]
            self._start(job, ps, devices, extra_startup_s=0.0)
        elif job.state == "running" and job.attempt is not None:
            if job.attempt.pool == pool_name and job.attempt.devices == devices:
                return
            self._migrate(job, ps, devices)
        else:
            self._rejected += 1

    def _start(self, job: _Job, ps: _PoolState, devices: int, extra_startup_s: float) -> None:
        from trainyard.schedule.candidates import price_option

        progress = min(1.0, job.durable_steps / job.total_steps) if job.total_steps > 0 else 0.0
        # the cost model's quote for this allocation (option_for, through the shared cache); only its
        # step time, checkpointing and restart figures are used, which do not depend on the deadline
        opt = price_option(job.spec, ps.live(), devices, min(progress, 0.999999), self.book.cache)
        write_s = (
            self.config.checkpoint_write_s if self.config.checkpoint_write_s is not None else opt.checkpoint_s
        )
        interval = float(opt.checkpoint_interval_s or 0.0)
        startup_s = float(opt.restart_s)
        if job.durable_steps <= 0:  # nothing to load on a first start
            startup_s = max(0.0, startup_s - _checkpoint_load_s(job.spec, opt.nodes))
        self._token += 1
        step_s = opt.step_time_s * self._truth_factor(job, opt)
        att = _Attempt(
            job_id=job.job_id,
            pool=ps.base.name,
            devices=devices,
            capacity=capacity_devices(ps.base, devices),
            market=ps.market,
            accelerator=opt.accelerator,
            start_s=self.now,
            startup_s=startup_s + extra_startup_s,
            interval_s=interval if interval > 0 else math.inf,
            write_s=write_s,
            step_s=step_s,
            steps_at_start=job.durable_steps,
            steps_to_go=max(0.0, job.total_steps - job.durable_steps),
            token=self._token,
            billed_until_s=self.now,
            predicted_step_s=opt.step_time_s,
        )
        ps.used += att.capacity
        job.attempt = att
        job.attempts += 1
        job.state = "running"
        job.pools_used.append(ps.base.name)
        if job.first_start_s is None:
            job.first_start_s = self.now
        self._running[job.job_id] = None
        self._starts += 1
        finish = att.finish_s()
        self._push(finish, _COMPLETE, (job.job_id, att.token))
        if ps.market == "spot" and ps.trace is None:
            rate = ps.rate_per_hour
            nodes = (
                max(1, -(-att.capacity // ps.base.devices_per_node))
                if self.config.per_node_interruptions
                else 1
            )
            rng = stream(self.config.seed, "interrupt", job.job_id, job.attempts)
            delay = interruption_delay_s(rng, rate, nodes)
            if self.now + delay < finish:
                self._push(self.now + delay, _NOTICE, (job.job_id, att.token, True))

    def _on_complete(self, job_id: str, token: int) -> None:
        job = self.jobs[job_id]
        att = job.attempt
        if att is None or att.token != token or att.stopping:
            return
        self._end_attempt(job, att)
        job.durable_steps = job.total_steps
        job.state = "done"
        job.completion_s = self.now
        self._done += 1
        self._want_round()

    def _on_notice(self, job_id: str, token: int, replace_node: bool) -> None:
        """Preemption notice: stop training, try an emergency checkpoint, release at write end or reclaim."""
        job = self.jobs[job_id]
        att = job.attempt
        if att is None or att.token != token or att.stopping:
            return
        ps = self.pools[att.pool]
        notice = ps.notice_s
        done_s, durable_s = att.trained_s(self.now)
        att.stopping = True
        job.state = "stopping"
        if att.write_s <= notice:
            durable_s = done_s
            release = self.now + (att.write_s if done_s > 0 else 0.0)
        else:
            release = self.now + notice
        lost_s = done_s - durable_s
        job.lost_work_device_s += lost_s * att.devices
        job.durable_steps = att.steps_at_start + durable_s / att.step_s
        job.preemptions += 1
        ps.preemptions += 1
        self._preemptions += 1
        self._push(release, _RELEASE, (job_id, token))

    def _migrate(self, job: _Job, ps: _PoolState, devices: int) -> None:
        """Move a running job: checkpoint on the old allocation, start on the new one (paying start-up, the
        checkpoint write, and a conversion when the accelerator family changes)."""
        from trainyard.catalog.names import ACCELERATOR_FAMILY

        att = job.attempt
        assert att is not None
        done_s, _ = att.trained_s(self.now)
        att.stopping = True
        job.durable_steps = att.steps_at_start + done_s / att.step_s
        old_family = ACCELERATOR_FAMILY.get(att.accelerator)
        cross = old_family != ACCELERATOR_FAMILY.get(ps.base.accelerator)
        release = self.now + (att.write_s if done_s > 0 else 0.0)
        extra = (release - self.now) + (self.config.conversion_s if cross else 0.0)
        job.migrations += 1
        self._push(release, _RELEASE, (job.job_id, att.token))
        # The new allocation starts now; its start-up includes waiting for the checkpoint.
        self._end_running_bookkeeping(job)
        job.attempt = None
        self._detached[att.token] = att
        self._start(job, ps, devices, extra_startup_s=extra)

    def _end_running_bookkeeping(self, job: _Job) -> None:
        self._running.pop(job.job_id, None)

    def _on_release(self, job_id: str, token: int) -> None:
        job = self.jobs[job_id]
        att = job.attempt if job.attempt is not None and job.attempt.token == token else None
        if att is None:
            att = self._detached.pop(token, None)
            if att is None:
                return
            self._end_attempt(job, att, keep_running=True)
            self._want_round()
            return
        self._end_attempt(job, att)
        job.state = "queued"
        self._queue[job_id] = None
        self._want_round()

    def _end_attempt(self, job: _Job, att: _Attempt, keep_running: bool = False) -> None:
        self._settle(att, self.now)
        self._account_hold(job, att, self.now)
        ps = self.pools[att.pool]
        ps.used -= att.capacity
        if not keep_running:
            job.attempt = None
            self._running.pop(job.job_id, None)

    def _account_hold(self, job: _Job, att: _Attempt, t: float) -> None:
        held = att.devices * (t - att.start_s)
        job.held_device_s += held
        self._held_device_s += held
        self.pools[att.pool].held_device_s += att.capacity * (t - att.start_s)

    def _settle(self, att: _Attempt, t: float) -> None:
        dt = t - att.billed_until_s
        if dt <= 0:
            return
        ps = self.pools[att.pool]
        # reserved capacity is committed spend, billed over the whole span at the end (_result): using it
        # costs nothing more
        cost = 0.0 if ps.market == "reserved" else att.devices * dt * ps.price() / 3600.0
        att.cost_usd += cost
        att.billed_device_s += att.devices * dt
        att.billed_until_s = t
        job = self.jobs[att.job_id]
        job.cost_usd += cost
        job.billed_device_s += att.devices * dt
        self._total_cost += cost
        self._billed_device_s += att.devices * dt

    def _all_attempts(self) -> list[_Attempt]:
        out = [a for a in (self.jobs[j].attempt for j in self._running) if a is not None]
        return out + list(self._detached.values())

    def _attempts_on(self, pool: str) -> list[_Attempt]:
        return [a for a in self._all_attempts() if a.pool == pool]

    def _set_capacity(self, ps: _PoolState, devices: int) -> None:
        self._close_capacity_window(ps)
        ps.capacity = max(0, min(devices, ps.base.total_devices))
        if ps.used > ps.capacity:
            # reclaim: the most recently started allocations go first
            victims = sorted(
                (a for a in self._attempts_on(ps.base.name) if not a.stopping),
                key=lambda a: (-a.start_s, -a.token),
            )
            over = ps.used - ps.capacity
            for att in victims:
                if over <= 0:
                    break
                over -= att.capacity
                self._on_notice(att.job_id, att.token, False)
        self._want_round()

    def _close_capacity_window(self, ps: _PoolState) -> None:
        ps.capacity_device_s += ps.capacity * (self.now - ps.capacity_since_s)
        ps.capacity_since_s = self.now

    def _on_change(self, ch: PoolChange | tuple[str, str, float]) -> None:
        if isinstance(ch, tuple):
            _, pool, fraction = ch
            ps = self.pools[pool]
            self._set_capacity(ps, self._trace_capacity(ps, fraction))
            if not self._finished():
                self._next_trace_change(pool)
            return
        ps = self.pools[ch.pool]
        if ch.price_usd_per_device_hour is not None:
            self._settle_pool(ps)
            ps.base_price = ch.price_usd_per_device_hour
            ps.price_mult = 1.0
            self._want_round()
        if ch.available_devices is not None:
            self._set_capacity(ps, ch.available_devices)

    def _trace_capacity(self, ps: _PoolState, fraction: float) -> int:
        nodes = math.floor(ps.base.nodes * fraction + 1e-9)
        return min(ps.base.free_devices, nodes * ps.base.devices_per_node)

    def _next_trace_change(self, pool: str) -> None:
        it = self._trace_iters.get(pool)
        if it is None:
            return
        nxt = next(it, None)
        if nxt is not None:
            self._push(nxt[0], _CAPACITY, ("trace", pool, nxt[1]))

    def _settle_pool(self, ps: _PoolState) -> None:
        for att in self._attempts_on(ps.base.name):
            self._settle(att, self.now)

    def _on_price(self, pool: str, _what: Any) -> None:
        ps = self.pools[pool]
        cfg = self.config
        rng = stream(cfg.seed, "price", pool, round(self.now, 3))
        self._settle_pool(ps)
        ps.log_mult = cfg.spot_price_reversion * ps.log_mult + cfg.spot_price_volatility * rng.gauss(0.0, 1.0)
        ps.price_mult = math.exp(ps.log_mult)
        self._want_round()
        if not self._finished():
            self._push(self.now + cfg.spot_price_interval_s, _PRICE, (pool, None))

    def _sample(self) -> None:
        cost = self._total_cost
        for att in self._all_attempts():
            cost += att.devices * (self.now - att.billed_until_s) * self.pools[att.pool].price() / 3600.0
        self._samples.append(
            Sample(
                time_s=self.now,
                cost_usd=cost,
                queued=len(self._queue),
                running=len(self._running),
                used_devices={name: ps.used for name, ps in self.pools.items()},
                preemptions=self._preemptions,
            )
        )

    # ---- views -------------------------------------------------------------------------------------
    def _queued_view(self, job: _Job) -> QueuedView:
        return QueuedView(
            job_id=job.job_id,
            tenant=job.tenant,
            spec=job.spec,
            submit_s=job.submit_s,
            priority=job.priority,
            progress_fraction=min(1.0, job.durable_steps / job.total_steps) if job.total_steps else 0.0,
            attempts=job.attempts,
        )

    def _running_view(self, job: _Job) -> RunningView:
        att = job.attempt
        assert att is not None
        # The scheduler knows checkpointed progress plus what the heartbeats report: steps done so far.
        done_s, _ = att.trained_s(self.now)
        steps = att.steps_at_start + done_s / att.step_s
        return RunningView(
            job_id=job.job_id,
            tenant=job.tenant,
            spec=job.spec,
            submit_s=job.submit_s,
            pool=att.pool,
            devices=att.devices,
            market=att.market,
            placed_s=att.start_s,
            progress_fraction=min(1.0, steps / job.total_steps) if job.total_steps else 0.0,
            priority=job.priority,
        )

    # ---- result ------------------------------------------------------------------------------------
    def _result(self, end: float, beyond_s: float) -> SimResult:
        """The result with committed spend and the bound's capacities over the run plus ``beyond_s``."""
        outcomes = []
        for job_id in self.order:
            job = self.jobs[job_id]
            missed = False
            if job.deadline_abs_s is not None:
                missed = job.completion_s is None or job.completion_s > job.deadline_abs_s + 1e-6
            outcomes.append(
                JobOutcome(
                    job_id=job.job_id,
                    tenant=job.tenant,
                    submit_s=job.submit_s,
                    completion_s=job.completion_s,
                    cost_usd=job.cost_usd,
                    preemptions=job.preemptions,
                    migrations=job.migrations,
                    attempts=job.attempts,
                    lost_work_device_s=job.lost_work_device_s,
                    deadline_abs_s=job.deadline_abs_s,
                    missed_deadline=missed,
                    pools=tuple(job.pools_used),
                    lower_bound_cost_usd=self._lower_bounds.get(job_id, 0.0),
                )
            )
        from trainyard.sim.bound import capacity_lower_bound

        stats = []
        committed = 0.0
        span_capacity = {}  # past the run's end a pool keeps the capacity it had then
        for ps in self.pools.values():
            span_capacity[ps.base.name] = ps.capacity_device_s + ps.capacity * beyond_s
            if ps.market == "reserved":
                committed += span_capacity[ps.base.name] * ps.price() / 3600.0
            stats.append(
                PoolStats(
                    name=ps.base.name,
                    market=ps.market,
                    accelerator=ps.base.accelerator,
                    held_device_s=ps.held_device_s,
                    capacity_device_s=ps.capacity_device_s,
                    preemptions=ps.preemptions,
                )
            )
        done = {
            j.job_id: self._bound_options.get(j.job_id, []) for j in outcomes if j.completion_s is not None
        }
        bound = capacity_lower_bound(done, span_capacity)
        return SimResult(
            policy=self.policy.name,
            seed=self.config.seed,
            jobs=tuple(outcomes),
            samples=tuple(self._samples),
            pools=tuple(stats),
            round_solve_times_s=tuple(self._solve_times),
            rounds=self._rounds,
            end_s=end,
            billed_device_s=self._billed_device_s,
            held_device_s=self._held_device_s,
            total_cost_usd=self._total_cost + committed,
            starts=self._starts,
            rejected_starts=self._rejected,
            committed_cost_usd=committed,
            usage_cost_usd=self._total_cost,
            lower_bound_cost_usd=committed + bound.usage_usd,
            per_job_lower_bound_usd=committed + sum(self._lower_bounds.values()),
            lower_bound_status=bound.status,
            committed_span_s=end - self._start_s + beyond_s,
        )
