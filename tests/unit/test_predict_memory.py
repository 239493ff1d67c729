"""Predictor memory model: every published calibration configuration fits on its hardware, the terms of
the memory breakdown (states, FSDP buffers, activations, logits and the chunked loss), the replayed ways
of holding model states and FP8 activations."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.catalog.accelerators import get_accelerator
from trainyard.predict import predict
from trainyard.predict.calib_data import CalibrationRow, packaged_rows
from trainyard.predict.engine import GIB, LOSS_CHUNK_TOKENS, MEMORY_TERMS
from trainyard.predict.params import HEADROOM_FRACTION, WORKSPACE_GIB
from trainyard.predict.workload import activation_bytes_per_token_per_layer, shape_of, workload_of
from trainyard.spec.models import JobSpec

ROWS, _SKIPPED = packaged_rows()

LLAMA_8B = {
    "n_layers": 32,
    "d_model": 4096,
    "n_heads": 32,
    "n_kv_heads": 8,
    "d_ff": 14336,
    "ffn": "gated",
    "vocab_size": 128256,
}


def _spec(model: dict[str, Any] | None = None, **workload: Any) -> JobSpec:
    wl: dict[str, Any] = {"seq_len": 4096, "global_batch": 64, "steps": 10}
    wl.update(workload)
    return JobSpec.model_validate({"name": "mem", "model": model or LLAMA_8B, "workload": wl})


def _replay(row: CalibrationRow) -> Any:
    return predict(
        row.spec,
        get_accelerator(row.accelerator),
        row.devices,
        plan=row.plan or None,
        stack=row.stack,
        fast_domain_devices=row.fast_domain_devices,
        inter_node_gbps=row.inter_node_gbps,
        search_min_devices=False,
    )


def _row_id(row: CalibrationRow) -> str:
    return f"{row.index}-{row.model_name}-{row.accelerator}x{row.devices}-{row.spec.workload.precision.value}"


# ---- every published configuration ran, so it must fit ------------------------------------------------


@pytest.mark.parametrize("row", ROWS, ids=[_row_id(r) for r in ROWS])
def test_every_calibration_row_fits_its_published_configuration(row: CalibrationRow) -> None:
    """Each row is a measured run: its configuration (the replayed plan, or the planner's choice where the
    source publishes none) on its hardware must fit, with the fit check's headroom and workspace kept."""
    p = _replay(row)
    terms = {k: round(v, 2) for k, v in p.breakdown.items() if k.startswith("memory_")}
    assert p.fits, (
        f"{_row_id(row)}: {p.memory_per_device_gib:.1f} GiB > {p.memory_capacity_gib:.1f} GiB usable; "
        f"plan {p.plan}; terms {terms}"
    )
    assert p.memory_per_device_gib <= p.memory_capacity_gib
    for key in ("tensor", "pipeline", "expert", "micro_batch", "activation_checkpointing"):
        if key in row.plan:
            assert p.plan[key] == row.plan[key], key


def test_all_rows_are_covered_dense_and_moe() -> None:
    assert not _SKIPPED and len(ROWS) >= 90
    assert sum(r.is_moe for r in ROWS) >= 4 and sum(not r.is_moe for r in ROWS) >= 80


def test_fit_check_keeps_its_headroom_and_workspace() -> None:
    for name in ("h100", "a100-40gb", "t4", "tpu-v5e"):
        acc = get_accelerator(name)
        p = predict(_spec(), acc, 8, search_min_devices=False)
        usable = acc.memory_gib * (1 - HEADROOM_FRACTION) - WORKSPACE_GIB[acc.family]
        assert p.memory_capacity_gib == pytest.approx(usable)


# ---- the breakdown ------------------------------------------------------------------------------------


def test_memory_breakdown_terms_sum_to_the_reported_memory() -> None:
    for row in ROWS[::7]:
        p = _replay(row)
        terms = [p.breakdown[f"memory_{k}_gib"] for k in MEMORY_TERMS]
        assert all(t >= 0 for t in terms)
        assert sum(terms) == pytest.approx(p.memory_per_device_gib, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(mb=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2, 4, 8]))
def test_logits_in_working_precision_and_the_loss_in_fp32_chunks(mb: int, tp: int) -> None:
    """Logits of one micro-batch in bf16 (divided by tensor parallel, vocab-parallel); the fp32 loss block
    covers at most LOSS_CHUNK_TOKENS tokens however large the micro-batch."""
    spec = _spec(seq_len=2048, global_batch=64)
    p = predict(
        spec,
        get_accelerator("h100"),
        8 * tp,
        plan={"tensor": tp, "pipeline": 1, "micro_batch": mb, "fsdp": True, "fsdp_scope": "full"},
        search_min_devices=False,
    )
    tokens, vocab = mb * 2048, 128256
    assert p.breakdown["memory_logits_gib"] * GIB == pytest.approx(tokens * vocab / tp * 2.0)
    assert p.breakdown["memory_loss_chunk_gib"] * GIB == pytest.approx(
        min(tokens, LOSS_CHUNK_TOKENS) * vocab / tp * 4.0
    )
    # No full fp32 [tokens x vocab] copy: the loss terms stay under 3 bytes per logit once chunks repeat.
    if tokens > 2 * LOSS_CHUNK_TOKENS:
        loss_bytes = (p.breakdown["memory_logits_gib"] + p.breakdown["memory_loss_chunk_gib"]) * GIB
        assert loss_bytes < tokens * vocab / tp * 4.0


# ---- replayed ways of holding the states ----------------------------------------------------------------


