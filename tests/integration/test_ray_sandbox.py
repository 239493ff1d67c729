"""The Ray executor with the sandbox, on a real one-node Ray cluster on loopback started by this module.

Every rank's worker that a Ray actor starts runs in bubblewrap on its node, as a local worker does
(executors/sandbox.py): the attacks of tests/integration/test_sandbox.py fail the same way from a Ray
worker; a node where bubblewrap cannot start fails the attempt before any worker starts; and the
built-in trainer, sandboxed, checkpoints, resumes after a preemption notice to the same weights as an
uninterrupted run, and is adopted by a new control plane through its recorded host pids.
A cluster that cannot start fails the tests (never skips them).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trainyard.executors.base import CLASSIFICATION_INFRA, ExecutorEvent, LaunchRequest, WorkerInfo
from trainyard.executors.ray import RayExecutor, pool_resource
from trainyard.executors.ray_cluster import LOOPBACK_ENV, LoopbackNode, LoopbackRayCluster
from trainyard.executors.sandbox import SANDBOX_UID, SandboxSpec
from trainyard.runtime.checkpoint import MANIFEST
from trainyard.server import make_executor
from trainyard.settings import Settings

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POOL = "ray-sb"
SECRET = "ty_secretadminkey_0123456789"
STEPS = 60
CHECKPOINT_EVERY = 10
TERMINAL = ("succeeded", "failed", "lost", "preempted")
SPEC: dict[str, Any] = {
    "apiVersion": "trainyard/v1",
    "kind": "TrainingJob",
    "name": "ray-sandboxed",
    "model": {"architecture": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 512},
    "workload": {"seq_len": 64, "global_batch": 8, "steps": STEPS, "precision": "fp32", "seed": 11},
    "requirements": {"allow": ["cpu"]},
}


@dataclass
class World:
    cluster: LoopbackRayCluster
    node: LoopbackNode
    executor: RayExecutor
    shared: Path
    home: Path


def _executor(address: str, shared: Path, **kw: Any) -> RayExecutor:
    kw.setdefault("sandbox", SandboxSpec())
    return RayExecutor(address, shared_paths=[str(shared)], heartbeat_timeout_s=90.0, **kw)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install -y bubblewrap"
    saved = {k: os.environ.get(k) for k in LOOPBACK_ENV}
    os.environ.update(LOOPBACK_ENV)
    shared = tmp_path_factory.mktemp("ray-sandbox-shared")
    home = tmp_path_factory.mktemp("ray-sandbox-home")  # the server's TRAINYARD_HOME
    home.chmod(0o700)
    (home / "api_key").write_text(SECRET)
    (home / "api_key").chmod(0o600)
    (home / "trainyard.db").write_text("every tenant's jobs")
    cluster = LoopbackRayCluster()
    executor: RayExecutor | None = None
    try:
        node = cluster.add_node("head", resources={pool_resource(POOL): 4}, num_cpus=4)
        executor = _executor(
            cluster.address,
            shared,
            extra_env={"TRAINYARD_HOME": str(home), "TRAINYARD_DATABASE_URL": "sqlite:///x.db"},
        )
        w = World(cluster, node, executor, shared, home)
        yield w
        executor = w.executor  # the adoption test replaces it (control-plane restart)
    finally:
        if executor is not None:
            executor.shutdown(kill_workers=True)
        cluster.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _request(w: World, job_id: str, attempt: int, spec: dict[str, Any], world_size: int) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        attempt=attempt,
        spec=spec,
        world_size=world_size,
        pool=POOL,
        market="on_demand",
        checkpoint_url=f"file://{w.shared / 'checkpoints'}",
        checkpoint_interval_s=None,
        run_dir=str(w.shared / "runs" / job_id),
        env={
            "TRAINYARD_CHECKPOINT_EVERY_STEPS": str(CHECKPOINT_EVERY),
            "TRAINYARD_HEARTBEAT_S": "0.5",
            "TRAINYARD_API_KEY": SECRET,
            "DATABASE_URL": "postgresql://u:pw@127.0.0.1/db",
        },
    )


def _poll(
    ex: RayExecutor, events: dict[str, list[ExecutorEvent]], stop: Any, timeout_s: float = 240.0
) -> None:
    """Poll like the control loop until ``stop()``; events by job id."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for e in ex.poll():
            events.setdefault(e.job_id, []).append(e)
        if stop():
            return
        time.sleep(0.05)
    pytest.fail(
        f"timed out after {timeout_s:.0f} s; events: { {j: [e.kind for e in v] for j, v in events.items()} }"
    )


