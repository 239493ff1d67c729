"""GPU check: the runtime on CUDA, end to end, in minutes (run it when a machine with a GPU is lent).

1. Device: what torch and nvidia-smi see, the catalog accelerator it maps to, the local-gpu pool the
   server would register.
2. Step time of a small decoder on ``cuda:0``: a plain PyTorch loop vs the trainyard Trainer in-process
   (bf16 autocast, deterministic kernels), and vs the predictor for that GPU.
3. Kill and resume through the local executor: one uninterrupted run and one killed with SIGKILL
   mid-run then resumed; both must export the same sha256 (exact resume on CUDA).
4. FSDP (FSDP2 ``fully_shard`` over NCCL) over every visible GPU (skipped with one GPU), and its kill
   and resume.

    python benchmarks/gpu_check.py                 # on a CUDA machine (benchmarks/results/gpu_check.json)
    python benchmarks/gpu_check.py --device cpu    # the same checks on CPU (gloo, tiny model), a smoke test

Prints a table and writes JSON (``--out`` to choose the file).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu_check.json"

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def check_spec(device: str, steps: int) -> dict[str, Any]:
    """A small decoder: big enough to keep a GPU busy for a few ms per step, tiny on CPU."""
    if device == "cuda":
        model = {
            "architecture": "decoder",
            "n_layers": 8,
            "d_model": 1024,
            "n_heads": 16,
            "vocab_size": 32000,
        }
        workload = {"seq_len": 1024, "global_batch": 8, "precision": "bf16-mixed"}
    else:
        model = {"architecture": "decoder", "n_layers": 2, "d_model": 32, "n_heads": 4, "vocab_size": 64}
        workload = {"seq_len": 16, "global_batch": 4, "precision": "fp32"}
    return {
        "name": f"gpu-check-{device}",
        "model": {**model, "ffn": "gated"},
        "workload": {**workload, "steps": steps, "seed": 3, "learning_rate": 0.0003},
        "checkpoint": {"keep_last": 2},
    }


# ---- 1. device -------------------------------------------------------------------------------------


def device_section(device: str) -> dict[str, Any]:
    import torch

    from trainyard.executors.local import detect_local_gpus
    from trainyard.runtime.device import device_report
    from trainyard.services.pools import local_gpu_pools

    out: dict[str, Any] = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available()}
    if device == "cuda":
        out["torch_devices"] = [
            device_report(torch.device("cuda", i)) for i in range(torch.cuda.device_count())
        ]
        out["cuda"] = torch.version.cuda
    else:
        out["torch_devices"] = [device_report(torch.device("cpu"))]
    gpus = detect_local_gpus()
    out["nvidia_smi"] = gpus
    out["local_gpu_pools"] = [p.model_dump(mode="json", exclude_none=True) for p in local_gpu_pools(gpus)]
    return out


# ---- 2. step time ----------------------------------------------------------------------------------


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop_step_s(doc: dict[str, Any], device_name: str, steps: int, warmup: int) -> float:
    """Median step time of a plain PyTorch loop over the same HF model, data and optimizer."""
    import numpy as np
    import torch

    from trainyard.runtime.data import Sampler, build_dataset
    from trainyard.runtime.modeling import build_model, forward_loss, policy_for
    from trainyard.spec.models import JobSpec

    spec = JobSpec.model_validate(doc)
    device = torch.device(device_name)
    built = build_model(spec)
    model = built.model.to(device)
    policy = policy_for(spec.workload.precision)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.workload.learning_rate, weight_decay=0.01, foreach=False)
    ds = build_dataset(None, vocab_size=built.vocab_size, seq_len=spec.workload.seq_len, seed=0)
    sampler = Sampler(ds, spec.workload.global_batch, 0, 1)
    times = []
    for step in range(warmup + steps):
        tokens = torch.from_numpy(np.ascontiguousarray(sampler.batch(sampler.indices(step)))).to(device)
        _sync(device)
        t0 = time.perf_counter()
        for p in params:
            p.grad = None
        with policy.autocast(device.type):
            loss = forward_loss(built, tokens)
        loss.float().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=False)
        opt.step()
        _sync(device)
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def trainer_step_s(doc: dict[str, Any], device_name: str, store: Path) -> dict[str, Any]:
    """Median heartbeat step time of the trainyard Trainer in-process (world size 1) on the device."""
    import torch

    from trainyard.executors.base import LaunchRequest
    from trainyard.runtime.device import device_report
    from trainyard.runtime.trainer import PreemptionNotice, Trainer

    beats: list[float] = []
    started: dict[str, Any] = {}

    def emit(kind: str, **data: Any) -> None:
        if kind == "heartbeat":
            beats.append(float(data["step_time_s"]))
        elif kind == "started":
            started.update(data)

    device = torch.device(device_name)
    req = LaunchRequest(
        job_id="trainer-step",
        attempt=0,
        spec=doc,
        world_size=1,
        pool="local-gpu" if device.type == "cuda" else "local-cpu",
        market="on_demand",
        checkpoint_url=store.as_uri(),
        checkpoint_interval_s=None,
        run_dir=str(store / "run"),
        accelerator=device_report(device)["accelerator"],
    )
    trainer = Trainer(
        req, 0, emit=emit, notice=PreemptionNotice(30.0), heartbeat_s=0.0, device=device,
        device_info=device_report(device),
    )  # fmt: skip
    trainer.run()
    steady = beats[max(3, len(beats) // 10) :] or beats
    return {"step_time_s": statistics.median(steady), "started": started}


def predicted_step_s(doc: dict[str, Any], accelerator: str | None) -> float | None:
    if not accelerator:
        return None
    from trainyard.catalog.accelerators import get_accelerator
    from trainyard.predict import predict
    from trainyard.spec.models import JobSpec

    return float(predict(JobSpec.model_validate(doc), get_accelerator(accelerator), 1).step_time_s)


# ---- 3./4. kill and resume through the local executor ----------------------------------------------


def run_gang(
    ex: Any,
    root: Path,
    job_id: str,
    doc: dict[str, Any],
    *,
    world_size: int,
    accelerator: str,
    plan: dict[str, Any] | None,
    kill_at_step: int | None,
    timeout_s: float,
) -> dict[str, Any]:
    """Run a job to success on the local executor, SIGKILLing rank 0 once at ``kill_at_step``."""
    from trainyard.executors.base import LaunchRequest

    req = LaunchRequest(
        job_id=job_id,
        attempt=0,
        spec=doc,
        world_size=world_size,
        pool="local-gpu" if accelerator != "cpu" else "local-cpu",
        market="on_demand",
        checkpoint_url=(root / "store").as_uri(),
        checkpoint_interval_s=None,
        run_dir=str(root / "runs" / job_id),
        env={"TRAINYARD_CHECKPOINT_EVERY_STEPS": "5", "TRAINYARD_HEARTBEAT_S": "0"},
        accelerator=accelerator,
        plan=plan,
    )
    workers = ex.launch(req)
    attempt, killed, lost = 0, False, 0
    events: list[Any] = []
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        for e in ex.poll():
            if e.job_id != job_id:
                continue
            events.append(e)
            beat = e.kind == "heartbeat" and e.data.get("rank") == 0
            if beat and kill_at_step and not killed and e.data["step"] >= kill_at_step:
                os.kill(next(w.pid for w in workers if w.rank == 0), signal.SIGKILL)
                killed = True
            if e.kind == "succeeded" and e.data.get("rank") in (0, None):
                started = [x.data for x in events if x.kind == "started" and x.attempt == attempt]
                return {
                    "ok": True,
                    "sha256": e.data.get("model_sha256"),
                    "lost": lost,
                    "resumed_from_step": started[0].get("resumed_from_step") if started else None,
                    "device": started[0].get("device") if started else None,
                    "plan": started[0].get("plan") if started else None,
                    "wall_s": round(time.time() - t0, 2),
                }
            if e.kind == "failed":
                return {"ok": False, "failed": e.data}
            if e.kind == "lost":
                lost += 1
                attempt += 1
                workers = ex.launch(replace(req, attempt=attempt))
        time.sleep(0.05)
    return {"ok": False, "failed": f"timed out after {timeout_s} s", "events": [e.kind for e in events][-10:]}


def kill_resume_section(
    device: str, doc: dict[str, Any], world_size: int, plan: dict[str, Any] | None, timeout_s: float
) -> dict[str, Any]:
    from trainyard.executors.local import LocalExecutor, detect_local_gpus

    gpus = detect_local_gpus() if device == "cuda" else []
    accelerator = (gpus[0]["accelerator"] if gpus else None) if device == "cuda" else "cpu"
    if accelerator is None:
        return {"ok": False, "failed": "nvidia-smi reports no GPU the catalog knows"}
    steps = int(doc["workload"]["steps"])
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        ex = LocalExecutor(failure_grace_s=1.0, gpus=gpus)
        try:
            ex.wait_until_warm(180)
            common = dict(world_size=world_size, accelerator=accelerator, plan=plan, timeout_s=timeout_s)
            clean = run_gang(ex, Path(tmp), "clean", doc, kill_at_step=None, **common)  # type: ignore[arg-type]
            killed = run_gang(ex, Path(tmp), "killed", doc, kill_at_step=steps // 2 + 1, **common)  # type: ignore[arg-type]
        finally:
            ex.shutdown(kill_workers=True)
    same = bool(clean.get("ok") and killed.get("ok") and clean["sha256"] == killed["sha256"])
    return {"world_size": world_size, "clean": clean, "killed": killed, "bit_identical": same}


# ---- main ------------------------------------------------------------------------------------------


def run_checks(device: str, steps: int, timeout_s: float) -> dict[str, Any]:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible; use --device cpu for the CPU smoke test")
    doc = check_spec(device, steps)
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": platform.node(),
        "load_1m": os.getloadavg()[0],
        "device": device,
        "spec": doc,
    }
    out["devices"] = device_section(device)
    dev_name = "cuda:0" if device == "cuda" else "cpu"
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        plain = plain_loop_step_s(doc, dev_name, steps=max(5, steps // 2), warmup=3)
        runtime = trainer_step_s(doc, dev_name, Path(tmp))
    acc = runtime["started"].get("device", {}).get("accelerator")
    predicted = predicted_step_s(doc, acc)
    out["step_time"] = {
        "plain_loop_s": plain,
        "trainer_s": runtime["step_time_s"],
        "overhead_pct": 100.0 * (runtime["step_time_s"] / plain - 1.0),
        "predicted_s": predicted,
        "predicted_over_measured": None if predicted is None else predicted / runtime["step_time_s"],
        "accelerator": acc,
    }
    out["kill_resume"] = kill_resume_section(device, doc, 1, None, timeout_s)
    n = torch.cuda.device_count() if device == "cuda" else 2
    if n >= 2:
        out["fsdp"] = kill_resume_section(
            device, doc, n, {"fsdp": True, "tensor": 1, "pipeline": 1}, timeout_s
        )
    else:
        out["fsdp"] = {"skipped": f"{n} GPU visible; FSDP needs two or more"}
    out["passed"] = bool(out["kill_resume"]["bit_identical"] and (out["fsdp"].get("bit_identical", True)))
    return out


def print_table(doc: dict[str, Any]) -> None:
    st = doc["step_time"]
    rows = [
        (
            "device",
            ", ".join(f"{d.get('name')} ({d.get('accelerator')})" for d in doc["devices"]["torch_devices"]),
        ),
        ("plain loop step", f"{st['plain_loop_s'] * 1000:.2f} ms"),
        ("trainer step", f"{st['trainer_s'] * 1000:.2f} ms ({st['overhead_pct']:+.1f} %)"),
        ("predicted step", "-" if st["predicted_s"] is None else f"{st['predicted_s'] * 1000:.2f} ms"),
        ("kill/resume sha256 equal", str(doc["kill_resume"]["bit_identical"])),
        ("fsdp", str(doc["fsdp"].get("bit_identical", doc["fsdp"].get("skipped")))),
        ("passed", str(doc["passed"])),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--steps", type=int, default=40, help="training steps per run")
    ap.add_argument("--timeout-s", type=float, default=240.0, help="per run")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    doc = run_checks(args.device, args.steps, args.timeout_s)
    out = args.out or (RESULTS if args.device == "cuda" else RESULTS.with_name("gpu_check_cpu.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print_table(doc)
    print(f"wrote {out}")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
