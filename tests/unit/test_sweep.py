"""Sweeps: trials expanded deterministically, invalid sweeps refused with the field named, successive
halving's rungs, and the group quote's cost and time against a hand computation."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.catalog.pools import Pool
from trainyard.cost.sweep import (
    SimTrial,
    estimate_search,
    promotes,
    quote_sweep,
    rung_steps,
    rungs_for,
    simulate_asha,
)
from trainyard.errors import SpecError
from trainyard.spec.sweep import SweepSpec, sweep_from_dict, trial_specs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sweep-lora.yaml"

TEMPLATE: dict[str, Any] = {
    "name": "tiny",
    "model": {
        "architecture": "decoder",
        "n_layers": 2,
        "d_model": 64,
        "n_heads": 4,
        "d_ff": 256,
        "vocab_size": 256,
    },
    "workload": {"seq_len": 64, "global_batch": 8, "steps": 900, "precision": "fp32"},
    "measured": {"step_time_s": {"cpu": 2.0}},
    "requirements": {"allow": ["cpu"]},
}
POOL = Pool(name="cpu-pool", accelerator="cpu", devices_per_node=4, nodes=1, market="on_demand",
            region="local", price_usd_per_device_hour=3.6)  # fmt: skip


def sweep(**over: Any) -> SweepSpec:
    doc: dict[str, Any] = {
        "kind": "Sweep",
        "name": "s",
        "parameters": {
            "workload.learning_rate": {"values": [1e-4, 3e-4, 1e-3]},
            "workload.seed": {"values": [0, 1]},
        },
        "template": TEMPLATE,
    }
    doc.update(over)
    return sweep_from_dict(doc)


def test_grid_expands_every_combination_with_names_and_tags() -> None:
    trials = trial_specs(sweep())
    assert len(trials) == 6
    assert {(p["workload.learning_rate"], p["workload.seed"]) for p, _ in trials} == {
        (lr, s) for lr in (1e-4, 3e-4, 1e-3) for s in (0, 1)
    }
    for i, (params, spec) in enumerate(trials):
        assert spec.name == f"s-t{i:03d}"
        assert spec.tags["sweep"] == "s" and spec.tags["trial"] == str(i)
        assert spec.workload.learning_rate == params["workload.learning_rate"]
        assert spec.workload.seed == params["workload.seed"]


def test_random_search_is_seeded_and_respects_ranges() -> None:
    params = {"workload.learning_rate": {"min": 1e-5, "max": 1e-2, "scale": "log"},
              "workload.global_batch": {"min": 2, "max": 64, "integer": True}}  # fmt: skip
    a = trial_specs(sweep(method="random", trials=20, seed=7, parameters=params))
    b = trial_specs(sweep(method="random", trials=20, seed=7, parameters=params))
    c = trial_specs(sweep(method="random", trials=20, seed=8, parameters=params))
    assert [p for p, _ in a] == [p for p, _ in b] != [p for p, _ in c]
    for p, spec in a:
        assert 1e-5 <= p["workload.learning_rate"] <= 1e-2
        assert isinstance(spec.workload.global_batch, int) and 2 <= spec.workload.global_batch <= 64
    lrs = sorted(p["workload.learning_rate"] for p, _ in a)
    assert lrs[0] < 1e-4 and lrs[-1] > 1e-3  # log scale spreads over the decades


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"parameters": {"workload.learning_rate": {"min": 1e-4, "max": 1e-3}}}, "a grid needs `values`"),
        ({"method": "random"}, "random search needs the number of trials"),
        ({"parameters": {"training.lr": {"values": [1]}}}, "no section 'training'"),
        ({"parameters": {"name": {"values": ["x"]}}}, "vary a field inside a section"),
        (
            {
                "parameters": {"workload.learning_rate": {"min": 1.0, "max": 0.5}},
                "method": "random",
                "trials": 2,
            },
            "must be below max",
        ),
    ],
)
def test_invalid_sweeps_name_the_field(over: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        sweep(**over)


def test_a_value_the_template_refuses_names_the_trial() -> None:
    bad = sweep(parameters={"workload.learning_rate": {"values": [1e-4, 50.0]}})
    with pytest.raises(SpecError, match=r"trial 1 .*workload.learning_rate"):
        trial_specs(bad)


def test_successive_halving_rungs() -> None:
    s = sweep(early_stopping={"reduction_factor": 3, "min_fraction": 1 / 9})
    rungs = rungs_for(s, 9, 900)
    assert [(r.trials, r.steps) for r in rungs] == [(9, 100), (3, 300), (1, 900)]
    assert [(r.trials, r.steps) for r in rungs_for(sweep(), 9, 900)] == [(9, 900)]


@given(n=st.integers(1, 200), eta=st.integers(2, 6), f0=st.floats(0.01, 1.0), steps=st.integers(1, 10_000))
def test_rungs_shrink_and_end_at_full_length(n: int, eta: int, f0: float, steps: int) -> None:
    s = sweep(early_stopping={"reduction_factor": eta, "min_fraction": f0})
    rungs = rungs_for(s, n, steps)
    assert rungs[0].trials == n and rungs[-1].fraction == 1.0 and rungs[-1].steps == steps
    assert all(a.trials >= b.trials and a.steps <= b.steps for a, b in itertools.pairwise(rungs))


def test_asynchronous_halving_matches_a_hand_computation() -> None:
    """Three trials one at a time, eta 2, a decision at step 50 of 100, $1 a second, 1 s a step. With
    values 3, 1, 2: trial 0 is the only value at the rung and goes on, trial 1 is the best of two and goes
    on, trial 2 is not the best of three and stops at 50: 250 steps. Over the 3! orders of the ranks the
    first always goes on, the second with probability 1/2 (75 steps expected), the third with 1/3
    (66.7): 241.7 steps, where the synchronous schedule (3 x 50, then 1 x 50) is 200."""
    tr = [SimTrial(1.0, 0.0, 1.0, 100, (50,))] * 3
    out = simulate_asha(tr, [[3], [1], [2]], reduction_factor=2, max_parallel=1, budget_usd=None)
    assert out.states == ("completed", "completed", "stopped") and out.steps == (100, 100, 50)
    assert out.cost_usd == pytest.approx(250.0) and out.hours == pytest.approx(250.0 / 3600)
    est = estimate_search(tr, reduction_factor=2, max_parallel=1, budget_usd=None)
    assert est.outcomes == 6 and est.expected_cost_usd == pytest.approx(100 + 75 + 50 + 50 / 3)
    assert est.max_cost_usd == pytest.approx(300.0)  # ranks improving in launch order: nobody stops
    # two at a time: trials 0 and 1 reach the rung together (0 first, by index), then trial 2 alone
    two = simulate_asha(tr, [[3], [1], [2]], reduction_factor=2, max_parallel=2, budget_usd=None)
    assert two.steps == (100, 100, 50) and two.hours == pytest.approx(150.0 / 3600)
    # a start-up is billed once per trial
    slow = [SimTrial(1.0, 10.0, 1.0, 100, (50,))] * 3
    out = simulate_asha(slow, [[3], [1], [2]], reduction_factor=2, max_parallel=1, budget_usd=None)
    assert out.cost_usd == pytest.approx(280.0)


def test_the_budget_admits_waits_skips_and_stops() -> None:
    tr = [SimTrial(1.0, 0.0, 1.0, 100, (50,))] * 3
    # $250: trials 0 and 1 fit the prediction ($100 each), trial 2 waits, then is admitted when trial 1
    # stops at 50 and leaves room ($150 + $100 predicted = $250)
    out = simulate_asha(tr, [[1], [2], [3]], reduction_factor=2, max_parallel=3, budget_usd=250.0)
    assert out.states == ("completed", "stopped", "stopped") and out.cost_usd == pytest.approx(200.0)
    # $150 without halving: one trial at a time; the second never fits and is skipped
    out = simulate_asha(tr, [[1], [2], [3]], reduction_factor=None, max_parallel=3, budget_usd=150.0)
    assert out.states == ("completed", "skipped", "skipped") and out.cost_usd == pytest.approx(100.0)
    # a trial dearer than predicted is stopped 5 s of its spend before the budget
    dear = [SimTrial(1.0, 0.0, 2.0, 100, (), predicted_usd=100.0)]
    out = simulate_asha(dear, [[]], reduction_factor=None, max_parallel=1, budget_usd=150.0)
    assert out.states == ("cancelled",) and out.budget_stopped and out.cost_usd == pytest.approx(145.0)


def test_group_quote_prices_the_trials_on_one_pool_and_simulates_the_policy() -> None:
    """Six identical trials at $3.60/device-hour on one CPU pool, 2 s steps, a 60 s start-up: the quote is
    the simulation's mean over the 720 orders of their ranks, on the quote's own step prices."""
    s = sweep(early_stopping={"reduction_factor": 3, "min_fraction": 1 / 9}, max_parallel=2)
    dear = POOL.model_copy(update={"name": "dear-pool", "price_usd_per_device_hour": 7.2})
    q = quote_sweep(s, [dear, POOL])
    assert q.feasible and len(q.trials) == 6 and q.pool == "cpu-pool" and q.outcomes == 720
    opt = q.trials[0].option
    assert opt is not None and all(t.option is not None and t.option.pool == "cpu-pool" for t in q.trials)
    sim = SimTrial.of(opt, 900, [100, 300])
    assert sim.rate_usd_per_s == pytest.approx(0.001) and sim.step_s == pytest.approx(2.0, rel=1e-5)
    assert sim.cost_usd(sim.full_s) == pytest.approx(opt.expected_cost_usd)
    est = estimate_search([sim] * 6, reduction_factor=3, max_parallel=2, budget_usd=None)
    assert q.expected_cost_usd == pytest.approx(est.expected_cost_usd)
    assert q.expected_hours == pytest.approx(est.expected_hours)
    assert q.no_stopping_cost_usd == pytest.approx(6 * opt.expected_cost_usd)
    # asynchronous halving lets more go on than the synchronous 6 x 100, 2 x 200, 1 x 600 steps
    assert q.expected_cost_usd > 6 * 60 * 0.001 + 1600 * opt.usd_per_step
    assert q.expected_cost_usd < q.no_stopping_cost_usd / 2
    # served pools first: the dearer one when it is the only pool an executor serves
    served = quote_sweep(s, [dear, POOL], served={"dear-pool"})
    assert served.pool == "dear-pool" and served.expected_cost_usd == pytest.approx(2 * q.expected_cost_usd)


def test_a_budget_below_the_expected_search_is_not_feasible_and_caps_the_quote() -> None:
    s = sweep(early_stopping={"reduction_factor": 3, "min_fraction": 1 / 9})
    free = quote_sweep(s, [POOL])
    tight = quote_sweep(s.model_copy(update={"budget_usd": free.expected_cost_usd * 0.9}), [POOL])
    assert not tight.feasible and "over its budget" in tight.reason
    assert tight.max_cost_usd <= tight.budget_usd and tight.budget_stop_share > 0
    assert tight.uncapped_cost_usd == pytest.approx(free.expected_cost_usd)
    ok = quote_sweep(s.model_copy(update={"budget_usd": free.no_stopping_cost_usd * 1.01}), [POOL])
    assert (
        ok.feasible
        and ok.budget_stop_share == 0
        and ok.expected_cost_usd == pytest.approx(free.expected_cost_usd)
    )


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 7),
    eta=st.integers(2, 4),
    f0=st.sampled_from([0.1, 0.25, 0.5]),
    parallel=st.integers(1, 4),
    budget=st.none() | st.floats(50, 1500),
    startup=st.sampled_from([0.0, 20.0]),
)
def test_quote_invariants(
    n: int, eta: int, f0: float, parallel: int, budget: float | None, startup: float
) -> None:
    """The simulated quote never spends more than every trial run to its end, never more than the
    budget, is no dearer with early stopping than without (no budget), and costs more with more trials."""
    steps = 100
    rungs = [max(1, math.ceil(steps * min(1.0, f0 * eta**r))) for r in range(8)]
    decisions = tuple(sorted({x for x in rungs if x < steps}))

    def quote_of(k: int, halving: bool = True, cap: float | None = budget) -> Any:
        trials = [SimTrial(1.0, startup, 1.0, steps, decisions)] * k
        return estimate_search(
            trials, reduction_factor=eta if halving else None, max_parallel=parallel, budget_usd=cap,
            samples=120,
        )  # fmt: skip

    q = quote_of(n)
    full = n * (startup + steps)
    assert q.expected_cost_usd <= q.max_cost_usd + 1e-9 <= full + 1e-6
    assert q.expected_cost_usd <= quote_of(n, halving=False, cap=None).expected_cost_usd + 1e-9
    if budget is not None:
        assert q.max_cost_usd <= budget + 1e-9
    else:
        assert quote_of(n + 1).expected_cost_usd >= q.expected_cost_usd - 1e-9
        assert q.expected_cost_usd <= quote_of(n, halving=False).expected_cost_usd + 1e-9


def test_a_trial_without_a_feasible_option_makes_the_sweep_infeasible() -> None:
    s = sweep(parameters={"requirements.allow": {"values": [["cpu"], ["h100"]]}})
    q = quote_sweep(s, [POOL])
    assert not q.feasible and "1 of 2 trials" in q.reason and math.isinf(q.expected_cost_usd)


def test_trials_that_no_single_pool_runs_make_the_sweep_infeasible() -> None:
    t4 = Pool(name="t4-pool", accelerator="t4", devices_per_node=1, nodes=1, market="on_demand",
              region="local", price_usd_per_device_hour=0.5)  # fmt: skip
    s = sweep(parameters={"requirements.allow": {"values": [["cpu"], ["t4"]]}})
    q = quote_sweep(s, [POOL, t4])
    assert not q.feasible and "no pool can run every trial" in q.reason


def test_the_example_sweep_parses_and_quotes_within_its_budget() -> None:
    s = sweep_from_dict(yaml.safe_load(EXAMPLE.read_text()))
    q = quote_sweep(s)
    assert len(q.trials) == 6 and q.feasible and q.max_cost_usd <= (s.budget_usd or 0)


def test_halving_keeps_the_best_fraction_of_those_that_reached_a_rung() -> None:
    # the first to reach a rung goes on; while fewer than eta are in, only the best of them does
    assert promotes(2.0, [2.0], 3, "minimize")
    assert not promotes(3.0, [2.0, 3.0], 3, "minimize")
    assert promotes(1.0, [2.0, 1.0], 3, "minimize")
    # six values with eta 3: the best two go on
    values = [5.0, 1.0, 4.0, 2.0, 6.0, 3.0]
    assert [v for v in values if promotes(v, values, 3, "minimize")] == [1.0, 2.0]
    assert [v for v in values if promotes(v, values, 3, "maximize")] == [5.0, 6.0]
    # eta 2 over four: the best half
    assert [v for v in [0.4, 0.1, 0.3, 0.2] if promotes(v, [0.4, 0.1, 0.3, 0.2], 2, "minimize")] == [0.1, 0.2]


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=40),
    st.integers(2, 6),
    st.sampled_from(["minimize", "maximize"]),
)
def test_halving_keeps_at_least_one_and_at_most_a_fraction(values: list[float], eta: int, goal: str) -> None:
    kept = [v for v in values if promotes(v, values, eta, goal)]
    assert (min(values) if goal == "minimize" else max(values)) in kept
    ranked = sorted(values, reverse=goal == "maximize")
    keep = max(1, len(values) // eta)
    # exactly the best max(1, k // eta), plus any value tied with the last of them
    assert sorted(kept, reverse=goal == "maximize") == [v for v in ranked if v in ranked[:keep]]


def test_rung_steps_scale_with_each_trials_length() -> None:
    s = sweep(early_stopping={"reduction_factor": 2, "min_fraction": 0.25})
    rungs = rungs_for(s, 6, 400)
    assert rung_steps(rungs, 400) == [100, 200, 400]
    assert rung_steps(rungs, 30) == [8, 15, 30]
