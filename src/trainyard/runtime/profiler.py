"""Profile real training steps of a job spec's model on the local device (CPU, or CUDA when present).

``profile_spec`` (``trainyard profile``, and the brief measurement ``trainyard up`` makes at first start)
and ``profile_gang`` (``--ranks``) time the built-in trainer's own step
(:class:`~trainyard.runtime.step_profile.TrainerStepSession`): the model the job trains, its optimizer,
data loading, gradient clipping and, for a gang, the gradient all-reduce, timed as the job's step metrics
time them; they record the median step time, peak memory and the device's measured matmul throughput and
memory bandwidth, so the predictor calibrates the local device to the step jobs really run.

:class:`ProfileSession` is a plain-PyTorch Llama-style decoder built from the spec (RMSNorm, grouped-query
causal attention through ``scaled_dot_product_attention``, gated-SiLU or GELU FFN, optional tied
embeddings, LoRA adapters for ``method: lora``) whose steps can be interleaved and timed on the process
clock; benchmarks of the predictor's kernel model use it. A profile is a plain dict; storing it is the
caller's business.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainyard.errors import InvalidInputError
from trainyard.spec.models import FFNKind, JobSpec, Method, Optimizer, Precision

GIB = 1024.0**3


class LoRALinear(nn.Module):
    def __init__(self, d_in: int, d_out: int, rank: int | None) -> None:
        super().__init__()
        self.base = nn.Linear(d_in, d_out, bias=False)
        self.rank = rank
        if rank:
            self.base.weight.requires_grad_(False)
            self.a = nn.Parameter(torch.randn(rank, d_in) / math.sqrt(d_in))
            self.b = nn.Parameter(torch.zeros(d_out, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.rank:
            y = y + F.linear(F.linear(x, self.a), self.b)
        return y


class Block(nn.Module):
    def __init__(self, spec: JobSpec) -> None:
        super().__init__()
        m = spec.model
        assert m.d_model is not None and m.n_heads is not None
        r = spec.workload.lora_rank if spec.workload.method == Method.LORA else None
        d, hd = m.d_model, m.head_dim_eff
        self.n_heads, self.n_kv, self.hd = m.n_heads, m.n_kv_heads_eff, hd
        self.norm1 = nn.RMSNorm(d)
        self.norm2 = nn.RMSNorm(d)
        self.q = LoRALinear(d, self.n_heads * hd, r)
        self.k = LoRALinear(d, self.n_kv * hd, r)
        self.v = LoRALinear(d, self.n_kv * hd, r)
        self.o = LoRALinear(self.n_heads * hd, d, r)
        self.gated = m.ffn == FFNKind.GATED
        self.up = LoRALinear(d, m.d_ff_eff, r)
        self.gate = LoRALinear(d, m.d_ff_eff, r) if self.gated else None
        self.down = LoRALinear(m.d_ff_eff, d, r)
        self.selective = spec.workload.activation_checkpointing.value == "selective"

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != self.n_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, s, self.n_heads, self.hd).transpose(1, 2)
        k = self.k(h).view(b, s, self.n_kv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, s, self.n_kv, self.hd).transpose(1, 2)
        if self.selective and torch.is_grad_enabled():
            a = checkpoint(self._attend, q, k, v, use_reentrant=False)
        else:
            a = self._attend(q, k, v)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        h = self.norm2(x)
        u = self.up(h)
        u = F.silu(self.gate(h)) * u if self.gate is not None else F.gelu(u)
        return x + self.down(u)


class Decoder(nn.Module):
    def __init__(self, spec: JobSpec) -> None:
        super().__init__()
        m = spec.model
        if m.is_custom or m.n_experts:
            raise InvalidInputError(
                "profiling needs a dense decoder described by its shape (no custom params_b, no MoE)",
                hint="Give n_layers, d_model, n_heads and vocab_size.",
            )
        assert m.vocab_size is not None and m.d_model is not None and m.n_layers is not None
        self.embed = nn.Embedding(m.vocab_size, m.d_model)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(m.n_layers))
        self.norm = nn.RMSNorm(m.d_model)
        self.head = nn.Linear(m.d_model, m.vocab_size, bias=False)
        if m.tie_embeddings:
            self.head.weight = self.embed.weight
        if spec.workload.method == Method.LORA:
            self.embed.weight.requires_grad_(False)
            self.head.weight.requires_grad_(False)
        self.full_ckpt = spec.workload.activation_checkpointing.value == "full"

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for blk in self.blocks:
            x = (
                checkpoint(blk, x, use_reentrant=False)
                if self.full_ckpt and torch.is_grad_enabled()
                else blk(x)
            )
        return self.head(self.norm(x))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_device(device: torch.device, repeats: int = 5, clock: str = "wall") -> dict[str, Any]:
    """Achievable matmul FLOP/s (fp32 and, on CUDA, bf16) and memory bandwidth of the device.

    ``clock="process"`` (CPU, one thread) times with this process's CPU time, like the profiled steps.
    """
    perf = time.process_time if clock == "process" and device.type == "cpu" else time.perf_counter
    out: dict[str, Any] = {"type": device.type, "clock": clock}
    n = 1024 if device.type == "cpu" else 8192
    for dt in [torch.float32] if device.type == "cpu" else [torch.float32, torch.bfloat16]:
        a = torch.randn(n, n, device=device, dtype=dt)
        b = torch.randn(n, n, device=device, dtype=dt)
        torch.matmul(a, b)
        _sync(device)
        ts = []
        for _ in range(repeats):
            t0 = perf()
            torch.matmul(a, b)
            _sync(device)
            ts.append(perf() - t0)
        name = "fp32" if dt == torch.float32 else "bf16"
        out[f"matmul_flops_{name}"] = 2.0 * n**3 / statistics.median(ts)
    out["matmul_flops"] = out["matmul_flops_fp32"]
    if "matmul_flops_bf16" in out:
        out["matmul_flops"] = out["matmul_flops_bf16"]
        out["matmul_flops_fp16"] = out["matmul_flops_bf16"]
    else:
        out["matmul_flops_bf16"] = out["matmul_flops_fp16"] = out["matmul_flops_fp32"]
    x = torch.empty(16 * 1024 * 1024 if device.type == "cpu" else 256 * 1024 * 1024, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    _sync(device)
    ts = []
    for _ in range(repeats):
        t0 = perf()
        y.copy_(x)
        _sync(device)
        ts.append(perf() - t0)
    out["mem_bw_bytes_s"] = 2.0 * x.numel() * x.element_size() / statistics.median(ts)
    if device.type == "cuda":
        out["name"] = torch.cuda.get_device_name(device)
        out["memory_gib"] = torch.cuda.get_device_properties(device).total_memory / GIB
    else:
        out["name"] = platform.processor() or platform.machine()
    return out


def _peak_rss_gib() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return 0.0


class ProfileSession:
    """A built model, optimizer and data for one spec; ``step()`` runs and times one optimizer step.

    Keeping the session lets a benchmark interleave the steps of several configurations, so a burst of
    load from other processes on a shared machine hits them all alike.
    """

    def __init__(
        self,
        spec: JobSpec,
        *,
        device: str | None = None,
        threads: int | None = None,
        seed: int = 0,
        clock: str = "wall",
    ) -> None:
        if clock not in ("wall", "process"):
            raise InvalidInputError(f"clock {clock!r} is not wall or process")
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise InvalidInputError(
                "CUDA was requested but no CUDA device is available", hint="Use --device cpu."
            )
        if threads is not None:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)
        if clock == "process" and (dev.type != "cpu" or torch.get_num_threads() != 1):
            raise InvalidInputError("the process clock is only meaningful on CPU with one thread")
        self.spec, self.device, self.clock = spec, dev, clock
        self.group: Any = None  # a torch.distributed group: gradients are all-reduced over it each step
        wl = spec.workload
        self.micro_batch = min(wl.micro_batch or wl.global_batch, wl.global_batch)
        self.accum = math.ceil(wl.global_batch / self.micro_batch)
        self.model = Decoder(spec).to(dev)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if wl.optimizer == Optimizer.SGD:
            self.opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=wl.learning_rate, momentum=0.9)
        elif wl.optimizer == Optimizer.ADAFACTOR:
            self.opt = torch.optim.Adafactor(params, lr=wl.learning_rate)
        else:
            self.opt = torch.optim.AdamW(params, lr=wl.learning_rate)
        amp = {Precision.BF16_MIXED: torch.bfloat16, Precision.FP16_MIXED: torch.float16}.get(wl.precision)
        if wl.precision == Precision.FP8_MIXED:
            amp = torch.bfloat16  # fp8 kernels need Transformer Engine; profiled as bf16
        self.amp_dtype = amp
        self.vocab = spec.model.vocab_size or 2
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.data = torch.randint(
            0, self.vocab, (self.accum, self.micro_batch, wl.seq_len_eff + 1), generator=gen
        ).to(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)

    def _run(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        for i in range(self.accum):
            x, y = self.data[i, :, :-1], self.data[i, :, 1:]
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                logits = self.model(x)
                loss = F.cross_entropy(logits.float().reshape(-1, self.vocab), y.reshape(-1)) / self.accum
            loss.backward()
        if self.group is not None:
            self._all_reduce_grads()
        self.opt.step()

    def _all_reduce_grads(self) -> None:
        """What the built-in trainer does between backward and the update of a data-parallel gang: one
        all-reduce of every gradient flattened together with its three side-channel values."""
        import torch.distributed as dist

        params = [p for p in self.model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads] + [torch.zeros(3, device=self.device)])
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            k = g.numel()
            p.grad = flat[offset : offset + k].view_as(p).to(p.dtype)
            offset += k

    def step(self) -> float:
        """Run one optimizer step; its time in seconds.

        ``wall`` clock: elapsed time. ``process`` clock (CPU, one thread): CPU time of this process, which
        leaves out the time other processes hold the core — the step time of an unshared machine.
        """
        clk = time.process_time if self.clock == "process" else time.perf_counter
        _sync(self.device)
        t0 = clk()
        self._run()
        _sync(self.device)
        return clk() - t0

    def document(
        self, times: list[float], device_info: dict[str, Any] | None = None, statistic: str = "median"
    ) -> dict[str, Any]:
        """The profile document; ``step_time_s`` is the median (or, with ``statistic="min"``, the fastest)
        of the timed steps — the minimum estimates the undisturbed time on a shared machine."""
        if statistic not in ("median", "min"):
            raise InvalidInputError(f"statistic {statistic!r} is not median or min")
        wl = self.spec.workload
        dev = self.device
        peak = torch.cuda.max_memory_allocated(dev) / GIB if dev.type == "cuda" else _peak_rss_gib()
        ck = wl.activation_checkpointing.value
        return {
            "format": 1,
            "name": self.spec.name,
            "accelerator": "cpu" if dev.type == "cpu" else "cuda",
            "spec": self.spec.to_document(),
            "plan": {
                "micro_batch": self.micro_batch,
                "grad_accum": self.accum,
                "activation_checkpointing": "none" if ck == "auto" else ck,
            },
            "clock": self.clock,
            "statistic": statistic,
            "step_time_s": statistics.median(times) if statistic == "median" else min(times),
            "step_time_median_s": statistics.median(times),
            "step_time_min_s": min(times),
            "step_times_s": times,
            "peak_memory_gib": peak,
            "peak_memory_kind": "allocated" if dev.type == "cuda" else "process peak resident set",
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "device": device_info or {"type": dev.type},
            "params": sum(p.numel() for p in self.model.parameters()),
        }


def profile_spec(
    spec: JobSpec,
    *,
    steps: int = 5,
    warmup: int = 2,
    device: str | None = None,
    threads: int | None = None,
    seed: int | None = None,
    measure: bool = True,
) -> dict[str, Any]:
    """Time ``steps`` optimizer steps of the built-in trainer (after ``warmup``) and return the profile
    document (``seed``: instead of the spec's ``workload.seed``)."""
    if steps < 1 or warmup < 0:
        raise InvalidInputError("steps must be >= 1 and warmup >= 0")
    from trainyard.runtime.step_profile import TrainerStepSession

    if seed is not None:
        spec = spec.model_copy(update={"workload": spec.workload.model_copy(update={"seed": seed})})
    with TrainerStepSession(spec, device=device, threads=threads) as session:
        for _ in range(warmup):
            session.step()
        times = [session.step() for _ in range(steps)]
        return session.document(times, measure_device(session.device) if measure else None)


# ---- a gang of ranks on this host (data parallel over gloo, as the local executor runs one) -------------


def _gang_rank(
    rank: int,
    ranks: int,
    store_path: str,
    out_path: str,
    spec_path: str,
    steps: int,
    warmup: int,
    seed: int,
    threads: int,
) -> None:
    import torch.distributed as dist

    from trainyard.runtime.step_profile import TrainerStepSession
    from trainyard.spec.loader import spec_from_dict

    with open(spec_path, encoding="utf-8") as fh:
        spec = spec_from_dict(json.load(fh))
    if seed:
        spec = spec.model_copy(update={"workload": spec.workload.model_copy(update={"seed": seed})})
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=ranks)
    try:
        # the trainer deals the global batch over the ranks and all-reduces the gradients, as in a job
        session = TrainerStepSession(
            spec, device="cpu", threads=threads, world_size=ranks, rank=rank, process_group=dist.group.WORLD
        )
        # Rank 0 also times the whole batch on one rank between the gang's steps, while the others wait:
        # the gang's step relative to one rank's under the same load from the rest of the machine.
        solo = TrainerStepSession(spec, device="cpu", threads=threads) if rank == 0 else None
        times, solo_times = [], []
        for i in range(warmup + steps):
            t = session.step()
            dist.barrier()
            if solo is not None:
                u = solo.step()
                if i >= warmup:
                    times.append(t)
                    solo_times.append(u)
            dist.barrier()
        if rank == 0:
            doc = session.document(times, {"type": "cpu", "name": platform.processor() or platform.machine()})
            doc.update(
                devices=ranks,
                host_cores=os.cpu_count() or 1,
                plan={**doc["plan"], "data_parallel": ranks},
                solo_step_time_s=statistics.median(solo_times),
                solo_step_times_s=solo_times,
                # median over the pairs of (gang step / one-rank step) timed back to back
                ratio_to_one_rank=statistics.median(a / b for a, b in zip(times, solo_times, strict=True)),
            )
            with open(out_path, "w", encoding="utf-8") as fh:
                json.dump(doc, fh)
        session.close()
        if solo is not None:
            solo.close()
    finally:
        dist.destroy_process_group()


