"""Dashboard and /metrics cost as the data grows (SQLite, in-process app, no network).

Builds a platform in a temporary TRAINYARD_HOME, submits jobs through the API, runs them on a scripted
executor through the real supervisor (placement, started, heartbeats, checkpoints), then times:
- the jobs overview (`/`) with N jobs in the tenant,
- one job page (`/jobs/{id}`) with E heartbeat events (loss and step-time charts, cost split, event log),
- a Prometheus scrape (`/metrics`) with K open jobs (store-backed gauges and alert rules),
- at scale (``--scale``, on by default): every dashboard page of a tenant with 10,000 jobs and 1,000
  model versions — the jobs overview and its later pages, the live job endpoint, the models list
  (first and a deep page), one model with its 1,000 sibling versions, datasets, evaluations, usage.
  The extra jobs and versions are copies of ones the real services made (bulk inserted: the pages
  are measured, not the submissions).

Wall time per request (median and p90 of R repeats) and the process CPU time per request, which is
less sensitive to other load on the machine. The server time per page must stay under 100 ms.

Usage:  python benchmarks/bench_dashboard.py [--repeats 15] [--quick] [--no-scale]
Writes: benchmarks/results/bench_dashboard.json
"""

from __future__ import annotations

import argparse
import json
import platform as pyplatform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from trainyard.api.app import create_app
from trainyard.executors.base import ExecutorEvent, LaunchRequest, WorkerInfo
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduling import GreedyCheapestRound
from trainyard.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_dashboard.json"
SPEC: dict[str, Any] = {
    "apiVersion": "trainyard/v1",
    "kind": "TrainingJob",
    "name": "bench",
    "model": {"architecture": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 256},
    "workload": {"seq_len": 64, "global_batch": 4, "steps": 100_000, "precision": "fp32"},
    "requirements": {"allow": ["cpu"]},
}


class ScriptedExecutor:
    """Runs nothing; the benchmark decides what the workers report."""

    name = "scripted"

    def __init__(self) -> None:
        self.events: list[ExecutorEvent] = []
        self.attempts: dict[str, int] = {}
        self.lock = threading.Lock()

    def serves(self, pool: Any) -> bool:
        return True  # every pool: the benchmark decides what runs where

    def launch(self, req: LaunchRequest) -> list[WorkerInfo]:
        self.attempts[req.job_id] = req.attempt
        return [WorkerInfo(rank=r, pid=None, host="bench") for r in range(req.world_size)]

    def report(self, job_id: str, kind: str, data: dict[str, Any], time_s: float) -> None:
        with self.lock:
            self.events.append(ExecutorEvent(job_id, self.attempts[job_id], kind, data, time_s))

    def poll(self) -> list[ExecutorEvent]:
        with self.lock:
            out, self.events = self.events, []
        return out

    def preempt(self, job_id: str, notice_s: float) -> None: ...
    def cancel(self, job_id: str) -> None: ...
    def workers(self, job_id: str) -> list[WorkerInfo]:
        return []

    def adopt(self, job_id: str, attempt: int, run_dir: str, workers: list[WorkerInfo]) -> bool:
        return False

    def shutdown(self) -> None: ...


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def build(home: Path, jobs: int, running: int, heartbeats: int) -> tuple[TestClient, str, Any]:
    clock, ex = Clock(), ScriptedExecutor()
    p = Platform.open(
        Settings(home=home, database_url=f"sqlite:///{home / 'trainyard.db'}"),
        PlatformOptions(
            executor=ex,
            schedule_round=GreedyCheapestRound(),
            cpu_count=max(running, 1),
            clock=clock,
            with_catalog=False,
        ),
    )
    p.pools.update("local-cpu", {"price_usd_per_device_hour": 0.5})
    app = create_app(p, access_log=False)
    c = TestClient(app)
    key = p.settings.api_key_path.read_text().strip()
    h = {"Authorization": f"Bearer {key}"}
    ids = []
    for i in range(jobs):
        r = c.post("/v1/jobs", json={"spec": {**SPEC, "name": f"bench-{i}"}}, headers=h)
        ids.append(r.json()["id"])
    p.tick()  # admit all; place as many as the pool holds
    started = [j for j in ids if j in ex.attempts][:running]
    for j in started:
        ex.report(j, "started", {"rank": 0, "pid": 1, "host": "bench"}, clock.now)
    p.tick()
    target = started[0] if started else ids[0]
    for k in range(heartbeats):
        clock.now += 10
        ex.report(
            target,
            "heartbeat",
            {
                "rank": 0,
                "step": 10 * (k + 1),
                "loss": 5.0 / (1 + k / 50),
                "step_time_s": 0.5,
                "total_steps": 100_000,
            },
            clock.now,
        )
        if k % 100 == 99:
            ex.report(
                target,
                "checkpoint",
                {"step": 10 * (k + 1), "path": f"file:///ck/{k}", "stall_s": 1.0},
                clock.now,
            )
        if k % 500 == 499:
            p.supervisor.poll_once()  # type: ignore[union-attr]
    p.supervisor.poll_once()  # type: ignore[union-attr]
    c.post("/login", data={"api_key": key})
    c.headers["Authorization"] = f"Bearer {key}"  # /metrics answers an admin key only
    return c, target, p


