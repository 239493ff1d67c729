"""CLI start-up: wall time of `trainyard --help`, `--version`, `jobs list` (empty and 50 jobs) and `status`
as a user runs them (a fresh process each time, against a real `trainyard up --detach`), median and p90 of
N runs, beside the interpreter's own start-up (`python -c pass`) as the floor. Also checks that none of
the heavy modules (torch, fastapi, sqlalchemy, ortools, ray, numpy) is imported by those commands, nor
(by `jobs list` with jobs to print) pydantic, the typed documents or httpx's command-line tool.

    .venv/bin/python benchmarks/bench_cli.py [--runs 15] [--out benchmarks/results/cli_startup.json]
        [--baseline-src DIR]   # also time another checkout's sources (e.g. `git worktree add /tmp/old REF`,
                               # DIR=/tmp/old/src), interleaved with these, for a side-by-side ratio

Target: `trainyard --help` and `trainyard jobs list` ≤ 0.3 s (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".venv" / "bin" / "trainyard"
HEAVY = ("torch", "fastapi", "sqlalchemy", "ortools", "ray", "numpy", "scipy", "uvicorn")
# what a command that reads and prints has no use for either: the typed documents with pydantic (the CLI
# prints the JSON it gets) and httpx's own command-line tool (click, pygments)
NOT_NEEDED = ("pydantic", "trainyard.api_models", "httpx._main", "click", "pygments")
TINY = {
    "apiVersion": "trainyard/v1",
    "kind": "TrainingJob",
    "name": "bench-cli",
    "model": {"architecture": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 256},
    "workload": {"seq_len": 64, "global_batch": 4, "steps": 20, "precision": "fp32"},
    "requirements": {"allow": ["cpu"]},
}
PROBE = (
    "import sys\nfrom trainyard.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
    "    pass\nsys.stderr.write('LOADED ' + ','.join(m for m in %r if m in sys.modules) + '\\n')\n"
)


def trainyard() -> list[str]:
    return [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "trainyard.cli.main"]


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one fresh process. CPU time does not count waiting for
    a CPU on a loaded machine, nor for the server's answer."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.decode().strip()}")
    return dt, usage.ru_utime + usage.ru_stime


def loaded(args: list[str], env: dict[str, str], modules: tuple[str, ...] = HEAVY) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE % (modules,), *args], env=env, capture_output=True, text=True
    )
    line = next((ln for ln in proc.stderr.splitlines() if ln.startswith("LOADED ")), "LOADED ?")
    return [m for m in line.removeprefix("LOADED ").split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cli_startup.json")
    parser.add_argument("--baseline-src", type=Path, default=None, help="Another checkout's src directory.")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env.update(TRAINYARD_HOME=str(home), TRAINYARD_PROFILE_AT_START="0")
    env["PYTHONPATH"] = str(ROOT / "src")
    ty = trainyard()
    base_env = None
    if args.baseline_src is not None:
        base_env = {**env, "PYTHONPATH": str(args.baseline_src.resolve())}
    up = subprocess.run(
        [*ty, "up", "--detach", "--port", "0", "--executor", "none", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    if up.returncode != 0:
        raise SystemExit(f"trainyard up failed: {up.stderr}")
    server = json.loads(up.stdout)
    try:
        spec = home / "tiny.yaml"
        spec.write_text(yaml.safe_dump(TINY))
        empty_home_cases = {
            "python -c pass (floor)": [sys.executable, "-c", "pass"],
            "trainyard --help": [*ty, "--help"],
            "trainyard --version": [*ty, "--version"],
            "trainyard status": [*ty, "status"],
            "trainyard jobs list (no jobs)": [*ty, "jobs", "list"],
        }
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in empty_home_cases}
        if base_env is not None:
            for name in ("trainyard --help", "trainyard jobs list (no jobs)"):
                times[f"{name} [baseline]"] = []
        for _ in range(args.runs):  # interleaved, so that load changes hit every case alike
            for name, cmd in empty_home_cases.items():
                times[name].append(timed(cmd, env))
                if base_env is not None and f"{name} [baseline]" in times:
                    # the baseline may predate server.json: it is told the URL
                    base = {**base_env, "TRAINYARD_URL": server["url"]}
                    times[f"{name} [baseline]"].append(timed(cmd, base))
        for _ in range(50):
            submit = [*ty, "jobs", "submit", str(spec), "--json"]
            subprocess.run(submit, env=env, capture_output=True, check=True)
        fifty = "trainyard jobs list (50 jobs)"
        times[fifty] = []
        if base_env is not None:
            times[f"{fifty} [baseline]"] = []
        for _ in range(args.runs):
            times[fifty].append(timed([*ty, "jobs", "list"], env))
            if base_env is not None:
                base = {**base_env, "TRAINYARD_URL": server["url"]}
                times[f"{fifty} [baseline]"].append(timed([*ty, "jobs", "list"], base))
        imports = {
            "trainyard --help": loaded(["--help"], env),
            "trainyard jobs list": loaded(["jobs", "list"], env),
            "trainyard status": loaded(["status"], env),
        }
        not_needed = {
            "trainyard jobs list": loaded(["jobs", "list"], env, NOT_NEEDED),
            "trainyard jobs list --json": loaded(["jobs", "list", "--json"], env, NOT_NEEDED),
        }
    finally:
        subprocess.run([*ty, "down"], env=env, capture_output=True)
    floor = statistics.median(t for t, _ in times["python -c pass (floor)"])
    rows = []
    for name, samples in times.items():
        walls = sorted(t for t, _ in samples)
        med = statistics.median(walls)
        p90 = walls[min(len(walls) - 1, round(0.9 * (len(walls) - 1)))]
        cpu = statistics.median(c for _, c in samples)
        rows.append(
            {
                "command": name,
                "median_s": med,
                "p90_s": p90,
                "cpu_median_s": cpu,
                "x_floor": med / floor,
                "runs": len(walls),
            }
        )
    doc = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "server": server["url"],
        "rows": rows,
        "heavy_modules_imported": imports,
        "documents_or_httpx_tool_imported": not_needed,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"load average {doc['load_average'][0]:.2f} ({doc['cpus']} CPUs), {args.runs} runs each")
    print(f"{'command':<42} {'median':>8} {'p90':>8} {'cpu':>8} {'× floor':>8}")
    for r in rows:
        print(
            f"{r['command']:<42} {r['median_s']:>7.3f}s {r['p90_s']:>7.3f}s {r['cpu_median_s']:>7.3f}s "
            f"{r['x_floor']:>8.1f}"
        )
    print("heavy modules imported:", json.dumps(imports))
    print("documents or httpx's tool imported (50 jobs listed):", json.dumps(not_needed))


if __name__ == "__main__":
    main()
