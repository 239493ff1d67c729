"""Quote latency: a 7B-parameter LoRA fine-tune over the whole packaged catalog.

Measures (1) `quote()` in-process, cold (first call: catalog parse, offers -> pools, predictions) and
warm (median of repeats), (2) rendering the ranked table, and (3) the whole `trainyard quote` command
as a user runs it (process start-up included). Each is reported as wall time and as CPU time: on a
shared machine the CPU time is the stable figure. Prints a table and writes
benchmarks/results/bench_quote.json.

    .venv/bin/python benchmarks/bench_quote.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "lora-7b.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "bench_quote.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    t0, c0 = time.perf_counter(), time.process_time()
    from rich.console import Console

    from trainyard.cli.quote_cmd import print_quote
    from trainyard.cost.quote import quote
    from trainyard.spec import load_spec

    import_s, import_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    spec = load_spec(SPEC)
    t0, c0 = time.perf_counter(), time.process_time()
    options = quote(spec)
    cold_s, cold_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    warm, warm_cpu = [], []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        options = quote(spec)
        warm.append(time.perf_counter() - t0)
        warm_cpu.append(time.process_time() - c0)
    t0, c0 = time.perf_counter(), time.process_time()
    buf = Console(file=io.StringIO(), width=140)
    print_quote(spec, options, limit=20, out=buf, title="bench")
    render_s, render_cpu_s = time.perf_counter() - t0, time.process_time() - c0

    cli, cli_cpu = [], []
    exe = ROOT / ".venv" / "bin" / "trainyard"
    for _ in range(max(1, args.repeats // 2)):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r = subprocess.run([str(exe), "quote", str(SPEC)], capture_output=True, text=True, cwd=ROOT)
        cli.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cli_cpu.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return 1
    feasible = sum(o.feasible for o in options)
    result = {
        "spec": str(SPEC.relative_to(ROOT)),
        "options": len(options),
        "feasible": feasible,
        "pools": len({o.pool for o in options}),
        "import_s": import_s,
        "import_cpu_s": import_cpu_s,
        "quote_cold_s": cold_s,
        "quote_cold_cpu_s": cold_cpu_s,
        "quote_warm_median_s": statistics.median(warm),
        "quote_warm_median_cpu_s": statistics.median(warm_cpu),
        "render_table_s": render_s,
        "render_table_cpu_s": render_cpu_s,
        "cli_end_to_end_median_s": statistics.median(cli),
        "cli_end_to_end_median_cpu_s": statistics.median(cli_cpu),
        "load_average_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"quote: {result['spec']} over the packaged catalog "
        f"({result['pools']} pools, {len(options)} options, {feasible} feasible)"
    )
    print(f"{'measure':<30}{'wall s':>10}{'CPU s':>10}")
    for k in ("import", "quote_cold", "quote_warm_median", "render_table", "cli_end_to_end_median"):
        print(f"{k:<30}{result[k + '_s']:>10.3f}{result[k + '_cpu_s']:>10.3f}")
    print(f"load average {result['load_average_1m']:.1f} on {result['cpus']} CPUs")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
