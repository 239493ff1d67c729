"""The training loop that runs inside each worker process.

Data parallel over ``world_size`` ranks (gloo on loopback): after backward, every rank's gradients are
packed into one flat fp32 buffer in a fixed parameter order and summed with a single all-reduce, so the
arithmetic is the same on every run with the same world size. Three extra slots ride in that buffer: the
loss sum, "a preemption notice arrived" and "rank 0 says checkpoint now", so every rank takes those
decisions after the same step without extra collectives.

Exact resume: the checkpoint of step ``s`` holds the parameters and optimizer state after ``s`` steps,
every rank's RNG state and the sampler position (a function of ``s``); the learning-rate schedule is a
function of the step. On CPU with a fixed thread count, a resumed run therefore replays exactly the
floating-point operations of an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainyard.executors.base import LaunchRequest, notice_file_name
from trainyard.runtime.checkpoint import (
    CheckpointManager,
    CheckpointRef,
    CheckpointWriteError,
    SaveResult,
    config_hash,
)
from trainyard.runtime.data import IGNORE_INDEX, Sampler, TokenDataset, build_datasets, mlm_mask
from trainyard.runtime.determinism import capture_rng_state, restore_rng_state, seed_everything
from trainyard.runtime.metrics import MetricsStream
from trainyard.runtime.modeling import BuiltModel, PrecisionPolicy, build_model, forward_loss, policy_for
from trainyard.spec.models import JobSpec, Method, Optimizer

EmitFn = Callable[..., Any]

GRAD_CLIP_NORM = 1.0
DEFAULT_HEARTBEAT_S = 1.0
MAX_CHECKPOINT_FAILURES = 2
# how long checkpoint storage may stay unwritable before the attempt gives up (saving to the local
# fallback meanwhile); a short outage is ridden out inside the attempt instead of spending restarts
DEFAULT_STORAGE_OUTAGE_BUDGET_S = 600.0
STORAGE_RETRY_FIRST_S = 1.0
STORAGE_RETRY_MAX_S = 30.0
MAX_EVAL_SAMPLES = 64  # eval-split samples scored at each checkpoint and at the end


class PreemptionNotice:
    """SIGTERM handler state: when the notice arrived and when the machine goes away."""

    def __init__(self, notice_s: float, run_dir: str | None = None, attempt: int = 0):
        self.notice_s = notice_s
        self.run_dir = run_dir
        self.attempt = attempt
        self.received_at: float | None = None
        self.deadline: float | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        if self.received_at is not None:
            return
        now = time.time()
        deadline = now + self.notice_s
        if self.run_dir is not None:
            try:
                import json

                doc = json.loads((Path(self.run_dir) / notice_file_name(self.attempt)).read_text())
                deadline = float(doc["deadline_time_s"])
            except (OSError, ValueError, KeyError):
                pass
        self.received_at, self.deadline = now, deadline

    @property
    def pending(self) -> bool:
        return self.received_at is not None

    def remaining_s(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.time()


@dataclass
class Outcome:
    kind: str  # "succeeded" | "preempted" | "failed"
    data: dict[str, Any] = field(default_factory=dict)


def device_memory_gib(device: torch.device) -> float:
    """Peak memory of this rank: allocated CUDA memory on a GPU, the resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return rss_gib()


class PlanNotExecutable(ValueError):
    """The placement's plan needs tensor or pipeline parallelism, which the built-in trainer does not run."""


