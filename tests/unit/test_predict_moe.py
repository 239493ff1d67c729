"""Predictor, mixture-of-experts: FLOPs of the active experts, memory of all experts split by expert
parallelism, the expert all-to-all, planner invariants on MoE specs, the calibration rows, and the FP8
recipe's bf16 output layer and cast traffic."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from trainyard.catalog.accelerators import get_accelerator, load_accelerators
from trainyard.predict import Calibration, predict
from trainyard.predict.calib_data import KNOWN_MODELS, packaged_rows
from trainyard.predict.fit import fit_calibration
from trainyard.predict.params import EfficiencyParams
from trainyard.predict.workload import (
    expert_flops_per_token,
    forward_flops_per_token,
    shape_of,
    training_flops_per_step,
    workload_of,
)
from trainyard.spec.models import ActivationCheckpointing, JobSpec, Method

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SMALL_MOE = {
    "n_layers": 2,
    "d_model": 256,
    "n_heads": 4,
    "d_ff": 512,
    "ffn": "gated",
    "vocab_size": 1000,
    "n_experts": 8,
    "experts_per_token": 2,
}
QWEN3_30B_A3B = dict(KNOWN_MODELS["Qwen3-30B-A3B"])


def make_spec(model: dict[str, Any], **workload: Any) -> JobSpec:
    wl: dict[str, Any] = {"seq_len": 128, "global_batch": 8, "steps": 10}
    wl.update(workload)
    return JobSpec.model_validate({"name": "moe", "model": model, "workload": wl})


# ---- workload math ------------------------------------------------------------------------------------


def test_moe_flops_by_hand_count_active_experts_only() -> None:
    spec = make_spec(SMALL_MOE, seq_len=128)
    f = forward_flops_per_token(shape_of(spec.model), 128)
    L, d, ff, E, k, V = 2, 256, 512, 8, 2, 1000
    experts = L * k * 3 * 2 * d * ff  # two active gated experts (3 matrices each)
    router = L * 2 * d * E
    assert f.experts == experts
    assert f.ffn == experts + router
    assert f.qkv == L * 2 * d * (d + 2 * d) and f.attn_out == L * 2 * d * d
    assert f.attn_scores == L * 4 * 128 * d * 0.5
    assert f.logits == 2 * d * V
    per_token = 3 * (f.qkv + f.attn_out + f.ffn + f.logits) + 3 * f.attn_scores
    assert training_flops_per_step(spec) == pytest.approx(per_token * 128 * 8)
    # The routed-expert share of the training FLOPs: 3x forward, plus a forward more with full recompute.
    assert expert_flops_per_token(f, Method.FULL, ActivationCheckpointing.NONE) == 3 * experts
    assert expert_flops_per_token(f, Method.FULL, ActivationCheckpointing.FULL) == 4 * experts
    # Memory holds all eight experts: parameters and 16 bytes/parameter of mixed-precision AdamW state.
    w = workload_of(spec)
    assert w.expert_params == L * E * 3 * d * ff
    block = 4 * d * d + E * 3 * d * ff + d * E + 2 * d
    assert w.params == L * block + 2 * V * d + d
    assert w.states.total == pytest.approx(16 * w.params)
    assert spec.model.active_params < spec.model.params / 2


def test_dense_model_has_no_expert_terms() -> None:
    dense = make_spec({k: v for k, v in SMALL_MOE.items() if k not in ("n_experts", "experts_per_token")})
    w = workload_of(dense)
    assert w.fwd.experts == 0 and w.expert_params == 0
    p = predict(dense, get_accelerator("h100"), 8, plan={"expert": 4})  # no experts: the pin has no effect
    assert p.plan["expert"] == 1 and p.breakdown["all_to_all_s"] == 0


# ---- memory and all-to-all ----------------------------------------------------------------------------


def _qwen(**workload: Any) -> JobSpec:
    wl = {"seq_len": 4096, "global_batch": 256}
    wl.update(workload)
    return make_spec(QWEN3_30B_A3B, **wl)


def _pinned(spec: JobSpec, devices: int, **plan: Any) -> Any:
    base = {"tensor": 1, "pipeline": 1, "micro_batch": 1, "activation_checkpointing": "full"}
    base.update(plan)
    return predict(spec, get_accelerator("h100"), devices, plan=base, search_min_devices=False)


def test_expert_parallelism_shrinks_memory_without_fsdp() -> None:
    spec = _qwen()
    mem = [_pinned(spec, 16, fsdp=False, expert=ep).memory_per_device_gib for ep in (1, 2, 4, 8, 16)]
    assert all(b < a for a, b in itertools.pairwise(mem))
    # All 128 experts' states are held: without EP or FSDP one device holds > 16 B x 30B parameters.
    assert mem[0] * 1024**3 > 16 * spec.params
    # With FSDP over 16 ranks the experts are already split 16 ways; EP up to 16 keeps that split.
    fsdp = [_pinned(spec, 16, fsdp=True, fsdp_scope="full", expert=ep) for ep in (1, 4, 16)]
    assert fsdp[0].memory_per_device_gib >= fsdp[1].memory_per_device_gib >= fsdp[2].memory_per_device_gib
    assert fsdp[0].memory_per_device_gib < mem[0] / 8


def test_all_to_all_only_for_moe_with_expert_parallelism() -> None:
    spec = _qwen()
    none = _pinned(spec, 16, fsdp=True, fsdp_scope="full", expert=1)
    intra = _pinned(spec, 16, fsdp=True, fsdp_scope="full", expert=8)
    inter = _pinned(spec, 16, fsdp=True, fsdp_scope="full", expert=16)
    assert none.breakdown["all_to_all_s"] == 0
    assert intra.breakdown["all_to_all_s"] > 0 and intra.plan["expert"] == 8
    # Sixteen experts ranks span two 8-GPU nodes: half the peers are behind the network.
    assert inter.breakdown["all_to_all_s"] > 2 * intra.breakdown["all_to_all_s"]
    assert intra.breakdown["comm_exposed_s"] >= intra.breakdown["all_to_all_s"]
    # Recomputing the forward repeats its dispatch and combine: 6 all-to-alls per layer instead of 4.
    no_ck = _pinned(spec, 16, fsdp=True, fsdp_scope="full", expert=8, activation_checkpointing="none")
    assert intra.breakdown["all_to_all_s"] == pytest.approx(1.5 * no_ck.breakdown["all_to_all_s"])


def test_contiguous_routing_sends_less_than_uniform_routing() -> None:
    spec = _qwen()
    uni = _pinned(spec, 64, fsdp=True, fsdp_scope="full", expert=64)
    con = _pinned(spec, 64, fsdp=True, fsdp_scope="full", expert=64, routing="contiguous")
    assert 0 < con.breakdown["all_to_all_s"] < uni.breakdown["all_to_all_s"]


def test_expert_width_and_tokens_per_expert_set_expert_matmul_time() -> None:
    """Moving a fixed number of expert FLOPs into more, narrower experts (each seeing fewer tokens) runs
    them less efficiently."""
    wide = make_spec({**QWEN3_30B_A3B, "d_ff": 3072, "n_experts": 32, "experts_per_token": 2})
    narrow = make_spec({**QWEN3_30B_A3B, "d_ff": 768, "n_experts": 128, "experts_per_token": 8})
    assert workload_of(wide).fwd.experts == workload_of(narrow).fwd.experts
    t_wide = _pinned(wide, 8, fsdp=True, fsdp_scope="full", expert=1).breakdown["compute_s"]
    t_narrow = _pinned(narrow, 8, fsdp=True, fsdp_scope="full", expert=1).breakdown["compute_s"]
    assert t_narrow > t_wide


# ---- planner invariants on MoE specs ------------------------------------------------------------------

ACCS = [a for a in load_accelerators().values() if a.name != "cpu"]

moe_strategy = st.builds(
    lambda layers, d, experts, k, ff, seq, batch, prec, ep: make_spec(
        {
            "n_layers": layers,
            "d_model": d,
            "n_heads": d // 128,
            "d_ff": ff,
            "ffn": "gated",
            "vocab_size": 32000,
            "n_experts": experts,
            "experts_per_token": min(k, experts),
        },
        seq_len=seq,
        global_batch=batch,
        precision=prec,
        **({"parallelism": {"fsdp": True, "expert": ep}} if ep else {}),
    ),
    st.integers(2, 48),
    st.sampled_from([512, 1024, 2048, 4096]),
    st.sampled_from([8, 16, 64, 128]),
    st.sampled_from([1, 2, 8]),
    st.sampled_from([256, 768, 2048]),
    st.sampled_from([512, 4096]),
    st.sampled_from([8, 64, 512]),
    st.sampled_from(["bf16-mixed", "fp8-mixed"]),
    st.sampled_from([None, 2, 8]),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=moe_strategy, acc=st.sampled_from(ACCS), devices=st.sampled_from([1, 2, 8, 16, 64, 256]))
def test_moe_plan_reported_as_fitting_fits_and_respects_the_expert_pin(
    spec: JobSpec, acc: Any, devices: int
) -> None:
    p = predict(spec, acc, devices, search_min_devices=False)
    pin = spec.workload.parallelism
    if p.fits:
        plan = p.plan
        assert p.memory_per_device_gib <= p.memory_capacity_gib
        assert plan["data"] * plan["tensor"] * plan["pipeline"] * plan["context"] == devices
        assert plan["data"] % plan["expert"] == 0 and spec.model.n_experts % plan["expert"] == 0
        if not isinstance(pin, str) and pin.expert is not None:
            assert plan["expert"] == pin.expert
        assert p.step_time_p10_s <= p.step_time_s <= p.step_time_p90_s
        assert (p.breakdown["all_to_all_s"] > 0) == (plan["expert"] > 1)
    else:
        assert p.reason


def test_expert_pin_that_cannot_be_met_says_why() -> None:
    spec = _qwen(parallelism={"fsdp": True, "expert": 16})
    p = predict(spec, get_accelerator("h100"), 8)  # 8 data-parallel ranks cannot hold 16 expert groups
    assert not p.fits and "expert parallel 16" in p.reason
    assert p.min_devices_to_fit is not None and p.min_devices_to_fit % 16 == 0
    assert predict(spec, get_accelerator("h100"), p.min_devices_to_fit).plan["expert"] == 16


def test_expert_pin_is_validated_against_the_model() -> None:
    dense = {k: v for k, v in SMALL_MOE.items() if k not in ("n_experts", "experts_per_token")}
    with pytest.raises(ValidationError, match=r"workload\.parallelism\.expert"):
        make_spec(dense, parallelism={"expert": 2})
    with pytest.raises(ValidationError, match="does not divide"):
        make_spec(SMALL_MOE, parallelism={"expert": 3})
    ok = make_spec(SMALL_MOE, parallelism={"expert": 4})
    assert ok.to_document()["workload"]["parallelism"]["expert"] == 4
    assert (
        "expert"
        not in make_spec(SMALL_MOE, parallelism={"fsdp": True}).to_document()["workload"]["parallelism"]
    )


def test_cli_predict_on_the_moe_example(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from trainyard.cli.main import app

    runner = CliRunner()
    path = str(EXAMPLES / "moe-finetune.yaml")
    r = runner.invoke(app, ["predict", path, "--accelerator", "h100", "--devices", "16", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["fits"] is True and doc["plan"]["expert"] >= 1 and doc["step_time_s"] > 0
    r = runner.invoke(app, ["predict", path, "--accelerator", "h100", "--devices", "1", "--json"])
    assert r.exit_code == 0, r.output
    one = json.loads(r.stdout)
    assert one["fits"] is False and "GiB" in one["reason"]  # all 30.5B parameters' states do not fit


def _table_rows(text: str) -> dict[str, list[str]]:
    """Rows of `trainyard predict SPEC`'s table: accelerator -> cell texts (folded cells joined)."""
    rows: list[list[list[str]]] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[0] and cells[1]:  # a row starts where the devices column is filled
            rows.append([[c] for c in cells])
        elif rows:
            for col, c in zip(rows[-1], cells, strict=False):
                col.append(c)
    return {"".join(r[0]): [" ".join(x for x in col if x) for col in r] for r in rows}


