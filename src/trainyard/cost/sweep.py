"""A sweep priced as a group: expected total cost and time of the whole search before anything runs.

Each trial is quoted on its own (its parameters change its shape, batch or steps, so its best option
may differ); the sweep then runs trials on their cheapest feasible options, ``max_parallel`` at a time.

Successive halving (``early_stopping``): rung ``r`` trains the surviving ``n_r = max(1, ⌊n/η^r⌋)``
trials up to ``f_r = min(1, f_0·η^r)`` of their steps, continuing from their checkpoints, so rung
``r`` adds ``f_r − f_{r−1}`` of each survivor's steps. Which trials survive is known only while the
sweep runs, so the quote gives:
- ``expected_cost_usd``: every trial equally likely to survive — trial ``i`` runs rung ``r`` with
  probability ``n_r / n``;
- ``max_cost_usd``: the most expensive trials survive every rung (the amount the budget must cover);
- ``expected_hours``: rungs one after another; within a rung, trials in waves of ``max_parallel``,
  each wave as long as its slowest trial's steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

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


@dataclass(frozen=True)
class TrialQuote:
    index: int
    name: str
    parameters: dict[str, Any]
    spec: JobSpec
    option: QuoteOption | None  # the cheapest feasible option; None when none is
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
        }


def rungs_for(sweep: SweepSpec, n_trials: int, total_steps: int) -> list[Rung]:
    """The successive-halving schedule for ``n_trials`` trials of ``total_steps`` steps (one rung at
    full length without early stopping)."""
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


def _increments(rungs: Sequence[Rung], total_steps: int) -> list[tuple[Rung, int]]:
    """(rung, steps each survivor adds in it) scaled to a trial of ``total_steps`` steps."""
    out, before = [], 0
    for r in rungs:
        upto = max(1, math.ceil(total_steps * r.fraction))
        out.append((r, max(0, upto - before)))
        before = upto
    return out


def quote_sweep(
    sweep: SweepSpec,
    pools: Sequence[Pool] | None = None,
    *,
    params: cm.CostParams = cm.DEFAULT_PARAMS,
    now: datetime | None = None,
    quoter: Callable[[JobSpec, Sequence[Pool] | None], list[QuoteOption]] | None = None,
) -> SweepQuote:
    """``quoter`` prices one trial (default: :func:`trainyard.cost.quote.quote` with ``params``); the
    service passes the quote its admission uses, calibrated with the step times measured there."""
    trials: list[TrialQuote] = []
    for i, (values, spec) in enumerate(trial_specs(sweep)):
        options = quoter(spec, pools) if quoter is not None else quote(spec, pools, params=params, now=now)
        best = next((o for o in options if o.feasible), None)
        reason = "" if best else (options[0].reason if options else "no pool can run it")
        steps = best.total_steps if best and best.total_steps else spec.workload.total_steps()
        trials.append(TrialQuote(i, spec.name, values, spec, best, steps, reason))
    notes: list[str] = []
    infeasible = [t for t in trials if not t.feasible]
    n = len(trials)
    template_steps = max((t.total_steps for t in trials), default=1)
    rungs = rungs_for(sweep, n, template_steps)
    if infeasible:
        t = infeasible[0]
        why = f"{len(infeasible)} of {n} trials have no feasible option; {t.name}: {t.reason}"
        return SweepQuote(
            sweep.name, trials, rungs, math.inf, math.inf, math.inf, sweep.budget_usd, False, why
        )
    expected = 0.0
    per_rung_costs: list[list[float]] = []
    for t in trials:
        assert t.option is not None
        inc = _increments(rungs, t.total_steps)
        expected += sum(r.trials / n * steps * t.option.usd_per_step for r, steps in inc)
    for rung_index in range(len(rungs)):
        costs = []
        for t in trials:
            assert t.option is not None
            _, steps = _increments(rungs, t.total_steps)[rung_index]
            costs.append(steps * t.option.usd_per_step)
        per_rung_costs.append(sorted(costs, reverse=True))
    worst = sum(sum(costs[: r.trials]) for r, costs in zip(rungs, per_rung_costs, strict=True))
    hours = 0.0
    for rung_index, r in enumerate(rungs):
        lengths = []
        for t in trials:
            _, steps = _increments(rungs, t.total_steps)[rung_index]
            lengths.append(steps * t.step_hours)
        lengths.sort(reverse=True)  # worst case for the wall clock: the slowest trials survive
        waves = [lengths[k : k + sweep.max_parallel] for k in range(0, r.trials, sweep.max_parallel)]
        hours += sum(max(w) for w in waves if w)
    feasible, reason = True, ""
    if sweep.budget_usd is not None and worst > sweep.budget_usd:
        feasible = False
        reason = (
            f"the sweep can cost up to ${worst:,.2f} (expected ${expected:,.2f}), over its budget of "
            f"${sweep.budget_usd:,.2f}"
        )
    if sweep.early_stopping is None and n > 1:
        notes.append("without early_stopping every trial trains for all its steps")
    return SweepQuote(
        sweep.name, trials, rungs, expected, worst, hours, sweep.budget_usd, feasible, reason, notes
    )


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
