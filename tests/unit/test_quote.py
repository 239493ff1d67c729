"""Quotes: the DESIGN §4 worked example, ranking, and every infeasibility reason."""

from __future__ import annotations

import math
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.catalog.accelerators import get_accelerator
from trainyard.catalog.pools import Pool, load_pools
from trainyard.cost import model as cm
from trainyard.cost import quote as Q
from trainyard.cost.quote import CONTRACT_KEYS, QuoteOption, candidate_device_counts, option_for, quote
from trainyard.predict import Prediction
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


# ---- worked examples with a given step time: every number of an option by hand --------------------------


PARAMS = cm.CostParams(
    storage_write_gb_per_s=2.0, storage_read_gb_per_s=4.0,
    provisioning_s={"nvidia": 100.0, "google-tpu": 200.0},
    spot_capacity_wait_s=600.0,
)  # fmt: skip


def _pred(step: float = 0.5, p90: float = 0.6, **over: Any) -> Prediction:
    doc: dict[str, Any] = dict(
        accelerator="a100-80gb", devices=1, step_time_s=step, tokens_per_s=1.0, mfu=0.5,
        memory_per_device_gib=10.0, fits=True, plan={}, step_time_p90_s=p90,
    )  # fmt: skip
    doc.update(over)
    return Prediction(**doc)


def test_on_demand_option_worked_example() -> None:
    spec = _spec()  # 1,000 steps
    pool = _pool(interruption_rate_per_hour=0.0, notice_s=30.0)
    o = option_for(spec, pool, 2, prediction=_pred(), params=PARAMS)
    ckpt = cm.checkpoint_bytes(spec)
    stall = ckpt / (2.0 * 1e9)  # one node writes at 2 GB/s
    load = ckpt / (4.0 * 1e9)
    frac = stall / 1800.0  # no interruptions: the 30-minute cap
    work = 1000 * 0.5
    billed = 100.0 + work * (1 + frac)  # provisioning once (nothing to load at the start), then the work
    assert o.feasible and o.reason == ""
    assert o.checkpoint_interval_s == 1800.0 and o.checkpoint_s == pytest.approx(stall)
    assert o.restart_s == pytest.approx(100.0 + load) and o.compile_s == 0.0
    assert o.price_usd_per_hour == 4.0  # two devices at $2
    assert o.expected_hours == pytest.approx(billed / 3600)
    assert o.expected_cost_usd == pytest.approx(4.0 * billed / 3600)
    assert o.expected_hours_p90 == pytest.approx((100.0 + 1000 * 0.6 * (1 + frac)) / 3600)
    assert o.usd_per_step == pytest.approx(4.0 * 0.5 * (1 + frac) / 3600)
    assert o.checkpoint_overhead_usd == pytest.approx(4.0 * work * frac / 3600)
    assert (o.preemption_overhead_usd, o.interruption_rate_per_hour, o.notice_s) == (0.0, 0.0, 0.0)
    assert (o.capacity_wait_hours, o.total_steps, o.nodes) == (0.0, 1000, 1)
    assert (o.step_time_s, o.step_time_p90_s, o.step_time_source) == (0.5, 0.6, "analytic")
    assert (o.accelerator, o.devices, o.cloud, o.region, o.instance_type, o.market, o.pool) == (
        "a100-80gb", 2, "aws", "us-east-1", None, "on_demand", "p",
    )  # fmt: skip
    assert o.to_dict() == {
        **o.to_contract(), "pool": "p", "nodes": 1, "expected_hours_p90": o.expected_hours_p90,
        "restart_s": o.restart_s, "compile_s": 0.0, "checkpoint_s": o.checkpoint_s,
        "checkpoint_overhead_usd": o.checkpoint_overhead_usd, "interruption_rate_per_hour": 0.0,
        "notice_s": 0.0, "step_time_p90_s": 0.6, "step_time_source": "analytic", "total_steps": 1000,
        "capacity_wait_hours": 0.0,
    }  # fmt: skip
    assert o.to_contract() == {k: getattr(o, k) for k in CONTRACT_KEYS}


