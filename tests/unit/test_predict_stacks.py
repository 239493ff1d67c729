"""The stack-aware plan space: each accelerator's software stack says which parallelisms the planner may
use (CUDA: FSDP, tensor, pipeline, data; XLA on TPU: FSDP and tensor sharding, data parallel across
slices, no pipeline; Neuron on Trainium: tensor, pipeline and data parallel with ZeRO-1, no FSDP), in the
one-by-one and the batch paths alike."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.catalog.accelerators import get_accelerator, load_accelerators
from trainyard.predict import predict, predict_grouped, predict_many
from trainyard.predict.calib_data import packaged_rows
from trainyard.predict.engine import FSDP_NONE, Pins, Topology, enumerate_candidates
from trainyard.predict.model import _candidates, _context
from trainyard.predict.params import STACK_PLAN_SPACE, default_calibration, plan_space_of, stack_of
from trainyard.spec.models import JobSpec

ACCS = sorted(a for a in load_accelerators() if a != "cpu")
TPUS = [a for a in ACCS if get_accelerator(a).family == "google-tpu"]
TRAINIUM = [a for a in ACCS if get_accelerator(a).family == "aws-trainium"]
GPUS = [a for a in ACCS if get_accelerator(a).family == "nvidia"]


def _spec(
    layers: int, d_mult: int, heads: int, seq: int, batch: int, pin: dict[str, Any] | None = None
) -> JobSpec:
    wl: dict[str, Any] = {"seq_len": seq, "global_batch": batch, "steps": 10}
    if pin:
        wl["parallelism"] = pin
    model = {
        "n_layers": layers,
        "d_model": 128 * d_mult,
        "n_heads": heads,
        "ffn": "gated",
        "vocab_size": 32000,
    }
    return JobSpec.model_validate({"name": "t", "model": model, "workload": wl})


def _all_plans(spec: JobSpec, acc: str, devices: int) -> dict[str, np.ndarray]:
    a = get_accelerator(acc)
    ctx, _, _, _ = _context(
        spec,
        a,
        devices_per_node=None,
        inter_node_gbps=None,
        calibration=default_calibration(),
        stack=None,
        plan=None,
    )
    return _candidates(ctx, devices)[1]


spec_st = st.builds(
    _spec,
    st.integers(4, 96),
    st.sampled_from([8, 16, 32, 64, 128]),
    st.sampled_from([8, 16, 32, 64]),
    st.sampled_from([1024, 2048, 4096]),
    st.sampled_from([8, 64, 512, 1024]),
)
devices_st = st.sampled_from([1, 2, 16, 64, 128, 512, 1024])


def test_stack_table() -> None:
    assert stack_of(get_accelerator("trn1")) == "neuron"
    assert stack_of(get_accelerator("tpu-v5p")) == "xla"
    assert stack_of(get_accelerator("h100")) == "cuda"
    neuron, xla, cuda = STACK_PLAN_SPACE["neuron"], STACK_PLAN_SPACE["xla"], STACK_PLAN_SPACE["cuda"]
    assert not neuron.fsdp and neuron.pipeline and neuron.tensor and neuron.zero1
    assert xla.fsdp and xla.tensor and not xla.pipeline
    assert cuda.fsdp and cuda.tensor and cuda.pipeline
    assert plan_space_of("some-new-stack").fsdp and plan_space_of("some-new-stack").pipeline


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=spec_st, acc=st.sampled_from(TRAINIUM), devices=devices_st)
def test_neuron_plans_never_use_fsdp(spec: JobSpec, acc: str, devices: int) -> None:
    cand = _all_plans(spec, acc, devices)
    if cand:
        assert (cand["scope"] == FSDP_NONE).all() and (cand["shard"] == 1).all()
    p = predict(spec, get_accelerator(acc), devices, search_min_devices=False)
    if p.plan:
        assert p.plan["fsdp"] is False and p.plan["fsdp_scope"] == "none"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=spec_st, acc=st.sampled_from(TPUS), devices=devices_st)
def test_tpu_plans_never_use_pipeline_parallelism(spec: JobSpec, acc: str, devices: int) -> None:
    cand = _all_plans(spec, acc, devices)
    if cand:
        assert (cand["pp"] == 1).all()
    p = predict(spec, get_accelerator(acc), devices, search_min_devices=False)
    if p.plan:
        assert p.plan["pipeline"] == 1


def test_cuda_keeps_every_parallelism() -> None:
    spec = _spec(80, 64, 64, 4096, 1024)
    cand = _all_plans(spec, "h100", 256)
    assert (cand["pp"] > 1).any() and (cand["tp"] > 1).any() and (cand["scope"] != FSDP_NONE).any()
    # the same model on Trainium: tensor and pipeline, never FSDP; on TPU: FSDP and tensor, never pipeline
    trn = _all_plans(spec, "trn1", 256)
    assert (trn["pp"] > 1).any() and (trn["tp"] > 1).any() and not (trn["scope"] != FSDP_NONE).any()
    tpu = _all_plans(spec, "tpu-v5p", 256)
    assert (tpu["scope"] != FSDP_NONE).any() and (tpu["tp"] > 1).any() and not (tpu["pp"] > 1).any()


def test_enumeration_inside_a_space_is_the_full_space_filtered() -> None:
    """The narrowed space is exactly the full space's plans that use only what the stack runs."""
    topo = Topology(64, 16, 16, 100.0, 10.0, 16)
    for name, space in STACK_PLAN_SPACE.items():
        full = enumerate_candidates(topo, 256, 32, 32, Pins())
        got = enumerate_candidates(topo, 256, 32, 32, Pins(), 1, space)
        keep = np.ones(len(full["tp"]), dtype=bool)
        if not space.fsdp:
            keep &= full["scope"] == FSDP_NONE
        if not space.pipeline:
            keep &= full["pp"] == 1
        if not space.tensor:
            keep &= full["tp"] == 1
        for k in ("tp", "pp", "dp", "scope", "shard", "ck", "mb"):
            assert np.array_equal(got[k], full[k][keep]), (name, k)


