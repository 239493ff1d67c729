"""Predictor: workload math, memory model, planner invariants, monotonicity, calibration and feedback."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from trainyard.catalog.accelerators import get_accelerator, load_accelerators
from trainyard.predict import Calibration, default_calibration, predict, predict_grouped, predict_many
from trainyard.predict.calib_data import maxtext_training_flops, packaged_rows
from trainyard.predict.fit import fit_calibration, ingest_measurement
from trainyard.predict.workload import (
    activation_bytes_per_token_per_layer,
    forward_flops_per_token,
    korthikanti_activation_bytes_per_layer,
    shape_of,
    training_flops_per_step,
    workload_of,
)
from trainyard.spec.models import JobSpec


def make_spec(model: dict[str, Any] | None = None, **workload: Any) -> JobSpec:
    wl = {"seq_len": 2048, "global_batch": 32}
    wl.update(workload)
    if not {"steps", "tokens", "epochs"} & set(wl):
        wl["steps"] = 100
    m = model or {
        "n_layers": 16,
        "d_model": 2048,
        "n_heads": 16,
        "n_kv_heads": 8,
        "d_ff": 5632,
        "ffn": "gated",
        "vocab_size": 32000,
    }
    return JobSpec.model_validate({"name": "t", "model": m, "workload": wl})


GPT3 = {"n_layers": 96, "d_model": 12288, "n_heads": 96, "ffn": "mlp", "vocab_size": 50257}


# ---- workload math ------------------------------------------------------------------------------------


def test_gpt3_175b_training_flops_for_300b_tokens() -> None:
    spec = make_spec(GPT3, seq_len=2048, global_batch=1536, tokens=300 * 10**9)
    total = training_flops_per_step(spec) * spec.total_steps
    # Brown et al. 2020 / Kaplan: 6·N·D = 6 · 175e9 · 300e9 ≈ 3.14e23 (attention adds ~1-2 %).
    assert spec.params == pytest.approx(175e9, rel=0.01)
    assert total == pytest.approx(3.14e23, rel=0.03)
    assert total > 6 * spec.params * spec.total_tokens  # attention is on top of 6N


def test_component_flops_match_hand_computation_with_gqa() -> None:
    spec = make_spec(seq_len=1024)
    f = forward_flops_per_token(shape_of(spec.model), 1024)
    L, d, hd = 16, 2048, 128
    assert f.qkv == L * 2 * d * (16 * hd + 2 * 8 * hd)
    assert f.attn_out == L * 2 * (16 * hd) * d
    assert f.attn_scores == L * 4 * 1024 * (16 * hd) * 0.5  # causal
    assert f.ffn == L * 3 * 2 * d * 5632
    assert f.logits == 2 * d * 32000
    # Without attention and logits, forward FLOPs are 2 x the block parameters (norms excluded).
    blocks = spec.model.n_layers * (spec.model.block_params() - 2 * d)  # type: ignore[operator]
    assert f.blocks_matmul == 2 * blocks


def test_moe_counts_active_experts_only() -> None:
    dense = make_spec({**GPT3, "n_layers": 4})
    moe = make_spec({**GPT3, "n_layers": 4, "n_experts": 8, "experts_per_token": 2})
    fd = forward_flops_per_token(shape_of(dense.model), 2048)
    fm = forward_flops_per_token(shape_of(moe.model), 2048)
    assert fm.ffn == pytest.approx(2 * fd.ffn + 4 * 2 * 12288 * 8)  # two experts plus the router
    assert moe.params > 3 * dense.params  # all eight experts are stored


def test_lora_has_no_weight_gradient_flops() -> None:
    full = make_spec()
    lora = make_spec(method="lora", lora_rank=8)
    wf, wl = workload_of(full), workload_of(lora)
    ratio = (
        wl.flops(full.workload.activation_checkpointing).matmul_model
        / wf.flops(full.workload.activation_checkpointing).matmul_model
    )
    assert 0.66 < ratio < 0.70  # 2x forward (+ small adapters) instead of 3x
    assert wl.trainable < 0.01 * wl.params
    assert wl.states.optimizer == wl.trainable * 8  # AdamW state only for the adapters


def test_recompute_adds_forward_flops() -> None:
    w = workload_of(make_spec())
    from trainyard.spec.models import ActivationCheckpointing as AC

    none, sel, full = (w.flops(AC.NONE), w.flops(AC.SELECTIVE), w.flops(AC.FULL))
    assert none.hardware == none.model
    assert sel.hardware == pytest.approx(none.model + w.fwd.attn_scores)
    assert full.hardware == pytest.approx(none.model + w.fwd.blocks_matmul + w.fwd.attn_scores)


def test_maxtext_flop_accounting_matches_reported_tflops() -> None:
    # MaxText 32B on v5e: 125 TFLOP/s/chip and MFU 63.67 % of 197 (row 71 of the calibration data).
    f = maxtext_training_flops(
        batch=1, seq=2048, emb=8192, mlp=28672, q_heads=64, kv_heads=64, head_dim=128, layers=32, vocab=32000
    )
    assert f / 2048 == pytest.approx(6 * 32e9 * 1.1, rel=0.15)


# ---- memory model -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("s", "h", "a", "t"), [(2048, 12288, 96, 8), (2048, 20480, 128, 8), (2048, 4096, 32, 1)]
)
def test_activation_memory_reproduces_korthikanti(s: int, h: int, a: int, t: int) -> None:
    b = 1
    # Korthikanti et al. 2022, eq. (2) / section 4: 34·sbh + 5·a·s²·b bytes per layer (fp16, dropout).
    paper_none = s * b * h * (34 + 5 * a * s / h)
    assert korthikanti_activation_bytes_per_layer(s, b, h, a) == pytest.approx(paper_none)
    assert korthikanti_activation_bytes_per_layer(s, b, h, a, t) == pytest.approx(paper_none / t)
    assert korthikanti_activation_bytes_per_layer(s, b, h, a, t, sequence_parallel=False) == pytest.approx(
        s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    )
    assert korthikanti_activation_bytes_per_layer(s, b, h, a, t, "selective") == pytest.approx(
        34 * s * b * h / t
    )
    assert korthikanti_activation_bytes_per_layer(s, b, h, a, 1, "full") == pytest.approx(2 * s * b * h)
    # The generalised accounting used by the predictor gives the same number for a GPT-style layer.
    spec = make_spec({"n_layers": 1, "d_model": h, "n_heads": a, "ffn": "mlp", "vocab_size": 1000}, seq_len=s)
    per_tok, scores = activation_bytes_per_token_per_layer(
        shape_of(spec.model), s, 2.0, flash=False, dropout=True
    )
    assert (per_tok + scores) * s * b == pytest.approx(paper_none)


def test_mixed_precision_adam_is_16_bytes_per_parameter_unsharded() -> None:
    w = workload_of(make_spec())
    assert w.states.total == pytest.approx(16 * w.params)


def test_fits_false_names_reason_and_smallest_device_count_that_fits() -> None:
    spec = make_spec(
        {
            "n_layers": 80,
            "d_model": 8192,
            "n_heads": 64,
            "n_kv_heads": 8,
            "d_ff": 28672,
            "ffn": "gated",
            "vocab_size": 128256,
        },
        seq_len=4096,
        global_batch=256,
    )
    acc = get_accelerator("a100-80gb")
    p = predict(spec, acc, 1)
    assert not p.fits and "GiB" in p.reason and p.min_devices_to_fit is not None
    assert str(p.min_devices_to_fit) in p.reason
    assert predict(spec, acc, p.min_devices_to_fit).fits
    assert not predict(spec, acc, p.min_devices_to_fit - 1).fits


# ---- planner invariants -------------------------------------------------------------------------------

ACCS = [a for a in load_accelerators().values() if a.name != "cpu"]

spec_strategy = st.builds(
    lambda layers, d_mult, heads, seq, batch, prec, method: make_spec(
        {
            "n_layers": layers,
            "d_model": 128 * d_mult * heads // heads * 1,
            "n_heads": heads,
            "ffn": "gated",
            "vocab_size": 32000,
        },
        seq_len=seq,
        global_batch=batch,
        precision=prec,
        method=method,
    ),
    st.integers(2, 96),
    st.sampled_from([4, 8, 16, 32, 64, 96]),
    st.sampled_from([8, 16, 32]),
    st.sampled_from([512, 2048, 8192]),
    st.sampled_from([1, 8, 64, 512]),
    st.sampled_from(["bf16-mixed", "fp32", "fp8-mixed"]),
    st.sampled_from(["full", "lora"]),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=spec_strategy, acc=st.sampled_from(ACCS), devices=st.sampled_from([1, 2, 3, 8, 16, 64, 256]))
def test_a_plan_reported_as_fitting_fits(spec: JobSpec, acc: Any, devices: int) -> None:
    p = predict(spec, acc, devices, search_min_devices=False)
    if p.fits:
        assert p.memory_per_device_gib <= p.memory_capacity_gib
        plan = p.plan
        assert plan["data"] * plan["tensor"] * plan["pipeline"] * plan["context"] == devices
        assert plan["tensor"] <= acc.max_devices_per_node or acc.family == "google-tpu"
        assert plan["micro_batch"] * plan["grad_accum"] * plan["data"] >= spec.workload.global_batch
        assert p.step_time_s > 0 and 0 < p.mfu < 1
        assert p.step_time_p10_s <= p.step_time_s <= p.step_time_p90_s
    else:
        assert p.reason


@settings(max_examples=25, deadline=None)
@given(
    tensor=st.sampled_from([1, 2, 4, 8]),
    pipeline=st.sampled_from([1, 2, 4]),
    fsdp=st.booleans(),
    mb=st.sampled_from([1, 2, 4]),
    ck=st.sampled_from(["none", "selective", "full"]),
)
def test_pins_are_respected(tensor: int, pipeline: int, fsdp: bool, mb: int, ck: str) -> None:
    spec = make_spec(
        parallelism={"fsdp": fsdp, "tensor": tensor, "pipeline": pipeline},
        micro_batch=mb,
        activation_checkpointing=ck,
        global_batch=64,
    )
    p = predict(spec, get_accelerator("h100"), 32, search_min_devices=False)
    assert p.plan["tensor"] == tensor and p.plan["pipeline"] == pipeline
    assert p.plan["fsdp"] == (fsdp and p.plan["data"] > 1)
    # A pinned micro-batch larger than a replica's share of the batch is clamped to that share.
    assert p.plan["micro_batch"] == min(mb, -(-64 // p.plan["data"]))
    assert p.plan["activation_checkpointing"] == ck


def test_tensor_parallel_never_crosses_a_node() -> None:
    spec = make_spec(parallelism={"tensor": 16})
    p = predict(spec, get_accelerator("h100"), 32)
    assert not p.fits and "node" in p.reason
    auto = predict(make_spec(GPT3, global_batch=8), get_accelerator("a100-80gb"), 64)
    assert auto.plan["tensor"] <= 8


# ---- monotonicity -------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(spec=spec_strategy, acc=st.sampled_from(ACCS), k=st.integers(1, 6))
def test_more_devices_never_increase_memory_per_device(spec: JobSpec, acc: Any, k: int) -> None:
    """With the memory-relevant choices pinned (FSDP on, micro-batch 1, full recomputation), doubling the
    devices never raises memory per device. (An unpinned plan may spend freed memory on a larger
    micro-batch, and one device has no FSDP gather buffers, hence the pins and k >= 1.)"""
    doc = spec.to_document()
    doc["workload"].update(micro_batch=1, activation_checkpointing="full", parallelism={"fsdp": True})
    pinned = JobSpec.model_validate(doc)
    a = predict(pinned, acc, 2**k, search_min_devices=False)
    b = predict(pinned, acc, 2 ** (k + 1), search_min_devices=False)
    if math.isfinite(a.memory_per_device_gib) and math.isfinite(b.memory_per_device_gib):
        assert b.memory_per_device_gib <= a.memory_per_device_gib * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(
    spec=spec_strategy,
    acc=st.sampled_from(ACCS),
    devices=st.sampled_from([1, 4, 16, 64]),
    factor=st.sampled_from([2, 3, 8]),
)
def test_larger_batch_never_lowers_step_time(spec: JobSpec, acc: Any, devices: int, factor: int) -> None:
    """Holds whenever the smaller batch can already occupy every device with data parallelism (a batch
    smaller than the device count forces tensor/pipeline parallelism, which a larger batch may avoid)."""
    assume(devices <= spec.workload.global_batch)
    big = JobSpec.model_validate(
        {
            **spec.to_document(),
            "workload": {
                **spec.workload.model_dump(mode="json", exclude_none=True),
                "global_batch": spec.workload.global_batch * factor,
            },
        }
    )
    a = predict(spec, acc, devices, search_min_devices=False)
    b = predict(big, acc, devices, search_min_devices=False)
    if a.fits and b.fits:
        assert b.step_time_s >= a.step_time_s * (1 - 1e-9)


# ---- calibration, uncertainty and feedback -------------------------------------------------------------


def test_packaged_calibration_predicts_published_rows_in_sample() -> None:
    rows, _ = packaged_rows()
    errs = []
    for r in rows:
        p = predict(
            r.spec,
            get_accelerator(r.accelerator),
            r.devices,
            plan=r.plan,
            stack=r.stack,
            fast_domain_devices=r.fast_domain_devices,
            inter_node_gbps=r.inter_node_gbps,
            search_min_devices=False,
        )
        errs.append(abs(p.step_time_s / r.measured_step_time_s - 1))
    errs.sort()
    assert errs[len(errs) // 2] < 0.10


def test_fit_recovers_parameters_on_a_group() -> None:
    rows, _ = packaged_rows()
    tpu = [r for r in rows if r.family == "google-tpu"]
    v6e = [r for r in tpu if r.accelerator == "tpu-v6e"]
    cal = fit_calibration([r for r in tpu if r.accelerator != "tpu-v6e"] + v6e[:2])
    assert "google-tpu/xla/bf16" in cal.params
    p, note = cal.lookup("google-tpu", "xla", "bf16", "tpu-v5p")
    assert not note and p.n_rows == 5  # v5p has enough rows of its own (MIN_ROWS_ACCELERATOR)
    assert 0.3 < p.mm_max < 0.98
    p, note = cal.lookup("google-tpu", "xla", "bf16", "tpu-v6e")
    assert note  # two v6e rows are too few: group parameters with a note
    assert 0.3 < p.mm_max < 0.98


def test_unmeasured_family_falls_back_with_a_note_and_wider_band() -> None:
    spec = make_spec()
    amd = predict(spec, get_accelerator("mi300x"), 8)
    nv = predict(spec, get_accelerator("a100-80gb"), 8)
    assert amd.source == "prior" and any("no measurements" in n for n in amd.notes)
    assert nv.source == "calibrated"
    width = lambda p: p.step_time_p90_s / p.step_time_p10_s  # noqa: E731
    assert width(amd) > width(nv)


def test_feedback_moves_prediction_toward_measurement_and_is_pure() -> None:
    spec = make_spec()
    acc = get_accelerator("h100")
    cal = default_calibration()
    before = predict(spec, acc, 8, calibration=cal).step_time_s
    measured = before * 1.5
    cal2 = ingest_measurement(cal, spec, acc, 8, measured)
    after = predict(spec, acc, 8, calibration=cal2).step_time_s
    assert before < after < measured
    cal3 = ingest_measurement(ingest_measurement(cal2, spec, acc, 8, measured), spec, acc, 8, measured)
    assert after < predict(spec, acc, 8, calibration=cal3).step_time_s < measured
    assert cal.corrections == {} and len(cal3.measurements) == 3
    assert predict(spec, get_accelerator("a100-80gb"), 8, calibration=cal3).step_time_s == pytest.approx(
        predict(spec, get_accelerator("a100-80gb"), 8, calibration=cal).step_time_s
    )
    doc = json.loads(json.dumps(cal3.to_document()))
    assert Calibration.from_document(doc) == cal3
    with pytest.raises(ValueError):
        ingest_measurement(cal, spec, acc, 8, -1.0)


def test_spec_measured_step_time_overrides_prediction() -> None:
    spec = JobSpec.model_validate({**make_spec().to_document(), "measured": {"step_time_s": {"h100": 0.42}}})
    assert predict(spec, get_accelerator("h100"), 1).step_time_s == pytest.approx(0.42)
    p8 = predict(spec, get_accelerator("h100"), 8)
    assert p8.source == "measured" and p8.step_time_s < 0.42


def test_compile_time_is_reported_separately() -> None:
    spec = make_spec()
    tpu = predict(spec, get_accelerator("tpu-v5e"), 8)
    trn = predict(spec, get_accelerator("trn1"), 16)
    gpu = predict(spec, get_accelerator("h100"), 8)
    assert tpu.compile_time_s > 0 and trn.compile_time_s > 0 and gpu.compile_time_s == 0
    assert replace(tpu, compile_time_s=0).step_time_s == tpu.step_time_s


def test_contract_document_has_exactly_the_design_keys() -> None:
    doc = predict(make_spec(), get_accelerator("a100-40gb"), 4).to_contract()
    assert list(doc) == [
        "accelerator",
        "devices",
        "step_time_s",
        "tokens_per_s",
        "mfu",
        "memory_per_device_gib",
        "fits",
        "plan",
        "reason",
    ]


# ---- CLI contracts ------------------------------------------------------------------------------------


def test_cli_single_and_batch_json(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from trainyard.cli.main import app

    spec_path = tmp_path / "s.json"
    spec_path.write_text(json.dumps(make_spec().to_document()))
    runner = CliRunner()
    r = runner.invoke(app, ["predict", str(spec_path), "--accelerator", "h100", "--devices", "8", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["accelerator"] == "h100" and doc["devices"] == 8 and doc["fits"] is True
    batch = tmp_path / "b.jsonl"
    lines = [
        {"spec": make_spec().to_document(), "accelerator": "a100-80gb", "devices": 4},
        {"spec": make_spec().to_document(), "accelerator": "no-such-chip", "devices": 4},
        "not json",
        {"spec": str(spec_path), "accelerator": "tpu-v5e", "devices": 8},
    ]
    batch.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    r = runner.invoke(app, ["predict", "--batch", str(batch), "--json"])
    assert r.exit_code == 0, r.output
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(out) == 4
    assert out[0]["accelerator"] == "a100-80gb" and "error" in out[1] and "error" in out[2]
    assert out[3]["accelerator"] == "tpu-v5e"
    r = runner.invoke(app, ["predict", str(tmp_path / "missing.yaml"), "--accelerator", "h100", "--json"])
    assert r.exit_code == 2


def test_predict_many_equals_one_by_one() -> None:
    spec = make_spec(global_batch=16)
    accs = [get_accelerator(n) for n in ("h100", "tpu-v5e", "t4", "cpu")]
    counts = [1, 2, 3, 8, 32]
    many = predict_many(spec, accs, counts)
    one = [predict(spec, a, n) for a in accs for n in counts]
    assert [p.to_dict() for p in many] == [p.to_dict() for p in one]


@pytest.mark.parametrize("min_devices", [1, 2, 4])
def test_predict_many_with_measured_step_times_equals_one_by_one(min_devices: int) -> None:
    """A measured step time scales to the other counts from its reference count's prediction; the batch
    takes that prediction from its own pass (the reference count is among the counts, or is not)."""
    base = make_spec(global_batch=16)
    spec = base.model_copy(
        update={
            "measured": base.measured.model_copy(update={"step_time_s": {"h100": 0.7, "t4": 4.0}}),
            "resources": base.resources.model_copy(update={"min_devices": min_devices}),
        }
    )
    accs = [get_accelerator(n) for n in ("h100", "t4", "tpu-v5e")]
    for counts in ([1, 2, 4, 8, 16], [8, 3, 32]):
        many = predict_many(spec, accs, counts, devices_per_node=8, inter_node_gbps=100.0)
        one = [predict(spec, a, n, devices_per_node=8, inter_node_gbps=100.0) for a in accs for n in counts]
        assert [p.to_dict() for p in many] == [p.to_dict() for p in one]
        assert any(p.source == "measured" for p in many)


def test_plan_enumeration_is_shared_by_models_it_cannot_tell_apart() -> None:
    """The memo of plan enumeration keys on min(layers, 16) and the power-of-two part of the head count
    (up to 64) unless pins fix the pipeline or tensor degree; the plans equal the full key's."""
    from itertools import product

    import numpy as np

    from trainyard.predict.engine import Pins, Topology, _enumerate_candidates, enumerate_candidates

    full = _enumerate_candidates.__wrapped__
    pins_cases = [Pins(), Pins(pipeline=4), Pins(tensor=2), Pins(fsdp=True), Pins(micro_batch=2)]
    for devices, per_node, batch, layers, heads, pins in product(
        [1, 2, 3, 8, 24, 64], [1, 8], [1, 3, 64, 512], [1, 3, 16, 17, 40], [1, 12, 40, 96, 192], pins_cases
    ):
        topo = Topology(devices, per_node, per_node, 100.0, 10.0, min(per_node, devices))
        got = enumerate_candidates(topo, batch, layers, heads, pins)
        want = full(topo, batch, layers, heads, pins, 1)
        assert got.keys() == want.keys()
        for k in want:
            assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k])
    deep = Topology(16, 8, 8, 100.0, 10.0, 8)
    assert enumerate_candidates(deep, 64, 40, 96, Pins()) is enumerate_candidates(deep, 64, 24, 32, Pins())