def test_spot_option_worked_example_resuming_halfway() -> None:
    """Spot, 2 single-device nodes at 0.25 interruptions per node-hour, async saves, a 10-minute wait for
    capacity per interruption, the p95 for deadlines and half the job already done."""
    spec = _spec(checkpoint={"storage": "s3://bucket/ckpt"}, workload={"steps": 40000})
    pool = _pool(market="spot", devices_per_node=1, nodes=4, price_usd_per_device_hour=1.0,
                 interruption_rate_per_hour=0.25, notice_s=30.0)  # fmt: skip
    params = cm.CostParams(async_checkpoint=True, spot_capacity_wait_s=600.0, deadline_quantile=0.95,
                           provisioning_s={"nvidia": 100.0})  # fmt: skip
    o = option_for(spec, pool, 2, prediction=_pred(), params=params, elapsed_fraction=0.5)
    ckpt = cm.checkpoint_bytes(spec)
    stall = ckpt / (2 * 10.0 * 1e9)  # async: each device copies its share to the host at 10 GB/s
    load = ckpt / (2 * cm.storage_read_gb_per_s("s3://bucket/ckpt") * 1e9)  # two nodes read from S3
    restart = 100.0 + load
    rate_s = 0.5 / 3600  # a gang of two nodes stops when either is reclaimed
    interval = cm.choose_interval_s(None, stall, rate_s, params)
    work = 20000 * 0.5  # the half that is left
    ckpt_frac, pre_frac = stall / interval, rate_s * (interval / 2 + restart)
    startup = 100.0 + load  # resuming loads the checkpoint
    billed = startup + work * (1 + ckpt_frac + pre_frac)
    wall = billed + rate_s * work * 600.0
    p95 = cm.pessimistic_wall_s(
        work_p_s=20000 * 0.6, checkpoint_frac=ckpt_frac, interval_s=interval, rate_per_s=rate_s,
        restart_s=restart, startup_s=startup, quantile=0.95, wait_s=600.0,
    )  # fmt: skip
    assert o.feasible and (o.nodes, o.interruption_rate_per_hour, o.notice_s) == (2, 0.5, 30.0)
    assert o.checkpoint_s == pytest.approx(stall) and o.checkpoint_interval_s == interval
    assert o.restart_s == pytest.approx(restart)
    assert o.expected_hours == pytest.approx(wall / 3600)
    assert o.capacity_wait_hours == pytest.approx((wall - billed) / 3600)
    assert o.expected_cost_usd == pytest.approx(2.0 * billed / 3600)  # waiting is not billed
    assert o.expected_hours_p90 == pytest.approx(p95 / 3600)
    assert o.preemption_overhead_usd == pytest.approx(2.0 * work * pre_frac / 3600)
    assert o.checkpoint_overhead_usd == pytest.approx(2.0 * work * ckpt_frac / 3600)
    assert o.usd_per_step == pytest.approx(2.0 * 0.5 * (1 + ckpt_frac + pre_frac) / 3600)
    assert o.total_steps == 40000  # the job's steps, not the ones left
    assert o.expected_hours_p90 > (startup + 20000 * 0.6 * (1 + ckpt_frac)) / 3600 + 0.1  # interruptions


def test_an_accelerator_that_compiles_pays_it_at_start_and_at_every_restart() -> None:
    spec = _spec()
    pool = _pool(accelerator="tpu-v4", devices_per_node=4, nodes=1, interruption_rate_per_hour=0.0)
    acc = get_accelerator("tpu-v4")
    assert acc.compile_required
    ckpt = cm.checkpoint_bytes(spec)
    load = ckpt / (4.0 * 1e9)
    typical = option_for(spec, pool, 4, prediction=_pred(accelerator="tpu-v4"), params=PARAMS)
    assert typical.compile_s == acc.first_compile_s  # the predictor gives none: the accelerator's typical
    assert typical.restart_s == pytest.approx(200.0 + load + acc.first_compile_s)
    given = option_for(
        spec, pool, 4, prediction=_pred(accelerator="tpu-v4", compile_time_s=50.0), params=PARAMS
    )
    assert given.compile_s == 50.0 and given.restart_s == pytest.approx(200.0 + load + 50.0)
    assert given.expected_hours == pytest.approx(
        (200.0 + 50.0 + 500 * (1 + given.checkpoint_s / 1800)) / 3600
    )
    gpu = option_for(spec, _pool(), 1, prediction=_pred(compile_time_s=50.0), params=PARAMS)
    assert gpu.compile_s == 0.0  # an accelerator that runs eagerly compiles nothing


