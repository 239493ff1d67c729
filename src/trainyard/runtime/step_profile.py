"""Profile the built-in trainer's own step: the step a job runs, timed as its metrics time it.

A :class:`TrainerStepSession` builds a real :class:`~trainyard.runtime.trainer.Trainer` for a spec in a
scratch directory (the model ``build_model`` builds, the optimizer the spec names, the sampler over the
spec's dataset, the plan resolved as for a placement, the gradient clipping and learning-rate schedule of
every step) and times ``Trainer.train_step`` the way ``Trainer.run`` times the ``step_time_s`` of a job's
step metrics: ``time.perf_counter`` around the call. So a profile measures the same quantity a finished
job reports (data loading, forward/backward through the trained model, the gradient all-reduce of a gang,
clipping and the update), and quotes calibrated from it are quotes of the step the job will run. What
``Trainer.run`` does between steps (heartbeat lines, metrics rows, checkpoint-interval checks) is outside
that time in a job as in a profile.
"""

from __future__ import annotations

import contextlib
import math
import platform
import statistics
import tempfile
import time
from typing import Any

import torch

from trainyard.errors import InvalidInputError
from trainyard.spec.models import JobSpec

GIB = 1024.0**3


def _discard(kind: str, **data: Any) -> None:
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gib(device: torch.device) -> float:
    """Peak allocated CUDA memory, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return 0.0


class TrainerStepSession:
    """A built trainer for one spec; ``step()`` runs and times one of its optimizer steps.

    ``world_size`` > 1 with a ``process_group``: this process is rank ``rank`` of a data-parallel gang (the
    trainer deals the global batch over the ranks and all-reduces the gradients every step, as in a job).
    Use as a context manager (or call ``close()``) to remove the scratch directory.
    """

    def __init__(
        self,
        spec: JobSpec,
        *,
        device: str | None = None,
        threads: int | None = None,
        world_size: int = 1,
        rank: int = 0,
        process_group: Any = None,
        plan: dict[str, Any] | None = None,
    ) -> None:
        from trainyard.executors.base import LaunchRequest
        from trainyard.runtime.determinism import configure_determinism
        from trainyard.runtime.trainer import PreemptionNotice, Trainer

        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise InvalidInputError(
                "CUDA was requested but no CUDA device is available", hint="Use --device cpu."
            )
        if world_size > 1 and process_group is None:
            raise InvalidInputError("a gang rank needs its process group")
        # the worker's settings: fixed thread count, deterministic kernels (set before the model is built)
        configure_determinism(threads if threads is not None else torch.get_num_threads())
        self.spec, self.device = spec, dev
        self._scratch = tempfile.TemporaryDirectory(prefix="trainyard-profile-")
        root = self._scratch.name
        req = LaunchRequest(
            job_id="profile",
            attempt=0,
            spec=spec.to_document(),
            world_size=world_size,
            pool="local",
            market="on_demand",
            checkpoint_url=f"file://{root}/checkpoints",
            checkpoint_interval_s=None,
            run_dir=root,
            accelerator="cpu" if dev.type == "cpu" else None,
            plan=plan,
        )
        self.trainer = Trainer(
            req,
            rank,
            emit=_discard,
            notice=PreemptionNotice(req.notice_s),
            process_group=process_group,
            device=dev,
        )
        self.trainer.setup()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        self._next = 0

    def step(self) -> float:
        """Run one optimizer step of the trainer; its wall time in seconds (what the job's metrics say)."""
        _sync(self.device)
        t0 = time.perf_counter()
        self.trainer.train_step(self._next, False)
        _sync(self.device)
        dt = time.perf_counter() - t0
        self._next += 1
        return dt

    @property
    def plan(self) -> dict[str, Any]:
        tr = self.trainer
        local = len(tr.sampler.indices(0))
        return {
            "micro_batch": tr.micro_batch,
            "grad_accum": math.ceil(local / tr.micro_batch),
            "activation_checkpointing": tr.executed["activation_checkpointing"],
        }

    def document(
        self, times: list[float], device_info: dict[str, Any] | None = None, statistic: str = "median"
    ) -> dict[str, Any]:
        """The profile document; ``step_time_s`` is the median (or, with ``statistic="min"``, the fastest)
        of the timed steps."""
        if statistic not in ("median", "min"):
            raise InvalidInputError(f"statistic {statistic!r} is not median or min")
        dev = self.device
        return {
            "format": 1,
            "name": self.spec.name,
            "accelerator": "cpu" if dev.type == "cpu" else "cuda",
            "spec": self.spec.to_document(),
            "plan": self.plan,
            "runner": "trainer",  # timed through Trainer.train_step, as a job's step metrics are
            "clock": "wall",
            "statistic": statistic,
            "step_time_s": statistics.median(times) if statistic == "median" else min(times),
            "step_time_median_s": statistics.median(times),
            "step_time_min_s": min(times),
            "step_times_s": times,
            "peak_memory_gib": peak_memory_gib(dev),
            "peak_memory_kind": "allocated" if dev.type == "cuda" else "process peak resident set",
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "device": device_info or {"type": dev.type, "name": platform.processor() or platform.machine()},
            "params": sum(p.numel() for p in self.trainer.model.parameters()),
        }

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.trainer.ckpt.close()
        self._scratch.cleanup()

    def __enter__(self) -> TrainerStepSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
