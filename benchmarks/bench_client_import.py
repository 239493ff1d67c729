"""Import time of the Python client (issue 19 target: ``import trainyard.client`` ≤ 0.2 s).

Each sample is a fresh interpreter that times one import with ``time.perf_counter`` around it (the
interpreter's own start-up is not counted), so nothing is cached in the process; the median of
``--runs`` samples is reported. Alongside, as reference points on the same machine and load: the two
libraries the client is built on (``httpx``, ``pydantic``; together they are the floor), the job spec
(``trainyard.spec``), a first typed document (import, then parse a job document, which builds the
models' schemas on first use) and a first client (``TrainyardClient()``, which imports httpx: the
client imports it on first use, not at import).

Usage:  python benchmarks/bench_client_import.py [--runs 15]
Writes: benchmarks/results/bench_client_import.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_client_import.json"
TARGET_S = 0.2

FIRST_DOCUMENT = """
from trainyard.api_models import JobDocument
JobDocument.model_validate({"id": "job-1", "name": "n", "state": "queued", "placement": None,
    "cost_usd": 0.0, "checkpoints": [], "workers": [], "events": [], "result": None, "attempt": 0,
    "reason": "", "progress": {}, "created_at": None, "updated_at": None})
"""

CASES: dict[str, str] = {
    "httpx": "import httpx",
    "pydantic": "import pydantic",
    "httpx + pydantic (floor)": "import httpx, pydantic",
    "trainyard.client": "import trainyard.client",
    "trainyard.spec": "import trainyard.spec",
    "trainyard.client + first document": "import trainyard.client\n" + FIRST_DOCUMENT,
    # httpx is imported when the first client is made: this is the cost before the first request
    "trainyard.client + TrainyardClient()": (
        "import trainyard.client\ntrainyard.client.TrainyardClient('http://127.0.0.1:9', 'k').close()"
    ),
}
HEAVY = ("torch", "fastapi", "sqlalchemy", "ray", "transformers", "uvicorn")


def sample(code: str) -> dict[str, Any]:
    probe = (
        "import sys, time, json\n"
        "t0 = time.perf_counter()\n"
        f"exec(compile({code!r}, 'bench', 'exec'))\n"
        "dt = time.perf_counter() - t0\n"
        f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
        "print(json.dumps({'s': dt, 'heavy': heavy}))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    return dict(json.loads(out.stdout))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    for _ in range(args.runs):  # interleaved, so a load change hits every case alike
        for name, code in CASES.items():
            s = sample(code)
            r = results.setdefault(name, {"samples_s": [], "heavy_modules": s["heavy"]})
            r["samples_s"].append(s["s"])
    for r in results.values():
        r["median_s"] = statistics.median(r["samples_s"])
        r["p90_s"] = sorted(r["samples_s"])[int(0.9 * (len(r["samples_s"]) - 1))]
    floor = results["httpx + pydantic (floor)"]["median_s"]
    for r in results.values():
        r["ratio_to_floor"] = r["median_s"] / floor if floor > 0 else None
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "runs": args.runs,
        "target_s": TARGET_S,
        "cases": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print(f"{'import':36} {'median':>9} {'p90':>9} {'x floor':>8}  heavy modules")
    for name, r in results.items():
        print(
            f"{name:36} {r['median_s'] * 1000:7.1f}ms {r['p90_s'] * 1000:7.1f}ms {r['ratio_to_floor']:8.2f}  "
            f"{','.join(r['heavy_modules']) or '-'}"
        )
    client = results["trainyard.client"]
    verdict = "meets" if client["median_s"] <= TARGET_S else "misses"
    print(f"trainyard.client {verdict} the {TARGET_S:.1f} s target ({client['median_s']:.3f} s median)")
    if client["heavy_modules"]:
        raise SystemExit(f"importing the client loaded {client['heavy_modules']}")


if __name__ == "__main__":
    main()