def test_measured_step_time_scaled_by_the_predictors_ratio() -> None:
    spec = _spec(measured={"step_time_s": {"a100-80gb": 0.8}})
    preds = {1: _pred(1.0, 1.2), 2: _pred(0.6, 0.9), 4: _pred(0.4, 0.41), 8: _pred(0.3, 0.0)}

    def fn(s: Any, a: Any, d: int) -> Prediction:
        return preds[d]

    one = option_for(spec, _pool(), 1, predict_fn=fn)
    assert (one.step_time_s, one.step_time_source) == (0.8, "measured")
    assert one.step_time_p90_s == pytest.approx(0.8 * 1.05)  # a measured time still jitters: +5 %
    two = option_for(spec, _pool(), 2, predict_fn=fn)
    assert two.step_time_source == "measured-scaled" and two.step_time_s == pytest.approx(0.8 * 0.6)
    assert two.step_time_p90_s == pytest.approx(0.8 * 0.6 * 1.5)  # the predictor's p90/p50 at 2 devices
    four = option_for(spec, _pool(), 4, predict_fn=fn)
    assert four.step_time_p90_s == pytest.approx(0.8 * 0.4 * 1.05)  # never below the measured jitter
    eight = option_for(spec, _pool(), 8, predict_fn=fn)
    assert eight.step_time_p90_s == pytest.approx(0.8 * 0.3 * 1.05)  # no p90 predicted: the jitter

    def no_reference(s: Any, a: Any, d: int) -> Prediction:
        if d == 1:
            raise ValueError("cannot model one device")
        return preds[d]

    linear = option_for(spec, _pool(), 2, predict_fn=no_reference)
    assert linear.step_time_s == pytest.approx(0.4) and linear.step_time_p90_s == pytest.approx(0.4 * 1.05)
    # the measured count is the spec's min_devices
    spec2 = _spec(measured={"step_time_s": {"a100-80gb": 0.8}}, resources={"min_devices": 2})
    at2 = option_for(spec2, _pool(), 2, predict_fn=fn)
    assert (at2.step_time_s, at2.step_time_source) == (0.8, "measured")
    at4 = option_for(spec2, _pool(), 4, predict_fn=fn)
    assert at4.step_time_s == pytest.approx(0.8 * 0.4 / 0.6)


def test_predictions_that_cannot_be_priced() -> None:
    def boom(s: Any, a: Any, d: int) -> Prediction:
        raise ValueError("cannot model 3D parallelism")

    o = option_for(_spec(), _pool(), 2, predict_fn=boom)
    assert not o.feasible and o.reason == "predictor: cannot model 3D parallelism"
    assert (o.price_usd_per_hour, o.step_time_s, o.nodes, o.prediction) == (4.0, 0.0, 1, None)
    tight = option_for(_spec(), _pool(), 2, prediction=_pred(fits=False))
    assert tight.reason == "does not fit in memory on 2 x a100-80gb"
    assert (tight.step_time_s, tight.step_time_source, tight.price_usd_per_hour) == (0.5, "analytic", 4.0)
    assert tight.prediction is not None and not tight.feasible
    endless = option_for(_spec(), _pool(), 2, prediction=_pred(math.inf, math.inf))
    assert endless.reason == "does not fit in memory on 2 x a100-80gb" and endless.step_time_s == 0.0
    # a p90 below the median or missing is the median
    assert option_for(_spec(), _pool(), 1, prediction=_pred(0.5, 0.4)).step_time_p90_s == 0.5
    assert option_for(_spec(), _pool(), 1, prediction=_pred(0.5, math.nan)).step_time_p90_s == 0.5


def test_interconnect_on_one_node_and_across_nodes() -> None:
    acc = get_accelerator("a100-80gb")
    pool = _pool()
    assert Q.interconnect_gbps(pool, acc, 8) == acc.intra_node_gbs * 8.0
    assert Q.interconnect_gbps(pool, acc, 16) == acc.inter_node_gbps
    assert Q.interconnect_gbps(_pool(inter_node_gbps=100.0), acc, 16) == 100.0
    spec = _spec(resources={"min_interconnect_gbps": 200.0}, objective={"budget_usd": 0.000001})
    o = option_for(spec, _pool(inter_node_gbps=100.0), 16, prediction=_pred())
    assert (
        o.reason
        == "resources.min_interconnect_gbps: 16 x a100-80gb on 2 node(s) has 100 Gbit/s per device < 200"
    )
    ok = option_for(
        _spec(resources={"min_interconnect_gbps": 100.0}),
        _pool(inter_node_gbps=100.0),
        16,
        prediction=_pred(),
    )
    assert ok.feasible  # exactly the minimum is enough
    assert option_for(spec, _pool(inter_node_gbps=100.0), 8, prediction=_pred()).reason.startswith(
        "objective.budget_usd"
    )