def test_predict_grouped_equals_predict_many_per_spec() -> None:
    """Many specs' plans in one pass (dense models of one method and precision share it; MoE, FP8 and
    pinned replays go alone) give each spec's own predictions."""
    moe = {"n_layers": 8, "d_model": 1024, "n_heads": 8, "vocab_size": 32000, "n_experts": 8,
           "experts_per_token": 2}  # fmt: skip
    specs = [
        make_spec(global_batch=16),
        make_spec(global_batch=64, seq_len=1024),
        make_spec({"architecture": "custom", "params_b": 0.7}, global_batch=32),
        make_spec({"architecture": "custom", "params_b": 7.0}, global_batch=8, method="lora"),
        make_spec({"architecture": "custom", "params_b": 2.0}, global_batch=32, precision="fp32"),
        make_spec({"architecture": "custom", "params_b": 2.0}, global_batch=32, precision="fp8-mixed"),
        make_spec(moe, global_batch=32),
        make_spec(global_batch=32, parallelism={"fsdp": True, "tensor": 2, "pipeline": 1}),
        make_spec({"architecture": "custom", "params_b": 40.0}, global_batch=8),
    ]
    measured = specs[2].model_copy(
        update={
            "measured": specs[2].measured.model_copy(update={"step_time_s": {"h100": 0.3, "tpu-v5e": 0.9}}),
            "resources": specs[2].resources.model_copy(update={"min_devices": 2}),
        }
    )
    specs.append(measured)
    for name, topology in (
        ("h100", {"devices_per_node": 8, "inter_node_gbps": 100.0}),
        ("tpu-v5e", {"fast_domain_devices": 8, "inter_node_gbps": None}),
        ("t4", {"devices_per_node": 4}),
    ):
        acc = get_accelerator(name)
        items = [(s, [1, 2, 4, 8, 16][i % 3 :]) for i, s in enumerate(specs)]
        grouped = predict_grouped(items, acc, **topology)
        for (s, counts), got in zip(items, grouped, strict=True):
            want = predict_many(s, [acc], counts, **topology)
            assert [p.to_dict() for p in got] == [p.to_dict() for p in want]
        assert any(p.fits for g in grouped for p in g) and any(not p.fits for g in grouped for p in g)