def test_cli_table_shows_the_expert_parallel_degree() -> None:
    from typer.testing import CliRunner

    from trainyard.cli.main import app

    runner = CliRunner()
    path = str(EXAMPLES / "moe-finetune.yaml")
    r = runner.invoke(app, ["predict", path, "--accelerator", "h100", "--devices", "16", "--json"])
    assert r.exit_code == 0, r.output
    expert = json.loads(r.stdout)["plan"]["expert"]
    assert expert > 1
    table = runner.invoke(app, ["predict", path, "--devices", "16"])
    assert table.exit_code == 0, table.output
    rows = _table_rows(table.stdout)
    assert re.search(rf"\bep{expert}\b", rows["h100"][7]), rows["h100"]
    dense = runner.invoke(app, ["predict", str(EXAMPLES / "lora-7b.yaml"), "--devices", "16"])
    assert dense.exit_code == 0, dense.output
    assert "h100" in _table_rows(dense.stdout) and not re.search(r"\bep\d+\b", dense.stdout)


# ---- calibration --------------------------------------------------------------------------------------


def test_moe_calibration_rows_replay_their_published_plans() -> None:
    rows, skipped = packaged_rows()
    assert not skipped
    moe = {r.model_name: r for r in rows if r.is_moe}
    assert set(moe) == {"GPT-OSS-20B", "Qwen3-MoE-30B", "DeepSeek-V3-671B", "Qwen3-30B-A3B"}
    assert moe["DeepSeek-V3-671B"].plan["expert"] == 64 and moe["DeepSeek-V3-671B"].plan["pipeline"] == 4
    qwen_fp8 = moe["Qwen3-30B-A3B"]
    assert qwen_fp8.plan["expert"] == 8 and qwen_fp8.spec.workload.precision.value == "fp8-mixed"
    # One architecture under two names is one model for leave-one-model-out.
    assert moe["Qwen3-MoE-30B"].model_key == moe["Qwen3-30B-A3B"].model_key
    # Published sizes: GPT-OSS-20B 20.9B, Qwen3-30B-A3B 30.5B total / 3.3B active.
    assert moe["GPT-OSS-20B"].spec.params == pytest.approx(20.9e9, rel=0.01)
    assert moe["Qwen3-30B-A3B"].spec.params == pytest.approx(30.5e9, rel=0.01)
    assert moe["Qwen3-30B-A3B"].spec.model.active_params == pytest.approx(3.35e9, rel=0.02)
    assert all(r.assumptions for r in moe.values())