def test_work_reasons_at_their_limits() -> None:
    spec = _spec(objective={"budget_usd": 1000.0}, resources={"accelerator_hours": 10.0})
    facts = Q.SpecFacts(1000, 1e9, 5400.0)

    def w(**over: float) -> Q.WorkPricing:
        doc = dict(billed_s=9000.0, wall_s=9000.0, wall_p90_s=5400.0, cost_usd=1000.0, checkpoint_frac=0.01,
                   preemption_frac=0.5, checkpoint_overhead_usd=1.0, preemption_overhead_usd=1.0)  # fmt: skip
        doc.update(over)
        return Q.WorkPricing(**doc)

    kw = dict(rate_h=0.0, restart_s=300.0, interval_s=600.0, params=cm.DEFAULT_PARAMS)
    assert Q.work_reason(spec, facts, 4, w(), **kw) == ""  # every limit met exactly
    assert Q.work_reason(spec, facts, 4, w(preemption_frac=1.0), **{**kw, "rate_h": 2.0}) == (
        "preemptions every 0.5 h cost 300 s restart + half a 600 s interval each: "
        "more wall time is lost than trained"
    )
    assert Q.work_reason(spec, facts, 4, w(wall_p90_s=5401.0, wall_s=3000.0), **kw) == (
        "objective.deadline: p90 step time wall time 1.5 h exceeds the deadline 1.5 h (expected 50 min)"
    )
    spot = {**kw, "rate_h": 0.5, "params": cm.CostParams(deadline_quantile=0.95)}
    assert Q.work_reason(spec, Q.SpecFacts(1000, 1e9, 1800.0), 4, w(), **spot) == (
        "objective.deadline: p95 wall time 1.5 h exceeds the deadline 30 min (expected 2.5 h)"
    )
    assert Q.work_reason(spec, facts, 4, w(cost_usd=1234.5), **kw) == (
        "objective.budget_usd: expected $1,234.50 exceeds the budget $1,000.00"
    )
    assert Q.work_reason(spec, facts, 4, w(billed_s=9001.0), **kw) == (
        "resources.accelerator_hours: 10.0 device-hours exceed the limit 10"
    )
    assert (
        Q.work_reason(_spec(), Q.SpecFacts(1000, 1e9, None), 4, w(wall_p90_s=1e9, cost_usd=1e9), **kw) == ""
    )
    assert (Q._fmt_h(1.0), Q._fmt_h(0.999), Q._fmt_h(0.5)) == ("1.0 h", "60 min", "30 min")


def test_screening_reasons_name_the_numbers() -> None:
    ranged = _spec(resources={"min_devices": 2, "max_devices": 4})
    assert option_for(ranged, _pool(), 1).reason == "resources: 1 devices is outside 2..4"
    assert option_for(ranged, _pool(), 8).reason == "resources: 8 devices is outside 2..4"
    assert option_for(ranged, _pool(), 2, prediction=_pred()).feasible
    assert option_for(ranged, _pool(), 4, prediction=_pred()).feasible
    at_least = _spec(resources={"min_devices": 2})
    assert option_for(at_least, _pool(), 1).reason == "resources: 1 devices is outside at least 2"
    assert option_for(_spec(), _pool(), 3).reason == (
        "pool p: 3 devices does not fit 2 x 8 (power-of-two shares of a node or whole nodes)"
    )
    assert option_for(_spec(), _pool(whole_nodes_only=True), 4).reason == (
        "pool p: 4 devices does not fit 2 x 8 (whole instances only)"
    )
    unpriced = option_for(_spec(), _pool(price_usd_per_device_hour=None), 1)
    assert unpriced.reason == (
        "no price: pools[p].price_usd_per_device_hour: required when the pool has no instance_type"
    )
    assert (unpriced.price_usd_per_hour, unpriced.feasible) == (0.0, False)
    with pytest.raises(ValueError, match=r"elapsed_fraction must be in \[0, 1\), got -0.1"):
        option_for(_spec(), _pool(), 1, elapsed_fraction=-0.1)


def test_shapes_an_allocation_may_take() -> None:
    pool = _pool()  # 2 nodes of 8
    assert [d for d in range(0, 20) if Q._shape_ok(pool, d)] == [1, 2, 4, 8, 16]
    six = _pool(devices_per_node=6, nodes=2)
    assert [d for d in range(0, 14) if Q._shape_ok(six, d)] == [1, 2, 6, 12]
    whole = _pool(whole_nodes_only=True)
    assert [d for d in range(0, 20) if Q._shape_ok(whole, d)] == [8, 16]
    three = _pool(nodes=3)
    assert candidate_device_counts(_spec(), three) == [1, 2, 4, 8, 16, 24]  # all three nodes too
    assert candidate_device_counts(_spec(resources={"min_devices": 17}), _pool(nodes=4)) == [24, 32]
    assert candidate_device_counts(_spec(resources={"max_devices": 6}), _pool()) == [1, 2, 4]


