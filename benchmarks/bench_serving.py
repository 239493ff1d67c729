"""Serving numbers (issue 16): gateway overhead, engine speed against bare `transformers.generate`,
dynamic batching, time to first token, replicas needed for N adapters.

1. Engine (in process, a random Llama of --hidden/--layers): tokens/s of one request through the engine
   against `model.generate` on the same model and prompt (target >= 90 %); 8 concurrent requests against
   the same 8 one after another (target >= 3x).
2. Gateway (a real `trainyard up` and a real replica process): p50/p99 latency of a 1-token completion
   through `/openai/v1` minus the same request sent straight to the replica (targets: p50 <= 2 ms,
   p99 <= 10 ms); time to first token of a streamed chat completion through the gateway.
3. Replicas for N LoRA adapters over one base: N deployments, each of another adapter, all served
   by the replica pool of their base (expected: 1).

Usage:  python benchmarks/bench_serving.py [--requests 300] [--adapters 8] [--hidden 512 --layers 8]
Writes: benchmarks/results/bench_serving.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "bench_serving.json"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def bench_engine(model_dir: Path, new_tokens: int, repeats: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainyard.serving.engine import GenerationEvent, GenerationRequest, TransformersEngine

    tok = AutoTokenizer.from_pretrained(model_dir)
    prompt = tok("the quick brown fox jumps over the lazy dog")["input_ids"]
    bare = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([prompt])

    def bare_once() -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            out = bare.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
        assert out.shape[1] - ids.shape[1] == new_tokens
        return time.perf_counter() - t

    eng = TransformersEngine(str(model_dir), batch_wait_s=0.0)
    eng.start()

    def engine_run(n: int) -> float:
        finished = [threading.Event() for _ in range(n)]
        counts = [0] * n

        def sink_for(i: int) -> Any:
            def sink(ev: GenerationEvent) -> None:  # runs on the engine's thread: never block here
                if ev.finish_reason is not None:
                    counts[i] = ev.completion_tokens
                    finished[i].set()

            return sink

        t = time.perf_counter()
        for i in range(n):
            eng.submit(GenerationRequest(list(prompt), max_tokens=new_tokens), sink_for(i))
        for f in finished:
            f.wait()
        assert all(c == new_tokens for c in counts), counts
        return time.perf_counter() - t

    bare_once()
    engine_run(1)  # warm both
    bare_s, eng_s = [], []
    for _ in range(repeats):  # interleaved, so load changes hit both alike
        bare_s.append(bare_once())
        eng_s.append(engine_run(1))
    seq_s, batch_s = [], []
    for _ in range(max(1, repeats // 2)):
        seq_s.append(sum(engine_run(1) for _ in range(8)))
        batch_s.append(engine_run(8))
    eng.stop()
    bare_tps = new_tokens / statistics.median(bare_s)
    eng_tps = new_tokens / statistics.median(eng_s)
    seq_tps = 8 * new_tokens / statistics.median(seq_s)
    batch_tps = 8 * new_tokens / statistics.median(batch_s)
    return {
        "new_tokens": new_tokens,
        "bare_generate_tokens_per_s": bare_tps,
        "engine_tokens_per_s": eng_tps,
        "engine_vs_bare": eng_tps / bare_tps,
        "sequential_8_tokens_per_s": seq_tps,
        "batched_8_tokens_per_s": batch_tps,
        "batching_speedup_8": batch_tps / seq_tps,
    }


def _server_cpu_s(proc: Any) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _gateway_side(srv: Any, tc: Any, name: str) -> dict[str, Any]:
    """Deploy ``name`` (bench@1) on ``srv``; what the measurement needs of that server."""
    import psutil

    tc.create_deployment(name, "bench@1")
    doc = tc.wait_deployment(name, timeout_s=300)
    return {
        "url": srv.url,
        "replica": doc["replica_set"][0]["url"],
        "body": {"model": name, "prompt": "hello", "max_tokens": 1, "temperature": 0},
        "direct_body": {"model": "__base__", "prompt": "hello", "max_tokens": 1, "temperature": 0},
        "headers": {"Authorization": f"Bearer {srv.api_key}"},
        "proc": psutil.Process(srv.proc.pid),
    }


def _measure_gateways(sides: dict[str, dict[str, Any]], n_requests: int) -> dict[str, dict[str, Any]]:
    """For each server, alternately: a gateway request, then the same request straight to its replica
    (latency pairs); and the API server's CPU per gateway request (CPU over blocks of gateway requests,
    the servers taking turns, minus each one's background CPU over an idle period as long)."""
    import httpx

    out: dict[str, dict[str, Any]] = {}
    with httpx.Client(timeout=60) as h:

        def gateway(side: dict[str, Any]) -> None:
            url = f"{side['url']}/openai/v1/completions"
            h.post(url, json=side["body"], headers=side["headers"]).raise_for_status()

        def direct(side: dict[str, Any]) -> None:
            h.post(f"{side['replica']}/v1/completions", json=side["direct_body"]).raise_for_status()

        for side in sides.values():
            for _ in range(20):  # warm-up
                gateway(side)
                direct(side)
        busy = {k: 0.0 for k in sides}
        wall = {k: 0.0 for k in sides}
        block = 50
        done = 0
        while done < n_requests:
            m = min(block, n_requests - done)
            for k, side in sides.items():
                cpu0, t0 = _server_cpu_s(side["proc"]), time.perf_counter()
                for _ in range(m):
                    gateway(side)
                busy[k] += _server_cpu_s(side["proc"]) - cpu0
                wall[k] += time.perf_counter() - t0
            done += m
        idle0 = {k: _server_cpu_s(side["proc"]) for k, side in sides.items()}
        time.sleep(max(wall.values()))
        idle = {k: _server_cpu_s(side["proc"]) - idle0[k] for k, side in sides.items()}
        lat: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in sides}
        for _ in range(n_requests):
            for k, side in sides.items():
                t = time.perf_counter()
                gateway(side)
                lat[k][0].append(time.perf_counter() - t)
                t = time.perf_counter()
                direct(side)
                lat[k][1].append(time.perf_counter() - t)
        for k in sides:
            gw, dr = lat[k]
            idle_share = idle[k] * wall[k] / max(wall.values())
            out[k] = {
                "requests": n_requests,
                "direct_p50_ms": pct(dr, 50) * 1e3,
                "direct_p99_ms": pct(dr, 99) * 1e3,
                "gateway_p50_ms": pct(gw, 50) * 1e3,
                "gateway_p99_ms": pct(gw, 99) * 1e3,
                "overhead_p50_ms": (pct(gw, 50) - pct(dr, 50)) * 1e3,
                "overhead_p99_ms": (pct(gw, 99) - pct(dr, 99)) * 1e3,
                "server_cpu_ms_per_request": (busy[k] - idle_share) / n_requests * 1e3,
            }
        # time to first token of a streamed chat completion, through the first server
        side = next(iter(sides.values()))
        chat = {
            "model": side["body"]["model"],
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 16,
            "temperature": 0,
            "stream": True,
        }
        ttft = []
        for _ in range(max(10, n_requests // 10)):
            t = time.perf_counter()
            with h.stream(
                "POST", f"{side['url']}/openai/v1/chat/completions", json=chat, headers=side["headers"]
            ) as r:
                first = None
                for line in r.iter_lines():
                    if first is None and '"content":"' in line and '"content":""' not in line:
                        first = time.perf_counter() - t
                ttft.append(first if first is not None else float("nan"))
        first_key = next(iter(sides))
        out[first_key]["ttft_p50_ms"] = pct(ttft, 50) * 1e3
        out[first_key]["ttft_p95_ms"] = pct(ttft, 95) * 1e3
    return out


def bench_gateway(
    home: Path,
    storage: Path,
    base: Path,
    n_requests: int,
    n_adapters: int,
    baseline_src: Path | None = None,
) -> dict[str, Any]:
    import httpx
    from tests.controlplane_support import ServerProcess
    from tests.tiny_models import build_lora_adapter, place_model_version

    from trainyard.client import TrainyardClient

    place_model_version(storage, "default", "bench", 1, base)
    srv = ServerProcess(home).start(timeout_s=300)
    servers = {"gateway": srv}
    out: dict[str, Any] = {}
    try:
        if baseline_src is not None:  # the same measurement against other code, side by side
            bhome = home.parent / "home-baseline"
            place_model_version(bhome / "storage", "default", "bench", 1, base)
            bsrv = ServerProcess(bhome)
            bsrv.env["PYTHONPATH"] = str(baseline_src.resolve())
            servers["gateway_baseline"] = bsrv.start(timeout_s=300)
        sides = {}
        clients = {k: TrainyardClient(s.url, s.api_key, timeout_s=300) for k, s in servers.items()}
        try:
            for k, s in servers.items():
                sides[k] = _gateway_side(s, clients[k], "bench")
            out.update(_measure_gateways(sides, n_requests))
            tc = clients["gateway"]
            body = sides["gateway"]["body"]
            headers = sides["gateway"]["headers"]
            if n_adapters:
                adapters_dir = home / "adapters"
                for i in range(n_adapters):
                    a = build_lora_adapter(base, adapters_dir / f"a{i}", seed=100 + i)
                    place_model_version(storage, "default", f"ft{i}", 1, a, base="bench@1")
                    tc.create_deployment(f"ft{i}", f"ft{i}@1")
                t = time.perf_counter()
                for i in range(n_adapters):
                    tc.wait_deployment(f"ft{i}", timeout_s=300)
                replicas = {
                    r["id"] for i in range(n_adapters) for r in tc.get_deployment(f"ft{i}")["replica_set"]
                }
                answers = set()
                with httpx.Client(timeout=60) as h:
                    for i in range(n_adapters):
                        r = h.post(
                            f"{srv.url}/openai/v1/completions",
                            json={**body, "model": f"ft{i}", "max_tokens": 6},
                            headers=headers,
                        )
                        answers.add(r.json()["choices"][0]["text"])
                out["adapters"] = {
                    "adapters": n_adapters,
                    "replicas": len(replicas),
                    "distinct_answers": len(answers),
                    "all_ready_s": time.perf_counter() - t,
                }
        finally:
            for c in clients.values():
                c.close()
    finally:
        for s in servers.values():
            s.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--skip-engine", action="store_true", help="only the gateway (and adapter) numbers")
    ap.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="another checkout's src: a second API server runs it, measured side by side (gateway_baseline)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the JSON results go")
    args = ap.parse_args()
    from tests.tiny_models import build_tiny_llama

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        engine_model = (
            None
            if args.skip_engine
            else build_tiny_llama(tmpd / "engine", hidden_size=args.hidden, n_layers=args.layers)
        )
        engine = None if args.skip_engine else bench_engine(engine_model, args.new_tokens, args.repeats)
        tiny = build_tiny_llama(tmpd / "tiny")
        serving = bench_gateway(
            tmpd / "home", tmpd / "home" / "storage", tiny, args.requests, args.adapters, args.baseline_src
        )
    doc = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_start": load_start,
            "load_end": os.getloadavg(),
        },
        "engine_model": {"hidden_size": args.hidden, "layers": args.layers},
        "engine": engine,
        **serving,
        "targets": {
            "overhead_p50_ms": 2.0,
            "overhead_p99_ms": 10.0,
            "engine_vs_bare": 0.9,
            "batching_speedup_8": 3.0,
            "replicas_for_n_adapters": 1,
        },
    }
    doc["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    doc["command"] = " ".join(["benchmarks/bench_serving.py", *sys.argv[1:]])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    e, a = engine, serving.get("adapters")
    rows = []
    if e is not None:
        rows += [
            (
                "engine tokens/s vs bare generate",
                f"{e['engine_tokens_per_s']:.1f} / {e['bare_generate_tokens_per_s']:.1f}",
                f"{e['engine_vs_bare']:.1%}",
                ">= 90 %",
            ),
            (
                "8 concurrent vs sequential",
                f"{e['batched_8_tokens_per_s']:.1f} / {e['sequential_8_tokens_per_s']:.1f} tok/s",
                f"{e['batching_speedup_8']:.2f}x",
                ">= 3x",
            ),
        ]
    for key in ("gateway", "gateway_baseline"):
        g = serving.get(key)
        if g is None:
            continue
        rows += [
            (
                f"{key} overhead p50",
                f"{g['gateway_p50_ms']:.2f} - {g['direct_p50_ms']:.2f} ms",
                f"{g['overhead_p50_ms']:.2f} ms",
                "<= 2 ms",
            ),
            (
                f"{key} overhead p99",
                f"{g['gateway_p99_ms']:.2f} - {g['direct_p99_ms']:.2f} ms",
                f"{g['overhead_p99_ms']:.2f} ms",
                "<= 10 ms",
            ),
            (
                f"{key}: API server CPU per request",
                "(busy - idle) / requests",
                f"{g['server_cpu_ms_per_request']:.2f} ms",
                "",
            ),
        ]
    g = serving["gateway"]
    rows.append(
        ("time to first token p50 / p95", "", f"{g['ttft_p50_ms']:.1f} / {g['ttft_p95_ms']:.1f} ms", "")
    )
    if a is not None:
        rows.append(
            (
                f"replicas for {a['adapters']} adapters",
                f"{a['distinct_answers']} distinct answers",
                str(a["replicas"]),
                "1",
            )
        )
    print(f"{'measure':40} {'raw':34} {'value':>14} {'target':>10}")
    for r in rows:
        print(f"{r[0]:40} {r[1]:34} {r[2]:>14} {r[3]:>10}")
    print(f"load {load_start} -> {os.getloadavg()}; wrote {args.out}")


if __name__ == "__main__":
    main()