def test_cpu_calibration_from_profiles_recovers_known_parameters() -> None:
    from trainyard.predict.fit import calibrate_from_profiles
    from trainyard.predict.params import PRIORS

    device = {"matmul_flops": 5e10, "matmul_flops_fp32": 5e10, "mem_bw_bytes_s": 1.5e10}
    peaks = {"cpu": {"fp32_flops": 5e10, "bf16_flops": 5e10, "fp16_flops": 5e10, "mem_bw_bytes_s": 1.5e10}}
    truth = Calibration(
        params={"cpu/torch-cpu/fp32": replace(PRIORS["cpu"], mm_max=0.4, step_overhead_s=0.02)},
        peaks_override=peaks,
    )
    cpu = get_accelerator("cpu")

    def cfg(layers: int, batch: int) -> JobSpec:
        return make_spec(
            {
                "n_layers": layers,
                "d_model": 128,
                "n_heads": 4,
                "n_kv_heads": 2,
                "ffn": "gated",
                "vocab_size": 1024,
            },
            precision="fp32",
            seq_len=128,
            global_batch=batch,
            micro_batch=batch,
            activation_checkpointing="none",
        )

    profiles = [
        {
            "spec": s.to_document(),
            "accelerator": "cpu",
            "device": device,
            "plan": {"micro_batch": s.workload.global_batch, "activation_checkpointing": "none"},
            "step_time_s": predict(s, cpu, 1, calibration=truth).step_time_s,
        }
        for s in (cfg(2, 4), cfg(4, 8))
    ]
    cal = calibrate_from_profiles(profiles)
    fitted = cal.params["cpu/torch-cpu/fp32/cpu"]
    assert fitted.mm_max == pytest.approx(0.4, rel=1e-3)
    assert fitted.step_overhead_s == pytest.approx(0.02, rel=1e-3)
    unseen = cfg(6, 16)
    assert predict(unseen, cpu, 1, calibration=cal).step_time_s == pytest.approx(
        predict(unseen, cpu, 1, calibration=truth).step_time_s, rel=1e-3
    )
    assert predict(unseen, cpu, 1, calibration=cal).source == "calibrated"