def test_eligibility_reasons_name_the_rule() -> None:
    tpu = _pool(accelerator="tpu-v4", devices_per_node=4)

    def why(pool: Pool = _pool(), **over: Any) -> str:
        return Q.eligibility_reason(_spec(**over), pool)

    assert why(tpu, requirements={"frameworks": ["cuda-kernels"]}) == (
        "requirements.frameworks: cuda-kernels needs nvidia, tpu-v4 is google-tpu"
    )
    assert why(tpu, requirements={"frameworks": ["triton"]}) == (
        "requirements.frameworks: triton needs amd or nvidia, tpu-v4 is google-tpu"
    )
    assert why(requirements={"frameworks": ["triton", "pytorch"]}) == ""
    assert why(requirements={"allow": ["google-tpu", "h100"]}) == (
        "requirements.allow: a100-80gb (nvidia) is not in google-tpu, h100"
    )
    assert why(requirements={"allow": ["a100-80gb"]}) == why(requirements={"allow": ["nvidia"]}) == ""
    assert why(requirements={"deny": ["a100-80gb"]}) == "requirements.deny: a100-80gb (nvidia) is denied"
    assert why(requirements={"deny": ["nvidia"]}) == "requirements.deny: a100-80gb (nvidia) is denied"
    assert why(requirements={"deny": ["h100"]}) == ""
    assert why(requirements={"regions": ["eu-*", "asia-*"]}) == (
        "requirements.regions: us-east-1 matches none of eu-*, asia-*"
    )
    assert (
        why(requirements={"regions": ["aws/us-*"]}) == why(requirements={"regions": ["aws:us-east-1"]}) == ""
    )
    assert why(_pool(cloud=None), requirements={"regions": ["aws/*"]}).startswith("requirements.regions")
    assert (
        why(objective={"markets": ["spot", "reserved"]})
        == "objective.markets: on_demand is not in spot, reserved"
    )
    assert why(resources={"min_memory_per_device_gib": 100}) == (
        "resources.min_memory_per_device_gib: a100-80gb has 80 GiB < 100 GiB"
    )
    assert why(resources={"min_memory_per_device_gib": 80}) == ""
    small = _pool(memory_per_device_gib=40.0)
    assert why(small, resources={"min_memory_per_device_gib": 60}) == (
        "resources.min_memory_per_device_gib: a100-80gb has 40 GiB < 60 GiB"
    )
    assert why(_pool(memory_per_device_gib=96.0), resources={"min_memory_per_device_gib": 90}) == ""


def test_the_pools_accelerator_and_topology_for_the_predictor() -> None:
    acc = get_accelerator("a100-80gb")
    assert Q.pool_accelerator(_pool()) == acc
    assert Q.pool_accelerator(_pool(memory_per_device_gib=40.0)).memory_gib == 40.0
    assert Q.pool_accelerator(_pool(memory_per_device_gib=40.0), acc).memory_gib == 40.0
    assert Q.predict_kwargs(_pool(inter_node_gbps=50.0), acc) == {
        "inter_node_gbps": 50.0,
        "devices_per_node": 8,
    }
    tpu = _pool(accelerator="tpu-v4", devices_per_node=4)
    assert Q.predict_kwargs(tpu, get_accelerator("tpu-v4")) == {
        "inter_node_gbps": None,
        "fast_domain_devices": 4,
    }


def test_spec_facts_and_deadlines() -> None:
    from datetime import datetime

    spec = _spec(objective={"deadline": "2h"})
    facts = Q.SpecFacts.of(spec)
    assert (facts.total_steps, facts.checkpoint_bytes, facts.deadline_s) == (
        1000,
        cm.checkpoint_bytes(spec),
        7200.0,
    )
    assert Q.SpecFacts.of(spec, deadline_s=60.0).deadline_s == 60.0
    absolute = _spec(objective={"deadline": "2030-01-01T02:00:00+00:00"})
    assert Q.SpecFacts.of(absolute).deadline_s is None  # cannot be checked without the submission time
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert Q.SpecFacts.of(absolute, now).deadline_s == 7200.0
    late = option_for(absolute, _pool(), 1, prediction=_pred(), now=now, deadline_s=60.0)
    assert late.reason.startswith("objective.deadline")
    assert option_for(absolute, _pool(), 1, prediction=_pred(), now=now).feasible