def _terminal(events: list[ExecutorEvent], attempt: int | None = None) -> list[ExecutorEvent]:
    return [e for e in events if e.kind in TERMINAL and (attempt is None or e.attempt == attempt)]


def test_user_code_on_a_ray_node_is_walled_in(world: World) -> None:
    ex = world.executor
    home, ckpt = world.home, world.shared / "checkpoints"
    other = world.node.temp_dir / "trainyard" / "job-other" / "a0-r0"  # another job's rank on this node
    other.mkdir(parents=True)
    (other / "rank-0.log").write_text("another job's log")
    run = "$TRAINYARD_RUN_DIR"
    port = world.cluster.port  # the head node's GCS: whoever reaches it runs code as the node's user
    script = (
        "id -u; echo env:; env; echo :env; "
        f"cat {home}/api_key; cat {home}/trainyard.db; ls {other}; ls {home}/runs; "
        f"echo owned > {ckpt}/job-walls/mine; "
        f"echo escaped > {ckpt}/escaped; echo escaped > /tmp/../escaped-root; "
        f"rm -f {run}/rank-0.log; ln -s {home}/api_key {run}/rank-0.log && echo LINKED-LOG; "
        f"ln -sf {home}/api_key {run}/launch-a0.json && echo LINKED-LAUNCH; "
        f"ln -s {home}/api_key {run}/launch-a1.json.tmp && echo LINKED-TMP; "
        f"[ -L {run}/rank-0.log ] || [ -L {run}/launch-a0.json ] && echo IS-A-LINK; "
        f"python -c \"import socket; socket.create_connection(('{world.node.ip}', {port}), 2)\" "
        "&& echo REACHED-RAY || echo ray-unreachable; "
        "echo done-attacking; exit 0"
    )
    spec = {**SPEC, "name": "attack", "entrypoint": {"command": ["sh", "-c", script]}}
    ex.launch(_request(world, "job-walls", 0, spec, world_size=1))
    events: dict[str, list[ExecutorEvent]] = {}
    _poll(ex, events, lambda: bool(_terminal(events.get("job-walls", []))), timeout_s=120)
    log = (world.shared / "runs" / "job-walls" / "rank-0.log").read_text()
    (end,) = _terminal(events["job-walls"])
    assert end.kind == "succeeded", (end.data, log)
    assert "done-attacking" in log, log
    uid = log.split("--- attempt 0 rank 0 ---\n", 1)[1].splitlines()[0]
    assert uid != "0", log
    if os.geteuid() == 0:
        assert uid == str(SANDBOX_UID), log
    env = log.split("env:\n", 1)[1].split(":env", 1)[0]
    for name in ("TRAINYARD_HOME", "TRAINYARD_DATABASE_URL", "TRAINYARD_API_KEY", "DATABASE_URL"):
        assert f"{name}=" not in env, (name, env)
    assert not [line for line in env.splitlines() if line.startswith("RAY_")], env  # nor the node's
    assert SECRET not in log and "every tenant's jobs" not in log, log
    assert f"ls: cannot access '{other}'" in log and "another job's log" not in log, log
    assert f"ls: cannot access '{home}/runs'" in log, log
    assert (ckpt / "job-walls" / "mine").read_text() == "owned\n"
    if os.geteuid() == 0:  # what the worker writes is the sandbox uid's
        assert (ckpt / "job-walls" / "mine").stat().st_uid == SANDBOX_UID
    assert not (ckpt / "escaped").exists()
    assert not Path("/escaped-root").exists() and not (world.node.temp_dir / "escaped-root").exists()
    # the node-local run directory's entries are the actor's: the log and launch files cannot become links
    for marker in ("LINKED-LOG", "LINKED-LAUNCH", "LINKED-TMP", "IS-A-LINK"):
        assert marker not in log, log
    # a single-rank job with file storage has no network: not even the Ray cluster's own port
    assert "REACHED-RAY" not in log and "ray-unreachable" in log, log


def test_a_node_without_bubblewrap_starts_nothing(world: World, tmp_path: Path) -> None:
    # the server builds the Ray executor with the same setting as the local one (TRAINYARD_SANDBOX)
    settings = Settings(executor="ray", ray_address=world.cluster.address, ray_shared_paths=str(world.shared))
    assert make_executor(settings).sandbox == SandboxSpec()
    off = Settings(executor="ray", ray_address=world.cluster.address, sandbox="none")
    assert make_executor(off).sandbox is None

    ex = _executor(world.cluster.address, world.shared, sandbox=SandboxSpec(bwrap=str(tmp_path / "no-bwrap")))
    ex.launch(_request(world, "no-bwrap", 0, SPEC, world_size=2))
    events: dict[str, list[ExecutorEvent]] = {}
    _poll(ex, events, lambda: bool(_terminal(events.get("no-bwrap", []))), timeout_s=120)
    (end,) = _terminal(events["no-bwrap"])
    assert end.kind == "failed" and end.data["classification"] == CLASSIFICATION_INFRA, end.data
    assert "the sandbox cannot start on Ray node(s) " + world.node.ip in end.data["reason"], end.data
    assert "bubblewrap" in end.data["reason"], end.data
    assert not [e for e in events["no-bwrap"] if e.kind in ("started", "heartbeat", "checkpoint")]
    # no worker ever ran: nothing was mirrored from the node
    run_dir = world.shared / "runs" / "no-bwrap"
    assert not list(run_dir.glob("events-a0-r*.jsonl"))
    assert "--- attempt 0 rank 0 ---" not in (run_dir / "rank-0.log").read_text()