def resolve_plan(spec: JobSpec, plan: dict[str, Any] | None, world_size: int) -> dict[str, Any]:
    """What this trainer executes: the spec's pins first, then the placement's plan, then defaults.

    Returns ``{micro_batch, activation_checkpointing, fsdp}``; raises :class:`PlanNotExecutable` for a
    plan with tensor or pipeline parallelism (prediction only; such jobs need their own entrypoint).
    """
    from trainyard.spec.models import ActivationCheckpointing

    wl = spec.workload
    plan = dict(plan or {})
    pins = wl.parallelism if not isinstance(wl.parallelism, str) else None
    tensor = int((pins.tensor if pins is not None else None) or plan.get("tensor") or 1)
    pipeline = int((pins.pipeline if pins is not None else None) or plan.get("pipeline") or 1)
    if tensor > 1 or pipeline > 1:
        raise PlanNotExecutable(
            f"plan not executable by the built-in trainer (tensor {tensor}, pipeline {pipeline}); "
            "user code required: give the job an entrypoint that runs it"
        )
    ck = wl.activation_checkpointing.value
    if wl.activation_checkpointing == ActivationCheckpointing.AUTO:
        ck = str(plan.get("activation_checkpointing") or "none")
    fsdp = bool(pins.fsdp) if pins is not None else bool(plan.get("fsdp"))
    return {
        "micro_batch": wl.micro_batch or plan.get("micro_batch"),
        "activation_checkpointing": ck if ck in ("none", "selective", "full") else "none",
        "fsdp": fsdp and world_size > 1,
    }


def _outermost(model: torch.nn.Module, match: Callable[[torch.nn.Module], bool]) -> list[torch.nn.Module]:
    """Modules that match and are not inside another matching module (parents come first)."""
    found: list[tuple[str, torch.nn.Module]] = []
    for name, mod in model.named_modules():
        if mod is model or not match(mod):
            continue
        if any(name.startswith(prefix + ".") for prefix, _ in found):
            continue
        found.append((name, mod))
    return [m for _, m in found]


def is_transformer_block(mod: torch.nn.Module) -> bool:
    cls = type(mod).__name__
    return cls.endswith(("DecoderLayer", "Layer", "Block")) and "Attention" not in cls