def _states_gib(spec: JobSpec, devices: int, **plan: Any) -> float:
    base = {"tensor": 1, "pipeline": 1, "micro_batch": 1, "fsdp": False, "activation_checkpointing": "full"}
    base.update(plan)
    p = predict(spec, get_accelerator("h100"), devices, plan=base, search_min_devices=False)
    return p.breakdown["memory_states_gib"]


def test_distributed_optimizer_shards_master_weights_and_moments_over_data_parallel() -> None:
    spec = _spec(global_batch=64)
    n = spec.params
    ddp = _states_gib(spec, 8)
    zero1 = _states_gib(spec, 8, distributed_optimizer=True)
    assert ddp * GIB == pytest.approx(16.0 * n)  # bf16 weights + bf16 grads + fp32 master + two moments
    assert zero1 * GIB == pytest.approx((2.0 + 2.0 + 12.0 / 8) * n)
    # FP8 working weights (fp8-mixed replays): blocks' weights at 1 byte, embeddings and output at 2.
    fp8 = _spec(global_batch=64, precision="fp8-mixed")
    blocks = 32 * shape_of(fp8.model).block_params
    got = _states_gib(fp8, 8, distributed_optimizer=True, fp8_params=True) * GIB
    assert got == pytest.approx(blocks * 1.0 + (n - blocks) * 2.0 + (2.0 + 12.0 / 8) * n)


def test_bf16_states_hold_eight_bytes_per_parameter() -> None:
    spec = _spec(global_batch=64)
    full = _states_gib(spec, 8, fsdp=True, fsdp_scope="full")
    pure = _states_gib(spec, 8, fsdp=True, fsdp_scope="full", bf16_states=True)
    assert full * GIB == pytest.approx(16.0 * spec.params / 8)
    assert pure * GIB == pytest.approx(8.0 * spec.params / 8)


def test_distributed_optimizer_changes_nothing_under_fsdp() -> None:
    """ZeRO-1 shards what FSDP already shards: with FSDP the replay field leaves memory and time alone."""
    spec = _spec(global_batch=64)
    plan = {"tensor": 1, "pipeline": 1, "micro_batch": 1, "fsdp": True, "fsdp_scope": "full"}
    a = predict(spec, get_accelerator("h100"), 16, plan=plan, search_min_devices=False)
    b = predict(
        spec,
        get_accelerator("h100"),
        16,
        plan={**plan, "distributed_optimizer": True},
        search_min_devices=False,
    )
    assert a.memory_per_device_gib == b.memory_per_device_gib and a.step_time_s == b.step_time_s


# ---- FP8 activations ------------------------------------------------------------------------------------


def test_fp8_recipes_store_linear_inputs_in_fp8() -> None:
    shape = shape_of(_spec().model)
    bf16, _ = activation_bytes_per_token_per_layer(shape, 4096, 2.0)
    fp8, _ = activation_bytes_per_token_per_layer(shape, 4096, 2.0, fp8_linear_inputs=True)
    d, q, ff = 4096, 4096, 14336
    assert bf16 - fp8 == pytest.approx(1.0 * (d + q + d + ff))  # QKV, proj, FC1, FC2 inputs: 2 B -> 1 B
    moe = shape_of(_spec({**LLAMA_8B, "n_experts": 8, "experts_per_token": 2}).model)
    m16, _ = activation_bytes_per_token_per_layer(moe, 4096, 2.0)
    m8, _ = activation_bytes_per_token_per_layer(moe, 4096, 2.0, fp8_linear_inputs=True)
    assert m16 - m8 == pytest.approx(d + q + 2 * (d + ff))  # per active expert: dispatched copy, FC2 input


def test_minimal_policy_keeps_the_matmul_outputs_the_backward_reads() -> None:
    """MaxText remat=minimal (replays): block input, Q/K/V, attention output projection, FC1's outputs;
    FC2's output only where a router weights it (MoE)."""
    w = workload_of(_spec())
    d, q, kv, ff = 4096, 4096, 1024, 14336
    assert w.act_matmul_outputs_per_token_layer == pytest.approx(2.0 * (d + q + 2 * kv + d + 2 * ff))
    moe = workload_of(_spec({**LLAMA_8B, "n_experts": 8, "experts_per_token": 2}))
    assert moe.act_matmul_outputs_per_token_layer == pytest.approx(
        2.0 * (d + q + 2 * kv + d + 2 * (2 * ff) + 2 * d)
    )
    # Between full recomputation (the block input) and keeping every activation.
    assert d * 2.0 < w.act_matmul_outputs_per_token_layer < w.act_per_token_layer
    plan = {"tensor": 1, "pipeline": 1, "micro_batch": 2, "fsdp": True, "fsdp_scope": "full"}
    mem = {
        ck: predict(
            _spec(),
            get_accelerator("h100"),
            8,
            plan={**plan, "activation_checkpointing": ck},
            search_min_devices=False,
        ).breakdown["memory_activations_gib"]
        for ck in ("none", "minimal", "full")
    }
    assert mem["full"] < mem["minimal"] < mem["none"]


def test_fp8_never_needs_more_memory_than_bf16() -> None:
    for devices in (8, 16, 64):
        a = predict(_spec(), get_accelerator("h100"), devices, search_min_devices=False)
        b = predict(_spec(precision="fp8-mixed"), get_accelerator("h100"), devices, search_min_devices=False)
        plan = {k: a.plan[k] for k in ("tensor", "pipeline", "micro_batch", "activation_checkpointing")}
        b = predict(
            _spec(precision="fp8-mixed"),
            get_accelerator("h100"),
            devices,
            plan=plan,
            search_min_devices=False,
        )
        assert b.breakdown["memory_activations_gib"] <= a.breakdown["memory_activations_gib"]
