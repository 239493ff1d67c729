"""Control-plane submission throughput and latency (issue 4 numbers).

Measures job submissions per second and p50/p99 latency with 8 concurrent clients against a real
`trainyard up` (control loop on, executor none) on SQLite and on PostgreSQL, and — as the stack's
ceiling — the same load against a bare FastAPI + SQLAlchemy endpoint that inserts one JSON row per POST
(same uvicorn, same database settings, no auth/validation/idempotency/event log).

The load generator is a minimal HTTP/1.1 keep-alive client on asyncio streams (one connection per
client), so that the generator, which shares the machine's cores with the server, costs as little as
possible.

Usage:  python benchmarks/bench_api.py [--requests N] [--clients 8] [--no-postgres]
Writes: benchmarks/results/bench_api.json
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
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_api.json"  # --no-bare runs write bench_api_variant.json
SPEC: dict[str, Any] = {
    "apiVersion": "trainyard/v1",
    "kind": "TrainingJob",
    "name": "bench",
    "model": {"architecture": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 256},
    "workload": {"seq_len": 64, "global_batch": 4, "steps": 20, "precision": "fp32"},
    "requirements": {"allow": ["cpu"]},
}
LOOP_INTERVAL_S = 0.5  # the control loop (admission of every submitted job) runs during the measurement
PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=5"

# ---- the bare ceiling app ----------------------------------------------------------------------------
BARE_APP = """
import sys, time
from typing import Any
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from sqlalchemy import JSON, Float, Integer, String, create_engine, event
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

class Base(DeclarativeBase):
    pass

class Row(Base):
    __tablename__ = "bare_rows"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    doc: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at_s: Mapped[float] = mapped_column(Float)

url, port = sys.argv[1], int(sys.argv[2])
if url.startswith("sqlite"):
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=16)
    @event.listens_for(engine, "connect")
    def _pragmas(conn, _rec):
        conn.isolation_level = None
        for p in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000"):
            conn.execute("PRAGMA " + p)
    @event.listens_for(engine, "begin")
    def _begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")
else:
    engine = create_engine(url, pool_size=16)
Base.metadata.create_all(engine)
app = FastAPI()

@app.post("/insert", status_code=201)
def insert(body: dict[str, Any]) -> JSONResponse:
    with Session(engine) as s, s.begin():
        row = Row(name=str(body.get("spec", {}).get("name", "")), doc=body, created_at_s=time.time())
        s.add(row)
        s.flush()
        rid = row.id
    return JSONResponse({"id": rid}, status_code=201)

@app.get("/readyz")
def readyz():
    return {"status": "ready"}

uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
"""


def _uvicorn_stack() -> str:
    """What uvicorn's "auto" picks for both servers: httptools/uvloop when installed, else h11/asyncio."""
    import importlib

    def importable(name: str) -> bool:
        try:
            importlib.import_module(name)
        except ImportError:
            return False
        return True

    http = "httptools" if importable("httptools") else "h11"
    loop = "uvloop" if importable("uvloop") else "asyncio"
    return f"{http} + {loop}"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server not ready")