def test_sandboxed_trainer_resumes_exactly_and_is_adopted(world: World) -> None:
    ex = world.executor
    ex.launch(_request(world, "reference", 1, SPEC, world_size=2))
    ex.launch(_request(world, "resumed", 1, SPEC, world_size=2))
    events: dict[str, list[ExecutorEvent]] = {}

    def resumed(attempt: int | None = None) -> list[ExecutorEvent]:
        return [e for e in events.get("resumed", []) if attempt is None or e.attempt == attempt]

    def mid_run_checkpoint() -> bool:
        return any(e.kind == "checkpoint" and CHECKPOINT_EVERY <= e.data["step"] < STEPS for e in resumed(1))

    _poll(ex, events, mid_run_checkpoint)
    assert not _terminal(resumed())
    ex.preempt("resumed", notice_s=30.0)
    _poll(ex, events, lambda: bool(_terminal(resumed(1))))
    (pre,) = _terminal(resumed(1))
    assert pre.kind == "preempted" and pre.data["checkpoint_step"] == pre.data["step"] < STEPS, pre.data
    step = int(pre.data["step"])
    job_ckpt = world.shared / "checkpoints" / "resumed" / f"step-{step}"
    assert (job_ckpt / MANIFEST).exists()
    if os.geteuid() == 0:  # the trainer wrote it from inside the sandbox, as the sandbox uid
        assert job_ckpt.stat().st_uid == SANDBOX_UID

    ex.launch(_request(world, "resumed", 2, SPEC, world_size=2))

    def training_again() -> bool:
        return any(e.kind == "heartbeat" and e.data["step"] > step for e in resumed(2)) or bool(
            _terminal(resumed(2))
        )

    _poll(ex, events, training_again)
    assert not _terminal(resumed(2)), _terminal(resumed(2))[0].data
    started = [e for e in resumed(2) if e.kind == "started"]
    assert sorted(e.data["rank"] for e in started) == [0, 1]
    assert {e.data["resumed_from_step"] for e in started} == {step}
    for e in started:  # the recorded pid is bubblewrap's on the node's host, not the one inside
        assert e.data["pid"] != e.data["pid_in_sandbox"]
        cmdline = Path(f"/proc/{e.data['pid']}/cmdline").read_bytes().split(b"\0")
        assert b"bwrap" in cmdline[0], cmdline

    # the control plane restarts: what it recorded (the started events' pids and hosts) is what it adopts
    ex.shutdown()
    adopter = _executor(world.cluster.address, world.shared)
    world.executor = adopter
    recorded = [
        WorkerInfo(int(e.data["rank"]), int(e.data["pid"]), str(e.data.get("host") or "")) for e in started
    ]
    assert adopter.adopt("resumed", 2, str(world.shared / "runs" / "resumed"), recorded)
    if not _terminal(events.get("reference", [])):
        ref_started = [e for e in events["reference"] if e.kind == "started"]
        ref_workers = [WorkerInfo(int(e.data["rank"]), int(e.data["pid"]), "") for e in ref_started]
        assert adopter.adopt("reference", 1, str(world.shared / "runs" / "reference"), ref_workers)
    _poll(adopter, events, lambda: bool(_terminal(resumed(2)) and _terminal(events.get("reference", []))))
    (ref_end,) = _terminal(events["reference"])
    (end,) = _terminal(resumed(2))
    assert ref_end.kind == "succeeded" and ref_end.data["final_step"] == STEPS, ref_end.data
    assert end.kind == "succeeded" and end.data["final_step"] == STEPS, end.data
    # a sandboxed preemption and resume, then an adoption, train to the uninterrupted run's weights
    assert end.data["model_sha256"] == ref_end.data["model_sha256"]
    log = (world.shared / "runs" / "resumed" / "rank-1.log").read_text()
    assert "worker rank 1 exiting with 0" in log, log[-2000:]
