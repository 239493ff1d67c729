"""The final model: a Hugging Face directory (``config.json`` + ``model.safetensors``) beside the steps.

``<storage>/<job_id>/model/`` loads with ``from_pretrained`` (and as another job's ``model.base``).
LoRA adapters are merged into the base weights first; the adapter alone (``adapter_config.json``
and ``adapter_model.safetensors``, loadable with ``peft``) is also written to
``<storage>/<job_id>/adapter/``, which the model registry keeps as the version's artefact.
The sha256 of ``model.safetensors`` identifies the trained weights (equal hashes ⇔ bit-identical
weights).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from trainyard.runtime.storage import is_local, join_url, sha256_file, url_to_fs

WEIGHTS_FILE = "model.safetensors"


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by name, contiguous, with shared tensors stored once."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in model.state_dict().items():
        ptr = t.data_ptr()
        if ptr in seen and t.numel() > 0:
            continue
        seen.add(ptr)
        out[name] = t.detach().to("cpu").contiguous().clone()
    return out


def export_model(
    model: torch.nn.Module, job_url: str, *, lora: bool, scratch_dir: str | None = None
) -> tuple[str, str]:
    """Write the model directory under ``job_url``; returns (model directory URL, weights sha256)."""
    from safetensors.torch import save_file

    fs, root = url_to_fs(job_url)
    target = f"{root}/model"
    if scratch_dir is not None:
        Path(scratch_dir).mkdir(parents=True, exist_ok=True)
    if lora:
        with tempfile.TemporaryDirectory(dir=scratch_dir, prefix="export-adapter-") as tmp:
            local_adapter = Path(tmp) / "adapter"
            model.save_pretrained(str(local_adapter), safe_serialization=True)  # type: ignore[operator]
            _publish(fs, local_adapter, f"{root}/adapter")
        model = model.merge_and_unload()  # type: ignore[operator]
    tensors = model_tensors(model)
    config: Any = getattr(model, "config", None)
    with tempfile.TemporaryDirectory(dir=scratch_dir, prefix="export-") as tmp:
        local = Path(tmp) / "model"
        local.mkdir()
        save_file(tensors, str(local / WEIGHTS_FILE), metadata={"format": "pt"})
        if config is not None:
            config.save_pretrained(str(local))
        _publish(fs, local, target)
    digest, _ = sha256_file(fs, f"{target}/{WEIGHTS_FILE}")
    return join_url(job_url, "model"), digest


def _publish(fs: Any, local: Path, target: str) -> None:
    """Copy a local directory to ``target`` (replaced whole on local storage)."""
    if is_local(fs):
        staging = f"{target}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(local, staging)
        shutil.rmtree(target, ignore_errors=True)
        Path(staging).rename(target)
    else:
        fs.put(str(local), target, recursive=True)