# ---- load generator ----------------------------------------------------------------------------------
async def _client(
    port: int, path: str, headers: dict[str, str], n: int, lat: list[float], errors: list[str]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(n):
            body = json.dumps({"spec": SPEC}).encode()
            hdr = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            req = (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Idempotency-Key: {uuid.uuid4()}\r\n{hdr}Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            t0 = time.perf_counter()
            writer.write(req)
            await writer.drain()
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            lat.append(time.perf_counter() - t0)
            status = int(status_line.split()[1])
            if status != 201:
                errors.append(str(status))
    finally:
        writer.close()


async def _load(
    port: int, path: str, headers: dict[str, str], clients: int, per_client: int
) -> dict[str, Any]:
    lat: list[float] = []
    errors: list[str] = []
    t0 = time.perf_counter()
    await asyncio.gather(*[_client(port, path, headers, per_client, lat, errors) for _ in range(clients)])
    wall = time.perf_counter() - t0
    lat.sort()
    q = statistics.quantiles(lat, n=100, method="inclusive")
    return {
        "requests": len(lat),
        "errors": len(errors),
        "wall_s": round(wall, 3),
        "submissions_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(q[49] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
        "mean_ms": round(statistics.fmean(lat) * 1000, 2),
    }


def run_target(kind: str, db_url: str, home: Path, clients: int, requests: int) -> dict[str, Any]:
    port = free_port()
    env = {**os.environ, "TRAINYARD_HOME": str(home), "TRAINYARD_DATABASE_URL": db_url}
    env.pop("TRAINYARD_API_KEY", None)
    if kind == "trainyard":
        cmd = [
            sys.executable,
            "-m",
            "trainyard.cli.main",
            "up",
            "--port",
            str(port),
            "--executor",
            "none",
            "--loop-interval-s",
            str(LOOP_INTERVAL_S),
        ]
        path = "/v1/jobs"
    else:
        cmd = [sys.executable, "-c", BARE_APP, db_url, str(port)]
        path = "/insert"
    log = (home / f"{kind}.log").open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        headers = {}
        if kind == "trainyard":
            headers["Authorization"] = "Bearer " + (home / "api_key").read_text().strip()
        asyncio.run(_load(port, path, headers, clients, max(1, 200 // clients)))  # warm-up
        cpu0 = _process_cpu_s(proc.pid)
        res = asyncio.run(_load(port, path, headers, clients, max(1, requests // clients)))
        # the server's CPU time per request (Linux /proc), a number less noisy than wall time on a
        # shared machine; for trainyard it includes the control loop admitting jobs meanwhile
        cpu1 = _process_cpu_s(proc.pid)
        if cpu0 is not None and cpu1 is not None:
            res["server_cpu_ms_per_request"] = round((cpu1 - cpu0) * 1000 / max(1, res["requests"]), 3)
        res["load_avg_1m"] = round(os.getloadavg()[0], 2)
        return res
    finally:
        proc.terminate()
        proc.wait(30)


def _process_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_db() -> tuple[str, Any]:
    import psycopg

    name = f"trainyard_bench_{uuid.uuid4().hex[:10]}"
    admin = psycopg.connect(PG_ADMIN, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()

    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", drop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--no-bare", action="store_true", help="Skip the ceiling runs.")
    ap.add_argument(
        "--loop-interval-s",
        type=float,
        default=0.5,
        help="trainyard up's control-loop period (60 = admission effectively off while measuring).",
    )
    args = ap.parse_args()
    global LOOP_INTERVAL_S
    LOOP_INTERVAL_S = args.loop_interval_s
    rows: list[dict[str, Any]] = []
    databases = ["sqlite"] + ([] if args.no_postgres else ["postgresql"])
    for db in databases:
        for kind in ("trainyard",) + (() if args.no_bare else ("bare",)):
            with tempfile.TemporaryDirectory() as tmp:
                home = Path(tmp)
                drop = None
                url = f"sqlite:///{home / 'bench.db'}"
                if db == "postgresql":
                    url, drop = postgres_db()
                try:
                    res = run_target(kind, url, home, args.clients, args.requests)
                finally:
                    if drop:
                        drop()
            rows.append(
                {
                    "database": db,
                    "target": kind,
                    "clients": args.clients,
                    "loop_interval_s": args.loop_interval_s if kind == "trainyard" else None,
                    **res,
                }
            )
            print(
                f"  {db:<10} {kind:<9} {res['submissions_per_s']:>8.1f}/s  p50 {res['p50_ms']:>7.2f} ms  "
                f"p99 {res['p99_ms']:>7.2f} ms  errors {res['errors']}  "
                f"server CPU {res.get('server_cpu_ms_per_request', float('nan')):.3f} ms/request  "
                f"load {res['load_avg_1m']}",
                flush=True,
            )
    for db in databases if not args.no_bare else []:
        ty = next(r for r in rows if r["database"] == db and r["target"] == "trainyard")
        bare = next(r for r in rows if r["database"] == db and r["target"] == "bare")
        ty["share_of_ceiling"] = round(ty["submissions_per_s"] / bare["submissions_per_s"], 3)
    print()
    print(f"{'database':<11}{'target':<11}{'subs/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'of ceiling':>12}")
    for r in rows:
        share = f"{r['share_of_ceiling'] * 100:.0f} %" if "share_of_ceiling" in r else "-"
        print(
            f"{r['database']:<11}{r['target']:<11}{r['submissions_per_s']:>9.1f}{r['p50_ms']:>9.2f}"
            f"{r['p99_ms']:>9.2f}{share:>12}"
        )
    out = RESULTS if not args.no_bare else RESULTS.with_name("bench_api_variant.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "bench_api",
                "clients": args.clients,
                "requests": args.requests,
                "machine": {
                    "http": _uvicorn_stack(),
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
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
