"""The device a worker trains on: chosen from the launch request, checked against what it really got.

A placement names a catalog accelerator (``LaunchRequest.accelerator``). ``cpu`` trains on the host CPU
with gloo; an NVIDIA accelerator trains on ``cuda:<local rank>`` with NCCL (the executor makes the
gang's GPUs visible through ``CUDA_VISIBLE_DEVICES``). The worker reports the device it got (type,
name, count, memory) in its ``started`` event and refuses to train — an ``infra`` failure, so the job is
placed again — when it is not what it was placed on: a GPU placement on a machine without CUDA, fewer
visible GPUs than local ranks, or a different GPU model. Nothing is ever silently run on the CPU instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from trainyard.executors.base import accelerator_for_cuda_device, is_gpu_accelerator

GIB = 1024.0**3


class DeviceMismatch(RuntimeError):
    """The worker did not get the device its placement named (an infrastructure failure)."""


@dataclass(frozen=True)
class DevicePlan:
    device: torch.device
    backend: str  # torch.distributed backend: "nccl" on CUDA, "gloo" on CPU
    accelerator: str  # what the placement named


def placed_accelerator(accelerator: str | None) -> str:
    return accelerator or "cpu"


def dist_backend(device: torch.device) -> str:
    """NCCL for CUDA gangs, gloo for CPU ones."""
    return "nccl" if device.type == "cuda" else "gloo"


def local_rank(rank: int, env: dict[str, str] | None = None) -> int:
    source = env if env is not None else os.environ
    value = source.get("LOCAL_RANK")
    return int(value) if value not in (None, "") else rank


def plan_device(
    accelerator: str | None,
    rank: int,
    *,
    cuda_available: bool | None = None,
    cuda_count: int | None = None,
    env: dict[str, str] | None = None,
) -> DevicePlan:
    """The torch device and collective backend for ``rank`` of a gang placed on ``accelerator``.

    Raises :class:`DeviceMismatch` when a GPU placement cannot be honoured here. ``cuda_available`` and
    ``cuda_count`` default to what torch sees (tests pass them to exercise the GPU paths on a CPU host).
    """
    acc = placed_accelerator(accelerator)
    if not is_gpu_accelerator(acc):
        if acc != "cpu":
            raise DeviceMismatch(
                f"placed on {acc}, which the built-in trainer cannot drive (it trains on cpu and NVIDIA "
                "CUDA GPUs); no work was done"
            )
        return DevicePlan(torch.device("cpu"), "gloo", acc)
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if not available:
        raise DeviceMismatch(
            f"placed on {acc} but this worker sees no CUDA device "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); it will not train "
            "on the CPU instead"
        )
    count = torch.cuda.device_count() if cuda_count is None else cuda_count
    if count == 1:  # a rank given one GPU of its own (a Ray actor's CUDA_VISIBLE_DEVICES) trains on it
        return DevicePlan(torch.device("cuda", 0), "nccl", acc)
    lr = local_rank(rank, env)
    if lr >= count:
        raise DeviceMismatch(f"placed on {acc}: local rank {lr} needs GPU {lr} but only {count} are visible")
    return DevicePlan(torch.device("cuda", lr), "nccl", acc)


def device_report(device: torch.device) -> dict[str, Any]:
    """What this worker really got: ``{type, name, count, memory_gib, accelerator}``."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        mem = props.total_memory / GIB
        return {
            "type": "cuda",
            "index": device.index,
            "name": props.name,
            "count": torch.cuda.device_count(),
            "memory_gib": round(mem, 2),
            "accelerator": accelerator_for_cuda_device(props.name, mem),
            "capability": f"{props.major}.{props.minor}",
        }
    return {
        "type": "cpu",
        "name": _cpu_name(),
        "count": 1,
        "threads": torch.get_num_threads(),
        "memory_gib": round(_host_memory_gib(), 2),
        "accelerator": "cpu",
    }


def check_report(accelerator: str | None, report: dict[str, Any]) -> None:
    """Raise :class:`DeviceMismatch` unless ``report`` is the accelerator the placement named."""
    acc = placed_accelerator(accelerator)
    got = report.get("accelerator")
    if got != acc:
        raise DeviceMismatch(
            f"placed on {acc} but this worker got {report.get('name') or report.get('type')} "
            f"({got or 'not in the catalog'}); refusing to train on a device the job was not placed on"
        )


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _host_memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError):
        return 0.0