def test_moe_rows_never_move_the_dense_parameters() -> None:
    rows, _ = packaged_rows()
    dense = [r for r in rows if r.group == "nvidia/cuda/fp16"]
    moe = [r for r in rows if r.is_moe]
    alone = fit_calibration(dense)
    both = fit_calibration(dense + moe)
    for key, p in alone.params.items():
        q = both.params[key]
        assert replace(q, moe_eff=p.moe_eff, moe_rows=p.moe_rows) == p
        assert q.moe_rows == len(moe) and p.moe_rows == 0


def test_moe_predictions_carry_the_moe_band() -> None:
    spec = _qwen()
    cal = Calibration(
        params={
            "nvidia/cuda/bf16": EfficiencyParams(
                key="nvidia/cuda/bf16", log_resid_p10=-0.1, log_resid_p90=0.1, moe_log_resid_p90=0.5
            )
        }
    )
    p = predict(spec, get_accelerator("h100"), 16, calibration=cal)
    assert p.step_time_p90_s / p.step_time_s == pytest.approx(2.718281828**0.5, rel=1e-6)
    assert any("no MoE measurements" in n for n in p.notes)


# ---- FP8 --------------------------------------------------------------------------------------------


def _dense(d: int, layers: int) -> dict[str, Any]:
    return {"n_layers": layers, "d_model": d, "n_heads": d // 128, "ffn": "gated", "vocab_size": 128256}


def test_fp8_speedup_is_below_2x_and_grows_with_width() -> None:
    """FP8 recipes run only the blocks' linear layers in FP8 (the output layer and attention stay bf16) and
    pay a cast of every FP8 GEMM input and output gradient; so the speed-up over bf16 is well under the
    2x of the peaks, and smaller for narrow models (Megatron-Bridge performance guide)."""
    same = EfficiencyParams(key="same")
    cal = Calibration(params={"nvidia/cuda/bf16": same, "nvidia/cuda/fp8": replace(same, key="fp8")})
    h100 = get_accelerator("h100")

    def speedup(model: dict[str, Any]) -> float:
        t = {}
        for prec in ("bf16-mixed", "fp8-mixed"):
            spec = make_spec(model, seq_len=4096, global_batch=64, precision=prec)
            t[prec] = predict(spec, h100, 8, calibration=cal, plan={"fsdp": True, "tensor": 1}).step_time_s
        return t["bf16-mixed"] / t["fp8-mixed"]

    small, large = speedup(_dense(2048, 24)), speedup(_dense(8192, 16))
    assert 1.0 < small < large < 2.0
    assert workload_of(make_spec(_dense(2048, 2))).fp8_cast_bytes_per_token == 0
    assert workload_of(make_spec(_dense(2048, 2), precision="fp8-mixed")).fp8_cast_bytes_per_token > 0


def test_megatron_bridge_rows_replay_tensor_parallel_overlap() -> None:
    rows, _ = packaged_rows()
    llama = next(r for r in rows if r.model_name == "Llama-3-70B")
    assert llama.plan["tp_overlap"] is True and llama.plan["tensor"] == 4
    h100 = get_accelerator("h100")
    n, st_ = llama.devices, llama.stack
    hidden = predict(llama.spec, h100, n, plan=llama.plan, stack=st_, search_min_devices=False)
    plan_off = {**llama.plan, "tp_overlap": False}
    exposed = predict(llama.spec, h100, n, plan=plan_off, stack=st_, search_min_devices=False)
    assert hidden.breakdown["comm_exposed_s"] < exposed.breakdown["comm_exposed_s"]
    assert hidden.step_time_s < exposed.step_time_s
    # Without tensor parallelism there is nothing to overlap.
    dense = make_spec(_dense(2048, 4), seq_len=2048, global_batch=16)
    a = predict(dense, h100, 8, plan={"tensor": 1, "tp_overlap": True})
    b = predict(dense, h100, 8, plan={"tensor": 1})
    assert a.step_time_s == b.step_time_s


def test_automodel_pipeline_replay_fills_and_drains_once_per_accumulation_step() -> None:
    # DeepSeek-V3 on 1024 H100 (Automodel): PP 4, GA 4 -> four pipeline schedules per optimizer step, so
    # four bubbles, not one bubble of a 32-micro-batch schedule.
    rows, _ = packaged_rows()
    row = next(r for r in rows if r.model_name == "DeepSeek-V3-671B")
    assert row.plan["pipeline"] == 4 and row.plan["pipeline_flushes"] == 4

    def run(plan: dict[str, Any]) -> Any:
        return predict(
            row.spec,
            get_accelerator(row.accelerator),
            row.devices,
            plan=plan,
            stack=row.stack,
            fast_domain_devices=row.fast_domain_devices,
            inter_node_gbps=row.inter_node_gbps,
            search_min_devices=False,
        )

    four = run(row.plan)
    one = run({**row.plan, "pipeline_flushes": 1})
    assert four.breakdown["bubble_s"] == pytest.approx(4 * one.breakdown["bubble_s"], rel=1e-9)
    assert four.step_time_s == pytest.approx(one.step_time_s + 3 * one.breakdown["bubble_s"], rel=1e-9)
