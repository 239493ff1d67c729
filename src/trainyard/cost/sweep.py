"""A sweep priced as a group: expected total cost and time of the whole search before anything runs.

The quote models the policy as the platform runs it (``trainyard.services.sweeps``), by a small
deterministic simulation on the trials' predicted step times and prices:

- **One pool.** The scheduler places a sweep's trials as a group on one pool, so the quote prices every
  trial there: the pool (among those an executor serves, when given, else any) where the trials' best
  options cost least in all. A sweep no single pool can run all of is not feasible.
- **Launch.** Trials start in order, at most ``max_parallel`` at once, and only while what they have
  cost plus the predicted rest of the running ones plus the new trial's predicted cost stays within
  ``budget_usd``; a trial that does not fit waits for a running one to end, or is skipped when none runs.
- **Asynchronous successive halving** (``early_stopping``): a trial that reaches a rung's step goes on
  when it ranks in the best ``⌊k/η⌋`` of the ``k`` values recorded there so far (:func:`promotes`),
  else it stops there; nothing waits for the slowest trial of a rung.
- **Budget stop.** When the spend plus ``STOP_MARGIN_S`` seconds of the running trials' rates reaches
  the budget, every running trial stops and the waiting ones are skipped.
- **Ranks.** Which trials are good is known only while the sweep runs: the quote averages the
  simulation over every order of the trials' ranks (a trial keeps its rank at every rung), or over
  ``SAMPLES`` orders drawn from a generator seeded by the sweep's ``seed`` when there are more.

It gives ``expected_cost_usd`` and ``expected_hours`` (the means), ``max_cost_usd`` (the most any
simulated outcome spent: never above the budget), ``uncapped_cost_usd`` (the mean without a budget),
``no_stopping_cost_usd`` (every trial to its last step) and ``budget_stop_share`` (the share of outcomes
the budget cut short).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from trainyard.catalog.pools import Pool
from trainyard.cost import model as cm
from trainyard.cost.quote import QuoteOption, quote
from trainyard.spec import JobSpec
from trainyard.spec.sweep import SweepSpec, trial_specs


@dataclass(frozen=True)
class Rung:
    index: int
    trials: int  # survivors that train in this rung
    fraction: float  # of the template's steps reached at the end of the rung
    steps: int  # steps per trial reached at the end of the rung


STOP_MARGIN_S = 5.0  # the budget stop acts this many seconds of the running trials' spend early
SAMPLES = 720  # orders of the trials' ranks the quote averages over (all of them up to 6 trials)


@dataclass(frozen=True)
class TrialQuote:
    index: int
    name: str
    parameters: dict[str, Any]
    spec: JobSpec
    option: QuoteOption | None  # its best option on the sweep's pool; None when none is feasible
    total_steps: int
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return self.option is not None

    @property
    def step_hours(self) -> float:
        assert self.option is not None
        return self.option.expected_hours / max(1, self.option.total_steps or self.total_steps)


@dataclass(frozen=True)
class SweepQuote:
    sweep: str
    trials: list[TrialQuote]
    rungs: list[Rung]
    expected_cost_usd: float
    max_cost_usd: float
    expected_hours: float
    budget_usd: float | None
    feasible: bool
    reason: str
    notes: list[str] = field(default_factory=list)
    pool: str | None = None  # the pool every trial is priced on
    uncapped_cost_usd: float = math.inf  # the expected cost if no budget stopped anything
    no_stopping_cost_usd: float = math.inf  # every trial to its last step
    budget_stop_share: float = 0.0  # of the simulated outcomes, those the budget cut short
    outcomes: int = 0  # rank orders simulated

    def to_dict(self) -> dict[str, Any]:
        return {
            "sweep": self.sweep,
            "trials": [
                {
                    "index": t.index,
                    "name": t.name,
                    "parameters": t.parameters,
                    "feasible": t.feasible,
                    "reason": t.reason,
                    "total_steps": t.total_steps,
                    "pool": t.option.pool if t.option else None,
                    "accelerator": t.option.accelerator if t.option else None,
                    "devices": t.option.devices if t.option else None,
                    "market": t.option.market if t.option else None,
                    "usd_per_step": t.option.usd_per_step if t.option else None,
                    "full_run_cost_usd": t.option.expected_cost_usd if t.option else None,
                }
                for t in self.trials
            ],
            "rungs": [r.__dict__ for r in self.rungs],
            "expected_cost_usd": self.expected_cost_usd,
            "max_cost_usd": self.max_cost_usd,
            "expected_hours": self.expected_hours,
            "budget_usd": self.budget_usd,
            "feasible": self.feasible,
            "reason": self.reason,
            "notes": self.notes,
            "pool": self.pool,
            "uncapped_cost_usd": self.uncapped_cost_usd,
            "no_stopping_cost_usd": self.no_stopping_cost_usd,
            "budget_stop_share": self.budget_stop_share,
            "outcomes": self.outcomes,
        }


def rungs_for(sweep: SweepSpec, n_trials: int, total_steps: int) -> list[Rung]:
    """The successive-halving schedule for ``n_trials`` trials of ``total_steps`` steps (one rung at
    full length without early stopping). ``trials`` is the synchronous schedule's count (``⌊n/η^r⌋``),
    a reference only: asynchronous halving can let more go on."""
    es = sweep.early_stopping
    if es is None or n_trials <= 1:
        return [Rung(0, n_trials, 1.0, total_steps)]
    eta, f0 = es.reduction_factor, es.min_fraction
    rungs: list[Rung] = []
    r = 0
    while True:
        fraction = min(1.0, f0 * eta**r)
        survivors = max(1, n_trials // eta**r)
        rungs.append(Rung(r, survivors, fraction, max(1, math.ceil(total_steps * fraction))))
        if fraction >= 1.0 or survivors == 1:
            break
        r += 1
    if rungs[-1].fraction < 1.0:  # the last survivor trains to the end
        last = rungs[-1]
        rungs.append(Rung(last.index + 1, 1, 1.0, total_steps))
    return rungs


@dataclass(frozen=True)
class SimTrial:
    """One trial as the simulation runs it: billed at ``rate_usd_per_s`` from its start, ``startup_s``
    before its first step, then ``step_s`` a step (checkpoint and expected preemption overhead in it)."""

    rate_usd_per_s: float
    startup_s: float
    step_s: float
    total_steps: int
    decisions: tuple[int, ...] = ()  # the steps where halving decides (every rung's end but the last)
    predicted_usd: float | None = None  # what admission predicts for the whole run (default: its cost)

    def cost_usd(self, seconds: float) -> float:
        return self.rate_usd_per_s * max(0.0, seconds)

    @property
    def full_s(self) -> float:
        return self.startup_s + self.total_steps * self.step_s

    @property
    def predicted(self) -> float:
        return self.cost_usd(self.full_s) if self.predicted_usd is None else self.predicted_usd

    @classmethod
    def of(cls, option: QuoteOption, total_steps: int, decisions: Sequence[int] = ()) -> SimTrial:
        """The trial priced by ``option`` (the quote's cost model): ``usd_per_step`` is a step's share of
        the price, the rest of ``expected_cost_usd`` the start-up."""
        steps = max(1, total_steps)
        rate = option.price_usd_per_hour / cm.SECONDS_PER_HOUR
        billed_s = max(0.0, option.expected_hours - option.capacity_wait_hours) * cm.SECONDS_PER_HOUR
        if rate > 0:
            step_s = option.usd_per_step / rate
            startup_s = max(0.0, option.expected_cost_usd / rate - steps * step_s)
        else:
            step_s, startup_s = billed_s / steps, 0.0
        return cls(rate, startup_s, step_s, steps, tuple(decisions), option.expected_cost_usd)


@dataclass(frozen=True)
class SimOutcome:
    cost_usd: float
    hours: float
    steps: tuple[int, ...]  # steps each trial trained
    states: tuple[str, ...]  # completed | stopped (halving) | cancelled (budget stop) | skipped
    budget_stopped: bool  # the budget stop ended it
    budget_waited: bool = False  # a trial waited for the budget (or was skipped) at some launch

    @property
    def cut_by_budget(self) -> bool:
        return self.budget_stopped or "skipped" in self.states or "cancelled" in self.states


def simulate_asha(
    trials: Sequence[SimTrial],
    values: Sequence[Sequence[float]],
    *,
    reduction_factor: int | None,
    max_parallel: int,
    budget_usd: float | None,
    goal: str = "minimize",
    stop_margin_s: float = STOP_MARGIN_S,
) -> SimOutcome:
    """The sweep as the platform runs it, on given metric values (``values[i][r]``: trial ``i``'s value
    at its ``r``-th decision step): launches in order within ``max_parallel`` and the budget, asynchronous
    halving at each decision step (none when ``reduction_factor`` is None), the budget stop. Pure."""
    n = len(trials)
    state = ["waiting"] * n
    start = [0.0] * n
    ended = [0.0] * n
    rung = [0] * n  # the next decision of a running trial
    recorded: dict[int, list[float]] = {}
    closed = 0.0  # the cost of the trials that ended
    t = 0.0
    stopped_by_budget = False
    waited = False
    running: list[int] = []

    def steps_at(i: int, now: float) -> int:
        tr = trials[i]
        if tr.step_s <= 0:
            return tr.total_steps
        return max(0, min(tr.total_steps, int((now - start[i] - tr.startup_s) / tr.step_s + 1e-9)))

    def spent(now: float) -> float:
        return closed + sum(trials[i].cost_usd(now - start[i]) for i in running)

    def launch(now: float) -> None:
        nonlocal waited
        if stopped_by_budget:
            return
        paid = spent(now)
        committed = paid
        for i in running:
            tr = trials[i]
            own = tr.cost_usd(now - start[i])
            rest = max(0.0, tr.predicted - own)
            done = steps_at(i, now)
            if done > 0:
                rest = max(rest, own / done * (tr.total_steps - done))
            committed += rest
        for i in range(n):
            if len(running) >= max_parallel:
                break
            if state[i] != "waiting":
                continue
            if budget_usd is not None and committed + trials[i].predicted > budget_usd:
                waited = True
                if not running:
                    state[i] = "skipped"
                    continue
                break
            state[i], start[i] = "running", now
            running.append(i)
            committed += trials[i].predicted

    def end(i: int, now: float, how: str) -> None:
        nonlocal closed
        running.remove(i)
        state[i], ended[i] = how, now
        closed += trials[i].cost_usd(now - start[i])

    launch(t)
    while running:
        events: list[tuple[float, int, str]] = []
        for i in running:
            tr = trials[i]
            if reduction_factor is not None and rung[i] < len(tr.decisions):
                events.append((start[i] + tr.startup_s + tr.decisions[rung[i]] * tr.step_s, i, "rung"))
            else:
                events.append((start[i] + tr.full_s, i, "done"))
        at, who, what = min(events)
        if budget_usd is not None:
            rate = sum(trials[i].rate_usd_per_s for i in running)
            if rate > 0:
                stop_at = t + (budget_usd - spent(t) - stop_margin_s * rate) / rate
                if stop_at <= at:
                    t = max(t, stop_at)
                    stopped_by_budget = True
                    for i in list(running):
                        end(i, t, "cancelled")
                    break
        t = at
        if what == "done":
            end(who, t, "completed")
        else:
            r = rung[who]
            v = float(values[who][r])
            recorded.setdefault(r, []).append(v)
            rung[who] += 1
            assert reduction_factor is not None
            if not promotes(v, recorded[r], reduction_factor, goal):
                end(who, t, "stopped")
        launch(t)
    if stopped_by_budget:
        for i in range(n):
            if state[i] == "waiting":
                state[i] = "skipped"
    steps = tuple(0 if state[i] in ("waiting", "skipped") else steps_at(i, ended[i]) for i in range(n))
    return SimOutcome(closed, t / cm.SECONDS_PER_HOUR, steps, tuple(state), stopped_by_budget, waited)


def rank_orders(n: int, seed: int, samples: int = SAMPLES) -> list[tuple[int, ...]]:
    """Every order of ``n`` trials' ranks when there are at most ``samples``, else ``samples`` drawn from
    a generator seeded by ``seed`` (the same sweep always gets the same orders)."""
    if n <= 0:
        return [()]
    if math.factorial(n) <= samples:
        return list(itertools.permutations(range(n)))
    rng = np.random.default_rng(seed)
    return [tuple(int(x) for x in rng.permutation(n)) for _ in range(samples)]


@dataclass(frozen=True)
class SearchEstimate:
    expected_cost_usd: float
    max_cost_usd: float
    expected_hours: float
    budget_stop_share: float
    outcomes: int
    budget_acted: bool = False  # in some outcome a trial waited for the budget, was skipped or stopped


def estimate_search(
    trials: Sequence[SimTrial],
    *,
    reduction_factor: int | None,
    max_parallel: int,
    budget_usd: float | None,
    seed: int = 0,
    samples: int = SAMPLES,
) -> SearchEstimate:
    """The simulation averaged over the orders of the trials' ranks (:func:`rank_orders`); a trial keeps
    its rank at every rung."""
    orders = rank_orders(len(trials), seed, samples) if reduction_factor is not None else [()]
    costs: list[float] = []
    hours: list[float] = []
    cut = 0
    acted = False
    for order in orders:
        values = [[float(order[i]) if order else 0.0] * len(tr.decisions) for i, tr in enumerate(trials)]
        out = simulate_asha(
            trials, values, reduction_factor=reduction_factor, max_parallel=max_parallel,
            budget_usd=budget_usd,
        )  # fmt: skip
        costs.append(out.cost_usd)
        hours.append(out.hours)
        cut += out.cut_by_budget
        acted |= out.cut_by_budget or out.budget_waited
    k = len(orders)
    return SearchEstimate(sum(costs) / k, max(costs), sum(hours) / k, cut / k, k, acted)


def _pool_key(o: QuoteOption) -> str:
    return o.pool or "|".join((o.cloud or "", o.region, o.instance_type or "", o.market, o.accelerator))


def _shared_pool(
    options: Sequence[Sequence[QuoteOption]], served: Collection[str] | None
) -> tuple[str | None, list[QuoteOption | None]]:
    """The pool where every trial can run and their best options cost least in all (pools in ``served``
    first, when one of them runs every trial), and each trial's best option there."""
    best: list[dict[str, QuoteOption]] = []
    for opts in options:
        mine: dict[str, QuoteOption] = {}
        for o in opts:
            if o.feasible and _pool_key(o) not in mine:
                mine[_pool_key(o)] = o  # options come cheapest first
        best.append(mine)
    if not best:
        return None, []
    common = [k for k in best[0] if all(k in b for b in best[1:])]
    if served is not None and any(k in served for k in common):
        common = [k for k in common if k in served]
    if not common:
        return None, [None] * len(best)
    key = min(common, key=lambda k: (sum(b[k].expected_cost_usd for b in best), common.index(k)))
    return key, [b[key] for b in best]


def quote_sweep(
    sweep: SweepSpec,
    pools: Sequence[Pool] | None = None,
    *,
    params: cm.CostParams = cm.DEFAULT_PARAMS,
    now: datetime | None = None,
    quoter: Callable[[JobSpec, Sequence[Pool] | None], list[QuoteOption]] | None = None,
    served: Collection[str] | None = None,
    samples: int = SAMPLES,
) -> SweepQuote:
    """``quoter`` prices one trial (default: :func:`trainyard.cost.quote.quote` with ``params``); the
    service passes the quote its admission uses, calibrated with the step times measured there, and the
    pools an executor serves (``served``)."""
    specs = trial_specs(sweep)
    all_options = [
        quoter(spec, pools) if quoter is not None else quote(spec, pools, params=params, now=now)
        for _, spec in specs
    ]
    pool, shared = _shared_pool(all_options, served)
    trials: list[TrialQuote] = []
    for i, ((values, spec), options, best) in enumerate(zip(specs, all_options, shared, strict=True)):
        usable = [o for o in options if o.feasible]
        reason = ""
        if not usable:
            reason = options[0].reason if options else "no pool can run it"
        elif best is None:
            reason = "no pool can run every trial of the sweep; its trials share one pool"
        steps = best.total_steps if best and best.total_steps else spec.workload.total_steps()
        trials.append(TrialQuote(i, spec.name, values, spec, best, steps, reason))
    notes: list[str] = []
    n = len(trials)
    template_steps = max((t.total_steps for t in trials), default=1)
    rungs = rungs_for(sweep, n, template_steps)
    infeasible = [t for t in trials if not t.feasible]
    if infeasible:
        alone = [t for t in infeasible if not any(o.feasible for o in all_options[t.index])]
        t = (alone or infeasible)[0]
        if alone:
            why = f"{len(alone)} of {n} trials have no feasible option; {t.name}: {t.reason}"
        else:
            why = "no pool can run every trial of the sweep (its trials share one pool)"
        inf = math.inf
        return SweepQuote(sweep.name, trials, rungs, inf, inf, inf, sweep.budget_usd, False, why)
    eta = sweep.early_stopping.reduction_factor if sweep.early_stopping is not None and n > 1 else None
    sims = []
    for t in trials:
        assert t.option is not None
        sims.append(SimTrial.of(t.option, t.total_steps, rung_steps(rungs, t.total_steps)[:-1]))
    run = dict(reduction_factor=eta, max_parallel=sweep.max_parallel, seed=sweep.seed, samples=samples)
    est = estimate_search(sims, budget_usd=sweep.budget_usd, **run)  # type: ignore[arg-type]
    uncapped = est  # where the budget never acted, the search ran as it would have without one
    if est.budget_acted:
        uncapped = estimate_search(sims, budget_usd=None, **run)  # type: ignore[arg-type]
    no_stopping = sum(s.cost_usd(s.full_s) for s in sims)
    feasible, reason = True, ""
    if sweep.budget_usd is not None and uncapped.expected_cost_usd > sweep.budget_usd:
        feasible = False
        reason = (
            f"the search is expected to cost ${uncapped.expected_cost_usd:,.2f}, over its budget of "
            f"${sweep.budget_usd:,.2f}: the budget would stop it short in "
            f"{est.budget_stop_share:.0%} of the outcomes"
        )
    if est.budget_stop_share > 0 and feasible:
        notes.append(f"the budget cuts the search short in {est.budget_stop_share:.0%} of the outcomes")
    if sweep.early_stopping is None and n > 1:
        notes.append("without early_stopping every trial trains for all its steps")
    return SweepQuote(
        sweep.name, trials, rungs, est.expected_cost_usd, est.max_cost_usd, est.expected_hours,
        sweep.budget_usd, feasible, reason, notes, pool, uncapped.expected_cost_usd, no_stopping,
        est.budget_stop_share, est.outcomes,
    )  # fmt: skip


def rung_steps(rungs: Sequence[Rung], total_steps: int) -> list[int]:
    """The step at which each rung ends for a trial of ``total_steps`` steps (the rung fractions applied
    to that trial's own length)."""
    return [max(1, math.ceil(total_steps * r.fraction)) for r in rungs]


def promotes(value: float, competing: Sequence[float], reduction_factor: int, goal: str) -> bool:
    """Asynchronous successive halving (ASHA, Li et al. 2020): a trial that reached a rung with ``value``
    goes on when it ranks in the best ``⌊k/η⌋`` of the ``k`` values recorded at that rung so far (its own
    included); while fewer than η have been recorded it goes on only as the best of them. This is the
    rule of Optuna's ``SuccessiveHalvingPruner`` and Ray Tune's ``ASHAScheduler``: decisions are made as
    trials arrive, so nothing waits for the slowest trial of a rung."""
    if not competing:
        return True
    ordered = sorted(competing, reverse=goal == "maximize")
    keep = max(1, len(ordered) // reduction_factor)
    threshold = ordered[keep - 1]
    return value >= threshold if goal == "maximize" else value <= threshold
