"""Device placement and what the trainer builds, on CPU: the CUDA paths that need no GPU (device choice,
collective backend, dtype policy, the mismatch failure), the FFN the spec names (parameter counts equal
``spec validate``'s), the optimizer class, activation checkpointing and the executed plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trainyard.catalog.pools import Pool
from trainyard.executors.base import LaunchRequest, accelerator_for_cuda_device, is_gpu_accelerator
from trainyard.executors.local import LocalExecutor
from trainyard.runtime.device import (
    DeviceMismatch,
    check_report,
    device_report,
    dist_backend,
    plan_device,
)
from trainyard.runtime.modeling import ModelBuildError, build_model, policy_for
from trainyard.runtime.trainer import (
    PlanNotExecutable,
    PreemptionNotice,
    Trainer,
    apply_activation_checkpointing,
    build_optimizer,
    resolve_plan,
)
from trainyard.services.pools import local_gpu_pools, pool_backend
from trainyard.spec.loader import spec_from_dict

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _doc(model: dict[str, Any] | None = None, **workload: Any) -> dict[str, Any]:
    return {
        "name": "dev",
        "model": {"architecture": "decoder", "n_layers": 2, "d_model": 32, "n_heads": 4, "vocab_size": 300}
        | (model or {}),
        "workload": {"seq_len": 8, "global_batch": 4, "steps": 3, "precision": "fp32"} | workload,
    }


@pytest.mark.parametrize(
    ("name", "memory_gib", "expected"),
    [
        ("NVIDIA H200", 139.8, "h200"),
        ("NVIDIA H100 80GB HBM3", 79.6, "h100"),
        ("NVIDIA A100-SXM4-40GB", 39.4, "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", 79.2, "a100-80gb"),
        ("NVIDIA A10G", 22.0, "a10g"),
        ("NVIDIA L4", 22.5, "l4"),
        ("Tesla T4", 15.0, "t4"),
        ("Tesla V100-SXM2-32GB", 32.0, "v100"),
        ("NVIDIA L40S", 44.0, None),
        ("NVIDIA GeForce RTX 4090", 24.0, None),
    ],
)
def test_cuda_device_names_map_to_catalog_accelerators(name: str, memory_gib: float, expected: str) -> None:
    assert accelerator_for_cuda_device(name, memory_gib) == expected


def test_device_plan_cpu_gloo_and_gpu_nccl() -> None:
    cpu = plan_device(None, 0)
    assert cpu.device == torch.device("cpu") and cpu.backend == "gloo" and dist_backend(cpu.device) == "gloo"
    gpu = plan_device("h100", 1, cuda_available=True, cuda_count=2, env={})
    assert gpu.device == torch.device("cuda", 1) and gpu.backend == "nccl"
    assert dist_backend(gpu.device) == "nccl"
    own = plan_device("h100", 5, cuda_available=True, cuda_count=1, env={})  # one GPU of its own (Ray)
    assert own.device == torch.device("cuda", 0)
    assert (
        plan_device("h100", 0, cuda_available=True, cuda_count=8, env={"LOCAL_RANK": "3"}).device.index == 3
    )
    assert is_gpu_accelerator("a10g") and not is_gpu_accelerator("cpu") and not is_gpu_accelerator("tpu-v4")


def test_gpu_placement_without_cuda_fails_clearly_and_never_falls_back_to_cpu() -> None:
    with pytest.raises(DeviceMismatch, match="placed on a100-40gb but this worker sees no CUDA device"):
        plan_device("a100-40gb", 0, cuda_available=False)
    with pytest.raises(DeviceMismatch, match="only 2 are visible"):
        plan_device("h100", 2, cuda_available=True, cuda_count=2, env={})
    with pytest.raises(DeviceMismatch, match="cannot drive"):
        plan_device("tpu-v4", 0)
    report = device_report(torch.device("cpu"))
    assert report["type"] == "cpu" and report["accelerator"] == "cpu" and report["count"] == 1
    check_report(None, report)
    check_report("cpu", report)
    with pytest.raises(DeviceMismatch, match="placed on h100 but this worker got"):
        check_report("h100", report)
    with pytest.raises(DeviceMismatch, match="placed on h100"):
        check_report("h100", {"type": "cuda", "name": "NVIDIA A10G", "accelerator": "a10g"})


def test_precision_policy_autocasts_on_the_models_device_and_scales_fp16_on_cuda_only() -> None:
    bf16, fp16, fp32 = policy_for("bf16-mixed"), policy_for("fp16-mixed"), policy_for("fp32")
    with bf16.autocast("cpu"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    assert bf16.autocast("cuda").device == "cuda"
    assert fp16.needs_grad_scaler("cuda") and not fp16.needs_grad_scaler("cpu")
    assert not bf16.needs_grad_scaler("cuda") and not fp32.needs_grad_scaler("cuda")
    with pytest.raises(ModelBuildError, match="fp8"):
        policy_for("fp8-mixed")


@pytest.mark.parametrize(
    "model",
    [
        {"ffn": "mlp"},
        {"ffn": "gated"},
        {"ffn": "mlp", "n_kv_heads": 2, "d_ff": 96},
        {"ffn": "gated", "tie_embeddings": True},
    ],
)
def test_the_model_trained_has_the_spec_parameter_count(model: dict[str, Any]) -> None:
    spec = spec_from_dict(_doc(model))
    built = build_model(spec)
    assert built.description["params"] == spec.params
    mlp_layer = built.model.model.layers[0].mlp  # type: ignore[union-attr, index]
    assert hasattr(mlp_layer, "gate_proj") == (model["ffn"] == "gated")


def test_moe_with_a_plain_mlp_is_refused_not_built_gated() -> None:
    with pytest.raises(ModelBuildError, match="ffn: gated"):
        build_model(spec_from_dict(_doc({"n_experts": 2, "experts_per_token": 1, "ffn": "mlp"})))


@pytest.mark.parametrize(
    ("optimizer", "cls"),
    [("adamw", torch.optim.AdamW), ("sgd", torch.optim.SGD), ("adafactor", torch.optim.Adafactor)],
)
def test_the_optimizer_the_spec_names(optimizer: str, cls: type) -> None:
    spec = spec_from_dict(_doc(optimizer=optimizer))
    opt = build_optimizer(spec, list(build_model(spec).model.parameters()))
    assert type(opt) is cls


def test_executed_plan_pins_then_plan_and_tensor_pipeline_refused() -> None:
    spec = spec_from_dict(_doc())
    assert resolve_plan(spec, None, 1) == {
        "micro_batch": None,
        "activation_checkpointing": "none",
        "fsdp": False,
    }
    planned = {"micro_batch": 1, "activation_checkpointing": "full", "fsdp": True, "tensor": 1, "pipeline": 1}
    assert resolve_plan(spec, planned, 2) == {
        "micro_batch": 1,
        "activation_checkpointing": "full",
        "fsdp": True,
    }
    assert resolve_plan(spec, planned, 1)["fsdp"] is False  # one rank has nothing to shard over
    pinned = spec_from_dict(_doc(micro_batch=2, activation_checkpointing="selective"))
    got = resolve_plan(pinned, planned, 2)
    assert got["micro_batch"] == 2 and got["activation_checkpointing"] == "selective"
    with pytest.raises(PlanNotExecutable, match="user code required"):
        resolve_plan(spec, {**planned, "tensor": 2}, 2)
    with pytest.raises(PlanNotExecutable, match="pipeline 2"):
        resolve_plan(spec_from_dict(_doc(parallelism={"pipeline": 2})), None, 2)


def test_activation_checkpointing_wraps_blocks_or_attention() -> None:
    spec = spec_from_dict(_doc())
    assert apply_activation_checkpointing(build_model(spec).model, "full") == 2  # one per decoder layer
    assert apply_activation_checkpointing(build_model(spec).model, "selective") == 2  # one attention each
    assert apply_activation_checkpointing(build_model(spec).model, "none") == 0


def _train(tmp: Path, job: str, doc: dict[str, Any], plan: dict[str, Any] | None = None) -> tuple[Any, list]:
    events: list = []
    req = LaunchRequest(
        job_id=job,
        attempt=0,
        spec=doc,
        world_size=1,
        pool="local-cpu",
        market="on_demand",
        checkpoint_url=f"file://{tmp / 'store'}",
        checkpoint_interval_s=None,
        run_dir=str(tmp / "run" / job),
        accelerator="cpu",
        plan=plan,
    )
    trainer = Trainer(req, 0, emit=lambda k, **d: events.append((k, d)), notice=PreemptionNotice(30.0))
    return trainer.run(), events


def test_trainer_executes_the_plan_and_recomputation_changes_no_bit(tmp_path: Path) -> None:
    doc = _doc(optimizer="adafactor")
    plain, _ = _train(tmp_path, "plain", doc)
    planned, events = _train(
        tmp_path, "planned", doc, {"micro_batch": 2, "activation_checkpointing": "full", "fsdp": False}
    )
    started = next(d for k, d in events if k == "started")
    assert started["plan"]["micro_batch"] == 2 and started["plan"]["grad_accum"] == 2
    assert (
        started["plan"]["activation_checkpointing"] == "full" and started["plan"]["checkpointed_modules"] == 2
    )
    assert started["plan"]["optimizer"] == "Adafactor"
    assert started["device"]["type"] == "cpu" and started["model"]["params"] == spec_from_dict(doc).params
    ck = next(d for k, d in events if k == "checkpoint")
    assert ck["step"] == 3
    # recomputation replays the same arithmetic; two micro-batches of 2 sum differently from one of 4
    again, _ = _train(tmp_path, "again", doc, {"micro_batch": 4, "activation_checkpointing": "full"})
    assert again.data["model_sha256"] == plain.data["model_sha256"]
    assert planned.kind == "succeeded"


def test_pool_backends_and_local_gpu_pools() -> None:
    seed = Pool(
        name="a100-spot", accelerator="a100-40gb", devices_per_node=1, nodes=4, market="spot", region="x"
    )
    assert pool_backend(seed) == "none"
    local = Pool(
        name="local-cpu", accelerator="cpu", devices_per_node=2, nodes=1, market="on_demand", region="l"
    )
    assert pool_backend(local) == "none"  # not cloud: local, no backend: a planning-only cpu pool
    local = local.model_copy(update={"cloud": "local"})
    assert pool_backend(local) == "local"
    gpus = [
        {"index": 0, "name": "NVIDIA H200", "memory_gib": 139.8, "accelerator": "h200"},
        {"index": 1, "name": "NVIDIA H200", "memory_gib": 139.8, "accelerator": "h200"},
        {"index": 2, "name": "Some GPU", "memory_gib": 8.0, "accelerator": None},
    ]
    (pool,) = local_gpu_pools(gpus)
    assert pool.name == "local-gpu" and pool.accelerator == "h200" and pool.devices_per_node == 2
    assert pool.backend == "local" and pool.memory_per_device_gib == pytest.approx(139.8)
    ex = LocalExecutor(warm_start=False, gpus=gpus)
    try:
        assert ex.serves(pool) and ex.serves(local) and not ex.serves(seed)
        assert not ex.serves(seed.model_copy(update={"backend": "local"}))  # no A100 on this machine
        req = LaunchRequest(
            job_id="j", attempt=1, spec={}, world_size=2, pool="local-gpu", market="on_demand",
            checkpoint_url="file:///x", checkpoint_interval_s=None, run_dir="/x", accelerator="h200",
        )  # fmt: skip
        assert ex._assign_gpus(req) == [0, 1]
        with pytest.raises(RuntimeError, match="only 2 are free"):
            ex._assign_gpus(LaunchRequest(**{**req.__dict__, "world_size": 3}))
    finally:
        ex.shutdown()
