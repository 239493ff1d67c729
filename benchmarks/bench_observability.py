"""Overhead of tracing and metrics on submission throughput, side by side in one run.

The same load as bench_api.py (8 concurrent keep-alive clients POSTing job specs to a real `trainyard up`
on SQLite, control loop on, executor none) against these configurations, interleaved round by round so
that the machine's background load hits each alike:

- ``off``: tracing off (``OTEL_SDK_DISABLED=true``), nobody scrapes ``/metrics``;
- ``tracing``: spans exported over OTLP/HTTP (``OTEL_TRACES_EXPORTER=otlp``) to a receiver on 127.0.0.1,
  with the default sampler (``parentbased_traceidratio`` at ``DEFAULT_SAMPLE_RATIO``; errors and slow
  requests kept) and the default instrumentation (no statement spans);
- ``tracing_100pct``: the same with every trace kept (``OTEL_TRACES_SAMPLER=parentbased_always_on``);
- ``tracing_100pct_db``: every trace, plus a span per database statement
  (``TRAINYARD_TRACE_DB_STATEMENTS=true``; what tracing recorded before statement spans became opt-in);
- ``metrics``: tracing off, ``/metrics`` scraped as Prometheus would, every ``--scrape-every-s`` (default
  1 s, 5-15 times a usual Prometheus interval, so that every round has several scrapes; the first one
  as the measurement starts), with the open jobs the load leaves queued (executor none) to collect;
- ``both``: default tracing and scraping; ``both_100pct``: every trace and scraping;
- with ``--baseline-src DIR`` (another checkout's ``src``, e.g. ``git archive main src | tar -x -C DIR``),
  ``off_baseline`` and ``tracing_baseline``: ``off`` and ``tracing`` (that code's own defaults) served by
  that code, so that a change to the request path is measured against its predecessor in the same run.

Reports submissions/s and the server's CPU time per request for each, and the ratios to ``off`` (the
issue's target: at most 5 % fewer submissions per second), with each round's paired CPU ratio.

Usage:  python benchmarks/bench_observability.py [--requests N] [--clients 8] [--rounds 3]
        [--configs tracing,tracing_100pct] [--baseline-src DIR]
Writes: benchmarks/results/bench_observability.json
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
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from bench_api import LOOP_INTERVAL_S, _load, _process_cpu_s, free_port, wait_ready
from trainyard.observability.tracing import DEFAULT_SAMPLE_RATIO

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_observability.json"
# name -> (tracing: none | otlp, /metrics scraped, extra environment of the server)
ALL_TRACES = {"OTEL_TRACES_SAMPLER": "parentbased_always_on"}
CONFIGS: dict[str, tuple[str, bool, dict[str, str]]] = {
    "off": ("none", False, {}),
    "metrics": ("none", True, {}),
    "tracing": ("otlp", False, {}),
    "tracing_100pct": ("otlp", False, ALL_TRACES),
    "tracing_100pct_db": ("otlp", False, {**ALL_TRACES, "TRAINYARD_TRACE_DB_STATEMENTS": "true"}),
    "both": ("otlp", True, {}),
    "both_100pct": ("otlp", True, ALL_TRACES),
}
DEFAULT_CONFIGS = ("metrics", "tracing", "tracing_100pct", "both", "both_100pct")
BASELINE_CONFIGS: dict[str, tuple[str, bool, dict[str, str]]] = {
    "off_baseline": ("none", False, {}),
    "tracing_baseline": ("otlp", False, {}),
}
SCRAPE_EVERY_S = 1.0


class Receiver:
    """Accepts OTLP/HTTP exports (answers 200, counts bytes); the server's exporter does the work."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                outer.bytes += len(self.rfile.read(n))
                outer.requests += 1
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


class Scraper:
    """GETs /metrics with the admin key as a Prometheus server would: once as the measurement starts,
    then every ``every_s``; keeps each scrape's wall time."""

    def __init__(self, url: str, key: str, every_s: float) -> None:
        self.url, self.key, self.every_s = url, key, every_s
        self.stop = threading.Event()
        self.scrapes = 0
        self.durations_ms: list[float] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                r = c.get(f"{self.url}/metrics", headers={"Authorization": f"Bearer {self.key}"})
                if r.status_code == 200:
                    self.scrapes += 1
                    self.durations_ms.append((time.perf_counter() - t0) * 1000)
                self.stop.wait(self.every_s)


