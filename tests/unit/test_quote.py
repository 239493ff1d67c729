"""Quotes: the DESIGN §4 worked example, ranking, and every infeasibility reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.catalog.pools import Pool, load_pools
from trainyard.cost.quote import CONTRACT_KEYS, QuoteOption, candidate_device_counts, option_for, quote
from trainyard.spec import load_spec, spec_from_dict

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _spec(**over: Any):
    doc: dict[str, Any] = {
        "apiVersion": "trainyard/v1",
        "kind": "TrainingJob",
        "name": "t",
        "model": {"architecture": "custom", "params_b": 1.0},
        "workload": {"seq_len": 2048, "global_batch": 8, "steps": 1000},
    }
    for k, v in over.items():
        doc.setdefault(k, {}).update(v) if isinstance(v, dict) else doc.__setitem__(k, v)
    return spec_from_dict(doc)


def _pool(**over: Any) -> Pool:
    base = dict(
        name="p",
        accelerator="a100-80gb",
        devices_per_node=8,
        nodes=2,
        market="on_demand",
        price_usd_per_device_hour=2.0,
        cloud="aws",
        region="us-east-1",
    )
    base.update(over)
    return Pool(**base)


@pytest.fixture(scope="module")
def worked() -> dict[str, QuoteOption]:
    spec = load_spec(EXAMPLES / "seed-example.yaml")
    opts = quote(spec, load_pools(EXAMPLES / "seed-pools.yaml"))
    return {o.pool: o for o in opts}


def test_worked_example_matches_design_digits(worked: dict[str, QuoteOption]) -> None:
    shown = {k: f"${v.usd_per_step:.5f}" for k, v in worked.items()}
    assert shown == {
        "a100-on-demand": "$0.00056",
        "trainium": "$0.00037",
        "tpu-v4": "$0.00042",
        "a100-spot": "$0.00016",
    }
    assert worked["a100-spot"].checkpoint_interval_s == 900.0  # Young/Daly, 15 minutes
    assert all(o.feasible and o.devices == 1 for o in worked.values())


def test_worked_example_ranking_and_contract() -> None:
    spec = load_spec(EXAMPLES / "seed-example.yaml")
    opts = quote(spec, load_pools(EXAMPLES / "seed-pools.yaml"))
    assert [o.pool for o in opts] == ["a100-spot", "trainium", "tpu-v4", "a100-on-demand"]
    costs = [o.expected_cost_usd for o in opts]
    assert costs == sorted(costs)
    doc = opts[0].to_contract()
    assert tuple(doc) == CONTRACT_KEYS
    spot = opts[0]
    assert (
        spot.preemption_overhead_usd > 0 and spot.interruption_rate_per_hour == 0.05 and spot.notice_s == 120
    )
    assert opts[-1].preemption_overhead_usd == 0.0


def test_measured_step_time_overrides_and_scales() -> None:
    spec = _spec(measured={"step_time_s": {"a100-80gb": 0.8}})
    pool = _pool()
    one = option_for(spec, pool, 1)
    assert one.step_time_s == 0.8 and one.step_time_source == "measured"
    eight = option_for(spec, pool, 8)
    assert eight.step_time_source == "measured-scaled" and eight.step_time_s < 0.8


def test_candidate_counts_respect_shape_and_bounds() -> None:
    spec = _spec()
    assert candidate_device_counts(spec, _pool()) == [1, 2, 4, 8, 16]
    assert candidate_device_counts(spec, _pool(whole_nodes_only=True)) == [8, 16]
    assert candidate_device_counts(
        _spec(resources={"min_devices": 3, "max_devices": 12}), _pool(devices_per_node=1, nodes=16)
    ) == [3, 4, 8, 12]
    assert candidate_device_counts(_spec(resources={"min_devices": 32}), _pool()) == []
    whole = _pool(whole_nodes_only=True, nodes=8)
    assert candidate_device_counts(_spec(resources={"max_devices": 44}), whole) == [8, 16, 32, 40]
    assert candidate_device_counts(_spec(resources={"min_devices": 3}), whole) == [8, 16, 32, 64]


@pytest.mark.parametrize(
    ("over", "pool_over", "needle"),
    [
        (
            {"requirements": {"frameworks": ["cuda-kernels"]}},
            {"accelerator": "tpu-v4", "devices_per_node": 4},
            "requirements.frameworks",
        ),
        ({"requirements": {"allow": ["google-tpu"]}}, {}, "requirements.allow"),
        ({"requirements": {"deny": ["nvidia"]}}, {}, "requirements.deny"),
        ({"requirements": {"deny": ["a100-80gb"]}}, {}, "requirements.deny"),
        ({"requirements": {"regions": ["eu-*"]}}, {}, "requirements.regions"),
        ({"objective": {"markets": ["spot"]}}, {}, "objective.markets"),
        ({"resources": {"min_memory_per_device_gib": 100}}, {}, "min_memory_per_device_gib"),
        ({"resources": {"min_interconnect_gbps": 1000}}, {}, "min_interconnect_gbps"),
        ({"objective": {"deadline": "1m"}}, {}, "objective.deadline"),
        ({"objective": {"budget_usd": 0.01}}, {}, "objective.budget_usd"),
        ({"resources": {"accelerator_hours": 0.001}}, {}, "resources.accelerator_hours"),
        ({"model": {"params_b": 400.0}}, {}, "GiB"),
    ],
)
def test_infeasible_reasons_name_the_field(
    over: dict[str, Any], pool_over: dict[str, Any], needle: str
) -> None:
    spec = _spec(**over)
    opts = quote(spec, [_pool(**pool_over)])
    one = next(o for o in opts if o.devices in (1, 4)) if needle != "min_interconnect_gbps" else opts[-1]
    assert not one.feasible
    assert needle in one.reason, one.reason


def test_region_globs_accept_matching_pools() -> None:
    spec = _spec(requirements={"regions": ["us-*"]})
    assert all(o.feasible for o in quote(spec, [_pool()]))


def test_deadline_uses_pessimistic_spot_percentile() -> None:
    spec = _spec(workload={"steps": 20000})
    pool = _pool(market="spot", interruption_rate_per_hour=0.5)
    o = option_for(spec, pool, 1)
    assert o.expected_hours_p90 > o.expected_hours
    # a deadline between the mean and p90 wall time rejects the option and names both numbers
    dl_h = (o.expected_hours + o.expected_hours_p90) / 2
    o2 = option_for(spec, pool, 1, deadline_s=dl_h * 3600)
    assert not o2.feasible and "p90" in o2.reason and "exceeds the deadline" in o2.reason


def test_objective_time_ranks_by_hours() -> None:
    spec = _spec(objective={"minimize": "time"})
    opts = [o for o in quote(spec, [_pool()]) if o.feasible]
    hours = [o.expected_hours for o in opts]
    assert hours == sorted(hours)
    assert opts[0].devices > 1


def test_elapsed_fraction_prices_only_the_rest() -> None:
    spec = _spec()
    full = option_for(spec, _pool(), 1)
    half = option_for(spec, _pool(), 1, elapsed_fraction=0.5)
    assert half.expected_cost_usd < full.expected_cost_usd
    with pytest.raises(ValueError):
        option_for(spec, _pool(), 1, elapsed_fraction=1.0)


def test_whole_catalog_quote_for_7b_lora() -> None:
    spec = spec_from_dict(
        {
            "name": "lora-7b",
            "model": {
                "n_layers": 32,
                "d_model": 4096,
                "n_heads": 32,
                "d_ff": 11008,
                "ffn": "gated",
                "vocab_size": 32000,
            },
            "workload": {
                "method": "lora",
                "lora_rank": 16,
                "seq_len": 2048,
                "global_batch": 32,
                "tokens": 50_000_000,
            },
        }
    )
    opts = quote(spec)
    feasible = [o for o in opts if o.feasible]
    assert len(feasible) > 50
    assert {o.market for o in feasible} == {"spot", "on_demand", "reserved"}
    assert feasible[0].expected_cost_usd <= feasible[-1].expected_cost_usd
    assert any(not o.feasible for o in opts)  # e.g. T4/K80 memory
    assert len({o.pool for o in opts}) == len({o.pool for o in opts if o.pool})


def test_a_gang_of_nodes_is_interrupted_more_often() -> None:
    spec = _spec()
    pool = _pool(market="spot", devices_per_node=1, nodes=8, interruption_rate_per_hour=0.1)
    one, four = option_for(spec, pool, 1), option_for(spec, pool, 4)
    assert one.interruption_rate_per_hour == pytest.approx(0.1)
    assert four.interruption_rate_per_hour == pytest.approx(0.4)
    assert four.checkpoint_interval_s <= one.checkpoint_interval_s


def test_unpriced_pool_is_an_infeasible_option_not_a_crash() -> None:
    pool = _pool(price_usd_per_device_hour=None, instance_type="nope.large")
    opts = quote(_spec(), [pool, _pool(name="ok")])
    bad = [o for o in opts if o.pool == "p"]
    assert bad and all(not o.feasible and o.reason.startswith("no price:") for o in bad)
    assert any(o.feasible and o.pool == "ok" for o in opts)


def test_nothing_fits_gives_finite_numbers_and_the_predictors_reason() -> None:
    import json
    import math

    from trainyard.predict import Prediction

    nothing = Prediction(
        accelerator="a100-80gb", devices=1, step_time_s=math.inf, tokens_per_s=0.0, mfu=0.0,
        memory_per_device_gib=math.inf, fits=False, plan={}, reason="needs 900 GiB per device",
    )  # fmt: skip
    o = option_for(_spec(), _pool(), 1, prediction=nothing)
    assert not o.feasible and o.reason == "needs 900 GiB per device"
    json.dumps(o.to_contract(), allow_nan=False)
    # measured at one device, predicted nowhere: scaled linearly instead of by the predictor
    spec = _spec(measured={"step_time_s": {"a100-80gb": 0.8}})
    two = option_for(spec, _pool(), 2, predict_fn=lambda s, a, d: nothing)
    assert not two.feasible  # the predictor says it does not fit at 2 devices
    one = option_for(spec, _pool(), 1, predict_fn=lambda s, a, d: nothing)
    assert one.feasible and one.step_time_s == 0.8  # measured: it ran


# ---- the infeasible options kept with a job name the binding constraint, from the whole quote -----------


def test_stored_quote_names_the_budget_not_the_first_pools_escape_hatches() -> None:
    from trainyard.cost.quote import quote, telling_infeasible
    from trainyard.services.quoting import MAX_STORED_INFEASIBLE, stored_quote
    from trainyard.spec import spec_from_dict

    spec = spec_from_dict(
        {
            "name": "tight",
            "model": {"n_layers": 24, "d_model": 2048, "n_heads": 16, "vocab_size": 32000},
            "workload": {"seq_len": 2048, "global_batch": 32, "steps": 20000},
            "requirements": {"allow": ["a10g"]},
            "objective": {"budget_usd": 1.0},
        }
    )
    options = quote(spec)
    assert options and not any(o.feasible for o in options)
    by_order = [o.reason for o in options if not o.feasible][:MAX_STORED_INFEASIBLE]
    assert not any("budget" in r for r in by_order)  # what the old cut kept
    told = telling_infeasible(options)
    assert told[0].reason.startswith("objective.budget_usd:")
    assert len({o.reason for o in told}) == len(told)  # one per distinct reason
    assert {o.reason for o in told} == {o.reason for o in options if not o.feasible}
    kept = stored_quote(options)
    assert kept[0]["reason"].startswith("objective.budget_usd:")
    assert len(kept) <= MAX_STORED_INFEASIBLE


@settings(max_examples=30, deadline=None)
@given(
    reasons=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.booleans(), st.floats(0.0, 100.0)),
        min_size=1,
        max_size=30,
    )
)
def test_telling_infeasible_puts_priced_refusals_first(reasons: list[tuple[str, bool, float]]) -> None:
    from trainyard.cost.quote import QuoteOption, telling_infeasible

    def opt(reason: str, priced: bool, cost: float) -> QuoteOption:
        return QuoteOption(
            accelerator="a100-40gb", devices=1, cloud=None, region="r", instance_type=None,
            market="on_demand", step_time_s=1.0 if priced else 0.0, price_usd_per_hour=1.0,
            usd_per_step=0.0, expected_hours=0.0, expected_cost_usd=cost if priced else 0.0,
            preemption_overhead_usd=0.0, checkpoint_interval_s=0.0, feasible=False,
            reason=("priced " if priced else "screened ") + reason,
        )  # fmt: skip

    options = [opt(*r) for r in reasons]
    told = telling_infeasible(options)
    assert sorted(o.reason for o in told) == sorted({o.reason for o in options})
    flags = [o.step_time_s > 0 for o in told]
    assert flags == sorted(flags, reverse=True)  # every priced refusal before every screened one