# ---- custom models without seq_len (CNNs, recommenders): FLOPs and memory per sample --------------------


def _custom(params_b: float, batch: int, **workload: Any) -> JobSpec:
    from trainyard.spec import spec_from_dict

    return spec_from_dict(
        {
            "name": "cnn",
            "model": {"architecture": "custom", "params_b": params_b},
            "workload": {"global_batch": batch, "steps": 10, **workload},
        }
    )


def test_custom_without_seq_len_predicts_per_sample() -> None:
    acc = get_accelerator("a100-80gb")
    spec = _custom(0.5, 128)
    p = predict(spec, acc, 1)
    assert p.fits and p.step_time_s > 0
    # the maths treats one sample as one token: equal to the same model with seq_len 1
    same = predict(_custom(0.5, 128, seq_len=1), acc, 1)
    assert p.step_time_s == same.step_time_s and p.memory_per_device_gib == same.memory_per_device_gib
    # training FLOPs per sample are at least 6·N (forward 2·N, backward 4·N)
    assert p.model_flops_per_step >= 6 * spec.params * 128 * 0.999
    # memory: at least weights, gradients and AdamW states (16 bytes/parameter mixed precision)
    assert p.memory_per_device_gib * 2**30 >= 16 * spec.params * 0.999
    # more parameters or a larger batch never predict a faster step
    assert predict(_custom(2.0, 128), acc, 1).step_time_s > p.step_time_s
    assert predict(_custom(0.5, 512), acc, 1).step_time_s > p.step_time_s


def test_custom_without_seq_len_prices_from_measured_step_time() -> None:
    from trainyard.catalog.pools import Pool
    from trainyard.cost.quote import option_for
    from trainyard.spec import spec_from_dict

    spec = spec_from_dict(
        {
            "name": "recsys",
            "model": {"architecture": "custom", "params_b": 0.2},
            "workload": {"global_batch": 4096, "steps": 1000},
            "measured": {"step_time_s": {"a100-40gb": 0.25}},
        }
    )
    pool = Pool(
        name="a", accelerator="a100-40gb", devices_per_node=8, nodes=1, market="on_demand",
        price_usd_per_device_hour=2.0, region="us-east-1",
    )  # fmt: skip
    opt = option_for(spec, pool, 1)
    assert opt.feasible, opt.reason
    assert opt.step_time_s == pytest.approx(0.25)
