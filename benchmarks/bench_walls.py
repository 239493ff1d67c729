"""Tenant walls: the attacks of an ordinary tenant key tried against a real platform and a real sandbox
(held or not), the sandbox's start-up cost per attempt and the step overhead inside it.

    python benchmarks/bench_walls.py [--startups 20] [--steps 300]

Prints a table and writes benchmarks/results/bench_walls.json. Needs bubblewrap (`make sandbox`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform as pyplatform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from trainyard.api.app import create_app
from trainyard.executors.base import TERMINAL_KINDS, LaunchRequest
from trainyard.executors.local import LocalExecutor
from trainyard.executors.sandbox import Mounts, Sandbox, scrubbed_env
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.settings import Settings

RESULTS = Path(__file__).resolve().parent / "results" / "bench_walls.json"
SPEC: dict[str, Any] = {
    "apiVersion": "trainyard/v1",
    "kind": "TrainingJob",
    "name": "walls",
    "model": {"architecture": "decoder", "n_layers": 1, "d_model": 16, "n_heads": 2, "vocab_size": 32},
    "workload": {"seq_len": 8, "global_batch": 1, "steps": 1, "precision": "fp32"},
    "requirements": {"allow": ["cpu"]},
}
STEP_SCRIPT = """
import time, statistics, torch
torch.manual_seed(0); torch.set_num_threads(1)
m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
opt = torch.optim.SGD(m.parameters(), lr=0.01); x = torch.randn(32, 256)
times = []
for i in range(STEPS + 30):
    t = time.perf_counter(); opt.zero_grad(); m(x).pow(2).mean().backward(); opt.step()
    if i >= 30: times.append(time.perf_counter() - t)
