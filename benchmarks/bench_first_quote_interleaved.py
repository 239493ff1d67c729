"""First-quote error without a server, robust to a loaded machine: the first-start profiles of the startup
decoders (``services.profiles.STARTUP_SPECS``) timed two ways — through the built-in trainer's step
(``runtime.step_profile.TrainerStepSession``, what ``trainyard profile`` and the first start now time) and
through the plain-PyTorch decoder (``runtime.profiler.ProfileSession``, what they timed before) — and the
four jobs of ``bench_first_quote.py`` run by the trainer itself (``Trainer.train_step``, timed as a job's
step metrics are), all in one process with their steps interleaved round robin, so a burst of load from
other processes hits every configuration alike. Each set of startup profiles calibrates the ``cpu``
parameters as at first start (``calibrate_from_profiles`` on the packaged calibration, the local pool's
topology), and the one-device prediction for each job is compared with its measured median step.

    python benchmarks/bench_first_quote_interleaved.py [--steps 12] [--warmup 2]

One device only (a gang needs processes of its own: ``bench_first_quote.py --devices 2``). Writes
benchmarks/results/first_quote_interleaved.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_first_quote import TARGET_PCT, jobs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "first_quote_interleaved.json"
    )
    args = ap.parse_args(argv)

    import torch

    from trainyard.catalog.accelerators import get_accelerator
    from trainyard.cost.quote import predict_kwargs
    from trainyard.predict import default_calibration, predict
    from trainyard.predict.fit import calibrate_from_profiles
    from trainyard.runtime.profiler import ProfileSession, measure_device
    from trainyard.runtime.step_profile import TrainerStepSession
    from trainyard.services.pools import local_cpu_pool
    from trainyard.services.profiles import STARTUP_SPECS
    from trainyard.spec.loader import spec_from_dict

    load_start = os.getloadavg()[0]
    c0, t0 = time.process_time(), time.perf_counter()
    startup = [
        spec_from_dict({"apiVersion": "trainyard/v1", "kind": "TrainingJob", **d}) for d in STARTUP_SPECS
    ]
    job_specs = [spec_from_dict(d) for d in jobs()]
    runners: dict[str, Any] = {}
    for s in startup:
        runners[f"trainer:{s.name}"] = TrainerStepSession(s, device="cpu", threads=1)
        runners[f"plain:{s.name}"] = ProfileSession(s, device="cpu", threads=1)
    for s in job_specs:
        runners[f"job:{s.name}"] = TrainerStepSession(s, device="cpu", threads=1)
    times: dict[str, list[float]] = {k: [] for k in runners}
    for i in range(args.warmup + args.steps):
        for name, r in runners.items():
            dt = r.step()
            if i >= args.warmup:
                times[name].append(dt)
    device = measure_device(torch.device("cpu"))
    cpu = get_accelerator("cpu")
    local = predict_kwargs(local_cpu_pool(), cpu)
    cals = {}
    for kind in ("trainer", "plain"):
        docs = [runners[f"{kind}:{s.name}"].document(times[f"{kind}:{s.name}"], device) for s in startup]
        cals[kind] = calibrate_from_profiles(docs, base=default_calibration())
    rows = []
    for s in job_specs:
        measured = statistics.median(times[f"job:{s.name}"])
        row: dict[str, Any] = {"job": s.name, "measured_step_time_s": measured}
        for kind, cal in cals.items():
            q = predict(s, cpu, 1, calibration=cal, **local).step_time_s
            row[f"{kind}_quoted_step_time_s"] = q
            row[f"{kind}_error_pct"] = 100 * (q / measured - 1)
        rows.append(row)
    for r in runners.values():
        if isinstance(r, TrainerStepSession):
            r.close()
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_1m_at_start": load_start,
        "load_1m_at_end": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        "steps": args.steps,
        "startup_profiles_ms": {
            k: 1e3 * statistics.median(v) for k, v in times.items() if not k.startswith("job:")
        },
        "rows": rows,
        "target_pct": TARGET_PCT,
        "max_abs_error_pct": {k: max(abs(r[f"{k}_error_pct"]) for r in rows) for k in cals},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"load {load_start:.1f} -> {doc['load_1m_at_end']:.1f}; "
        f"wall {doc['wall_s']:.0f} s, CPU {doc['cpu_s']:.0f} s"
    )
    for k, v in doc["startup_profiles_ms"].items():
        print(f"  profile {k:24} {v:8.1f} ms")
    print(f"{'job':16} {'measured':>10} {'trainer-profiled':>18} {'plain-profiled':>16}")
    for r in rows:
        m = r["measured_step_time_s"] * 1e3
        t, p = r["trainer_quoted_step_time_s"] * 1e3, r["plain_quoted_step_time_s"] * 1e3
        print(
            f"{r['job']:16} {m:8.1f}ms {t:8.1f}ms {r['trainer_error_pct']:+6.1f}% "
            f"{p:8.1f}ms {r['plain_error_pct']:+6.1f}%"
        )
    for k, v in doc["max_abs_error_pct"].items():
        print(f"max |error| {k}-profiled: {v:.1f} % (target ≤ {TARGET_PCT:.0f} %)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