def test_quote_lists_an_excluded_pool_once_and_says_why_no_count_fits() -> None:
    denied = quote(
        _spec(requirements={"deny": ["nvidia"]}), [_pool(), _pool(name="w", whole_nodes_only=True)]
    )
    assert [(o.pool, o.devices) for o in denied] == [("p", 1), ("w", 8)]  # at the smallest count
    none_fit = quote(_spec(resources={"min_devices": 32}, requirements={"deny": ["nvidia"]}), [_pool()])
    assert [(o.devices, o.reason) for o in none_fit] == [
        (8, "requirements.deny: a100-80gb (nvidia) is denied")
    ]
    (big,) = quote(_spec(resources={"min_devices": 32}), [_pool()])
    assert (big.devices, big.reason) == (
        8,
        "resources: the job needs at least 32 devices; the pool has 2 node(s) of 8",
    )
    (ranged,) = quote(_spec(resources={"min_devices": 3, "max_devices": 5}), [_pool(whole_nodes_only=True)])
    assert ranged.reason == "resources: the job needs 3..5 devices; the offer rents whole instances of 8"


def test_quote_ties_break_by_pool_then_devices() -> None:
    opts = quote(_spec(), [_pool(name="b"), _pool(name="a")])
    feasible = [o for o in opts if o.feasible]
    for first, second in zip(feasible[::2], feasible[1::2], strict=True):
        assert (first.pool, second.pool) == ("a", "b") and first.devices == second.devices
    key = Q.sort_key(_spec(objective={"minimize": "time"}))
    fast = QuoteOption(**{**feasible[0].to_contract(), "expected_hours": 1.0, "expected_cost_usd": 9.0})
    cheap = QuoteOption(**{**feasible[0].to_contract(), "expected_hours": 2.0, "expected_cost_usd": 1.0})
    assert sorted([cheap, fast], key=key) == [fast, cheap]
    assert sorted([fast, cheap], key=Q.sort_key(_spec())) == [cheap, fast]


def test_best_option_and_the_most_telling_refusals() -> None:
    def opt(reason: str, step: float, cost: float, feasible: bool = False) -> QuoteOption:
        return QuoteOption(
            accelerator="a100-40gb", devices=1, cloud=None, region="r", instance_type=None,
            market="on_demand", step_time_s=step, price_usd_per_hour=1.0, usd_per_step=0.0,
            expected_hours=0.0, expected_cost_usd=cost, preemption_overhead_usd=0.0,
            checkpoint_interval_s=0.0, feasible=feasible, reason=reason,
        )  # fmt: skip

    ok = opt("", 1.0, 2.0, feasible=True)
    first_b3 = opt("b", 1.0, 3.0)
    options = [
        opt("z", 0.0, 0.0), opt("b", 1.0, 5.0), opt("y", 0.0, 0.0), opt("z", 0.0, 0.0), first_b3, ok,
        opt("a", 1.0, 4.0), opt("c", 0.0, 0.0), opt("c", 1.0, 1.0), opt("a", 0.0, 0.0), opt("b", 1.0, 3.0),
        opt("x", 0.0, 0.0), opt("b", 1.0, 3.5),
    ]  # fmt: skip
    told = Q.telling_infeasible(options)
    # priced refusals first, the cheapest near miss first; then the others, the most common reason first
    # (then by reason); a feasible option in between changes nothing
    assert [(o.reason, o.expected_cost_usd) for o in told] == [
        ("c", 1.0), ("b", 3.0), ("a", 4.0), ("z", 0.0), ("x", 0.0), ("y", 0.0),
    ]  # fmt: skip
    assert told[1] is first_b3  # of two equally near misses, the first
    assert Q.best_option(options) is ok and Q.best_option(options[:3]) is None


def test_the_quotes_prediction_cache_keeps_each_pools_topology() -> None:
    spec = _spec(model={"params_b": 7.0})
    pools = [_pool(name="wide"), _pool(name="narrow", devices_per_node=1, nodes=16, inter_node_gbps=25.0),
             _pool(name="small", memory_per_device_gib=24.0)]  # fmt: skip
    opts = quote(spec, pools)
    by_pool = {p.name: p for p in pools}
    assert {o.pool for o in opts} == {"wide", "narrow", "small"}
    for o in opts:
        alone = option_for(spec, by_pool[o.pool], o.devices)
        assert (o.step_time_s, o.feasible, o.reason) == (alone.step_time_s, alone.feasible, alone.reason), (
            o.pool
        )
    two = {o.pool: o.step_time_s for o in opts if o.devices == 2}
    assert two["wide"] != two["narrow"]  # two devices on one node or across two


