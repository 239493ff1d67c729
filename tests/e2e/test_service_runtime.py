"""The real service with real workers across a crash: `trainyard up` is killed with SIGKILL while a local
CPU job trains; a new `trainyard up` on the same TRAINYARD_HOME reconciles it (adopts the live workers,
or requeues the job from its last committed checkpoint) and the job succeeds exactly once."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane_support import ServerProcess, tiny_spec
from trainyard.executors.local import pid_alive
from trainyard.runtime.export import WEIGHTS_FILE

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

STEPS = 60


def _get(srv: ServerProcess, path: str, **params: Any) -> Any:
    r = httpx.get(
        f"{srv.url}{path}", params=params, headers={"Authorization": f"Bearer {srv.api_key}"}, timeout=10
    )
    r.raise_for_status()
    return r.json()


def test_kill9_of_the_server_mid_training_the_job_succeeds_exactly_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    srv = ServerProcess(home, executor="local").start()
    try:
        spec = tiny_spec("crash-me", steps=STEPS, seq_len=128, global_batch=8, seed=3)
        # big enough that a step takes tens of milliseconds even on a fast, idle machine: progress is
        # reported by heartbeats (one a second), and the kill must land while the job is mid-run
        spec["model"] = {**spec["model"], "n_layers": 4, "d_model": 128, "vocab_size": 1024}
        spec["checkpoint"] = {"interval": "1s", "keep_last": 2}
        r = httpx.post(
            f"{srv.url}/v1/jobs",
            json={"spec": spec},
            headers={"Authorization": f"Bearer {srv.api_key}", "Idempotency-Key": "crash-1"},
            timeout=10,
        )
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        # each sandboxed attempt starts a cold interpreter and the 2-rank gang shards (FSDP): allow minutes
        deadline = time.monotonic() + 300
        while True:
            doc = _get(srv, f"/v1/jobs/{job_id}")
            if doc["state"] == "running" and (doc.get("progress") or {}).get("step", 0) >= 12:
                events = _get(srv, f"/v1/jobs/{job_id}/events", limit=5000)["events"]
                if any(e["kind"] == "checkpoint" for e in events):
                    break
            assert doc["state"] not in ("failed", "cancelled", "succeeded"), doc
            assert time.monotonic() < deadline, doc
            time.sleep(0.1)
        pids_before = [w["pid"] for w in doc["workers"]]
        srv.kill9()

        srv2 = ServerProcess(home, executor="local", port=srv.port).start()
        srv = srv2
        deadline = time.monotonic() + 300
        while True:
            doc = _get(srv, f"/v1/jobs/{job_id}")
            if doc["state"] in ("succeeded", "failed", "cancelled"):
                break
            assert time.monotonic() < deadline, doc
            time.sleep(0.2)
        assert doc["state"] == "succeeded", doc.get("reason")
        events = _get(srv, f"/v1/jobs/{job_id}/events", limit=5000)["events"]
        kinds = [e["kind"] for e in events]
        moves = [(e["data"]["from"], e["data"]["to"]) for e in events if e["kind"] == "state"]
        # reconciled: either adopted the live workers or requeued the job from its checkpoint
        adopted = "adopted" in kinds
        requeued = any(
            (m[1] == "queued" and m[0] == "running") or m == ("preempted", "queued") for m in moves
        )
        assert adopted or requeued, moves
        # exactly once: one success, one result, one job with this key
        assert moves.count(("running", "succeeded")) == 1
        ended = [to for _, to in moves if to in ("succeeded", "failed", "cancelled")]
        assert ended == ["succeeded"], moves  # one ending, and it is the success
        jobs = _get(srv, "/v1/jobs", limit=500)["jobs"]
        assert [j["id"] for j in jobs if j["name"] == "crash-me"] == [job_id]
        result = doc["result"]
        assert result["final_step"] == STEPS
        weights = Path(str(result["model_path"]).removeprefix("file://")) / WEIGHTS_FILE
        assert hashlib.sha256(weights.read_bytes()).hexdigest() == result["model_sha256"]
        if not adopted:
            started = [e["data"] for e in events if e["kind"] == "started"]
            assert (started[-1].get("resumed_from_step") or 0) >= 1, started[-1]
        # no worker of the first server is left behind
        for pid in pids_before:
            assert pid is None or not pid_alive(pid) or _is_zombie(pid)
        print(f"reconciled by {'adoption' if adopted else 'requeue from the checkpoint'}")
    finally:
        assert srv.stop() == 0, srv.log_text()


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return not os.path.exists(f"/proc/{pid}")


def test_up_with_an_unreachable_ray_cluster_fails_at_once_with_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from controlplane_support import ROOT, free_port

    env = {**os.environ, "TRAINYARD_HOME": str(tmp_path / "home")}
    env.pop("TRAINYARD_RAY_ADDRESS", None)
    flags = ["--ray-address", "127.0.0.1:1", "--ray-shared-paths", str(tmp_path), "--port", str(free_port())]
    proc = subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", "up", "--executor", "ray", *flags],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 8, (proc.stdout, proc.stderr[-2000:])
    assert "cannot connect to the Ray cluster at 127.0.0.1:1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ray_shared_paths_setting_reaches_the_ray_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.executors.ray import RayExecutor
    from trainyard.settings import Settings

    monkeypatch.setenv("TRAINYARD_RAY_SHARED_PATHS", "/mnt/shared,/data/ckpt")
    settings = Settings()
    assert settings.ray_shared_paths == "/mnt/shared,/data/ckpt"
    ex = RayExecutor(settings=settings, connect=False)
    assert ex.shared_paths == ["/mnt/shared", "/data/ckpt"]
