"""Offline checkpoint conversion: precision policy and layout (``trainyard checkpoint convert``).

Loading already converts (DCP reshards to the new world size; tensors are cast to the new policy's
dtypes). Offline conversion does the same ahead of time, without a model: every tensor of a committed
step is read in one process, parameters are cast to the target policy's ``param_dtype`` and optimizer
moments to its ``optimizer_state_dtype``, and the result is written as a new committed step (one
process, so ``world_size`` 1; any world size can load it). The manifest keeps the source's RNG and
data-loader state and records where it came from.
"""

from __future__ import annotations

from typing import Any

import torch

from trainyard.errors import CheckpointError, InvalidInputError
from trainyard.runtime.checkpoint import CheckpointManager, CheckpointRef
from trainyard.runtime.modeling import POLICIES, PrecisionPolicy
from trainyard.runtime.storage import join_url

OPTIM_MOMENTS = ("exp_avg", "exp_avg_sq", "momentum_buffer")


def resolve(url: str) -> CheckpointRef:
    """A step URL (``.../step-N``) or a job URL (its newest step that verifies)."""
    last = url.rstrip("/").rsplit("/", 1)[-1]
    if last.startswith("step-"):
        ok, why, manifest = CheckpointManager.verify(url)
        if not ok or manifest is None:
            raise CheckpointError(f"{url}: {why}")
        return CheckpointRef(int(manifest["step"]), url, manifest)
    base, job_id = url.rstrip("/").rsplit("/", 1)
    ref = CheckpointManager(base, job_id).latest_valid(report=False)
    if ref is None:
        raise CheckpointError(f"{url} holds no committed checkpoint that verifies")
    return ref


def read_all(ref: CheckpointRef) -> dict[str, Any]:
    """Every tensor and object of a checkpoint, as the nested state dict it was saved from."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(
        state, storage_reader=FsspecReader(ref.url), planner=_EmptyStateDictLoadPlanner(), no_dist=True
    )
    return state


def cast_state(state: dict[str, Any], policy: PrecisionPolicy) -> dict[str, int]:
    """Cast in place; returns how many tensors changed dtype per section."""
    changed = {"model": 0, "optim": 0}
    model = state.get("model") or {}
    for k, v in list(model.items()):
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != policy.torch_param_dtype:
            model[k] = v.to(policy.torch_param_dtype)
            changed["model"] += 1
    opt_dtype = getattr(torch, policy.optimizer_state_dtype)
    for per_param in ((state.get("optim") or {}).get("state") or {}).values():
        for k, v in list(per_param.items()):
            if k in OPTIM_MOMENTS and isinstance(v, torch.Tensor) and v.dtype != opt_dtype:
                per_param[k] = v.to(opt_dtype)
                changed["optim"] += 1
    return changed


def convert(
    src_url: str, dst_storage_url: str, *, precision: str, job_id: str | None = None
) -> dict[str, Any]:
    if precision not in POLICIES:
        raise InvalidInputError(f"--precision {precision!r} is not one of {', '.join(POLICIES)}")
    ref = resolve(src_url)
    policy = POLICIES[precision]
    state = read_all(ref)
    changed = cast_state(state, policy)
    src = ref.manifest
    job = job_id or str(src.get("job_id") or "converted")
    meta = {
        k: v
        for k, v in src.items()
        if k not in ("files", "world_size", "code_hash", "created_time_s", "step")
    }
    meta["precision"] = policy.to_dict()
    meta["converted_from"] = {
        "url": ref.url,
        "step": ref.step,
        "world_size": src.get("world_size"),
        "precision": (src.get("precision") or {}).get("name"),
    }
    mgr = CheckpointManager(dst_storage_url, job)
    mgr.save(ref.step, state, meta, blocking=True)
    mgr.close()
    return {
        "source": ref.url,
        "step": ref.step,
        "path": join_url(dst_storage_url, job, f"step-{ref.step}"),
        "precision": policy.name,
        "from_precision": meta["converted_from"]["precision"],
        "from_world_size": src.get("world_size"),
        "tensors_cast": changed,
    }