def start_server(
    config: str, home: Path, receiver: Receiver, baseline_src: Path | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {
        **os.environ,
        "TRAINYARD_HOME": str(home),
        "TRAINYARD_DATABASE_URL": f"sqlite:///{home / 'trainyard.db'}",
        "TRAINYARD_PROFILE_AT_START": "0",  # the first-start CPU measurement is not what this measures
    }
    for var in (
        "TRAINYARD_API_KEY",
        "TRAINYARD_TRACE_EXPORTER",
        "OTEL_TRACES_EXPORTER",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
        "TRAINYARD_TRACE_DB_STATEMENTS",
        "TRAINYARD_TRACE_KEEP_ERRORS",
        "TRAINYARD_TRACE_KEEP_SLOWER_THAN_S",
    ):
        env.pop(var, None)
    tracing, _, extra = CONFIGS[config]
    if config in BASELINE_CONFIGS:
        assert baseline_src is not None
        env["PYTHONPATH"] = str(baseline_src)
    if tracing == "none":
        env["OTEL_SDK_DISABLED"] = "true"
    else:
        env["OTEL_TRACES_EXPORTER"] = "otlp"
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
    env.update(extra)
    cmd = [
        sys.executable,
        "-m",
        "trainyard.cli.main",
        "server",
        "up",
        "--port",
        str(port),
        "--executor",
        "none",
        "--loop-interval-s",
        str(LOOP_INTERVAL_S),
    ]
    log = (home / "server.log").open("ab")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, timeout_s=300)
    except BaseException:
        proc.kill()  # a server that never became ready is not left behind
        proc.wait(30)
        raise
    return proc, port


