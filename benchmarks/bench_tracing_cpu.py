"""CPU per traced request, in process, by part: what the request middleware, the span objects and the
OTLP encoding each cost, sampled and not.

Drives :class:`trainyard.observability.tracing.TracingMiddleware` (the platform's request span) around a
minimal ASGI app that answers 201 and, like ``POST /v1/jobs``, sets the tenant and the job id on the
current span and opens one child (what the job's ``job.admit`` span costs is about the same: one SDK span
with a few attributes), with the ASGI scope of a real submission (headers, client, route). Configurations,
interleaved round by round:

- ``bare``: the app without the middleware;
- ``unsampled``: the middleware, every trace dropped by the sampler (what 90 % of requests cost under
  the default sampler);
- ``sampled``: the middleware, every trace kept, spans handed to the in-memory exporter;
- ``sampled_encode_library``: ``sampled``, plus the OTLP protobuf encoding of the finished spans in
  batches of 512 with opentelemetry's encoder (``encode_spans(...).SerializePartialToString()``, what
  the library's OTLP exporter does in the batch processor's thread before it posts);
- ``sampled_encode``: the same with the platform's encoder (``observability.otlp.encode_request``, what
  its OTLP exporter does).

``time.process_time`` around N requests (one thread; nothing else runs in the process). Prints
microseconds of CPU per request for each and the differences; writes
benchmarks/results/bench_tracing_cpu.json.

Usage:  python benchmarks/bench_tracing_cpu.py [--requests 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from trainyard.observability.otlp import encode_request
from trainyard.observability.tracing import (
    ObservabilitySettings,
    TracingMiddleware,
    make_tracer_provider,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_tracing_cpu.json"
CONFIGS = ("bare", "unsampled", "sampled", "sampled_encode_library", "sampled_encode")


class Route:
    path = "/v1/jobs"


SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/v1/jobs",
    "raw_path": b"/v1/jobs",
    "query_string": b"",
    "root_path": "",
    "headers": [
        (b"host", b"127.0.0.1:8000"),
        (b"user-agent", b"python-httpx/0.28.1"),
        (b"accept", b"*/*"),
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer ty_0123456789abcdef"),
        (b"content-length", b"301"),
    ],
    "client": ("127.0.0.1", 51234),
    "server": ("127.0.0.1", 8000),
}


class EncodingProcessor(SpanProcessor):
    """Encodes finished spans in batches of 512 (the batch processor's default) as an OTLP/HTTP exporter
    does (protobuf bytes), in this thread, and drops the bytes."""

    def __init__(self, library: bool) -> None:
        self.library = library
        self.batch: list[ReadableSpan] = []
        self.bytes = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.batch.append(span)
        if len(self.batch) >= 512:
            if self.library:
                self.bytes += len(encode_spans(self.batch).SerializePartialToString())
            else:
                self.bytes += len(encode_request(self.batch))
            self.batch = []


async def inner_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    scope["route"] = Route
    span = trace.get_current_span()
    span.set_attribute("trainyard.tenant", "default")
    tracer = scope["app_tracer"]
    if tracer is not None:
        child = tracer.start_span("job.admit", attributes={"trainyard.job_id": "job-0123456789ab"})
        child.set_attribute("trainyard.outcome", "queued")
        child.end()
    span.set_attribute("trainyard.job_id", "job-0123456789ab")
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def build(config: str) -> tuple[Any, Any]:
    if config == "bare":
        return inner_app, None
    sampler = "always_off" if config == "unsampled" else "parentbased_always_on"
    provider, _ = make_tracer_provider(
        ObservabilitySettings(trace_exporter="memory", trace_buffer_spans=256, otel_traces_sampler=sampler)
    )
    assert provider is not None
    if config.startswith("sampled_encode"):
        provider.add_exporting_processor(EncodingProcessor(library=config.endswith("_library")))
    return TracingMiddleware(inner_app, provider), provider.get_tracer("trainyard")


async def drive(app: Any, tracer: Any, n: int) -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(_message: dict[str, Any]) -> None:
        return None

    for _ in range(n):
        scope = dict(SCOPE)
        scope["app_tracer"] = tracer
        await app(scope, receive, send)


def measure(config: str, n: int) -> float:
    app, tracer = build(config)
    asyncio.run(drive(app, tracer, 500))  # warm-up
    t0 = time.process_time()
    asyncio.run(drive(app, tracer, n))
    return (time.process_time() - t0) * 1e6 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    load_start = round(os.getloadavg()[0], 2)
    runs: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        for config in CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS)):
            runs[config].append(round(measure(config, args.requests), 2))
        print(f"round {r + 1}: " + "  ".join(f"{c} {runs[c][-1]:.1f}" for c in CONFIGS), flush=True)
    med = {c: statistics.median(v) for c, v in runs.items()}
    doc = {
        "benchmark": "CPU per request of the tracing middleware and spans, in process",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_avg_1m_start_end": [load_start, round(os.getloadavg()[0], 2)],
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "cpu_us_per_request_median": med,
        "cpu_us_per_request_runs": runs,
        "cpu_us_over_bare": {c: round(med[c] - med["bare"], 2) for c in CONFIGS},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for c in CONFIGS:
        print(f"{c:>20}: {med[c]:7.1f} us CPU/request (+{med[c] - med['bare']:.1f} over bare)")


if __name__ == "__main__":
    main()
