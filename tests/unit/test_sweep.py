"""Sweeps: trials expanded deterministically, invalid sweeps refused with the field named, successive
halving's rungs, and the group quote's cost and time against a hand computation."""

from __future__ import annotations

import itertools
import math
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.catalog.pools import Pool
from trainyard.cost import model as cm
from trainyard.cost.quote import QuoteOption
from trainyard.cost.sweep import (
    Rung,
    SimOutcome,
    SimTrial,
    estimate_search,
    promotes,
    quote_sweep,
    rank_orders,
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


# ---- the simulation's rules, one at a time, worked by hand ---------------------------------------------


def test_rungs_at_their_edges() -> None:
    es = sweep(early_stopping={"reduction_factor": 2, "min_fraction": 0.1})
    assert rungs_for(es, 1, 900) == [Rung(0, 1, 1.0, 900)]  # one trial: nothing to halve
    assert rungs_for(es, 0, 900) == [Rung(0, 0, 1.0, 900)]
    # four trials, eta 2 from 10 %: 4 -> 2 -> 1 at 40 %, then the survivor trains to the end
    assert rungs_for(es, 4, 1000) == [
        Rung(0, 4, 0.1, 100),
        Rung(1, 2, 0.2, 200),
        Rung(2, 1, 0.4, 400),
        Rung(3, 1, 1.0, 1000),
    ]
    es3 = sweep(early_stopping={"reduction_factor": 3, "min_fraction": 0.5})
    assert rungs_for(es3, 2, 10) == [Rung(0, 2, 0.5, 5), Rung(1, 1, 1.0, 10)]  # the fraction caps at 1
    assert rungs_for(es, 4, 3)[0] == Rung(0, 4, 0.1, 1)  # at least one step
    assert rung_steps(rungs_for(es, 4, 1000), 7) == [1, 2, 3, 7]
    # the synchronous counts round down: 9 -> 4 -> 2 -> 1
    assert [r.trials for r in rungs_for(es, 9, 1000)] == [9, 4, 2, 1, 1]
    # a rung reaching the full length ends the schedule even with several trials left
    third = sweep(early_stopping={"reduction_factor": 3, "min_fraction": 1 / 3})
    assert rungs_for(third, 9, 900) == [Rung(0, 9, 1 / 3, 300), Rung(1, 3, 1.0, 900)]


def test_sim_trial_from_an_option() -> None:
    opt = QuoteOption(
        accelerator="cpu", devices=1, cloud=None, region="local", instance_type=None, market="on_demand",
        step_time_s=2.0, price_usd_per_hour=3.6, usd_per_step=0.002, expected_hours=0.6,
        expected_cost_usd=2.0, preemption_overhead_usd=0.0, checkpoint_interval_s=1800.0, feasible=True,
        reason="", total_steps=900, capacity_wait_hours=0.1,
    )  # fmt: skip
    sim = SimTrial.of(opt, 900, [100, 300])
    assert sim.rate_usd_per_s == pytest.approx(0.001) and sim.step_s == pytest.approx(2.0)
    assert sim.startup_s == pytest.approx(200.0)  # $2 = 200 s of start-up + 900 steps of 2 s at $0.001/s
    assert (sim.total_steps, sim.decisions, sim.predicted_usd) == (900, (100, 300), 2.0)
    assert SimTrial.of(opt, 0).total_steps == 1
    # no start-up left when the steps are the whole cost (or more)
    exact = QuoteOption(**{**opt.to_contract(), "expected_cost_usd": 1.8})
    assert SimTrial.of(exact, 900).startup_s == 0.0
    assert SimTrial.of(QuoteOption(**{**opt.to_contract(), "expected_cost_usd": 1.5}), 900).startup_s == 0.0
    free = SimTrial.of(
        QuoteOption(**{**opt.to_contract(), "price_usd_per_hour": 0.0, "capacity_wait_hours": 0.1}), 900
    )
    # a free pool: the billed hours (0.6 h less 0.1 h waiting for capacity) spread over the steps
    assert (free.rate_usd_per_s, free.startup_s) == (0.0, 0.0) and free.step_s == pytest.approx(
        0.5 * 3600 / 900
    )
    assert SimTrial(1.0, 0.0, 1.0, 10).cost_usd(-5.0) == 0.0


def test_halving_for_a_metric_to_maximize_and_at_each_rung_by_its_own_values() -> None:
    tr = [SimTrial(1.0, 0.0, 1.0, 100, (50,))] * 3
    out = simulate_asha(
        tr, [[1], [3], [2]], reduction_factor=2, max_parallel=1, budget_usd=None, goal="maximize"
    )
    assert out.states == ("completed", "completed", "stopped") and out.cost_usd == pytest.approx(250.0)
    two = [SimTrial(1.0, 0.0, 1.0, 100, (25, 50))] * 2
    # trial 1 is better at the first rung (0.5 < 1) and worse at the second (10 > 9): it stops at 50
    out = simulate_asha(two, [[1, 9], [0.5, 10]], reduction_factor=2, max_parallel=1, budget_usd=None)
    assert (
        out.states == ("completed", "stopped")
        and out.steps == (100, 50)
        and out.cost_usd == pytest.approx(150.0)
    )
    assert not out.budget_stopped and not out.budget_waited and not out.cut_by_budget


def test_a_trial_without_steps_and_a_free_trial() -> None:
    out = simulate_asha(
        [SimTrial(1.0, 10.0, 0.0, 100)], [[]], reduction_factor=None, max_parallel=1, budget_usd=None
    )
    assert (
        out.steps == (100,) and out.cost_usd == pytest.approx(10.0) and out.hours == pytest.approx(10 / 3600)
    )
    free = simulate_asha(
        [SimTrial(0.0, 0.0, 1.0, 100)], [[]], reduction_factor=None, max_parallel=1, budget_usd=10.0
    )
    assert free.states == ("completed",) and free.cost_usd == 0.0 and not free.budget_stopped
    # a trial still starting up when another ends has trained no step yet
    pair = [SimTrial(1.0, 0.0, 1.0, 10), SimTrial(1.0, 100.0, 1.0, 10)]
    out = simulate_asha(pair, [[], []], reduction_factor=None, max_parallel=2, budget_usd=1000.0)
    assert out.states == ("completed", "completed") and out.steps == (10, 10)
    assert out.cost_usd == pytest.approx(120.0) and out.hours == pytest.approx(110 / 3600)
    # the rung of a trial with a start-up comes after it
    slow = [SimTrial(1.0, 10.0, 1.0, 100, (50,))] * 2
    out = simulate_asha(slow, [[1], [2]], reduction_factor=2, max_parallel=2, budget_usd=None)
    assert out.states == ("completed", "stopped") and out.steps == (100, 50)
    assert out.cost_usd == pytest.approx(110.0 + 60.0) and out.hours == pytest.approx(110 / 3600)


def test_admission_counts_a_dear_running_trials_rest_at_its_own_pace() -> None:
    """Trial 0 costs $200 where $100 was predicted; trials 1 and 2 cost $100. Budget $350, two at a time:
    at t = 100 trial 0 has spent $100 for 50 of its 100 steps, so its rest is counted as $100 (not the $0
    the prediction leaves), and trial 2 ($100) does not fit: it waits, and when trial 0 ends at $300 in all
    there is no room, so it is skipped."""
    dear = SimTrial(1.0, 0.0, 2.0, 100, (), predicted_usd=100.0)
    cheap = SimTrial(1.0, 0.0, 1.0, 100)
    out = simulate_asha(
        [dear, cheap, cheap], [[], [], []], reduction_factor=None, max_parallel=2, budget_usd=350.0
    )
    assert out.states == ("completed", "completed", "skipped") and out.steps == (100, 100, 0)
    assert out.cost_usd == pytest.approx(300.0) and out.hours == pytest.approx(200 / 3600)
    assert out.budget_waited and not out.budget_stopped and out.cut_by_budget
    # with $415 the same $100 rest leaves room at t = 100 ($300 + $100): trial 2 runs from 100 to 200
    out = simulate_asha(
        [dear, cheap, cheap], [[], [], []], reduction_factor=None, max_parallel=2, budget_usd=415.0
    )
    assert out.states == ("completed",) * 3 and out.hours == pytest.approx(200 / 3600)
    assert out.cost_usd == pytest.approx(400.0) and not out.budget_waited


def test_a_trial_waits_for_the_budget_and_runs_when_a_cheaper_trial_leaves_room() -> None:
    tr = [
        SimTrial(1.0, 0.0, 1.0, 100),
        SimTrial(1.0, 0.0, 1.0, 50, (), predicted_usd=100.0),
        SimTrial(1.0, 0.0, 1.0, 50),
    ]
    out = simulate_asha(tr, [[], [], []], reduction_factor=None, max_parallel=3, budget_usd=240.0)
    assert out.states == ("completed",) * 3 and out.cost_usd == pytest.approx(200.0)
    assert out.hours == pytest.approx(100 / 3600) and out.budget_waited and not out.cut_by_budget
    est = estimate_search(tr, reduction_factor=None, max_parallel=3, budget_usd=240.0)
    assert (est.outcomes, est.budget_stop_share, est.budget_acted) == (1, 0.0, True)
    assert est.expected_cost_usd == pytest.approx(200.0) and est.max_cost_usd == pytest.approx(200.0)
    free = estimate_search(tr, reduction_factor=None, max_parallel=3, budget_usd=None)
    assert not free.budget_acted and free.expected_hours == pytest.approx(100 / 3600)


def test_the_budget_stop_cancels_the_running_and_skips_the_waiting() -> None:
    dear = SimTrial(1.0, 0.0, 2.0, 100, (), predicted_usd=100.0)
    out = simulate_asha([dear, dear], [[], []], reduction_factor=None, max_parallel=1, budget_usd=150.0)
    # stopped 5 s of its spend before $150: at t = 145, after 72 of its 2-second steps
    assert out.states == ("cancelled", "skipped") and out.steps == (72, 0)
    assert out.cost_usd == pytest.approx(145.0) and out.hours == pytest.approx(145 / 3600)
    assert out.budget_stopped
    # a budget already within the margin at the start: stopped at once, not before it started
    now = simulate_asha([SimTrial(1.0, 0.0, 1.0, 100, (), predicted_usd=1.0)], [[]], reduction_factor=None,
                        max_parallel=1, budget_usd=3.0)  # fmt: skip
    assert now.states == ("cancelled",) and now.cost_usd == 0.0 and now.hours == 0.0 and now.steps == (0,)
    # the stop falls exactly on the trial's end: the stop wins
    edge = simulate_asha([dear], [[]], reduction_factor=None, max_parallel=1, budget_usd=205.0)
    assert edge.states == ("cancelled",) and edge.cost_usd == pytest.approx(200.0) and edge.budget_stopped
    # with a start-up, the steps trained by the stop: (145 - 10) / 2
    late = SimTrial(1.0, 10.0, 2.0, 100, (), predicted_usd=100.0)
    out = simulate_asha([late], [[]], reduction_factor=None, max_parallel=1, budget_usd=150.0)
    assert out.steps == (67,) and out.cost_usd == pytest.approx(145.0)
    margin = simulate_asha(
        [dear], [[]], reduction_factor=None, max_parallel=1, budget_usd=150.0, stop_margin_s=0.0
    )
    assert margin.cost_usd == pytest.approx(150.0)


def test_rank_orders() -> None:
    assert rank_orders(0, 1) == [()]
    assert rank_orders(3, 1) == list(itertools.permutations(range(3)))
    assert rank_orders(6, 0) == list(itertools.permutations(range(6)))  # 720: all of them
    assert rank_orders(3, 0, samples=6) == list(itertools.permutations(range(3)))
    drawn = rank_orders(3, 7, samples=5)
    assert len(drawn) == 5 and all(sorted(o) == [0, 1, 2] for o in drawn)
    assert drawn == rank_orders(3, 7, samples=5) and all(isinstance(x, int) for o in drawn for x in o)
    assert rank_orders(7, 1) != rank_orders(7, 2) and len(rank_orders(7, 1)) == 720


def _option(pool: str, cost: float, **over: Any) -> QuoteOption:
    doc: dict[str, Any] = dict(
        accelerator="cpu", devices=1, cloud="aws", region="r1", instance_type="c5", market="spot",
        step_time_s=2.0, price_usd_per_hour=3.6, usd_per_step=0.002, expected_hours=cost / 3.6,
        expected_cost_usd=cost, preemption_overhead_usd=0.0, checkpoint_interval_s=1800.0, feasible=True,
        reason="", pool=pool, total_steps=900,
    )  # fmt: skip
    doc.update(over)
    return QuoteOption(**doc)


def test_the_shared_pool_is_the_cheapest_every_trial_can_use() -> None:
    from trainyard.cost.sweep import _pool_key, _shared_pool

    assert _pool_key(_option("", 1.0)) == "aws|r1|c5|spot|cpu"
    assert _pool_key(_option("", 1.0, cloud=None, instance_type=None)) == "|r1||spot|cpu"
    assert _shared_pool([], None) == (None, [])
    a1, b1, a2, b2 = _option("a", 3.0), _option("b", 2.0), _option("a", 0.5), _option("b", 2.0)
    bad, dearer = _option("c", 0.1, feasible=False), _option("b", 9.0)
    # options come cheapest first: a trial's first option on a pool is its best there
    key, best = _shared_pool([[bad, b1, a1, dearer], [a2, b2]], None)
    assert key == "a" and best == [a1, a2]  # a: $3.50 in all, b: $4
    assert _shared_pool([[bad, b1, dearer, a1], [a2, b2]], {"b"}) == ("b", [b1, b2])  # a served pool first
    assert _shared_pool([[bad, b1, a1], [a2, b2]], {"c", "x"})[0] == "a"  # none served runs all: any
    tie_a = _option("a", 2.0)
    assert (
        _shared_pool([[b1, tie_a], [_option("a", 2.0), b2]], None)[0] == "b"
    )  # a tie: the first trial's order
    assert _shared_pool([[a1], [b2]], None) == (None, [None, None])


def _quoter(costs: dict[str, list[QuoteOption]]) -> Any:
    """Each trial's options by trial name (what the quote would give), without the predictor."""

    def q(spec: Any, pools: Any) -> list[QuoteOption]:
        return costs[spec.name]

    return q


def test_group_quote_on_given_options() -> None:
    s = sweep(
        parameters={"workload.seed": {"values": [0, 1, 2]}},
        early_stopping={"reduction_factor": 3, "min_fraction": 1 / 9},
    )
    opts = {f"s-t{i:03d}": [_option("a", 2.0 + i)] for i in range(3)}
    q = quote_sweep(s, quoter=_quoter(opts))
    sims = [SimTrial.of(opts[f"s-t{i:03d}"][0], 900, [100, 300]) for i in range(3)]
    est = estimate_search(sims, reduction_factor=3, max_parallel=4, budget_usd=None)
    assert q.feasible and q.pool == "a" and q.reason == "" and q.notes == []
    assert (q.expected_cost_usd, q.max_cost_usd, q.expected_hours) == (
        est.expected_cost_usd, est.max_cost_usd, est.expected_hours,
    )  # fmt: skip
    assert q.uncapped_cost_usd == est.expected_cost_usd and q.outcomes == 6 and q.budget_stop_share == 0.0
    assert q.no_stopping_cost_usd == pytest.approx(2.0 + 3.0 + 4.0)
    assert [r.steps for r in q.rungs] == [100, 300, 900]
    doc = q.to_dict()
    assert doc["trials"][1] == {
        "index": 1, "name": "s-t001", "parameters": {"workload.seed": 1}, "feasible": True, "reason": "",
        "total_steps": 900, "pool": "a", "accelerator": "cpu", "devices": 1, "market": "spot",
        "usd_per_step": 0.002, "full_run_cost_usd": 3.0,
    }  # fmt: skip
    assert doc["rungs"][0] == {"index": 0, "trials": 3, "fraction": 1 / 9, "steps": 100}
    assert {k: v for k, v in doc.items() if k not in ("trials", "rungs")} == {
        "sweep": "s", "expected_cost_usd": q.expected_cost_usd, "max_cost_usd": q.max_cost_usd,
        "expected_hours": q.expected_hours, "budget_usd": None, "feasible": True, "reason": "", "notes": [],
        "pool": "a", "uncapped_cost_usd": q.uncapped_cost_usd, "no_stopping_cost_usd": q.no_stopping_cost_usd,
        "budget_stop_share": 0.0, "outcomes": 6,
    }  # fmt: skip
    # the sweep's seed and the number of orders reach the estimate: 3! = 6 orders, 4 drawn here
    few = quote_sweep(s.model_copy(update={"seed": 5}), quoter=_quoter(opts), samples=4)
    drawn = estimate_search(sims, reduction_factor=3, max_parallel=4, budget_usd=None, seed=5, samples=4)
    assert few.outcomes == 4 and few.expected_cost_usd == drawn.expected_cost_usd
    # the trial's own step count when its option carries none
    bare = {k: [_option("a", 2.0, total_steps=0)] for k in opts}
    assert [t.total_steps for t in quote_sweep(s, quoter=_quoter(bare)).trials] == [900, 900, 900]
    own = {k: [_option("a", 2.0, total_steps=450)] for k in opts}
    assert [t.total_steps for t in quote_sweep(s, quoter=_quoter(own)).trials] == [450, 450, 450]
    # two trials are halved too: 2 orders
    pair = sweep(
        parameters={"workload.seed": {"values": [0, 1]}},
        early_stopping={"reduction_factor": 2, "min_fraction": 0.5},
    )
    q2 = quote_sweep(pair, quoter=_quoter(opts))
    sims2 = [SimTrial.of(opts[f"s-t{i:03d}"][0], 900, [450]) for i in range(2)]
    assert q2.outcomes == 2 and q2.expected_cost_usd == pytest.approx(
        estimate_search(sims2, reduction_factor=2, max_parallel=4, budget_usd=None).expected_cost_usd
    )
    assert q2.expected_cost_usd < q2.no_stopping_cost_usd


def test_group_quote_notes_and_reasons() -> None:
    one = sweep(
        parameters={"workload.seed": {"values": [0]}},
        early_stopping={"reduction_factor": 3, "min_fraction": 0.5},
    )
    q = quote_sweep(one, quoter=_quoter({"s-t000": [_option("a", 2.0)]}))
    assert (
        q.outcomes == 1 and q.expected_cost_usd == pytest.approx(2.0) and q.notes == []
    )  # one trial: no halving
    two = sweep(parameters={"workload.seed": {"values": [0, 1]}})
    opts = {"s-t000": [_option("a", 2.0)], "s-t001": [_option("a", 3.0)]}
    q = quote_sweep(two, quoter=_quoter(opts))
    assert q.notes == ["without early_stopping every trial trains for all its steps"]
    assert q.expected_cost_usd == pytest.approx(5.0) and q.max_cost_usd == pytest.approx(5.0)
    # a budget the search exceeds: not feasible, and the uncapped cost says by how much
    tight = quote_sweep(two.model_copy(update={"budget_usd": 4.0, "max_parallel": 1}), quoter=_quoter(opts))
    assert not tight.feasible and tight.budget_stop_share == 1.0
    assert tight.reason == (
        "the search is expected to cost $5.00, over its budget of $4.00: the budget would stop it short in "
        "100% of the outcomes"
    )
    assert (
        tight.uncapped_cost_usd == pytest.approx(5.0)
        and tight.max_cost_usd <= 4.0
        and tight.notes[:1] == ["without early_stopping every trial trains for all its steps"]
    )
    assert len(tight.notes) == 1  # the budget note is for feasible quotes
    expected = quote_sweep(two, quoter=_quoter(opts)).expected_cost_usd
    exact = quote_sweep(two.model_copy(update={"budget_usd": expected}), quoter=_quoter(opts))
    assert exact.feasible and exact.uncapped_cost_usd == expected  # exactly the budget is within it
    alone = quote_sweep(
        sweep(parameters={"workload.seed": {"values": [0]}}), quoter=_quoter({"s-t000": [_option("a", 2.0)]})
    )
    assert alone.notes == []  # one trial: nothing to stop early
    # a budget the search fits in, that still cuts some outcomes short
    halving = sweep(parameters={"workload.seed": {"values": [0, 1, 2]}}, max_parallel=3,
                    early_stopping={"reduction_factor": 2, "min_fraction": 0.5})  # fmt: skip
    three = {f"s-t{i:03d}": [_option("a", 2.0)] for i in range(3)}
    free = quote_sweep(halving, quoter=_quoter(three))
    capped = quote_sweep(
        halving.model_copy(update={"budget_usd": free.expected_cost_usd * 1.02}), quoter=_quoter(three)
    )
    assert capped.feasible and capped.budget_stop_share > 0  # the orders where all three go on cost $6
    assert capped.notes == [
        f"the budget cuts the search short in {capped.budget_stop_share:.0%} of the outcomes"
    ]
    # infeasible trials: the reason of the first without any option
    none = quote_sweep(two, quoter=_quoter({"s-t000": [_option("a", 2.0)], "s-t001": []}))
    assert (
        not none.feasible
        and none.reason == "1 of 2 trials have no feasible option; s-t001: no pool can run it"
    )
    assert none.trials[1].reason == "no pool can run it" and math.isinf(none.max_cost_usd)
    refused = _option("a", 2.0, feasible=False, reason="objective.budget_usd: too dear")
    why = quote_sweep(two, quoter=_quoter({"s-t000": [refused], "s-t001": [refused]}))
    assert why.reason == "2 of 2 trials have no feasible option; s-t000: objective.budget_usd: too dear"
    apart = quote_sweep(two, quoter=_quoter({"s-t000": [_option("a", 2.0)], "s-t001": [_option("b", 2.0)]}))
    assert apart.reason == "no pool can run every trial of the sweep (its trials share one pool)"
    assert apart.trials[0].reason == "no pool can run every trial of the sweep; its trials share one pool"
    assert apart.pool is None and apart.to_dict()["trials"][0] == {
        "index": 0, "name": "s-t000", "parameters": {"workload.seed": 0}, "feasible": False,
        "reason": "no pool can run every trial of the sweep; its trials share one pool", "total_steps": 900,
        "pool": None, "accelerator": None, "devices": None, "market": None, "usd_per_step": None,
        "full_run_cost_usd": None,
    }  # fmt: skip


def test_the_trials_are_quoted_with_the_params_and_clock_given() -> None:
    from datetime import datetime

    s = sweep(parameters={"workload.seed": {"values": [0, 1]}})
    slow_start = cm.CostParams(provisioning_s={"cpu": 600.0})
    assert (
        quote_sweep(s, [POOL], params=slow_start).expected_cost_usd > quote_sweep(s, [POOL]).expected_cost_usd
    )
    due = {**TEMPLATE, "objective": {"deadline": "2030-01-01T00:10:00+00:00"}}
    timed = sweep(parameters={"workload.seed": {"values": [0, 1]}}, template=due)
    assert quote_sweep(timed, [POOL]).feasible  # an absolute deadline without the clock cannot be checked
    late = quote_sweep(timed, [POOL], now=datetime(2030, 1, 1, tzinfo=UTC))
    assert not late.feasible and "objective.deadline" in late.reason


def test_promotes_with_nothing_recorded() -> None:
    assert promotes(1.0, [], 2, "minimize") and promotes(1.0, [], 2, "maximize")


def _uneven_trials() -> list[SimTrial]:
    """Five trials, each slower and with a longer start-up than the one before, decisions at 25 and 50."""
    return [SimTrial(1.0, 5.0 * i, 1.0 + 0.25 * i, 100, (25, 50)) for i in range(5)]


def test_the_search_estimate_is_the_mean_over_the_rank_orders() -> None:
    """``estimate_search`` averages ``simulate_asha`` over every rank order (a trial's value at each rung
    is its rank): the mean cost and hours, the dearest outcome, the share the budget cut short, and
    whether the budget acted anywhere (a trial waited, was skipped or cancelled) even when no outcome was
    cut."""
    tr = _uneven_trials()
    orders = rank_orders(5, 0)
    free = estimate_search(tr, reduction_factor=2, max_parallel=2, budget_usd=None)
    assert not free.budget_acted and free.budget_stop_share == 0.0
    for share, budget in ((0.5, 1.2 * free.expected_cost_usd), (0.0, 1.65 * free.expected_cost_usd)):
        values = [[[float(o[i])] * 2 for i in range(5)] for o in orders]
        outs = [simulate_asha(tr, v, reduction_factor=2, max_parallel=2, budget_usd=budget) for v in values]
        est = estimate_search(tr, reduction_factor=2, max_parallel=2, budget_usd=budget)
        assert est.outcomes == len(orders) == 120
        assert est.expected_cost_usd == pytest.approx(sum(o.cost_usd for o in outs) / 120)
        assert est.expected_hours == pytest.approx(sum(o.hours for o in outs) / 120)
        assert est.max_cost_usd == max(o.cost_usd for o in outs)
        assert est.budget_stop_share == pytest.approx(share) == sum(o.cut_by_budget for o in outs) / 120
        assert est.budget_acted and any(o.budget_waited for o in outs)
    assert not outs[-1].cut_by_budget and not outs[-1].budget_waited  # the last order: the budget never acted


def test_sampled_rank_orders_follow_the_seed() -> None:
    """Past ``samples`` orders the estimate draws them from the seed (0 by default): the same seed gives
    the same estimate every time, another seed other orders."""
    tr = _uneven_trials()

    def est(**kw: Any) -> float:
        return estimate_search(
            tr, reduction_factor=2, max_parallel=2, budget_usd=None, samples=2, **kw
        ).expected_cost_usd

    by_seed = [est(seed=s) for s in range(5)]
    assert by_seed == [est(seed=s) for s in range(5)] and est() == by_seed[0] and len(set(by_seed)) > 2
    # the sweep's seed reaches them through the group quote the same way
    s = sweep(
        parameters={"workload.seed": {"values": [0, 1, 2, 3, 4]}},
        early_stopping={"reduction_factor": 2, "min_fraction": 0.25},
    )
    opts = {f"s-t{i:03d}": [_option("a", 2.0 + 1.5 * i, usd_per_step=0.002 + 0.0005 * i)] for i in range(5)}
    quoted = [
        quote_sweep(s.model_copy(update={"seed": k}), quoter=_quoter(opts), samples=2).expected_cost_usd
        for k in range(5)
    ]
    again = [
        quote_sweep(s.model_copy(update={"seed": k}), quoter=_quoter(opts), samples=2).expected_cost_usd
        for k in range(5)
    ]
    assert quoted == again and len(set(quoted)) > 2


def test_an_infeasible_sweep_quote_says_so_in_full() -> None:
    """The quote of a sweep a trial cannot run: its name and budget, infinite cost and hours, ``feasible``
    False (not merely falsy), and every trial with the spec it was quoted on."""
    two = sweep(parameters={"workload.seed": {"values": [0, 1]}}, budget_usd=50.0)
    q = quote_sweep(two, quoter=_quoter({"s-t000": [_option("a", 2.0)], "s-t001": []}))
    doc = q.to_dict()
    assert (doc["sweep"], doc["budget_usd"], doc["feasible"]) == ("s", 50.0, False)
    assert doc["expected_cost_usd"] == doc["max_cost_usd"] == doc["expected_hours"] == math.inf
    assert [t.spec for t in q.trials] == [spec for _, spec in trial_specs(two)]
    # over its budget: feasible is False too
    over = quote_sweep(
        two.model_copy(update={"budget_usd": 1.0}),
        quoter=_quoter({"s-t000": [_option("a", 2.0)], "s-t001": [_option("a", 2.0)]}),
    )
    assert over.to_dict()["feasible"] is False and over.reason.startswith("the search is expected to cost")
    assert [t.spec.name for t in over.trials] == ["s-t000", "s-t001"]


def test_the_quoter_is_handed_the_pools() -> None:
    seen: list[Any] = []

    def quoter(spec: Any, pools: Any) -> list[QuoteOption]:
        seen.append(pools)
        return [_option("a", 2.0)]

    pools = [POOL]
    quote_sweep(sweep(parameters={"workload.seed": {"values": [0, 1]}}), pools, quoter=quoter)
    assert len(seen) == 2 and all(p is pools for p in seen)


def test_an_outcome_the_budget_never_stopped_says_false() -> None:
    tr = [SimTrial(1.0, 0.0, 1.0, 100, (50,))] * 2
    out = simulate_asha(tr, [[1], [2]], reduction_factor=2, max_parallel=2, budget_usd=None)
    assert out.budget_stopped is False and out.budget_waited is False
    assert rank_orders(1, 3) == [(0,)]  # one trial: its one order


def test_admission_and_the_budget_stop_on_small_mixed_sweeps() -> None:
    """Small sweeps where one rule decides the outcome: a running trial's spend counts from its own start
    (a trial started later is not charged for the time before it), a rest below $1 is not rounded up, a
    trial with one step done already projects its pace, a rung falls at its step times the step time,
    and the stop falls 5 s of spend before the budget minus what is already spent."""
    T = SimTrial
    # the 4th trial is admitted when the 1st ends (trial 2 started later: its own spend is $2.50), then
    # cancelled by the budget at 18 of its 20 steps
    tr = [
        T(1.0, 0.0, 0.5, 10),
        T(1.0, 0.0, 0.5, 20, (5, 10), 15.0),
        T(1.0, 0.0, 0.5, 40),
        T(2.0, 0.0, 2.0, 20, (5, 10), 60.0),
    ]
    out = simulate_asha(
        tr, [[], [2.0, 3.0], [], [2.0, 0.0]], reduction_factor=None, max_parallel=2, budget_usd=120.0
    )
    assert out == SimOutcome(
        110.0,
        47.5 / 3600,
        (10, 20, 40, 18),
        ("completed", "completed", "completed", "cancelled"),
        True,
        False,
    )
    # no trial waits: what the running trials have left is exactly what they were predicted
    tr = [T(2.0, 10.0, 0.5, 20, (5, 10), 60.0), T(1.0, 0.0, 2.0, 10, (5,)), T(2.0, 0.0, 0.5, 20, (10,), 60.0)]
    out = simulate_asha(
        tr, [[3.0, 2.0], [2.0], [2.0]], reduction_factor=None, max_parallel=2, budget_usd=120.0
    )
    assert out == SimOutcome(80.0, 30.0 / 3600, (20, 10, 20), ("completed",) * 3, False, False)
    # one step done counts: a trial waits for the budget
    tr = [
        T(2.0, 0.0, 0.5, 10, (5,), 15.0),
        T(1.0, 0.0, 0.5, 10, (5,), 60.0),
        T(2.0, 0.0, 2.0, 10, (5,)),
        T(1.0, 0.0, 2.0, 10, (), 60.0),
    ]
    out = simulate_asha(tr, [[2.0], [3.0], [0.0], []], reduction_factor=2, max_parallel=2, budget_usd=120.0)
    assert out == SimOutcome(
        72.5, 32.5 / 3600, (10, 5, 10, 10), ("completed", "stopped", "completed", "completed"), False, True
    )
    # rungs at step x step time: trial 2 stops at its first rung (5 steps of 1 s), the others are cancelled
    tr = [T(1.0, 0.0, 0.5, 40, (5, 10)), T(2.0, 0.0, 2.0, 10), T(2.0, 0.0, 1.0, 20, (5, 10), 15.0)]
    out = simulate_asha(tr, [[2.0, 1.0], [], [3.0, 0.0]], reduction_factor=2, max_parallel=3, budget_usd=80.0)
    assert (out.cost_usd, out.steps, out.states, out.budget_stopped) == (
        65.0, (36, 9, 5), ("cancelled", "cancelled", "stopped"), True,
    )  # fmt: skip
    assert out.hours == pytest.approx(18.333333333333332 / 3600)
    # a $20 trial at $2/s under a $30 budget: stopped 5 s of spend early, at $20 spent... its last step
    out = simulate_asha(
        [T(2.0, 0.0, 1.0, 10, (5,))], [[3.0]], reduction_factor=2, max_parallel=3, budget_usd=30.0
    )
    assert out.states == ("cancelled",) and out.budget_stopped and out.cost_usd == 20.0 and out.steps == (10,)


def test_a_skipped_trial_without_a_step_time_trained_no_step() -> None:
    """A trial the budget skips trained 0 steps, also one whose step time is 0 (a trial that counts as
    done at once once it runs)."""
    tr = [SimTrial(1.0, 0.0, 0.0, 10, (), predicted_usd=100.0)]
    out = simulate_asha(tr, [[]], reduction_factor=None, max_parallel=1, budget_usd=50.0)
    assert out.states == ("skipped",) and out.steps == (0,) and out.cost_usd == 0.0 and out.budget_waited