def profile_gang(
    spec: JobSpec,
    *,
    ranks: int,
    steps: int = 5,
    warmup: int = 2,
    seed: int = 0,
    threads: int = 1,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Time ``steps`` optimizer steps of ``spec`` trained data parallel by ``ranks`` processes of this host
    on CPU (gloo over loopback, ``threads`` torch threads each, the global batch dealt over the ranks and
    the gradients all-reduced every step, as the built-in trainer runs a gang on the local pool). The
    profile document says ``devices: ranks`` and ``host_cores``; its ``step_time_s`` is rank 0's median
    step (the ranks step together: every step ends in the all-reduce). Between the gang's steps rank 0
    times the whole batch alone (``solo_step_time_s``); ``ratio_to_one_rank`` is the median ratio of the
    back-to-back pairs, which the load of other processes on a shared machine moves far less than
    either time."""
    import subprocess
    import sys
    import tempfile

    if ranks < 2:
        raise InvalidInputError("a gang profile needs at least 2 ranks", hint="Leave out --ranks for one.")
    if steps < 1 or warmup < 0:
        raise InvalidInputError("steps must be >= 1 and warmup >= 0")
    if spec.workload.global_batch < ranks:
        raise InvalidInputError(f"global_batch {spec.workload.global_batch} cannot feed {ranks} ranks")
    with tempfile.TemporaryDirectory(prefix="trainyard-gang-") as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "profile.json")
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w", encoding="utf-8") as fh:
            json.dump(spec.to_document(), fh)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "trainyard.runtime.profiler",
                    "--gang-rank",
                    str(r),
                    str(ranks),
                    store,
                    out,
                    spec_path,
                    str(steps),
                    str(warmup),
                    str(seed),
                    str(threads),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(ranks)
        ]
        deadline = time.monotonic() + timeout_s
        errors: list[str] = []
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if proc.returncode != 0:
                errors.append(f"exit {proc.returncode}: {(err or '').strip()[-300:]}")
        if errors or not os.path.exists(out):
            raise InvalidInputError(f"the {ranks}-rank profile did not finish ({'; '.join(errors)})")
        with open(out, encoding="utf-8") as fh:
            doc: dict[str, Any] = json.load(fh)
    return doc


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 11 and sys.argv[1] == "--gang-rank":
        r, n, store_path, out_path, spec_file, st, wu, sd, th = sys.argv[2:]
        _gang_rank(int(r), int(n), store_path, out_path, spec_file, int(st), int(wu), int(sd), int(th))
    else:
        sys.exit(
            "usage: python -m trainyard.runtime.profiler --gang-rank "
            "RANK RANKS STORE OUT SPEC STEPS WARMUP SEED THREADS"
        )
