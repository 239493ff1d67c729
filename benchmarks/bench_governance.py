"""Cost governance on the control plane: submission throughput with budgets and rate limits on vs off,
and rate-limit accuracy over a minute.

Throughput: one real `trainyard up` (executor none), two tenants on it — `plain` (no budget, no rate
limit) and `governed` (a hard monthly budget and a per-tenant and per-key rate limit, both far above
what the run uses, so every submission quotes, locks its tenant, reserves and takes a token but none is
refused). 8 keep-alive clients POST /v1/jobs; off and on alternate for --rounds rounds and the median
of each is reported, with "on" as a share of "off".

Accuracy: a tenant limited to --rate requests/s (burst = rate) is hammered with GET /v1/whoami by 4
clients for --duration seconds; admitted requests are compared with burst + rate x duration.

Usage:  python benchmarks/bench_governance.py [--requests 2000] [--rounds 3] [--duration 60] [--postgres]
Writes: benchmarks/results/bench_governance.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_api import _load, _process_cpu_s, free_port, postgres_db, wait_ready

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_governance.json"


def start_server(home: Path, db_url: str, loop_interval_s: float) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {**os.environ, "TRAINYARD_HOME": str(home), "TRAINYARD_DATABASE_URL": db_url}
    env.pop("TRAINYARD_API_KEY", None)
    cmd = [sys.executable, "-m", "trainyard.cli.main", "up", "--port", str(port), "--executor", "none"]
    cmd += ["--loop-interval-s", str(loop_interval_s)]
    proc = subprocess.Popen(cmd, env=env, stdout=(home / "server.log").open("wb"), stderr=subprocess.STDOUT)
    wait_ready(f"http://127.0.0.1:{port}", proc)
    return proc, port


def tenant(url: str, admin: str, name: str, limits: dict[str, Any] | None, budget_usd: float | None) -> str:
    h = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=url, headers=h, timeout=30) as c:
        key = c.post("/v1/tenants", json={"name": name}).raise_for_status().json()["api_key"]
        if limits:
            c.patch(f"/v1/tenants/{name}", json=limits).raise_for_status()
        if budget_usd is not None:
            c.put(f"/v1/budgets/{name}", json={"usd": budget_usd, "hard": True}).raise_for_status()
    return str(key)


async def _hammer(port: int, key: str, duration_s: float, counts: dict[int, int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    req = (f"GET /v1/whoami HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\r\n").encode()
    end = time.monotonic() + duration_s
    try:
        while time.monotonic() < end:
            writer.write(req)
            await writer.drain()
            status = int((await reader.readline()).split()[1])
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            counts[status] = counts.get(status, 0) + 1
    finally:
        writer.close()


def accuracy(port: int, key: str, rate: float, duration_s: float) -> dict[str, Any]:
    counts: dict[int, int] = {}

    async def run() -> None:
        await asyncio.gather(*[_hammer(port, key, duration_s, counts) for _ in range(4)])

    t0 = time.monotonic()
    asyncio.run(run())
    wall = time.monotonic() - t0
    expected = rate + rate * wall  # burst (= rate) + refill over the run
    admitted = counts.get(200, 0)
    return {
        "rate_rps": rate,
        "duration_s": round(wall, 2),
        "requests": sum(counts.values()),
        "admitted": admitted,
        "refused_429": counts.get(429, 0),
        "other": {str(k): v for k, v in counts.items() if k not in (200, 429)},
        "expected": round(expected, 1),
        "admitted_over_expected": round(admitted / expected, 4),
    }


def run_db(db: str, url: str, home: Path, args: argparse.Namespace) -> dict[str, Any]:
    proc, port = start_server(home, url, args.loop_interval_s)
    base = f"http://127.0.0.1:{port}"
    try:
        admin = (home / "api_key").read_text().strip()
        plain = tenant(base, admin, "plain", None, None)
        big = {"rate_limit_rps": 1e6, "rate_limit_burst": 1e6, "key_rate_limit_rps": 1e6}
        governed = tenant(base, admin, "governed", big, 1e12)
        limited = tenant(base, admin, "limited", {"rate_limit_rps": args.rate}, None)
        per_client = max(1, args.requests // args.clients)
        for key in (plain, governed):  # warm-up: auth caches, quote cache, connections
            asyncio.run(_load(port, "/v1/jobs", {"Authorization": f"Bearer {key}"}, args.clients, 25))
        off, on = [], []
        for _ in range(args.rounds):
            for key, out in ((plain, off), (governed, on)):
                cpu0 = _process_cpu_s(proc.pid)
                res = asyncio.run(
                    _load(port, "/v1/jobs", {"Authorization": f"Bearer {key}"}, args.clients, per_client)
                )
                cpu1 = _process_cpu_s(proc.pid)
                assert res["errors"] == 0, res
                if cpu0 is not None and cpu1 is not None:
                    res["server_cpu_ms_per_request"] = round(
                        (cpu1 - cpu0) * 1000 / max(1, res["requests"]), 3
                    )
                out.append(res)
        off_med = statistics.median(r["submissions_per_s"] for r in off)
        on_med = statistics.median(r["submissions_per_s"] for r in on)
        row: dict[str, Any] = {
            "database": db,
            "off_submissions_per_s": [r["submissions_per_s"] for r in off],
            "on_submissions_per_s": [r["submissions_per_s"] for r in on],
            "off_median": off_med,
            "on_median": on_med,
            "on_over_off": round(on_med / off_med, 3),
            "off_p99_ms": statistics.median(r["p99_ms"] for r in off),
            "on_p99_ms": statistics.median(r["p99_ms"] for r in on),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
        if all("server_cpu_ms_per_request" in r for r in off + on):
            off_cpu = statistics.median(r["server_cpu_ms_per_request"] for r in off)
            on_cpu = statistics.median(r["server_cpu_ms_per_request"] for r in on)
            row.update(
                off_server_cpu_ms_per_request=off_cpu,
                on_server_cpu_ms_per_request=on_cpu,
                # requests per server CPU-second, on as a share of off: the ratio load on the machine
                # disturbs least
                on_over_off_per_cpu=round(off_cpu / on_cpu, 3),
            )
        if args.duration > 0:
            row["rate_limit"] = accuracy(port, limited, args.rate, args.duration)
        return row
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=60.0, help="Rate-limit accuracy run (0 = skip).")
    ap.add_argument("--rate", type=float, default=20.0, help="The limited tenant's requests/s.")
    ap.add_argument("--loop-interval-s", type=float, default=0.5)
    ap.add_argument("--postgres", action="store_true", help="Also run on PostgreSQL (shared buckets).")
    args = ap.parse_args()
    rows = []
    for db in ["sqlite"] + (["postgresql"] if args.postgres else []):
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp)
            url, drop = f"sqlite:///{home / 'bench.db'}", None
            if db == "postgresql":
                url, drop = postgres_db()
            try:
                row = run_db(db, url, home, args)
            finally:
                if drop:
                    drop()
        rows.append(row)
        rl = row.get("rate_limit") or {}
        print(
            f"{db:<11} off {row['off_median']:>8.1f}/s  on {row['on_median']:>8.1f}/s  "
            f"on/off {row['on_over_off'] * 100:5.1f} %  "
            + (
                f"server CPU {row['off_server_cpu_ms_per_request']:.2f} vs "
                f"{row['on_server_cpu_ms_per_request']:.2f} ms/request "
                f"(on/off per CPU {row['on_over_off_per_cpu'] * 100:5.1f} %)  "
                if "on_over_off_per_cpu" in row
                else ""
            )
            + (
                f"rate limit {rl['admitted']} admitted / {rl['expected']} expected "
                f"({rl['admitted_over_expected'] * 100:.1f} %) in {rl['duration_s']} s"
                if rl
                else ""
            ),
            flush=True,
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "bench_governance",
                "args": vars(args),
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
