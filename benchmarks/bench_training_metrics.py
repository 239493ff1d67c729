"""Step metrics at training resolution: what storing and reading a 100,000-step curve costs.

Writes a job's curve the way the control plane does (one upsert per 100-row ``metrics`` batch, the rate
of one fast job flushing every second), then reads it: the whole curve downsampled to 2,000 and 500
points, one attempt's, an incremental poll (the last 100 steps), and a raw page of 10,000 rows; then the
same after a resumed second attempt replays 1,000 steps (the curve keeps, per step, the newest
attempt's row). SQLite on a temporary file; with ``--postgres`` also a throw-away PostgreSQL database.

Usage:  python benchmarks/bench_training_metrics.py [--steps 100000] [--postgres]
Writes: benchmarks/results/bench_training_metrics.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from trainyard.store.db import Database  # noqa: E402
from trainyard.store.metrics_repo import MetricsRepo  # noqa: E402
from trainyard.store.models import JobRow, TenantRow  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "bench_training_metrics.json"
BATCH = 100


def timed(fn: Any, repeat: int = 5) -> float:
    """Median wall seconds of ``fn()`` over ``repeat`` runs."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def run(url: str, steps: int) -> dict[str, Any]:
    db = Database(url)
    db.upgrade()
    with db.session() as s:
        s.add(TenantRow(id="t-bench", name="bench", created_at_s=0.0, storage_roots=[]))
        s.flush()
        s.add(
            JobRow(
                id="job-bench",
                tenant_id="t-bench",
                name="bench",
                state="running",
                spec={},
                spec_sha256="-",
                created_at_s=0.0,
                updated_at_s=0.0,
            )
        )

    def row(i: int, attempt: int) -> tuple[int, float, dict[str, float | None]]:
        return (
            i,
            float(i),
            {
                "loss": 5.0 / (1 + i / 1000) + attempt * 0.01,
                "step_time_s": 0.1,
                "tokens_per_s": 1e5,
                "learning_rate": 3e-4,
            },
        )

    t0 = time.perf_counter()
    for start in range(1, steps + 1, BATCH):
        with db.session() as s:
            MetricsRepo(s).upsert(
                "job-bench", 1, [row(i, 1) for i in range(start, min(steps, start + BATCH - 1) + 1)]
            )
    write_s = time.perf_counter() - t0
    batches = -(-steps // BATCH)

    def read(**kw: Any) -> Any:
        with db.session() as s:
            return MetricsRepo(s).curve("job-bench", **kw)

    out: dict[str, Any] = {
        "steps": steps,
        "write_ms_per_100_row_batch": round(1000 * write_s / batches, 3),
        "one_attempt": {
            "downsampled_2000_ms": round(1000 * timed(lambda: read(max_points=2000)), 2),
            "downsampled_500_ms": round(1000 * timed(lambda: read(max_points=500)), 2),
            "poll_last_100_ms": round(1000 * timed(lambda: read(since_step=steps - 100)), 2),
            "raw_page_10000_ms": round(1000 * timed(lambda: read(max_points=10_000, downsample=False)), 2),
        },
    }
    mid = steps // 2
    with db.session() as s:
        MetricsRepo(s).upsert("job-bench", 2, [row(i, 2) for i in range(mid, mid + 1000)])
    out["two_attempts"] = {
        "downsampled_2000_ms": round(1000 * timed(lambda: read(max_points=2000)), 2),
        "one_attempt_filter_2000_ms": round(1000 * timed(lambda: read(max_points=2000, attempt=1)), 2),
        "poll_last_100_ms": round(1000 * timed(lambda: read(since_step=steps - 100)), 2),
    }
    db.dispose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--postgres", action="store_true")
    args = ap.parse_args()
    results: dict[str, Any] = {"load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory() as d:
        results["sqlite"] = run(f"sqlite:///{d}/metrics.db", args.steps)
    if args.postgres:
        from controlplane_support import postgres_database

        with postgres_database() as url:
            results["postgresql"] = run(url, args.steps)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