def apply_activation_checkpointing(model: torch.nn.Module, mode: str) -> int:
    """Recompute activations in backward: ``full`` checkpoints every transformer block, ``selective``
    only the attention modules. Returns how many modules are checkpointed."""
    if mode not in ("full", "selective"):
        return 0
    from torch.utils.checkpoint import checkpoint

    def is_attention(mod: torch.nn.Module) -> bool:
        return type(mod).__name__.endswith("Attention")

    mods = _outermost(model, is_transformer_block if mode == "full" else is_attention)
    for mod in mods:
        inner = mod.forward

        def fwd(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():
                return checkpoint(_inner, *args, use_reentrant=False, **kwargs)
            return _inner(*args, **kwargs)

        mod.forward = fwd
    return len(mods)


def build_optimizer(spec: JobSpec, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer the spec names: AdamW (weight decay 0.01), SGD (momentum 0.9), Adafactor."""
    lr = spec.workload.learning_rate
    if spec.workload.optimizer == Optimizer.SGD:
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if spec.workload.optimizer == Optimizer.ADAFACTOR:
        return torch.optim.Adafactor(params, lr=lr, foreach=False)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.01, foreach=False)


def rss_gib() -> float:
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (OSError, ValueError, IndexError):
        return 0.0


class Trainer:
    def __init__(
        self,
        req: LaunchRequest,
        rank: int,
        *,
        emit: EmitFn,
        notice: PreemptionNotice,
        process_group: Any = None,
        checkpoint_group: Any = None,
        heartbeat_s: float | None = None,
        checkpoint_every_steps: int | None = None,
        fallback_url: str | None = None,
        device: torch.device | None = None,
        device_info: dict[str, Any] | None = None,
        metrics: MetricsStream | None = None,
        storage_outage_budget_s: float = DEFAULT_STORAGE_OUTAGE_BUDGET_S,
    ):
        self.req = req
        self.metrics = metrics  # step metrics at training resolution (rank 0's)
        self.device = device if device is not None else torch.device("cpu")
        self.device_info = device_info
        self.rank = rank
        self.world_size = req.world_size
        self.emit = emit
        self.notice = notice
        self.pg = process_group
        self.spec = JobSpec.model_validate(req.spec)
        self.policy: PrecisionPolicy = policy_for(
            req.env.get("TRAINYARD_PRECISION") or self.spec.workload.precision
        )
        self.total_steps = self.spec.total_steps
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else DEFAULT_HEARTBEAT_S
        self.interval_s = req.checkpoint_interval_s
        if self.interval_s is None:
            self.interval_s = self.spec.checkpoint.interval_s
        self.every_steps = checkpoint_every_steps
        self.ckpt = CheckpointManager(
            req.checkpoint_url,
            req.job_id,
            rank=rank,
            world_size=self.world_size,
            keep_last=self.spec.checkpoint.keep_last,
            process_group=checkpoint_group,
            emit=emit,
            fallback_url=fallback_url,
        )
        self.config_hash = config_hash(req.spec)
        self.step = 0
        self.last_loss: float | None = None
        self.last_ckpt_step: int | None = None
        self.ckpt_failures = 0
        self.resumed_from: int | None = None
        self.pending_step: int | None = None
        self.pending_primary = False  # the in-flight save goes to primary storage (not the fallback)
        self.fallback_step: int | None = None  # the newest step saved to the fallback by a blocking save
        # storage outage: when primary writes began failing, and when to try primary again
        self.storage_outage_budget_s = max(0.0, storage_outage_budget_s)
        self.outage_since: float | None = None
        self.retry_primary_at = 0.0
        self.retry_backoff_s = STORAGE_RETRY_FIRST_S

    # ---- set-up --------------------------------------------------------------------------------
    def setup(self) -> None:
        seed = self.spec.workload.seed
        seed_everything(seed, self.rank)
        self.executed = resolve_plan(self.spec, self.req.plan, self.world_size)
        self.built: BuiltModel = build_model(self.spec)
        self.model = self.built.model.to(device=self.device, dtype=self.policy.torch_param_dtype)
        self.checkpointed_modules = apply_activation_checkpointing(
            self.model, self.executed["activation_checkpointing"]
        )
        self.sharded = bool(self.executed["fsdp"])
        if self.sharded:
            self._shard()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.param_numel = sum(p.numel() for p in self.params)
        self.optimizer: torch.optim.Optimizer = build_optimizer(self.spec, self.params)
        self.scaler: Any = None
        if self.policy.needs_grad_scaler(self.device.type):
            self.scaler = torch.amp.GradScaler(self.device.type)
        self.dataset, self.eval_dataset = build_datasets(
            self.spec.workload.dataset,
            vocab_size=self.built.vocab_size,
            seq_len=self.spec.workload.seq_len_eff,
            seed=seed,
            tokenizer_path=self.built.tokenizer_path,
        )
        self.sampler = Sampler(self.dataset, self.spec.workload.global_batch, self.rank, self.world_size)
        local = len(self.sampler.indices(0))
        self.micro_batch = max(1, min(local, int(self.executed["micro_batch"] or local)))
        self.warmup_steps = max(1, min(100, self.total_steps // 10))
        self.tokens_per_rank_step = local * self.spec.workload.seq_len_eff

    def _shard(self) -> None:
        """FSDP2: every transformer block, then the root, sharded over the gang (``fully_shard``)."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        for mod in _outermost(self.model, is_transformer_block):
            fully_shard(mod, mesh=mesh, reshard_after_forward=True)
        fully_shard(self.model, mesh=mesh, reshard_after_forward=True)

    def _state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        opts = StateDictOptions(ignore_frozen_params=self.spec.workload.method == Method.LORA)
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=opts)
        return {"model": model_sd, "optim": optim_sd}

    def _apply_state(self, state: dict[str, Any], *, with_optim: bool) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        opts = StateDictOptions(strict=False)
        if with_optim:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
                options=opts,
            )
        else:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            set_model_state_dict(self.model, state["model"], options=opts)

    def _choose_checkpoint(self) -> CheckpointRef | None:
        ref = self.ckpt.latest_valid() if self.rank == 0 else None
        if self.world_size > 1:
            import torch.distributed as dist

            box: list[Any] = [None if ref is None else (ref.step, ref.url, ref.manifest)]
            dist.broadcast_object_list(box, src=0, group=self.pg)
            ref = None if box[0] is None else CheckpointRef(*box[0])
        return ref

    def _all_loaded(self, ok: bool) -> bool:
        """True when every rank loaded its part of the chosen step."""
        if self.world_size <= 1:
            return ok
        import torch.distributed as dist

        flags: list[Any] = [None] * self.world_size
        dist.all_gather_object(flags, ok, group=self.pg)
        return all(bool(f) for f in flags)

    def resume(self) -> CheckpointRef | None:
        """Load the newest checkpoint that verifies (rank 0 chooses; every rank loads the same step). A
        step that verifies but fails to load is quarantined (never chosen again) and the previous one used."""
        while True:
            ref = self._choose_checkpoint()
            if ref is None:
                if self.rank == 0:
                    self.ckpt.remove_newer_than(-1)
                return None
            man = ref.manifest
            same_optim = man.get("layout", {}).get("optimizer") == self.spec.workload.optimizer.value
            state = self._state_dict()
            if not same_optim:
                state = {"model": state["model"]}
            why = ""
            try:
                self.ckpt.load(ref, state)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # torch's CheckpointException is a BaseException
                why = f"loading failed: {exc.__class__.__name__}: {str(exc)[:300]}"
            if self._all_loaded(not why):
                break
            if self.rank == 0:
                self.ckpt.quarantine(ref, why or "loading failed on another rank")
            if self.world_size > 1:
                import torch.distributed as dist

                dist.barrier(group=self.pg)
        if self.rank == 0:
            self.ckpt.remove_newer_than(ref.step)
        self._apply_state(state, with_optim=same_optim)
        self.step = int(man["step"])
        self.last_ckpt_step = self.step
        self.last_loss = man.get("loss")
        converted = []
        if int(man["world_size"]) != self.world_size:
            converted.append(f"world size {man['world_size']} → {self.world_size}")
        saved_policy = man.get("precision", {}).get("name")
        if saved_policy and saved_policy != self.policy.name:
            converted.append(f"precision {saved_policy} → {self.policy.name}")
        if not same_optim:
            converted.append("optimizer state reset (different optimizer)")
        if self.scaler is not None and man.get("grad_scaler"):
            self.scaler.load_state_dict(man["grad_scaler"])
        saved_sharding = man.get("layout", {}).get("sharding", "replicated")
        current_sharding = "fsdp" if self.sharded else "replicated"
        if saved_sharding != current_sharding:
            converted.append(f"layout {saved_sharding} → {current_sharding}")
        rngs = man.get("rng") or {}
        if int(man["world_size"]) == self.world_size and str(self.rank) in rngs:
            restore_rng_state(rngs[str(self.rank)])
        if converted and self.rank == 0:
            self.emit("log", message=f"converted checkpoint step {self.step} on load: {'; '.join(converted)}")
        if self.rank == 0 and man.get("config_hash") not in (None, self.config_hash):
            self.emit("log", message=f"checkpoint step {self.step} was written under a different job config")
        self.resumed_from = self.step
        return ref

    # ---- one optimizer step --------------------------------------------------------------------
    def _lr(self, step: int) -> float:
        base = self.spec.workload.learning_rate
        return base * min(1.0, (step + 1) / self.warmup_steps)

    def train_step(self, step: int, ckpt_flag: bool) -> tuple[float, bool, bool]:
        """One optimizer step. Returns (global mean loss, preempt agreed, checkpoint agreed)."""
        indices = self.sampler.indices(step)
        tokens_np = self.sampler.batch(indices)
        labels_np = self.sampler.labels(indices)  # completion/chat data: loss masked to the answers
        if self.built.task == "masked-lm":
            tokens_np, labels_np = mlm_mask(
                tokens_np, indices, self.spec.workload.seed, self.built.vocab_size
            )
        gb = self.spec.workload.global_batch
        for p in self.params:
            p.grad = None
        loss_sum = 0.0
        for start in range(0, len(indices), self.micro_batch):
            sl = slice(start, start + self.micro_batch)
            tokens = torch.from_numpy(np.ascontiguousarray(tokens_np[sl])).to(self.device)
            labels = None
            if labels_np is not None:
                labels = torch.from_numpy(np.ascontiguousarray(labels_np[sl])).to(self.device)
            n = tokens.shape[0]
            with self.policy.autocast(self.device.type):
                loss = forward_loss(self.built, tokens, labels)
            scaled = loss.float() * (n / gb)
            if self.scaler is not None:
                scaled = self.scaler.scale(scaled)
            scaled.backward()
            loss_sum += float(loss.detach()) * n
        preempt = self.notice.pending
        if self.sharded:
            # FSDP reduce-scattered the gradients in backward; the side channel rides alone
            import torch.distributed as dist

            side = torch.tensor(
                [loss_sum, float(preempt), float(ckpt_flag and self.rank == 0)], device=self.device
            )
            dist.all_reduce(side, group=self.pg)
            loss_sum, preempt_v, ckpt_v = side.tolist()
            preempt, ckpt_flag = preempt_v > 0, ckpt_v > 0
        elif self.world_size > 1:
            import torch.distributed as dist

            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            flat = torch.cat(
                [g.reshape(-1).float() for g in grads]
                + [
                    torch.tensor(
                        [loss_sum, float(preempt), float(ckpt_flag and self.rank == 0)], device=self.device
                    )
                ]
            )
            dist.all_reduce(flat, group=self.pg)
            offset = 0
            for p, g in zip(self.params, grads, strict=True):
                k = g.numel()
                p.grad = flat[offset : offset + k].view_as(p).to(p.dtype)
                offset += k
            loss_sum, preempt_v, ckpt_v = flat[offset:].tolist()
            preempt, ckpt_flag = preempt_v > 0, ckpt_v > 0
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.params, GRAD_CLIP_NORM, foreach=False)
        for group in self.optimizer.param_groups:
            group["lr"] = self._lr(step)
        self.ckpt.wait_staged()  # an async save copies parameters during forward/backward; not past here
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skipped when the scaled gradients overflowed
            self.scaler.update()
        else:
            self.optimizer.step()
        return loss_sum / gb, preempt, ckpt_flag

    # ---- held-out evaluation --------------------------------------------------------------------
    def evaluate(self, step: int) -> float | None:
        """Mean per-token loss on (up to MAX_EVAL_SAMPLES of) the eval split, reported by rank 0 as an
        ``evaluation`` event. Rank 0 alone scores a replicated model; a sharded (FSDP) model is scored
        by every rank together. Uses no random state, so training replays identically with or without it."""
        ds: TokenDataset | None = self.eval_dataset
        if ds is None or (self.rank != 0 and not self.sharded):
            return None
        n = min(MAX_EVAL_SAMPLES, int(getattr(ds, "n_windows", MAX_EVAL_SAMPLES)))
        sampler = Sampler(ds, max(1, self.micro_batch), 0, 1)
        total, weight = 0.0, 0
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, n, self.micro_batch):
                    idx = list(range(start, min(n, start + self.micro_batch)))
                    toks = sampler.batch(idx)
                    labels = sampler.labels(idx)
                    if self.built.task == "masked-lm":
                        toks, labels = mlm_mask(toks, idx, self.spec.workload.seed, self.built.vocab_size)
                    if labels is None:
                        k = toks.shape[0] * max(1, toks.shape[1] - 1)
                    elif self.built.task == "causal-lm":
                        k = int((labels[:, 1:] != IGNORE_INDEX).sum())  # labels shift by one
                    else:
                        k = int((labels != IGNORE_INDEX).sum())
                    if k == 0:
                        continue
                    t = torch.from_numpy(np.ascontiguousarray(toks)).to(self.device)
                    lab = (
                        None
                        if labels is None
                        else torch.from_numpy(np.ascontiguousarray(labels)).to(self.device)
                    )
                    with self.policy.autocast(self.device.type):
                        loss = forward_loss(self.built, t, lab)
                    total += float(loss.float()) * k
                    weight += k
        finally:
            self.model.train(was_training)
        if weight == 0 or self.rank != 0:
            return None
        value = total / weight
        self.emit(
            "evaluation",
            step=step,
            split="eval",
            loss=value,
            samples=n,
            tokens=weight,
            dataset=self.spec.workload.dataset,
            final=step == self.total_steps,
        )
        return value

    # ---- checkpoints ---------------------------------------------------------------------------
    def _meta(self, step: int, rngs: dict[str, Any]) -> dict[str, Any]:
        return {
            "precision": self.policy.to_dict(),
            "layout": {
                "format": "torch-dcp",
                "replicated": not self.sharded,
                "sharding": "fsdp" if self.sharded else "replicated",
                "activation_checkpointing": self.executed["activation_checkpointing"],
                "micro_batch": self.micro_batch,
                "keys": ["model", "optim"],
                "trainable_only": self.spec.workload.method == Method.LORA,
                "optimizer": self.spec.workload.optimizer.value,
                "model": self.built.description,
            },
            "config_hash": self.config_hash,
            "rng": rngs,
            "data": self.sampler.state(step),
            "loss": self.last_loss,
            "total_steps": self.total_steps,
            "attempt": self.req.attempt,
            "grad_scaler": self._scaler_state(),
            "device": {"type": self.device.type, "accelerator": (self.device_info or {}).get("accelerator")},
        }

    def _scaler_state(self) -> dict[str, Any] | None:
        if self.scaler is None:
            return None
        st = self.scaler.state_dict()
        return {k: (float(v) if isinstance(v, float) else v) for k, v in st.items()}

    def _gather_rng(self) -> dict[str, Any]:
        mine = capture_rng_state()
        if self.world_size == 1:
            return {"0": mine}
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, mine, group=self.pg)
        return {str(r): s for r, s in enumerate(out)}

    def _any(self, flag: bool) -> bool:
        """True on every rank when it is true on any rank."""
        if self.world_size == 1:
            return flag
        import torch.distributed as dist

        t = torch.tensor([float(flag)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.pg)
        return bool(t.item() > 0)

    def _settle_pending(self) -> str | None:
        """Wait for the in-flight save; every rank learns whether any rank's part of it failed."""
        error: str | None = None
        try:
            self.ckpt.wait()
        except CheckpointWriteError as exc:
            error = str(exc)
        pending, self.pending_step = self.pending_step, None
        if self._any(error is not None):
            return error or "another rank failed to write its shards"
        if pending is not None:
            self.last_ckpt_step = pending
            if self.pending_primary:
                self._storage_recovered()
        return None

    def _storage_recovered(self) -> None:
        if self.outage_since is not None and self.rank == 0:
            self.emit(
                "log",
                message=f"checkpoint storage writable again after "
                f"{time.monotonic() - self.outage_since:.0f} s; saving there again",
            )
        self.ckpt_failures = 0
        self.outage_since = None
        self.retry_primary_at = 0.0
        self.retry_backoff_s = STORAGE_RETRY_FIRST_S

    def _save_root(self, root: str | None) -> str | None:
        """Where the next save goes: the primary storage, or while it is failing and its next retry is
        not yet due, the local fallback (so the work is kept). Rank 0 decides for the whole gang."""
        if root is not None or self.ckpt.fallback_job_url is None:
            return root
        waiting = self.outage_since is not None and time.monotonic() < self.retry_primary_at
        return self.ckpt.fallback_job_url if self._any(self.rank == 0 and waiting) else None

    def checkpoint(
        self, step: int, *, blocking: bool, emergency: bool = False, root: str | None = None
    ) -> None:
        err = self._settle_pending()
        if err is not None:
            self._checkpoint_failed(err)
        root = self._save_root(root)
        primary = root is None or root == self.ckpt.job_url
        rngs = self._gather_rng()
        try:
            self.ckpt.save(
                step,
                self._state_dict(),
                self._meta(step, rngs),
                blocking=blocking,
                emergency=emergency,
                root=root,
                overlap_staging=True,
            )
            failed = None
        except CheckpointWriteError as exc:
            failed = str(exc)
        if self._any(failed is not None):
            self._checkpoint_failed(failed or "another rank failed to write its shards")
            fallback = self.ckpt.fallback_job_url
            if primary and blocking and fallback is not None and self.fallback_step != step:
                self.checkpoint(step, blocking=True, emergency=emergency, root=fallback)
            return
        if blocking:
            self.last_ckpt_step = step
            if primary:
                self._storage_recovered()
            else:
                self.fallback_step = step
        else:
            self.pending_step = step
            self.pending_primary = primary

    def _checkpoint_failed(self, error: str) -> None:
        """A save failed on some rank. Storage errors are retried with exponential backoff inside the
        attempt (saves go to the local fallback in between); the attempt fails only when storage has
        been failing for longer than the outage budget (and at least MAX_CHECKPOINT_FAILURES times)."""
        now = time.monotonic()
        self.ckpt_failures += 1
        if self.outage_since is None:
            self.outage_since = now
        outage_s = now - self.outage_since
        give_up = self.ckpt_failures >= MAX_CHECKPOINT_FAILURES and outage_s >= self.storage_outage_budget_s
        if self._any(self.rank == 0 and give_up):
            raise StorageFailure(error)
        self.retry_primary_at = now + self.retry_backoff_s
        if self.rank == 0:
            self.emit(
                "log",
                message=f"checkpoint save failed ({self.ckpt_failures} in a row, storage failing for "
                f"{outage_s:.0f} s of {self.storage_outage_budget_s:.0f} s allowed; next try in "
                f"{self.retry_backoff_s:.0f} s, saving to the local fallback meanwhile): {error}",
                checkpoint_failed=True,
                failures=self.ckpt_failures,
                error=error[:1000],
            )
        self.retry_backoff_s = min(self.retry_backoff_s * 2, STORAGE_RETRY_MAX_S)

    def _final_checkpoint(self) -> None:
        """The last step goes to primary storage: during an outage, retry with backoff until storage is
        back or the outage budget is spent (StorageFailure)."""
        err = self._settle_pending()
        if err is not None:
            self._checkpoint_failed(err)
        if self.last_ckpt_step == self.step and self.outage_since is None:
            return
        while True:
            self.checkpoint(self.step, blocking=True, root=self.ckpt.job_url)
            if self.outage_since is None:
                return
            wait_s = max(0.0, self.retry_primary_at - time.monotonic())
            time.sleep(self._agreed_max(wait_s))

    def _agreed_max(self, value: float) -> float:
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.pg)
        return float(t.item())

    # ---- the loop ------------------------------------------------------------------------------
    def run(self) -> Outcome:
        self.setup()
        self.resume()
        self.emit_started()
        if self.rank == 0:
            from trainyard.runtime.record import run_record

            self.emit("record", **run_record(self.req, self.dataset.describe()))
        last_hb = 0.0
        hb_steps, hb_time = 0, 0.0
        last_ckpt_t = time.monotonic()
        while self.step < self.total_steps:
            due = False
            if self.rank == 0:
                if self.interval_s is not None and time.monotonic() - last_ckpt_t >= self.interval_s:
                    due = True
                if self.every_steps and (self.step + 1) % self.every_steps == 0:
                    due = True
            t0 = time.perf_counter()
            loss, preempt, due = self.train_step(self.step, due)
            dt = time.perf_counter() - t0
            self.step += 1
            self.last_loss = loss
            hb_steps += 1
            hb_time += dt
            if self.metrics is not None:
                self.metrics.record(
                    self.step,
                    final=self.step == self.total_steps,
                    loss=loss,
                    step_time_s=dt,
                    tokens_per_s=self.tokens_per_rank_step * self.world_size / dt if dt > 0 else None,
                    learning_rate=self._lr(self.step - 1),
                )
            if not math.isfinite(loss):
                self._flush_metrics()
                raise TrainingDiverged(f"loss became {loss} at step {self.step}")
            now = time.monotonic()
            if hb_steps and (
                now - last_hb >= self.heartbeat_s or self.step == 1 or self.step == self.total_steps
            ):
                mean = hb_time / hb_steps
                self.emit(
                    "heartbeat",
                    rank=self.rank,
                    step=self.step,
                    loss=loss,
                    step_time_s=mean,
                    tokens_per_s=self.tokens_per_rank_step * self.world_size / mean if mean > 0 else 0.0,
                    memory_gib=round(device_memory_gib(self.device), 4),
                    total_steps=self.total_steps,
                )
                last_hb, hb_steps, hb_time = now, 0, 0.0
            if preempt:
                self._flush_metrics()
                return self._preempted()
            if due and self.step < self.total_steps:
                self._flush_metrics()
                self.checkpoint(self.step, blocking=False)
                self._eval_metric(self.step, self.evaluate(self.step))
                last_ckpt_t = time.monotonic()
        self._final_checkpoint()
        self._eval_metric(self.step, self.evaluate(self.step))
        self._flush_metrics()
        return self._finish()

    def _eval_metric(self, step: int, value: float | None) -> None:
        if self.metrics is not None and value is not None:
            self.metrics.attach(step, eval_loss=value)

    def _flush_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.flush()

    def emit_started(self) -> None:
        self.emit(
            "started",
            rank=self.rank,
            pid=os.getpid(),
            host=os.uname().nodename,
            resumed_from_step=self.resumed_from,
            total_steps=self.total_steps,
            precision=self.policy.name,
            world_size=self.world_size,
            model=self.built.description,
            device=self.device_info or {"type": self.device.type},
            plan={
                **self.executed,
                "micro_batch": self.micro_batch,
                "grad_accum": -(-len(self.sampler.indices(0)) // self.micro_batch),
                "checkpointed_modules": self.checkpointed_modules,
                "optimizer": type(self.optimizer).__name__,
            },
        )

    def _preempted(self) -> Outcome:
        err = self._settle_pending()
        if err is not None:
            self.ckpt_failures += 1
        saved: int | None = self.last_ckpt_step if err is None else None
        if self.last_ckpt_step != self.step:
            estimate = self._save_estimate_s()
            fits = self.notice.remaining_s() > estimate * 1.5 + 0.25
            if self._any(not fits):
                fits = False
            if fits:
                with contextlib.suppress(StorageFailure):
                    self.checkpoint(self.step, blocking=True, emergency=True)
                saved = self.last_ckpt_step
            elif self.rank == 0:
                self.emit(
                    "log",
                    message=f"emergency checkpoint skipped: {estimate:.2f} s save does not fit the notice",
                )
        else:
            saved = self.step
        self.ckpt.close()
        return Outcome(
            "preempted", {"step": self.step, "checkpoint_step": saved, "lost_steps": self.step - (saved or 0)}
        )

    def _save_estimate_s(self) -> float:
        last: SaveResult | None = self.ckpt.last_save
        return 0.0 if last is None else last.total_s

    def _export_model(self) -> torch.nn.Module | None:
        """The model to export on rank 0: the trained one, or for a sharded run an unsharded copy
        holding the gathered full weights (a collective: every rank calls it)."""
        if not self.sharded:
            return self.model if self.rank == 0 else None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if self.rank != 0:
            return None
        plain = build_model(self.spec).model.to(self.policy.torch_param_dtype)
        plain.load_state_dict(full, strict=False)
        return plain

    def _finish(self) -> Outcome:
        self.ckpt.close()
        export = self._export_model()
        if self.rank != 0 or export is None:
            return Outcome("succeeded", {"final_step": self.step})
        from trainyard.runtime.export import export_model

        model_url, digest = export_model(
            export,
            self.ckpt.job_url,
            lora=self.spec.workload.method == Method.LORA,
            scratch_dir=os.path.join(self.req.run_dir, "scratch"),
        )
        return Outcome(
            "succeeded",
            {
                "model_path": model_url,
                "model_sha256": digest,
                "final_step": self.step,
                "loss": self.last_loss,
            },
        )

    def fail_to_fallback(self, error: str) -> Outcome:
        """Primary storage is failing: save the current state to the local fallback, then fail (infra)."""
        fallback = self.ckpt.fallback_job_url
        saved = None
        if fallback is not None:
            try:
                self.ckpt.save(
                    self.step,
                    self._state_dict(),
                    self._meta(self.step, self._gather_rng()),
                    blocking=True,
                    emergency=True,
                    root=fallback,
                )
                saved = self.ckpt.step_url(self.step, fallback)
            except CheckpointWriteError as exc:
                error = f"{error}; the fallback save failed too: {exc}"
        reason = f"checkpoint storage failed: {error}"
        if saved:
            reason += f"; training state at step {self.step} was saved to {saved}"
        return Outcome(
            "failed",
            {
                "reason": reason,
                "classification": "infra",
                "traceback_tail": "",
                "fallback_checkpoint": saved,
                "step": self.step,
            },
        )


class StorageFailure(RuntimeError):
    """Checkpoint storage failed repeatedly; the job must stop (infrastructure)."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite (a user configuration problem: learning rate, precision)."""
