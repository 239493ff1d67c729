"""The sandbox's start-up cost per attempt on the Ray executor (target ≤ 100 ms, issue 11).

A one-node loopback Ray cluster; per attempt one ``RankHost`` actor (the real per-rank actor of the
Ray executor), with the sandbox (``SandboxSpec()``: bubblewrap built and probed on the node) or bare,
alternating ABBA over ``--pairs`` pairs. After the actor is up (one cheap call, so the Ray worker
process start is not counted), three phases are timed from the driver:

- ``hello``: the actor's hello (with the sandbox: building it and probing one empty bubblewrap);
- ``start``: writing the launch file and starting the worker (with the sandbox: the run directory
  handed to the sandbox uid, the mounts and the bubblewrap command line);
- ``run``: from the start until the actor reports the worker's exit: the worker's interpreter start,
  its imports and an entrypoint ``/bin/true`` (with the sandbox: inside bubblewrap).

The sandbox's cost per attempt is the difference of the medians of the three together, and the
median of the per-pair differences; a gang pays it once per rank, in parallel on its nodes.

    .venv/bin/python benchmarks/bench_ray_sandbox.py [--pairs 10]

Prints a table and writes benchmarks/results/bench_ray_sandbox.json.
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
RESULTS = ROOT / "benchmarks" / "results" / "bench_ray_sandbox.json"
PHASES = ("hello", "start", "run", "total")


def attempt(cls: Any, sandboxed: bool, n: int, shared: Path) -> dict[str, float]:
    """One attempt of a one-rank job on a fresh actor: the seconds of each phase."""
    import ray

    from trainyard.executors.base import LaunchRequest, launch_request_to_dict
    from trainyard.executors.sandbox import SandboxSpec

    job = f"bench-{'sb' if sandboxed else 'bare'}-{n}"
    spec = {"name": job, "entrypoint": {"command": ["/bin/true"]}}
    ckpt, run_dir = f"file://{shared / 'checkpoints'}", str(shared / "runs" / job)
    req = LaunchRequest(job, 0, spec, 1, "bench", "on_demand", ckpt, None, run_dir)
    actor = cls.remote(job, 0, 0, 600.0, SandboxSpec() if sandboxed else None)
    try:
        ray.get(actor.drain.remote(0, 0, 0.0))  # the actor's process is up
        t0 = time.perf_counter()
        hello = ray.get(actor.hello.remote())
        t1 = time.perf_counter()
        assert hello["sandbox_error"] is None, hello
        ray.get(actor.start.remote(launch_request_to_dict(req), {}, None))
        t2 = time.perf_counter()
        while True:
            res = ray.get(actor.drain.remote(0, 0, 0.01))
            if res["exited"]:
                break
        t3 = time.perf_counter()
        assert res["exit_code"] == 0, res
        ray.get(actor.close.remote())
    finally:
        ray.kill(actor, no_restart=True)
    return {"hello": t1 - t0, "start": t2 - t1, "run": t3 - t2, "total": t3 - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=10)
    args = ap.parse_args()
    from trainyard.executors.ray_actor import RankHost
    from trainyard.executors.ray_cluster import LOOPBACK_ENV, LoopbackRayCluster

    os.environ.update(LOOPBACK_ENV)
    import ray

    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench-ray-sandbox-") as tmp, LoopbackRayCluster() as cluster:
        cluster.add_node("head", resources={"trainyard/pool:bench": 2}, num_cpus=2)
        os.environ.update(cluster.client_env)  # the cluster requires its token
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cls = ray.remote(num_cpus=0)(RankHost)
        attempt(cls, True, -1, Path(tmp))  # warm-up (file caches), not counted
        for i in range(args.pairs):
            for sandboxed in (False, True) if i % 2 == 0 else (True, False):
                runs[sandboxed].append(attempt(cls, sandboxed, i, Path(tmp)))
        ray.shutdown()

    def med(sandboxed: bool, phase: str) -> float:
        return statistics.median(r[phase] for r in runs[sandboxed])

    table = {
        phase: {
            "bare_ms": med(False, phase) * 1e3,
            "sandboxed_ms": med(True, phase) * 1e3,
            "difference_ms": (med(True, phase) - med(False, phase)) * 1e3,
            "median_pair_difference_ms": statistics.median(
                (s[phase] - b[phase]) * 1e3 for b, s in zip(runs[False], runs[True], strict=True)
            ),
        }
        for phase in PHASES
    }
    print(f"\n{args.pairs} pairs (ABBA), medians, one-rank attempts on a one-node loopback Ray cluster")
    print(f"{'phase':<8}{'bare ms':>10}{'sandboxed ms':>14}{'difference':>12}{'pairwise':>10}")
    for phase, row in table.items():
        print(
            f"{phase:<8}{row['bare_ms']:>10.1f}{row['sandboxed_ms']:>14.1f}"
            f"{row['difference_ms']:>12.1f}{row['median_pair_difference_ms']:>10.1f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "bench_ray_sandbox",
        "command": "python benchmarks/bench_ray_sandbox.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg": os.getloadavg()},
        "pairs": args.pairs,
        "phases_ms": table,
        "runs_s": {"bare": runs[False], "sandboxed": runs[True]},
    }
    RESULTS.write_text(json.dumps(doc, indent=2))
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
