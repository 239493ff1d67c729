"""The trainer in-process (one rank): every architecture, LoRA, a user's HF base model, exact resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trainyard.executors.base import LaunchRequest
from trainyard.runtime.trainer import Outcome, PreemptionNotice, Trainer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _spec(model: dict[str, Any], steps: int = 3, **workload: Any) -> dict[str, Any]:
    return {
        "name": "unit",
        "model": {"n_layers": 1, "d_model": 32, "n_heads": 4, "vocab_size": 300, **model},
        "workload": {"seq_len": 8, "global_batch": 2, "steps": steps, "precision": "fp32", **workload},
    }


def _run(tmp: Path, job: str, doc: dict[str, Any], every: int | None = None) -> tuple[Outcome, list]:
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
    )
    trainer = Trainer(
        req,
        0,
        emit=lambda k, **d: events.append((k, d)),
        notice=PreemptionNotice(30.0),
        checkpoint_every_steps=every,
    )
    return trainer.run(), events


@pytest.mark.parametrize(
    ("model", "workload"),
    [
        (
            {"architecture": "decoder", "n_kv_heads": 2},
            {"method": "lora", "lora_rank": 4, "optimizer": "sgd"},
        ),
        (
            {"architecture": "decoder", "n_experts": 2, "experts_per_token": 1, "ffn": "gated"},
            {"precision": "bf16-mixed"},
        ),
        ({"architecture": "encoder"}, {}),
        ({"architecture": "encoder-decoder", "ffn": "gated"}, {}),
    ],
)
def test_architectures_train_and_export(tmp_path: Path, model: dict, workload: dict) -> None:
    out, events = _run(tmp_path, "arch", _spec(model, **workload))
    assert out.kind == "succeeded" and out.data["final_step"] == 3
    assert len(out.data["model_sha256"]) == 64
    beats = [d for k, d in events if k == "heartbeat"]
    assert beats and all(torch.isfinite(torch.tensor(d["loss"])) for d in beats)
    assert (Path(out.data["model_path"].removeprefix("file://")) / "model.safetensors").exists()


def test_lora_on_a_users_hf_base_model_directory(tmp_path: Path) -> None:
    base, _ = _run(tmp_path, "base", _spec({"architecture": "decoder"}, steps=2))
    base_dir = base.data["model_path"]  # an HF directory: config.json + model.safetensors
    doc = _spec({"architecture": "custom", "params_b": 0.0001, "base": base_dir}, steps=2, method="lora")
    doc["model"] = {"architecture": "custom", "params_b": 0.0001, "base": base_dir}
    out, events = _run(tmp_path, "ft", doc)
    assert out.kind == "succeeded"
    started = next(d for k, d in events if k == "started")
    assert (
        started["model"]["source"].startswith("base:")
        and started["model"]["trainable_params"] < started["model"]["params"]
    )


def test_resume_in_process_is_bit_identical(tmp_path: Path) -> None:
    doc = _spec({"architecture": "decoder"}, steps=8)
    full, _ = _run(tmp_path, "full", doc, every=3)
    half_doc = _spec({"architecture": "decoder"}, steps=8)
    # a run that stops after step 6 (its last checkpoint), then a new process-like trainer resumes it
    first, _ = _run(
        tmp_path, "split", {**half_doc, "workload": {**half_doc["workload"], "steps": 6}}, every=3
    )
    assert first.data["final_step"] == 6
    second, events = _run(tmp_path, "split", half_doc, every=3)
    assert next(d for k, d in events if k == "started")["resumed_from_step"] == 6
    assert second.data["model_sha256"] == full.data["model_sha256"]


def test_a_step_that_verifies_but_fails_to_load_is_quarantined_and_the_previous_one_used(
    tmp_path: Path,
) -> None:
    import hashlib
    import json

    doc = _spec({"architecture": "decoder"}, steps=8)
    full, _ = _run(tmp_path, "full", doc, every=3)
    first, _ = _run(tmp_path, "bad", {**doc, "workload": {**doc["workload"], "steps": 6}}, every=3)
    assert first.data["final_step"] == 6
    # step 6's shard is damaged and its manifest was (re)written over the damaged bytes: it verifies,
    # but torch cannot load it
    step6 = tmp_path / "store" / "bad" / "step-6"
    shard = step6 / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    man = json.loads((step6 / "manifest.json").read_text())
    data = shard.read_bytes()
    man["files"]["__0_0.distcp"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (step6 / "manifest.json").write_text(json.dumps(man))
    second, events = _run(tmp_path, "bad", doc, every=3)
    assert next(d for k, d in events if k == "started")["resumed_from_step"] == 3
    assert any(d.get("quarantined_step") == 6 for k, d in events if k == "log")
    assert len(list((tmp_path / "store" / "bad").glob("quarantined-step-6-*"))) == 1
    # resuming from the older step still reproduces the uninterrupted run exactly
    assert second.data["model_sha256"] == full.data["model_sha256"]
