"""Step overhead of the bubblewrap sandbox: the same training steps in a plain worker process and in a
sandboxed one (the Sandbox the local executor uses for user code and the built-in trainer), side by
side (issue 11 target: ≤ 1 %).

Each run is a fresh interpreter doing STEPS SGD steps of a 256→512→256 MLP on one thread after a
warm-up, and reports the median wall time and the median thread CPU time of a step. Runs alternate in
ABBA order (plain, sandboxed, sandboxed, plain, ...), so that load changes hit both alike; the result
is the median over pairs of the per-pair ratio sandboxed / plain, for wall and CPU time. CPU time per
step leaves out waiting for a CPU, which on a shared machine is most of the noise.

``--concurrent`` starts the two runs of a pair at the same time instead (each pair then meets the same
load at the same moments, which alternation only approximates when the load changes within seconds).

    .venv/bin/python benchmarks/bench_sandbox_steps.py [--pairs 8] [--steps 300] [--concurrent]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from trainyard.executors.sandbox import Mounts, Sandbox, scrubbed_env

RESULTS = Path(__file__).resolve().parent / "results" / "bench_sandbox_steps.json"

STEP_SCRIPT = """
import json, statistics, time, torch
torch.manual_seed(0); torch.set_num_threads(1)
m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
opt = torch.optim.SGD(m.parameters(), lr=0.01); x = torch.randn(32, 256)
wall, cpu = [], []
for i in range(STEPS + 30):
    t, c = time.perf_counter(), time.thread_time()
    opt.zero_grad(); m(x).pow(2).mean().backward(); opt.step()
    if i >= 30:
        wall.append(time.perf_counter() - t); cpu.append(time.thread_time() - c)
print(json.dumps({"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu)}))
"""


def run(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_together(
    a: list[str], b: list[str], env: dict[str, str]
) -> tuple[dict[str, float], dict[str, float]]:
    """Both commands started at once; their results once both have finished."""
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, text=True) for c in (a, b)]
    outs = [p.communicate()[0] for p in procs]
    for p, c in zip(procs, (a, b), strict=True):
        if p.returncode != 0:
            raise subprocess.CalledProcessError(p.returncode, c)
    ra, rb = (json.loads(o.strip().splitlines()[-1]) for o in outs)
    return ra, rb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--concurrent", action="store_true", help="start the two runs of a pair together")
    args = ap.parse_args()
    sandbox = Sandbox()
    env = scrubbed_env(os.environ, {})
    code = STEP_SCRIPT.replace("STEPS", str(args.steps))
    plain_cmd = [sys.executable, "-c", code]
    boxed_cmd = sandbox.command(plain_cmd, Mounts(share_net=False))
    load_start = os.getloadavg()
    plain: list[dict[str, float]] = []
    boxed: list[dict[str, float]] = []
    for i in range(args.pairs):
        if args.concurrent:
            p, b = run_together(plain_cmd, boxed_cmd, env)
            plain.append(p)
            boxed.append(b)
        elif i % 2 == 0:
            plain.append(run(plain_cmd, env))
            boxed.append(run(boxed_cmd, env))
        else:
            boxed.append(run(boxed_cmd, env))
            plain.append(run(plain_cmd, env))
    out: dict[str, object] = {
        "benchmark": "sandbox_steps",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "cpus": os.cpu_count(),
        "pairs": args.pairs,
        "steps": args.steps,
        "order": "concurrent" if args.concurrent else "ABBA",
    }
    for kind in ("wall_s", "cpu_s"):
        ratios = [b[kind] / p[kind] for p, b in zip(plain, boxed, strict=True)]
        out[f"step_{kind.removesuffix('_s')}_ms_plain"] = round(
            statistics.median(p[kind] for p in plain) * 1e3, 4
        )
        out[f"step_{kind.removesuffix('_s')}_ms_sandboxed"] = round(
            statistics.median(b[kind] for b in boxed) * 1e3, 4
        )
        out[f"overhead_{kind.removesuffix('_s')}_pct"] = round((statistics.median(ratios) - 1) * 100, 2)
        out[f"ratios_{kind.removesuffix('_s')}"] = [round(r, 4) for r in ratios]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
