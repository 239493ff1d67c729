"""Ray executor: overhead against the local executor, and time from node loss to training resumed.

1. Overhead. The same small 2-rank job (4-layer decoder, d_model 128, fp32, gloo) runs under the local
   executor and under the Ray executor (both ranks on one node of a loopback Ray cluster, STRICT_PACK),
   alternating, ``--repeats`` times each, in one run. Reported per executor: launch → every rank
   started (process start, imports, model build), training (first ``started`` → ``succeeded``: steps,
   checkpoints, export), the mean step time from heartbeats, and the end-to-end wall time; the
   Ray/local ratio of each. The final weights' sha256 must be equal under both executors (same worker
   code).
2. Node loss. A 2-rank job spread over two nodes (one device each); after its first checkpoint the
   second node's raylet is SIGKILLed. Measured from the kill: the ``lost`` event (detection and
   teardown), the new attempt placed on the remaining node (the service's re-launch), every rank
   started again, and the first heartbeat past the checkpoint step (training resumed).

Node-failure detection depends on Ray's GCS health checks; the loopback cluster uses 0.3 s × 3
(``ray_cluster.LOOPBACK_ENV``); Ray's defaults (3 s × 5) detect a dead node in about 15 s.

    .venv/bin/python benchmarks/bench_ray.py [--repeats 2] [--steps 60]

Prints a table and writes benchmarks/results/bench_ray.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_ray.json"

SPEC: dict[str, Any] = {
    "apiVersion": "trainyard/v1",
    "kind": "TrainingJob",
    "name": "bench-ray",
    "model": {"architecture": "decoder", "n_layers": 4, "d_model": 128, "n_heads": 4, "vocab_size": 1024},
    "workload": {"seq_len": 128, "global_batch": 8, "steps": 60, "precision": "fp32", "seed": 3},
    "requirements": {"allow": ["cpu"]},
}
TERMINAL = ("succeeded", "failed", "lost", "preempted")


def _request(job_id: str, attempt: int, pool: str, root: Path, every: int) -> Any:
    from trainyard.executors.base import LaunchRequest

    return LaunchRequest(
        job_id=job_id,
        attempt=attempt,
        spec=SPEC,
        world_size=2,
        pool=pool,
        market="on_demand",
        checkpoint_url=f"file://{root / 'checkpoints'}",
        checkpoint_interval_s=None,
        run_dir=str(root / "runs" / job_id),
        env={"TRAINYARD_CHECKPOINT_EVERY_STEPS": str(every), "TRAINYARD_HEARTBEAT_S": "0.25"},
    )


def _watch(ex: Any, job_id: str, until: Any, timeout_s: float = 600.0) -> list[tuple[float, Any]]:
    """(arrival time, event) pairs for ``job_id`` until ``until(events)``."""
    seen: list[tuple[float, Any]] = []
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        now = time.time()
        seen += [(now, e) for e in ex.poll() if e.job_id == job_id]
        if until([e for _, e in seen]):
            return seen
        time.sleep(0.02)
    raise SystemExit(f"{job_id}: no result within {timeout_s:.0f} s: {[e.kind for _, e in seen]}")


def _terminal(events: list[Any]) -> bool:
    return any(e.kind in TERMINAL for e in events)


def _one_run(ex: Any, job_id: str, pool: str, root: Path, every: int) -> dict[str, Any]:
    t0 = time.time()
    ex.launch(_request(job_id, 1, pool, root, every))
    seen = _watch(ex, job_id, _terminal)
    end = next(e for _, e in seen if e.kind in TERMINAL)
    if end.kind != "succeeded":
        raise SystemExit(f"{job_id} under {ex.name}: {end.kind} {end.data}")
    started = [t for t, e in seen if e.kind == "started"]
    t_started = max(started)
    t_end = next(t for t, e in seen if e.kind in TERMINAL)
    steps = [e.data["step_time_s"] for _, e in seen if e.kind == "heartbeat" and e.data["step"] > 1]
    return {
        "executor": ex.name,
        "startup_s": t_started - t0,
        "train_s": t_end - t_started,
        "total_s": t_end - t0,
        "step_time_s": statistics.mean(steps) if steps else None,
        "model_sha256": end.data["model_sha256"],
    }


def overhead(repeats: int, every: int) -> dict[str, Any]:
    from trainyard.executors.local import LocalExecutor
    from trainyard.executors.ray import RayExecutor, pool_resource
    from trainyard.executors.ray_cluster import LoopbackRayCluster

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp, LoopbackRayCluster() as cluster:
        os.environ.update(cluster.client_env)  # the cluster requires its token
        root = Path(tmp)
        t = time.time()
        cluster.add_node("head", resources={pool_resource("bench"): 2}, num_cpus=2)
        cluster_start_s = time.time() - t
        ray_ex = RayExecutor(cluster.address, shared_paths=[tmp])
        local_ex = LocalExecutor()
        try:
            for i in range(repeats):
                for ex in (local_ex, ray_ex):
                    run = _one_run(ex, f"{ex.name}-{i}", "bench", root, every)
                    runs.append(run)
                    print(
                        f"  {run['executor']:<6} run {i}: startup {run['startup_s']:.2f} s, "
                        f"train {run['train_s']:.2f} s, total {run['total_s']:.2f} s",
                        flush=True,
                    )
        finally:
            local_ex.shutdown(kill_workers=True)
            ray_ex.shutdown(kill_workers=True)
    summary: dict[str, Any] = {"cluster_start_s": cluster_start_s, "runs": runs}
    # The first run of each executor is cold (the local executor starts its warm fork server then);
    # "steady" is the median of the later runs, the state a running service is in.
    for key in ("startup_s", "train_s", "total_s", "step_time_s"):
        row: dict[str, Any] = {}
        for name in ("local", "ray"):
            values = [r[key] for r in runs if r["executor"] == name]
            row[f"{name}_cold"] = values[0]
            row[name] = statistics.median(values[1:] or values)
        row["ratio"] = row["ray"] / row["local"] if row["local"] else None
        row["ratio_cold"] = row["ray_cold"] / row["local_cold"] if row["local_cold"] else None
        summary[key] = row
    summary["same_weights"] = len({r["model_sha256"] for r in runs}) == 1
    return summary


def node_loss(every: int) -> dict[str, Any]:
    from trainyard.executors.ray import RayExecutor, pool_resource
    from trainyard.executors.ray_cluster import LoopbackRayCluster

    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp, LoopbackRayCluster() as cluster:
        os.environ.update(cluster.client_env)  # the cluster requires its token
        root = Path(tmp)
        cluster.add_node("head", resources={pool_resource("a"): 1, pool_resource("b"): 2}, num_cpus=2)
        second = cluster.add_node("second", resources={pool_resource("a"): 1}, num_cpus=2)
        ex = RayExecutor(cluster.address, shared_paths=[tmp])
        try:
            ex.launch(_request("loss", 1, "a", root, every))
            seen = _watch(ex, "loss", lambda evs: any(e.kind == "checkpoint" for e in evs) or _terminal(evs))
            t_kill = time.time()
            cluster.kill_raylet(second)
            seen += _watch(ex, "loss", _terminal)
            t_lost, lost = next((t, e) for t, e in seen if e.kind in TERMINAL)
            if lost.kind != "lost":
                raise SystemExit(f"expected a lost event, got {lost.kind} {lost.data}")
            ckpt = max(e.data["step"] for _, e in seen if e.kind == "checkpoint")
            t_relaunch = time.time()
            ex.launch(_request("loss", 2, "b", root, every))
            t_placed = None
            seen2: list[tuple[float, Any]] = []
            while True:
                if t_placed is None and ex.phase("loss") == "running":
                    t_placed = time.time()
                seen2 += [(time.time(), e) for e in ex.poll() if e.job_id == "loss"]
                if any(e.kind == "heartbeat" and e.data["step"] > ckpt for _, e in seen2) or _terminal(
                    [e for _, e in seen2]
                ):
                    break
                time.sleep(0.02)
            t_started = max(t for t, e in seen2 if e.kind == "started")
            t_resumed = next(t for t, e in seen2 if e.kind == "heartbeat" and e.data["step"] > ckpt)
            resumed_from = {e.data["resumed_from_step"] for _, e in seen2 if e.kind == "started"}
            _watch(ex, "loss", _terminal)
        finally:
            ex.shutdown(kill_workers=True)
    return {
        "checkpoint_step": ckpt,
        "resumed_from_step": sorted(resumed_from),
        "lost_event_s": t_lost - t_kill,
        "relaunch_to_placed_s": (t_placed or t_started) - t_relaunch,
        "relaunch_to_started_s": t_started - t_relaunch,
        "kill_to_training_resumed_s": t_resumed - t_kill,
        "lost_reason": lost.data.get("reason"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--checkpoint-every", type=int, default=20)
    args = ap.parse_args()
    SPEC["workload"]["steps"] = args.steps
    from trainyard.executors.ray_cluster import LOOPBACK_ENV

    os.environ.update(LOOPBACK_ENV)
    print(f"overhead: {args.repeats} runs per executor, {args.steps} steps, 2 ranks", flush=True)
    over = overhead(args.repeats, args.checkpoint_every)
    print("node loss: 2 ranks over 2 nodes, the second node's raylet killed after a checkpoint", flush=True)
    loss = node_loss(args.checkpoint_every)

    print()
    print(f"{'metric':<34}{'local':>10}{'ray':>10}{'ray/local':>11}   first (cold) run: local, ray")
    for key, label in (
        ("startup_s", "launch → all ranks started (s)"),
        ("train_s", "started → succeeded (s)"),
        ("step_time_s", "step time (s)"),
        ("total_s", "launch → succeeded (s)"),
    ):
        row = over[key]
        print(
            f"{label:<34}{row['local']:>10.3f}{row['ray']:>10.3f}{row['ratio']:>11.2f}"
            f"   {row['local_cold']:.3f}, {row['ray_cold']:.3f}"
        )
    print(f"same final weights under both executors: {over['same_weights']}")
    print(f"loopback Ray head start: {over['cluster_start_s']:.1f} s")
    print()
    print("node loss (s after SIGKILL of the second node's raylet):")
    print(f"  lost event reported              {loss['lost_event_s']:.2f}")
    print(f"  new attempt placed (from launch)  {loss['relaunch_to_placed_s']:.2f}")
    print(f"  ranks started (from launch)       {loss['relaunch_to_started_s']:.2f}")
    print(f"  training resumed                  {loss['kill_to_training_resumed_s']:.2f}")
    print(f"  checkpoint step {loss['checkpoint_step']}, resumed from {loss['resumed_from_step']}")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "bench_ray",
        "command": "python benchmarks/bench_ray.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg": os.getloadavg()},
        "steps": args.steps,
        "overhead": over,
        "node_loss": loss,
    }
    RESULTS.write_text(json.dumps(doc, indent=2))
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0 if over["same_weights"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