def seed_scale(c: TestClient, p: Any, jobs_total: int, model_versions: int) -> dict[str, str]:
    """Bring the tenant to ``jobs_total`` jobs and ``model_versions`` versions of one model (with
    aliases and their history) by copying rows the real services wrote; a dataset and evaluations."""
    from sqlalchemy import func, insert, select

    from trainyard.store.models import JobRow
    from trainyard.store.registry_models import (
        EvaluationRow,
        ModelAliasEventRow,
        ModelAliasRow,
        ModelVersionRow,
    )

    h = {"Authorization": c.headers["Authorization"]}
    rows = "".join(json.dumps({"prompt": f"q{i} ", "completion": f"a{i}"}) + "\n" for i in range(500))
    r = c.post(
        "/v1/datasets?name=bench-data",
        content=rows.encode(),
        headers={**h, "Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 201, r.text
    dataset = r.json()["id"]
    with p.db.session() as s:
        have = int(s.scalar(select(func.count()).select_from(JobRow)) or 0)
        template = s.scalars(select(JobRow).order_by(JobRow.seq.desc()).limit(1)).one()
        cols = {c.key: getattr(template, c.key) for c in JobRow.__table__.columns if c.key != "seq"}
        states = ["succeeded", "failed", "cancelled"]
        batch = []
        for i in range(jobs_total - have):
            batch.append(
                {
                    **cols,
                    "id": f"job-bench{i:07d}",
                    "name": f"bulk-{i}",
                    "state": states[i % 3],
                    "idempotency_key": None,
                    "created_at_s": cols["created_at_s"] - i,
                }
            )
            if len(batch) == 2000:
                s.execute(insert(JobRow), batch)
                batch = []
        if batch:
            s.execute(insert(JobRow), batch)
        tenant_id = template.tenant_id
        now = float(template.created_at_s)
        s.execute(
            insert(ModelVersionRow),
            [
                {
                    "tenant_id": tenant_id,
                    "name": "bench-model",
                    "version": v,
                    "public": False,
                    "kind": "full",
                    "sha256": f"{v:064x}",
                    "base": "bench-model@1" if v > 1 else None,
                    "source_job": template.id,
                    "datasets": [dataset],
                    "doc": {"root": f"/nonexistent/bench-model/{v}", "metrics": {"loss": 1.0 / v}},
                    "created_by": "bench",
                    "created_at_s": now + v,
                }
                for v in range(1, model_versions + 1)
            ],
        )
        for alias, v in (("production", model_versions - 10), ("staging", model_versions)):
            s.add(
                ModelAliasRow(
                    tenant_id=tenant_id, name="bench-model", alias=alias, version=v, updated_at_s=now
                )
            )
        s.execute(
            insert(ModelAliasEventRow),
            [
                {
                    "tenant_id": tenant_id,
                    "name": "bench-model",
                    "alias": "staging",
                    "from_version": v - 1 if v > 1 else None,
                    "to_version": v,
                    "actor": "bench",
                    "evaluation_id": None,
                    "forced": False,
                    "reason": "",
                    "time_s": now + v,
                }
                for v in range(1, 101)
            ],
        )
        metric = {"model": 1.0, "baseline": 1.1, "delta": -0.1, "ci95": [-0.15, -0.05], "p_value": 0.01}
        s.execute(
            insert(EvaluationRow),
            [
                {
                    "id": f"eval-bench{i:05d}",
                    "tenant_id": tenant_id,
                    "state": "succeeded",
                    "model": f"bench-model@{model_versions - i}",
                    "baseline": "bench-model@1",
                    "dataset": dataset,
                    "split": "eval",
                    "job_id": None,
                    "doc": {"n": 50, "metrics": {"loss": metric}, "verdict": "better", "passed": True},
                    "created_at_s": now + i,
                    "finished_at_s": now + i,
                }
                for i in range(300)
            ],
        )
    return {"dataset": dataset.removeprefix("ds://"), "model": f"bench-model@{model_versions // 2}"}


def timed(c: TestClient, path: str, repeats: int) -> dict[str, float]:
    c.get(path)  # warm
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        r = c.get(path)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
        assert r.status_code == 200, (path, r.status_code)
    wall.sort()
    return {
        "wall_ms_p50": round(statistics.median(wall) * 1000, 2),
        "wall_ms_p90": round(wall[int(0.9 * (len(wall) - 1))] * 1000, 2),
        "cpu_ms_mean": round(statistics.fmean(cpu) * 1000, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--no-scale", action="store_true", help="skip the 10,000-job / 1,000-version pages")
    args = ap.parse_args()
    sizes = [(50, 20, 500)] if args.quick else [(50, 20, 500), (1000, 200, 5000)]
    rows = []
    for jobs, running, heartbeats in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            c, target, p = build(Path(tmp), jobs, running, heartbeats)
            for page, path in (
                ("overview /", "/"),
                ("job page", f"/jobs/{target}"),
                ("/metrics", "/metrics"),
            ):
                res = timed(c, path, args.repeats)
                rows.append(
                    {"page": page, "jobs": jobs, "running": running, "heartbeat_events": heartbeats, **res}
                )
            p.close()
    if not args.no_scale:
        with tempfile.TemporaryDirectory() as tmp:
            c, target, p = build(Path(tmp), 50, 20, 5000)
            refs = seed_scale(c, p, jobs_total=10_000, model_versions=1000)
            second = c.get("/").text.split("/?cursor=", 1)[1].split('"', 1)[0].split("&", 1)[0]
            # what an open job page polls: the events after the last one it shows
            live = json.loads(
                c.get(f"/jobs/{target}").text.split('id="job-live">', 1)[1].split("</script>")[0]
            )
            live_poll = f"{live['url']}?after={live['after']}&since_step={live['since_step']}"
            pages = (
                ("overview /", "/"),
                ("overview page 2", f"/?cursor={second}"),
                ("overview ?state", "/?state=failed"),
                ("job page", f"/jobs/{target}"),
                ("job live poll", live_poll),
                ("models", "/models"),
                ("models deep", "/models?offset=900"),
                ("model page", f"/models/{refs['model']}"),
                ("datasets", "/datasets"),
                ("dataset page", f"/datasets/{refs['dataset']}"),
                ("evaluations", "/evaluations"),
                ("usage", "/usage"),
            )
            for page, path in pages:
                res = timed(c, path, args.repeats)
                rows.append(
                    {
                        "page": page,
                        "jobs": 10_000,
                        "model_versions": 1000,
                        "running": 20,
                        "heartbeat_events": 5000,
                        **res,
                    }
                )
            p.close()
    print(
        f"{'page':<16} {'jobs':>6} {'running':>8} {'heartbeats':>10} "
        f"{'p50 ms':>8} {'p90 ms':>8} {'cpu ms':>8}"
    )
    for r in rows:
        print(
            f"{r['page']:<16} {r['jobs']:>6} {r['running']:>8} {r['heartbeat_events']:>10} "
            f"{r['wall_ms_p50']:>8} {r['wall_ms_p90']:>8} {r['cpu_ms_mean']:>8}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "dashboard",
                "python": pyplatform.python_version(),
                "repeats": args.repeats,
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
