"""Training runtime overheads, measured side by side on this machine.

1. Step time of the runtime (trainyard Trainer: sampler, flags, heartbeats, checkpoint cadence) vs a
   plain PyTorch loop over the same Hugging Face model, data and optimizer, without checkpoints and
   with an asynchronous checkpoint every 30 s (and every 5 s, a harsher setting). Rounds alternate
   plain/runtime so that load from other processes hits both alike; medians are reported, in wall
   time and in process CPU time (the stable figure on a shared machine).
2. Checkpoint save: the training stall of an asynchronous save (staging copy) vs the time of a
   synchronous save of the same state, and the save throughput vs this disk's write bandwidth
   (``dd``-like write + fsync of the same number of bytes into the same directory).
3. Kill to resumed: ``kill -9`` of a worker on the local executor until the restarted attempt reports
   its first training step (detection, relaunch, checkpoint load, first step), warm (fork server)
   and cold (fresh interpreter).

    .venv/bin/python benchmarks/bench_runtime.py [--quick]

Prints a table and writes benchmarks/results/bench_runtime.json.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_runtime.json"

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def bench_spec(steps: int, *, d_model: int = 128, n_layers: int = 4) -> dict[str, Any]:
    return {
        "name": "bench",
        "model": {
            "architecture": "decoder",
            "n_layers": n_layers,
            "d_model": d_model,
            "n_heads": 4,
            "vocab_size": 512,
        },
        "workload": {"seq_len": 128, "global_batch": 8, "steps": steps, "precision": "fp32", "seed": 0},
        "checkpoint": {"keep_last": 2},
    }


# ---- 1. step-time overhead ---------------------------------------------------------------------------


def plain_loop(doc: dict[str, Any]) -> tuple[float, float, float]:
    """A plain PyTorch loop over the same model, data, optimizer; (wall, process cpu, main-thread cpu)
    seconds per step."""
    import numpy as np
    import torch

    from trainyard.runtime.data import Sampler, build_dataset
    from trainyard.runtime.modeling import build_model, forward_loss
    from trainyard.spec.models import JobSpec

    spec = JobSpec.model_validate(doc)
    built = build_model(spec)
    model = built.model
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.workload.learning_rate, weight_decay=0.01, foreach=False)
    ds = build_dataset(None, vocab_size=built.vocab_size, seq_len=spec.workload.seq_len, seed=0)
    sampler = Sampler(ds, spec.workload.global_batch, 0, 1)
    steps = spec.total_steps
    t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
    for step in range(steps):
        tokens = torch.from_numpy(np.ascontiguousarray(sampler.batch(sampler.indices(step))))
        for p in params:
            p.grad = None
        loss = forward_loss(built, tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=False)
        opt.step()
    return (
        (time.perf_counter() - t0) / steps,
        (time.process_time() - c0) / steps,
        (time.thread_time() - m0) / steps,
    )


def runtime_loop(doc: dict[str, Any], store: str, job_id: str, interval_s: float | None) -> dict[str, float]:
    """The trainyard Trainer in-process (world size 1); per-step wall/CPU over the training loop."""
    from trainyard.executors.base import LaunchRequest
    from trainyard.runtime.trainer import PreemptionNotice, Trainer

    marks: dict[str, float] = {}
    saves: list[dict[str, Any]] = []

    def emit(kind: str, **data: Any) -> None:
        if kind == "started":
            marks["t0"], marks["c0"], marks["m0"] = (
                time.perf_counter(),
                time.process_time(),
                time.thread_time(),
            )
        elif kind == "heartbeat" and data["step"] == doc["workload"]["steps"]:
            marks["t1"], marks["c1"], marks["m1"] = (
                time.perf_counter(),
                time.process_time(),
                time.thread_time(),
            )
        elif kind == "checkpoint":
            saves.append(data)

    req = LaunchRequest(
        job_id=job_id,
        attempt=0,
        spec=doc,
        world_size=1,
        pool="local-cpu",
        market="on_demand",
        checkpoint_url=store,
        checkpoint_interval_s=interval_s,
        run_dir=str(Path(store.removeprefix("file://")) / "run"),
    )
    trainer = Trainer(req, 0, emit=emit, notice=PreemptionNotice(30.0), heartbeat_s=1.0)
    trainer.run()
    steps = doc["workload"]["steps"]
    in_loop = [s for s in saves if s["step"] < steps]  # the final save is after the loop
    return {
        "wall_s": (marks["t1"] - marks["t0"]) / steps,
        "cpu_s": (marks["c1"] - marks["c0"]) / steps,
        "main_cpu_s": (marks["m1"] - marks["m0"]) / steps,
        "checkpoints": len(in_loop),
        "stall_s": sum(s["stall_s"] for s in in_loop),
    }


def bench_overhead(rounds: int, target_s: float) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    probe = bench_spec(5)
    wall, _, _ = plain_loop(probe)
    steps = max(20, int(target_s / wall))
    doc = bench_spec(steps)
    rows: dict[str, list[dict[str, float]]] = {"plain": [], "runtime": [], "ckpt30": [], "ckpt5": []}
    with tempfile.TemporaryDirectory(prefix="bench-rt-") as tmp:
        for r in range(rounds):
            w, c, m = plain_loop(doc)
            rows["plain"].append({"wall_s": w, "cpu_s": c, "main_cpu_s": m})
            rows["runtime"].append(runtime_loop(doc, f"file://{tmp}/a{r}", "nockpt", None))
            rows["ckpt30"].append(runtime_loop(doc, f"file://{tmp}/b{r}", "ckpt30", 30.0))
            rows["ckpt5"].append(runtime_loop(doc, f"file://{tmp}/c{r}", "ckpt5", 5.0))
    metrics = ("wall_s", "cpu_s", "main_cpu_s")
    med = {k: {m: statistics.median(x[m] for x in v) for m in metrics} for k, v in rows.items()}
    out: dict[str, Any] = {"steps_per_run": steps, "rounds": rounds, "per_step": med, "raw": rows}
    for k in ("runtime", "ckpt30", "ckpt5"):
        # paired: each round's runtime run against the plain run just before it, then the median
        for m, label in (("wall_s", "wall"), ("cpu_s", "cpu"), ("main_cpu_s", "main_cpu")):
            ratios = [a[m] / b[m] - 1 for a, b in zip(rows[k], rows["plain"], strict=True)]
            out[f"{k}_overhead_{label}_pct"] = 100 * statistics.median(ratios)
    out["checkpoints_per_run"] = {k: [x.get("checkpoints", 0) for x in rows[k]] for k in ("ckpt30", "ckpt5")}
    return out


# ---- 2. async stall vs sync save; throughput vs disk bandwidth ----------------------------------------


def disk_write_bandwidth(directory: Path, n_bytes: int, streams: int = 1) -> float:
    """The disk's fsync'd write bandwidth: ``n_bytes`` in 4 MiB ``write`` calls then ``fsync``, split over
    ``streams`` files written at once (one thread each; a disk with several queues takes parallel streams
    faster than one)."""
    import threading

    block = os.urandom(4 * 2**20)
    per_stream = max(len(block), n_bytes // max(1, streams))
    written = [0] * streams

    def one(i: int) -> None:
        with open(directory / f"bw-{i}.bin", "wb") as fh:
            while written[i] < per_stream:
                fh.write(block)
                written[i] += len(block)
            fh.flush()
            os.fsync(fh.fileno())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    for i in range(streams):
        (directory / f"bw-{i}.bin").unlink()
    return sum(written) / dt


def bench_save(repeats: int, d_model: int, n_layers: int) -> dict[str, Any]:
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from trainyard.runtime.checkpoint import CheckpointManager
    from trainyard.runtime.modeling import build_model
    from trainyard.spec.models import JobSpec

    spec = JobSpec.model_validate(bench_spec(1, d_model=d_model, n_layers=n_layers))
    model = build_model(spec).model
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    model_sd, optim_sd = get_state_dict(model, opt)  # initialises the AdamW moments
    state = {"model": model_sd, "optim": optim_sd}
    n_params = sum(p.numel() for p in model.parameters())
    stalls, syncs, sync_write, totals_async, fwd_bwd = [], [], [], [], []
    tokens = torch.randint(4, 512, (4, 128))

    def forward_backward() -> None:
        model(input_ids=tokens, labels=tokens).loss.backward()

    with tempfile.TemporaryDirectory(prefix="bench-save-", dir=os.environ.get("TMPDIR")) as tmp:
        mgr = CheckpointManager(f"file://{tmp}", "save", keep_last=1)
        step = 0
        for _ in range(repeats):
            step += 1
            fut = mgr.save(step, state, {}, blocking=True)
            res = fut.result()
            syncs.append(res.total_s)
            sync_write.append(res.stage_s)
            nbytes = res.bytes_written
            step += 1
            # as in training: save, run the next forward/backward, wait for the copy before the update
            t0 = time.perf_counter()
            fut = mgr.save(step, state, {}, blocking=False, overlap_staging=True)
            stall = time.perf_counter() - t0
            forward_backward()
            t1 = time.perf_counter()
            mgr.wait_staged()
            stalls.append(stall + time.perf_counter() - t1)
            res = fut.result()
            totals_async.append(res.total_s)
            fwd_bwd.append(t1 - t0 - stall)
        mgr.close()
        bw = statistics.median(disk_write_bandwidth(Path(tmp), nbytes) for _ in range(3))
    sync_s = statistics.median(syncs)
    write_s = statistics.median(sync_write)
    return {
        "params": n_params,
        "checkpoint_bytes": nbytes,
        "repeats": repeats,
        "sync_save_s": sync_s,
        "sync_write_s": write_s,
        "async_stall_s": statistics.median(stalls),
        "async_total_s": statistics.median(totals_async),
        "forward_backward_s": statistics.median(fwd_bwd),
        "stall_vs_sync_pct": 100 * statistics.median(stalls) / sync_s,
        "disk_write_mb_per_s": bw / 1e6,
        "save_mb_per_s": nbytes / sync_s / 1e6,
        "write_only_mb_per_s": nbytes / write_s / 1e6,
        "save_vs_disk_pct": 100 * (nbytes / sync_s) / bw,
        "write_only_vs_disk_pct": 100 * (nbytes / write_s) / bw,
    }


# ---- 3. kill -9 → training resumed on the local executor ----------------------------------------------


def bench_kill_resume(repeats: int, warm: bool) -> dict[str, Any]:
    from trainyard.executors.base import LaunchRequest
    from trainyard.executors.local import LocalExecutor

    doc = bench_spec(100_000, d_model=64, n_layers=2)
    doc["workload"]["seq_len"] = 32
    ex = LocalExecutor(warm_start=warm)
    if warm:
        ex.wait_until_warm(300)
    samples: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-kill-") as tmp:

        def req(attempt: int) -> LaunchRequest:
            return LaunchRequest(
                job_id="kill",
                attempt=attempt,
                spec=doc,
                world_size=1,
                pool="local-cpu",
                market="spot",
                checkpoint_url=f"file://{tmp}/store",
                checkpoint_interval_s=None,
                run_dir=f"{tmp}/run",
                env={"TRAINYARD_CHECKPOINT_EVERY_STEPS": "5", "TRAINYARD_HEARTBEAT_S": "0"},
            )

        attempt = 0
        workers = ex.launch(req(attempt))
        killed_at: float | None = None
        lost_at: float | None = None
        armed_step: int | None = None
        deadline = time.time() + 600
        try:
            while len(samples) < repeats and time.time() < deadline:
                for e in ex.poll():
                    if e.kind == "heartbeat" and e.attempt == attempt:
                        if killed_at is None and armed_step is None:
                            armed_step = e.data["step"] + 7
                        if killed_at is None and armed_step is not None and e.data["step"] >= armed_step:
                            pid = workers[0].pid
                            assert pid is not None
                            killed_at = time.time()
                            os.kill(pid, signal.SIGKILL)
                        elif killed_at is not None and lost_at is not None:
                            samples.append(
                                {"detect_s": lost_at - killed_at, "kill_to_resumed_s": e.time_s - killed_at}
                            )
                            killed_at, lost_at, armed_step = None, None, None
                    elif e.kind == "lost":
                        lost_at = time.time()
                        attempt += 1
                        workers = ex.launch(req(attempt))
                time.sleep(0.02)
        finally:
            ex.shutdown(kill_workers=True)
    ks = [s["kill_to_resumed_s"] for s in samples]
    return {
        "warm_start": warm,
        "samples": samples,
        "median_s": statistics.median(ks) if ks else None,
        "max_s": max(ks) if ks else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs (noisier)")
    ap.add_argument("--only", choices=["overhead", "save", "kill"], help="run one section; keep the others")
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    previous: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    # each run lasts about 65 s, so the "every 30 s" variant takes two checkpoints in every run
    rounds, target = (1, 8.0) if args.quick else (args.rounds or 3, 65.0)
    t_start = time.time()
    load_before = os.getloadavg()
    run = {k: args.only in (None, k) for k in ("overhead", "save", "kill")}
    overhead = bench_overhead(rounds, target) if run["overhead"] else previous["overhead"]
    save = bench_save(2 if args.quick else 3, d_model=512, n_layers=4) if run["save"] else previous["save"]
    kill_warm = (
        bench_kill_resume(2 if args.quick else 5, warm=True) if run["kill"] else previous["kill_resume_warm"]
    )
    kill_cold = bench_kill_resume(1, warm=False) if run["kill"] else previous["kill_resume_cold"]
    result = {
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "elapsed_s": time.time() - t_start,
        "overhead": overhead,
        "save": save,
        "kill_resume_warm": kill_warm,
        "kill_resume_cold": kill_cold,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    o, s = overhead, save
    print(
        f"runtime benchmark ({o['steps_per_run']} steps/run, {o['rounds']} rounds; load {load_before[0]:.1f})"
    )
    print(f"{'measure':44} {'value':>12} {'target':>10}")
    print(
        f"{'plain loop step (wall / cpu)':44} {o['per_step']['plain']['wall_s'] * 1e3:8.1f} ms  "
        f"{o['per_step']['plain']['cpu_s'] * 1e3:6.1f} ms cpu"
    )
    print(f"{'(overhead: median of paired per-round ratios; wall / process cpu / main-thread cpu)':44}")
    for k, label, tgt in (
        ("runtime", "no checkpoints", "≤ 2 %"),
        ("ckpt30", "checkpoint every 30 s", "≤ 5 %"),
        ("ckpt5", "checkpoint every 5 s", ""),
    ):
        print(
            f"{'overhead, ' + label:44} {o[f'{k}_overhead_wall_pct']:+7.2f} %  "
            f"{o[f'{k}_overhead_cpu_pct']:+6.2f} % {o[f'{k}_overhead_main_cpu_pct']:+6.2f} % {tgt:>8}"
        )
    print(f"{'checkpoint size':44} {s['checkpoint_bytes'] / 1e6:9.1f} MB")
    print(f"{'sync save (write + sha256 + manifest)':44} {s['sync_save_s']:9.3f} s")
    print(f"{'async save stall (training waits)':44} {s['async_stall_s']:9.3f} s")
    print(f"{'async stall / sync save':44} {s['stall_vs_sync_pct']:9.2f} % {'≤ 5 %':>10}")
    print(f"{'disk write bandwidth (dd + fsync)':44} {s['disk_write_mb_per_s']:9.1f} MB/s")
    print(
        f"{'save throughput (all / write only) vs disk':44} {s['save_vs_disk_pct']:7.1f} % "
        f"{s['write_only_vs_disk_pct']:6.1f} %"
    )
    for name, k in (("warm", kill_warm), ("cold", kill_cold)):
        if k["median_s"] is not None:
            print(
                f"{'kill -9 → resumed, ' + name + ' (median / max)':44} {k['median_s']:7.2f} s "
                f"{k['max_s']:6.2f} s {'≤ 5 s' if name == 'warm' else '':>8}"
            )
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