@pytest.mark.parametrize(
    ("acc", "pin", "needle"),
    [
        ("trn1", {"fsdp": True}, "FSDP is not in the neuron stack's plan space"),
        ("tpu-v5p", {"pipeline": 4}, "pipeline parallel 4 is not in the xla stack's plan space"),
        ("tpu-v4", {"pipeline": 2, "tensor": 4}, "pipeline parallel 2 is not in the xla stack's plan space"),
    ],
)
def test_a_pin_outside_the_stack_has_no_plan_and_says_why(acc: str, pin: dict[str, Any], needle: str) -> None:
    spec = _spec(32, 32, 32, 2048, 256, pin)
    p = predict(spec, get_accelerator(acc), 64)
    assert not p.fits and p.step_time_s == float("inf") and needle in p.reason
    # the same pin is fine on CUDA
    assert predict(spec, get_accelerator("h100"), 64).fits


def test_neuron_data_parallel_shards_the_optimizer_states() -> None:
    """ZeRO-1 by default on Neuron: fp32 master weights and moments over the replicas."""
    spec = _spec(32, 32, 32, 2048, 256, {"tensor": 2, "pipeline": 1})
    a = get_accelerator("trn1")
    zero1 = predict(spec, a, 32, search_min_devices=False)
    plain = predict(spec, a, 32, plan={"distributed_optimizer": False}, search_min_devices=False)
    assert zero1.plan["data"] == 16 and zero1.plan["fsdp"] is False
    assert zero1.breakdown["memory_states_gib"] < plain.breakdown["memory_states_gib"] / 3


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(spec_st, min_size=1, max_size=4),
    acc=st.sampled_from([*TPUS, *TRAINIUM]),
    counts=st.lists(devices_st, min_size=1, max_size=4, unique=True),
)
def test_batch_paths_stay_inside_the_space_and_equal_one_by_one(
    specs: list[JobSpec], acc: str, counts: list[int]
) -> None:
    a = get_accelerator(acc)
    grouped = predict_grouped([(s, counts) for s in specs], a, search_min_devices=False)
    for s, preds in zip(specs, grouped, strict=True):
        many = predict_many(s, [a], counts, search_min_devices=False)
        for n, g, m in zip(counts, preds, many, strict=True):
            one = predict(s, a, n, search_min_devices=False)
            assert g.plan == m.plan == one.plan
            assert g.step_time_s == m.step_time_s == one.step_time_s
            if one.plan and a.family == "aws-trainium":
                assert one.plan["fsdp"] is False
            if one.plan and a.family == "google-tpu":
                assert one.plan["pipeline"] == 1


def test_planner_on_published_neuron_runs_picks_tensor_and_pipeline_near_the_measured_time() -> None:
    """Left to choose on 512 Trainium chips (the published runs' size), the planner runs Neuron's kind of
    plan (tensor and pipeline parallel, no FSDP) and its step time stays near Neuron's measured one (it used
    to pick full FSDP over all 512 chips)."""
    rows = [r for r in packaged_rows()[0] if r.family == "aws-trainium"]
    assert len(rows) == 4
    for r in rows:
        keep = {k: v for k, v in r.plan.items() if k == "bf16_states"}
        p = predict(r.spec, get_accelerator(r.accelerator), r.devices, plan=keep or None)
        assert p.fits and p.plan["fsdp"] is False
        assert p.plan["tensor"] > 1 or p.plan["pipeline"] > 1 or p.plan["data"] == r.devices
        assert 0.8 < p.step_time_s / r.measured_step_time_s < 1.25, (r.model_name, p.step_time_s)


def test_published_tpu_and_neuron_rows_replay_inside_their_stack() -> None:
    for r in packaged_rows()[0]:
        if r.stack == "neuron":
            assert r.plan["fsdp"] is False and r.plan["distributed_optimizer"] is True
        if r.stack == "xla":
            assert r.plan.get("pipeline", 1) == 1