def test_without_pools_the_catalog_is_priced_at_the_given_reserved_discount() -> None:
    from trainyard.catalog.offers import catalog_pools, offers_as_pools

    spec = _spec(requirements={"allow": ["a10g"]})

    def prices(options: list[QuoteOption]) -> dict[tuple[str, int], float]:
        return {(o.pool, o.devices): o.price_usd_per_hour for o in options}

    assert prices(quote(spec)) == prices(quote(spec, catalog_pools()))
    deeper = cm.CostParams(reserved_discount=0.6)
    got = prices(quote(spec, params=deeper))
    assert got == prices(quote(spec, offers_as_pools(reserved_discount=0.6), params=deeper))
    assert got != prices(quote(spec))  # the reserved offers are cheaper


def test_an_infeasible_option_names_the_pool_and_prices_nothing() -> None:
    pool = _pool(instance_type="p4d.24xlarge")
    o = option_for(_spec(), pool, 3)
    assert o.to_contract() == {
        "accelerator": "a100-80gb", "devices": 3, "cloud": "aws", "region": "us-east-1",
        "instance_type": "p4d.24xlarge", "market": "on_demand", "step_time_s": 0.0, "price_usd_per_hour": 6.0,
        "usd_per_step": 0.0, "expected_hours": 0.0, "expected_cost_usd": 0.0, "preemption_overhead_usd": 0.0,
        "checkpoint_interval_s": 0.0, "feasible": False,
        "reason": "pool p: 3 devices does not fit 2 x 8 (power-of-two shares of a node or whole nodes)",
    }  # fmt: skip
    assert (o.pool, o.nodes) == ("p", 1)
    none = option_for(_spec(), _pool(), 0)
    assert none.nodes == 0 and none.reason == "resources: 0 devices is outside at least 1"


def test_resuming_loads_the_checkpoint_at_the_given_read_speed_and_provisioning_defaults() -> None:
    spec = _spec()
    ckpt = cm.checkpoint_bytes(spec)
    o = option_for(spec, _pool(interruption_rate_per_hour=0.0), 1, prediction=_pred(), params=PARAMS,
                   elapsed_fraction=0.5)  # fmt: skip
    frac = ckpt / (2.0 * 1e9) / 1800.0
    assert o.expected_hours == pytest.approx((100.0 + ckpt / (4.0 * 1e9) + 250 * (1 + frac)) / 3600)
    # a family without a provisioning time of its own: the default 180 s
    bare = cm.CostParams(storage_write_gb_per_s=2.0, storage_read_gb_per_s=4.0, provisioning_s={})
    d = option_for(spec, _pool(interruption_rate_per_hour=0.0), 1, prediction=_pred(), params=bare)
    assert d.expected_hours == pytest.approx((180.0 + 500 * (1 + frac)) / 3600)
    assert d.restart_s == pytest.approx(180.0 + ckpt / (4.0 * 1e9))


def test_quote_passes_its_settings_to_every_option() -> None:
    from datetime import UTC, datetime

    spec, pools = _spec(), [_pool()]
    assert all("objective.deadline" in o.reason for o in quote(spec, pools, deadline_s=60.0))
    due = _spec(objective={"deadline": "2030-01-01T00:01:00+00:00"})
    assert quote(due, pools)[0].feasible  # cannot be checked without the submission time
    late = quote(due, pools, now=datetime(2030, 1, 1, tzinfo=UTC))
    assert all("objective.deadline" in o.reason for o in late)
    slow = cm.CostParams(provisioning_s={"nvidia": 3600.0})
    assert quote(spec, pools, params=slow)[0].expected_hours > quote(spec, pools)[0].expected_hours
    full = {(o.devices): o.expected_cost_usd for o in quote(spec, pools)}
    half = {(o.devices): o.expected_cost_usd for o in quote(spec, pools, elapsed_fraction=0.5)}
    assert all(half[d] < full[d] for d in full)
    # a pool where no count fits does not end the quote
    opts = quote(_spec(resources={"min_devices": 32}), [_pool(name="small"), _pool(name="big", nodes=4)])
    assert {o.pool for o in opts} == {"small", "big"} and any(o.feasible for o in opts if o.pool == "big")