print(statistics.median(times))
"""


def spec(name: str, **over: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(SPEC))
    doc["name"] = name
    for path, value in over.items():
        section, key = path.split(".")
        doc.setdefault(section, {})[key] = value
    return doc


def api_attacks(home: Path) -> list[dict[str, Any]]:
    """Storage, user-code, /metrics and session attacks against the real app (in-process ASGI)."""
    p = Platform.open(Settings(home=home), PlatformOptions(cpu_count=2, with_catalog=False))
    rows: list[dict[str, Any]] = []
    try:
        with TestClient(create_app(p, access_log=False)) as c:
            admin = {"Authorization": f"Bearer {p.settings.api_key_path.read_text().strip()}"}
            keys = {}
            for name in ("mallory", "victim"):
                keys[name] = c.post("/v1/tenants", json={"name": name}, headers=admin).json()["api_key"]
            me = {"Authorization": f"Bearer {keys['mallory']}"}
            storage = (home / "storage").resolve()
            victim = f"file://{storage}/tenants/victim/checkpoints"

            def submit(doc: dict[str, Any]) -> tuple[int, str]:
                r = c.post("/v1/jobs", json={"spec": doc}, headers=me)
                return r.status_code, (r.json().get("error") or {}).get("code", "")

            storage_attacks = {
                "checkpoint.storage chained URL (::)": f"{victim}/job-x::file:///x",
                "checkpoint.storage file:///anywhere": "file:///tmp/anywhere",
                "checkpoint.storage http:// to a local service": "http://127.0.0.1:8080/v1/jobs",
                "checkpoint.storage ../ out of the namespace": f"file://{storage}/tenants/mallory/../victim",
                "checkpoint.storage another tenant's area": victim,
                "checkpoint.storage the server's home": f"file://{home.resolve()}",
            }
            for what, url in storage_attacks.items():
                status, code = submit(spec("a", **{"checkpoint.storage": url}))
                rows.append({"attack": what, "held": status == 422 and code == "storage_not_allowed"})
            for what, ds in {
                "workload.dataset file:///etc/passwd": "file:///etc/passwd",
                "workload.dataset ../ relative": "../train.jsonl",
                "workload.dataset relative path": "train.jsonl",
            }.items():
                status, code = submit(spec("d", **{"workload.dataset": ds}))
                rows.append({"attack": what, "held": status == 422 and code == "storage_not_allowed"})
            status, code = submit(spec("m", **{"model.base": f"{victim.rsplit('/', 1)[0]}/models/m"}))
            rows.append(
                {"attack": "model.base another tenant's model", "held": code == "storage_not_allowed"}
            )
            a = c.post("/v1/jobs", json={"spec": spec("e1", **{"checkpoint.storage": "file:///etc/passwd"})},
                       headers=me).json()  # fmt: skip
            b = c.post("/v1/jobs", json={"spec": spec("e2", **{"checkpoint.storage": "file:///etc/nope-x"})},
                       headers=me).json()  # fmt: skip
            rows.append({"attack": "existence leak in the refusal", "held": a["error"] == b["error"]})
            status, code = submit({**spec("u"), "entrypoint": {"command": ["sh", "-c", "id"]}})
            rows.append({"attack": "entrypoint without an admin's allowance", "held": status == 403})
            r = c.patch("/v1/tenants/mallory", json={"allow_user_code": True}, headers=me)
            rows.append({"attack": "tenant allows itself user code", "held": r.status_code == 403})
            rows.append({"attack": "/metrics without a key", "held": c.get("/metrics").status_code == 401})
            tenant_metrics = c.get("/metrics", headers=me).status_code
            rows.append({"attack": "/metrics with a tenant key", "held": tenant_metrics == 403})
            # a dashboard session outliving its key
            with TestClient(create_app(p, access_log=False)) as browser:
                browser.post("/login", data={"api_key": keys["victim"], "next": "/"}, follow_redirects=False)
                key_id = c.get("/v1/tenants/victim/keys", headers=admin).json()["keys"][0]["id"]
                c.post(f"/v1/tenants/victim/keys/{key_id}/revoke", headers=admin)
                r = browser.get("/", follow_redirects=False)
                rows.append(
                    {"attack": "dashboard session after key revocation", "held": r.status_code == 303}
                )
            for name in ("trainyard.db", "api_key"):
                mode = (home / name).stat().st_mode & 0o777
                rows.append({"attack": f"{name} readable by others", "held": mode == 0o600})
    finally:
        p.close()
    return rows


def sandbox_attacks(root: Path) -> list[dict[str, Any]]:
    """One user command probing the sandbox from inside (real bubblewrap, a real worker)."""
    home = root / "home"
    home.mkdir(mode=0o700, parents=True)
    (home / "api_key").write_text("ty_SECRET")
    (home / "api_key").chmod(0o600)
    script = (
        "echo uid=$(id -u); env > $TRAINYARD_RUN_DIR/../env.txt 2>/dev/null; env | grep -c TRAINYARD_HOME; "
        f"cat {home}/api_key; echo x > {home}/written; "
        "ln -s /etc/shadow $TRAINYARD_RUN_DIR/rank-0.log.swap 2>/dev/null; exit 0"
    )
    req = LaunchRequest(
        job_id="job-probe",
        attempt=0,
        spec={**spec("probe"), "entrypoint": {"command": ["sh", "-c", script]}},
        world_size=1,
        pool="local-cpu",
        market="on_demand",
        checkpoint_url=f"file://{root / 'storage'}",
        checkpoint_interval_s=None,
        run_dir=str(root / "runs" / "job-probe"),
        env={"TRAINYARD_API_KEY": "ty_SECRET"},
    )
    ex = LocalExecutor(sandbox=Sandbox(), extra_env={"TRAINYARD_HOME": str(home)})
    try:
        ex.launch(req)
        deadline = time.time() + 300
        done = False
        while time.time() < deadline and not done:
            done = any(e.kind in TERMINAL_KINDS for e in ex.poll())
            time.sleep(0.05)
    finally:
        ex.shutdown(kill_workers=True)
    log = (root / "runs" / "job-probe" / "rank-0.log").read_text()
    uid_line = next((ln for ln in log.splitlines() if ln.startswith("uid=")), "uid=?")
    return [
        {"attack": "sh -c 'id' runs as root", "held": uid_line not in ("uid=0", "uid=?")},
        {"attack": "cat $TRAINYARD_HOME/api_key from user code", "held": "ty_SECRET" not in log},
        {"attack": "server settings in the worker's environment", "held": "\n0\n" in log},
        {"attack": "write into the server's home", "held": not (home / "written").exists()},
        {
            "attack": "plant a link in the run directory",
            "held": not (root / "runs" / "job-probe" / "rank-0.log.swap").exists(),
        },
    ]


def median_ms(fn: Callable[[], None], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1000, 2)


def startup_cost(n: int) -> dict[str, float]:
    sb = Sandbox()
    env = scrubbed_env(os.environ, {})
    bare = ["/bin/true"]
    wrapped = sb.command(bare, Mounts(share_net=False))
    py = [sys.executable, "-S", "-c", "pass"]
    py_wrapped = sb.command(py, Mounts(share_net=False))
    run = subprocess.run
    out = {
        "true_ms": median_ms(lambda: run(bare, env=env, check=True), n),
        "sandboxed_true_ms": median_ms(lambda: run(wrapped, env=env, check=True), n),
        "python_ms": median_ms(lambda: run(py, env=env, check=True), n),
        "sandboxed_python_ms": median_ms(lambda: run(py_wrapped, env=env, check=True), n),
    }
    out["sandbox_startup_ms"] = round(out["sandboxed_true_ms"] - out["true_ms"], 2)
    out["sandbox_startup_python_ms"] = round(out["sandboxed_python_ms"] - out["python_ms"], 2)

    def gang_network() -> None:
        with sb.gang_network():
            pass

    # what a gang's attempt adds once, on top of each rank's start-up: its own network namespace
    out["gang_network_ms"] = median_ms(gang_network, n)
    return out


def step_overhead(steps: int, pairs: int) -> dict[str, float]:
    sb = Sandbox()
    env = scrubbed_env(os.environ, {})
    code = STEP_SCRIPT.replace("STEPS", str(steps))
    plain, boxed = [], []
    for _ in range(pairs):  # alternate, so machine load hits both alike
        plain.append(float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                          text=True, check=True).stdout))  # fmt: skip
        cmd = sb.command([sys.executable, "-c", code], Mounts(share_net=False))
        boxed.append(float(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout))
    p, b = statistics.median(plain), statistics.median(boxed)
    return {
        "step_ms_plain": round(p * 1000, 4),
        "step_ms_sandboxed": round(b * 1000, 4),
        "step_overhead_pct": round((b - p) / p * 100, 2),
        "pairs": pairs,
        "steps": steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--startups", type=int, default=20)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = api_attacks(Path(tmp) / "api")
        rows += sandbox_attacks(Path(tmp) / "sbx")
    startup = startup_cost(args.startups)
    steps = step_overhead(args.steps, args.pairs)
    held = sum(r["held"] for r in rows)
    print(f"{'attack':<52} held")
    for r in rows:
        print(f"{r['attack']:<52} {'yes' if r['held'] else 'NO'}")
    print(f"attacks tried {len(rows)}, held {held}")
    print(
        f"sandbox start-up per attempt: {startup['sandbox_startup_ms']} ms (/bin/true "
        f"{startup['true_ms']} → {startup['sandboxed_true_ms']} ms; python -S "
        f"{startup['python_ms']} → {startup['sandboxed_python_ms']} ms); a gang's own network "
        f"namespace: {startup['gang_network_ms']} ms per attempt"
    )
    print(
        f"step time: {steps['step_ms_plain']} ms plain, {steps['step_ms_sandboxed']} ms sandboxed "
        f"({steps['step_overhead_pct']:+} %)"
    )
    load = os.getloadavg()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "walls",
                "python": pyplatform.python_version(),
                "cpus": os.cpu_count(),
                "load_avg_1m": round(load[0], 2),
                "attacks_tried": len(rows),
                "attacks_held": held,
                "attacks": rows,
                "startup": startup,
                "steps": steps,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