def measure(
    config: str,
    home: Path,
    receiver: Receiver,
    clients: int,
    requests: int,
    scrape_every_s: float,
    baseline_src: Path | None = None,
) -> dict[str, Any]:
    proc, port = start_server(config, home, receiver, baseline_src)
    scraper = None
    try:
        key = (home / "api_key").read_text().strip()
        headers = {"Authorization": f"Bearer {key}"}
        asyncio.run(_load(port, "/v1/jobs", headers, clients, max(1, 200 // clients)))  # warm-up
        if CONFIGS[config][1]:
            scraper = Scraper(f"http://127.0.0.1:{port}", key, scrape_every_s)
            scraper.thread.start()
        cpu0 = _process_cpu_s(proc.pid)
        res = asyncio.run(_load(port, "/v1/jobs", headers, clients, max(1, requests // clients)))
        cpu1 = _process_cpu_s(proc.pid)
        if cpu0 is not None and cpu1 is not None:
            res["server_cpu_ms_per_request"] = round((cpu1 - cpu0) * 1000 / max(1, res["requests"]), 3)
        if scraper is not None:
            scraper.stop.set()
            scraper.thread.join(30)
        res["scrapes"] = scraper.scrapes if scraper is not None else 0
        if scraper is not None and scraper.durations_ms:
            res["scrape_ms_median"] = round(statistics.median(scraper.durations_ms), 2)
        res["load_avg_1m"] = round(os.getloadavg()[0], 2)
        return res
    finally:
        if scraper is not None:
            scraper.stop.set()
            scraper.thread.join(5)
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1600)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the JSON results go")
    ap.add_argument("--scrape-every-s", type=float, default=SCRAPE_EVERY_S)
    ap.add_argument(
        "--configs",
        default=",".join(DEFAULT_CONFIGS),
        help=f"comma-separated, of {', '.join(CONFIGS)} (off is always run)",
    )
    ap.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="a src directory of other code to serve off_baseline and tracing_baseline from",
    )
    args = ap.parse_args()
    if args.baseline_src is not None:
        CONFIGS.update(BASELINE_CONFIGS)
    chosen = ["off", *[c for c in args.configs.split(",") if c in CONFIGS and c != "off"]]
    if args.baseline_src is not None:
        chosen += [c for c in BASELINE_CONFIGS if c not in chosen]
    load_start = round(os.getloadavg()[0], 2)
    receiver = Receiver()
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in chosen}
    with tempfile.TemporaryDirectory(prefix="bench-obs-") as tmp:
        for r in range(args.rounds):
            order = chosen if r % 2 == 0 else list(reversed(chosen))
            for config in order:
                home = Path(tmp) / f"{config}-{r}"
                home.mkdir()
                res = measure(
                    config,
                    home,
                    receiver,
                    args.clients,
                    args.requests,
                    args.scrape_every_s,
                    args.baseline_src.resolve() if args.baseline_src is not None else None,
                )
                runs[config].append(res)
                print(
                    f"round {r + 1} {config:>16}: {res['submissions_per_s']:8.1f} submissions/s  "
                    f"p50 {res['p50_ms']:6.2f} ms  p99 {res['p99_ms']:7.2f} ms  "
                    f"cpu {res.get('server_cpu_ms_per_request', float('nan')):6.3f} ms/request  "
                    f"scrapes {res['scrapes']} ({res.get('scrape_ms_median', 0)} ms)  "
                    f"errors {res['errors']}  load {res['load_avg_1m']}",
                    flush=True,
                )
    summary: dict[str, Any] = {}
    for config, rs in runs.items():
        summary[config] = {
            "submissions_per_s_median": statistics.median(x["submissions_per_s"] for x in rs),
            "server_cpu_ms_per_request_median": statistics.median(
                x.get("server_cpu_ms_per_request", 0.0) for x in rs
            ),
            "p99_ms_median": statistics.median(x["p99_ms"] for x in rs),
            "scrapes": sum(x["scrapes"] for x in rs),
            "scrape_ms_median": statistics.median(
                [x["scrape_ms_median"] for x in rs if "scrape_ms_median" in x] or [0.0]
            ),
        }
    for config in chosen:
        # a configuration served by the baseline code is compared with the baseline's own ``off``
        ref = "off_baseline" if config.endswith("_baseline") else "off"
        base, s = summary[ref], summary[config]
        s["ratios_to"] = ref
        s["throughput_ratio_to_off"] = round(
            s["submissions_per_s_median"] / base["submissions_per_s_median"], 3
        )
        s["cpu_ratio_to_off"] = round(
            s["server_cpu_ms_per_request_median"] / max(1e-9, base["server_cpu_ms_per_request_median"]), 3
        )
        # paired within each round (the two ran next to each other, under the same background load)
        s["cpu_ratio_to_off_per_round"] = [
            round(
                x.get("server_cpu_ms_per_request", 0.0) / max(1e-9, y.get("server_cpu_ms_per_request", 0.0)),
                3,
            )
            for x, y in zip(runs[config], runs[ref], strict=True)
        ]
    doc = {
        "benchmark": "observability overhead on submissions (SQLite, executor none)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "clients": args.clients,
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "scrape_every_s": args.scrape_every_s,
        "baseline_src": str(args.baseline_src) if args.baseline_src is not None else None,
        "default_sampler": "parentbased_traceidratio",
        "default_sample_ratio": DEFAULT_SAMPLE_RATIO,
        "load_avg_1m_start_end": [load_start, round(os.getloadavg()[0], 2)],
        "otlp_exports_received": receiver.requests,
        "otlp_bytes_received": receiver.bytes,
        "summary": summary,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for config in chosen:
        s = summary[config]
        print(
            f"{config:>16}: {s['submissions_per_s_median']:8.1f} submissions/s "
            f"(x{s['throughput_ratio_to_off']}), "
            f"{s['server_cpu_ms_per_request_median']:.3f} ms CPU/request (x{s['cpu_ratio_to_off']}; "
            f"per round {s['cpu_ratio_to_off_per_round']}, against {s['ratios_to']})"
        )
    print(f"OTLP exports received: {receiver.requests} ({receiver.bytes} bytes)")


if __name__ == "__main__":
    main()
