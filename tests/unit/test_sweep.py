"""Sweeps: trials expanded deterministically, invalid sweeps refused with the field named, successive
halving's rungs, and the group quote's cost and time against a hand computation."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from trainyard.catalog.pools import Pool
from trainyard.cost.sweep import promotes, quote_sweep, rung_steps, rungs_for
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


def test_group_quote_matches_a_hand_computation() -> None:
    """Six identical-cost trials on one CPU pool at $3.60/device-hour = $0.001/device-second; 2 s steps.
    Rungs (eta 3, f0 1/9, 900 steps): 6 trials x 100 steps, 2 x 200 more, 1 x 600 more = 1,600 steps."""
    s = sweep(early_stopping={"reduction_factor": 3, "min_fraction": 1 / 9}, max_parallel=2)
    q = quote_sweep(s, [POOL])
    assert q.feasible and len(q.trials) == 6
    opt = q.trials[0].option
    assert opt is not None and opt.accelerator == "cpu"
    per_step = opt.usd_per_step
    assert all(t.option is not None and t.option.usd_per_step == pytest.approx(per_step) for t in q.trials)
    assert [(r.trials, r.steps) for r in q.rungs] == [(6, 100), (2, 300), (1, 900)]
    assert q.expected_cost_usd == pytest.approx(1600 * per_step)
    assert q.max_cost_usd == pytest.approx(1600 * per_step)
    step_h = opt.expected_hours / opt.total_steps
    # waves: 3 x 100 steps, 1 x 200 steps, 1 x 600 steps
    assert q.expected_hours == pytest.approx((300 + 200 + 600) * step_h)
    no_es = quote_sweep(sweep(), [POOL])
    assert no_es.expected_cost_usd == pytest.approx(6 * 900 * per_step)
    assert no_es.expected_cost_usd > 3 * q.expected_cost_usd


def test_budget_is_checked_against_the_most_expensive_outcome() -> None:
    s = sweep(early_stopping={"reduction_factor": 3, "min_fraction": 1 / 9})
    full = quote_sweep(s, [POOL])
    tight = quote_sweep(s.model_copy(update={"budget_usd": full.max_cost_usd * 0.99}), [POOL])
    assert not tight.feasible and "over its budget" in tight.reason
    ok = quote_sweep(s.model_copy(update={"budget_usd": full.max_cost_usd * 1.01}), [POOL])
    assert ok.feasible


def test_a_trial_without_a_feasible_option_makes_the_sweep_infeasible() -> None:
    s = sweep(parameters={"requirements.allow": {"values": [["cpu"], ["h100"]]}})
    q = quote_sweep(s, [POOL])
    assert not q.feasible and "1 of 2 trials" in q.reason and math.isinf(q.expected_cost_usd)


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
