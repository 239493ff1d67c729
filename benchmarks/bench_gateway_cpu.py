"""The API server's own CPU per gateway request, measured on its event-loop thread (issue 16).

`bench_serving.py` measures the whole API-server process (busy minus idle) against a real replica; on a
shared 2-core machine that number also carries the background threads and whatever the machine's other
work does to the server's caches while it waits for the replica. This one isolates the request path:
the real app (`create_app` over a real platform on SQLite, access log on, the default tracing and
sampler) served by uvicorn (uvloop, httptools) on a thread, a stand-in replica (a Starlette app
answering a fixed completion, optionally after `--replica-wait-ms`) on another thread, and a client
sending 1-token completions one at a time; the CPU clock of the API server's thread over each round,
divided by its requests. With `--baseline-src DIR` every round runs once on this checkout's code and
once on DIR's (each in a child process with that `PYTHONPATH`), alternating, so both see the same load.

Usage:  python benchmarks/bench_gateway_cpu.py [--requests 1000] [--rounds 3] [--replica-wait-ms 0]
        [--baseline-src /tmp/base/src] [--out benchmarks/results/bench_gateway_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_gateway_cpu.json"
ANSWER = (
    b'{"id": "cmpl-bench", "object": "text_completion", "model": "__base__", '
    b'"choices": [{"index": 0, "text": "hi", "finish_reason": "length"}], '
    b'"usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}'
)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(app: Any, **options: Any) -> tuple[Any, Any, int]:
    import threading

    import uvicorn

    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="off", **options
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return server, thread, port


def child(n_requests: int, wait_s: float) -> dict[str, Any]:
    """One round on the code this process imports: API-server thread CPU per request."""
    import asyncio
    import tempfile

    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route as HttpRoute

    from trainyard.api.app import create_app
    from trainyard.observability.logging import configure_logging
    from trainyard.services.platform import Platform, PlatformOptions
    from trainyard.serving.autoscale import AutoscalingPolicy
    from trainyard.serving.models import ResolvedModel
    from trainyard.serving.service import DeploymentView, PoolView, ReplicaView, RouteView
    from trainyard.serving.traffic import Route
    from trainyard.settings import Settings

    async def completions(request: Request) -> Response:
        await request.body()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        return Response(ANSWER, media_type="application/json")

    home = Path(tempfile.mkdtemp(prefix="bench-gateway-cpu-"))
    log = (home / "server.log").open("w")
    configure_logging("info", stream=log)
    platform = Platform.open(
        Settings(home=home, database_url=f"sqlite:///{home / 'trainyard.db'}"),
        PlatformOptions(with_catalog=False),
    )
    app = create_app(platform)
    key = platform.settings.api_key_path.read_text().strip()
    principal = platform.tenants.authenticate(key)
    replica, replica_thread, replica_port = _serve(
        Starlette(routes=[HttpRoute("/v1/completions", completions, methods=["POST"])])
    )
    resolved = ResolvedModel(version_id="m@1", path="/nowhere", tokenizer_path="/nowhere")
    pool_key = (principal.tenant_id, resolved.base_version)
    pool = PoolView(pool_key, "/nowhere", "/nowhere", {}, AutoscalingPolicy())
    pool.replicas["r1"] = ReplicaView("r1", f"http://127.0.0.1:{replica_port}")
    svc = platform.serving
    with svc._lock:
        svc._pools = {pool_key: pool}
        svc._deployments = {
            (principal.tenant_id, "bench"): DeploymentView(
                id="d1",
                tenant_id=principal.tenant_id,
                tenant=principal.tenant_name,
                name="bench",
                model="m@1",
                routes=(RouteView(Route("m@1", 100.0), resolved, pool_key),),
                tags={},
                created_at_s=0.0,
            )
        }
    server, thread, port = _serve(app, loop="uvloop", http="httptools")
    clock = time.pthread_getcpuclockid(thread.ident or 0)
    url = f"http://127.0.0.1:{port}/openai/v1/completions"
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "bench", "prompt": "hello", "max_tokens": 1, "temperature": 0}
    with httpx.Client(timeout=60) as h:
        for _ in range(100):
            h.post(url, json=body, headers=headers).raise_for_status()
        cpu0, t0 = time.clock_gettime(clock), time.perf_counter()
        for _ in range(n_requests):
            h.post(url, json=body, headers=headers).raise_for_status()
        cpu = time.clock_gettime(clock) - cpu0
        wall = time.perf_counter() - t0
    for s in (server, replica):
        s.should_exit = s.force_exit = True
    thread.join(10)
    replica_thread.join(10)
    with svc._lock:
        svc._pending_meter.clear()  # the stand-in replica has no row to price its records with
    platform.close()
    return {"cpu_ms_per_request": cpu / n_requests * 1e3, "wall_ms_per_request": wall / n_requests * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replica-wait-ms", type=float, default=0.0, help="the stand-in replica's think time")
    ap.add_argument("--baseline-src", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.requests, args.replica_wait_ms / 1e3)))
        return
    sides = {"now": ROOT / "src"}
    if args.baseline_src is not None:
        sides["baseline"] = args.baseline_src.resolve()
    load_start = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for _ in range(args.rounds):
        for name, src in sides.items():
            env = {**os.environ, "PYTHONPATH": str(src)}
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    "--requests",
                    str(args.requests),
                    "--replica-wait-ms",
                    str(args.replica_wait_ms),
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {
        k: {
            "cpu_ms_per_request_median": statistics.median(r["cpu_ms_per_request"] for r in v),
            "cpu_ms_per_request": [round(r["cpu_ms_per_request"], 4) for r in v],
            "wall_ms_per_request_median": statistics.median(r["wall_ms_per_request"] for r in v),
        }
        for k, v in runs.items()
    }
    if "baseline" in summary:
        summary["ratio_now_over_baseline"] = (
            summary["now"]["cpu_ms_per_request_median"] / summary["baseline"]["cpu_ms_per_request_median"]
        )
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["benchmarks/bench_gateway_cpu.py", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "load_start": load_start, "load_end": os.getloadavg()},
        "requests_per_round": args.requests,
        "replica_wait_ms": args.replica_wait_ms,
        **summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    for k in sides:
        s = summary[k]
        print(
            f"{k:9} API-server thread CPU per request: median {s['cpu_ms_per_request_median']:.3f} ms "
            f"({', '.join(f'{x:.3f}' for x in s['cpu_ms_per_request'])}); "
            f"wall {s['wall_ms_per_request_median']:.2f} ms"
        )
    if "ratio_now_over_baseline" in summary:
        print(f"now / baseline: {summary['ratio_now_over_baseline']:.2f}")
    print(f"load {load_start} -> {os.getloadavg()}; wrote {args.out}")


if __name__ == "__main__":
    main()