def test_screening_pinned_intervals_storage_and_small_numbers() -> None:
    denied = option_for(_spec(requirements={"deny": ["nvidia"]}), _pool(), 2)
    assert (denied.reason, denied.devices, denied.pool) == (
        "requirements.deny: a100-80gb (nvidia) is denied",
        2,
        "p",
    )
    # a pinned checkpoint interval is used as given; the cap comes from the params
    pinned = option_for(_spec(checkpoint={"interval": "10m"}), _pool(), 1, prediction=_pred())
    assert pinned.checkpoint_interval_s == 600.0
    capped = option_for(_spec(), _pool(), 1, prediction=_pred(), params=cm.CostParams(max_interval_s=900.0))
    assert capped.checkpoint_interval_s == 900.0
    # a synchronous save writes at the checkpoint URL's speed unless the params give one
    s3 = _spec(checkpoint={"storage": "s3://bucket/ckpt"})
    ckpt = cm.checkpoint_bytes(s3)
    o = option_for(s3, _pool(), 1, prediction=_pred())
    assert o.checkpoint_s == pytest.approx(ckpt / (cm.storage_write_gb_per_s("s3://bucket/ckpt") * 1e9))
    assert cm.storage_write_gb_per_s("s3://bucket/ckpt") != cm.storage_write_gb_per_s(None)
    fast = option_for(s3, _pool(), 1, prediction=_pred(), params=cm.CostParams(storage_write_gb_per_s=7.0))
    assert fast.checkpoint_s == pytest.approx(ckpt / 7e9)
    # a compile time under a second is the predictor's, not the accelerator's typical one
    tpu = _pool(accelerator="tpu-v4", devices_per_node=4, nodes=1)
    assert (
        option_for(_spec(), tpu, 4, prediction=_pred(accelerator="tpu-v4", compile_time_s=0.5)).compile_s
        == 0.5
    )
    # a step time of 0 cannot be priced
    zero = option_for(_spec(), _pool(), 1, prediction=_pred(0.0, 0.0))
    assert not zero.feasible and zero.reason == "does not fit in memory on 1 x a100-80gb"


def test_a_catalog_pool_without_a_price_is_priced_at_the_reserved_discount_given() -> None:
    from trainyard.catalog.offers import catalog_pools

    reserved = next(p for p in catalog_pools() if p.market.value == "reserved" and p.instance_type)
    bare = reserved.model_copy(update={"price_usd_per_device_hour": None})
    d = reserved.devices_per_node
    default = option_for(_spec(), bare, d).price_usd_per_hour
    deeper = option_for(_spec(), bare, d, params=cm.CostParams(reserved_discount=0.6)).price_usd_per_hour
    assert deeper == pytest.approx(default * (1 - 0.6) / (1 - 0.35))
    # refused after pricing, the option still carries the catalog's price
    tight = option_for(_spec(), bare, d, prediction=_pred(fits=False))
    assert not tight.feasible and tight.price_usd_per_hour == default


def test_deadline_reasons_round_hours_and_minutes_at_one_hour() -> None:
    def w(p90: float, wall: float) -> Q.WorkPricing:
        return Q.WorkPricing(
            billed_s=wall, wall_s=wall, wall_p90_s=p90, cost_usd=1.0, checkpoint_frac=0.0,
            preemption_frac=0.0, checkpoint_overhead_usd=0.0, preemption_overhead_usd=0.0,
        )  # fmt: skip

    kw = dict(rate_h=0.0, restart_s=0.0, interval_s=600.0, params=cm.DEFAULT_PARAMS)
    assert Q.work_reason(_spec(), Q.SpecFacts(1000, 1e9, 3600.0), 1, w(3781.0, 3600.0), **kw) == (
        "objective.deadline: p90 step time wall time 1.1 h exceeds the deadline 1.0 h (expected 1.0 h)"
    )


def test_a_given_accelerator_is_used_as_given() -> None:
    from dataclasses import replace

    small = replace(get_accelerator("a100-80gb"), memory_gib=40.0)
    assert Q.pool_accelerator(_pool(), small).memory_gib == 40.0
    spec = _spec(resources={"min_memory_per_device_gib": 60})
    refused = "resources.min_memory_per_device_gib: a100-80gb has 40 GiB < 60 GiB"
    assert Q.eligibility_reason(spec, _pool(), small) == refused
    assert option_for(spec, _pool(), 1, accelerator=small).reason == refused
    # a pool without a cloud matches only its region
    assert Q.eligibility_reason(
        _spec(requirements={"regions": ["*/us-east-1"]}), _pool(cloud=None)
    ).startswith("requirements.regions")
    # an absolute deadline is checked against the clock given
    from datetime import UTC, datetime

    soon = _spec(objective={"deadline": "2030-01-01T00:01:00+00:00"})
    late = option_for(soon, _pool(), 1, prediction=_pred(), now=datetime(2030, 1, 1, tzinfo=UTC))
    assert late.reason.startswith("objective.deadline")
    # the option keeps the prediction it was priced from
    pred = _pred()
    assert option_for(_spec(), _pool(), 1, prediction=pred).prediction is pred
