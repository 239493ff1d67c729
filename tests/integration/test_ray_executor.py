"""The Ray executor on a real two-node Ray cluster on loopback, started by this module.

Two ``ray start`` nodes in separate temporary directories stand in for two machines (node IPs
127.0.0.2 and 127.0.0.3: Ray rewrites 127.0.0.1 to the machine's routable address, other loopback
addresses are kept). Their custom resources stand in for two pools:

- ``ray-a``: one device on each node, so a 2-rank job on it must span both nodes;
- ``ray-b``: two devices on the head node only.

A cluster that cannot start fails the tests (never skips them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trainyard.errors import StorageError
from trainyard.executors.base import Executor, ExecutorEvent, LaunchRequest, WorkerInfo
from trainyard.executors.ray import RayExecutor, pool_resource
from trainyard.executors.ray_cluster import LOOPBACK_ENV, LoopbackNode, LoopbackRayCluster
from trainyard.runtime.checkpoint import MANIFEST

pytestmark = pytest.mark.ray

STEPS = 120
CHECKPOINT_EVERY = 20
RUN_TIMEOUT_S = 240.0

SPEC: dict[str, Any] = {
    "apiVersion": "trainyard/v1",
    "kind": "TrainingJob",
    "name": "ray-tiny",
    # steps of tens of milliseconds even on a fast idle machine, so a node kill, a preemption notice or an
    # adoption lands while the gang is mid-run rather than after it finished
    "model": {"architecture": "decoder", "n_layers": 4, "d_model": 128, "n_heads": 4, "vocab_size": 1024},
    "workload": {"seq_len": 128, "global_batch": 8, "steps": STEPS, "precision": "fp32", "seed": 7},
    "requirements": {"allow": ["cpu"]},
}
TERMINAL = ("succeeded", "failed", "lost", "preempted")


@dataclass
class RayWorld:
    cluster: LoopbackRayCluster
    head: LoopbackNode
    second: LoopbackNode
    executor: RayExecutor
    shared: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayWorld]:
    saved = {k: os.environ.get(k) for k in LOOPBACK_ENV}
    os.environ.update(LOOPBACK_ENV)
    shared = tmp_path_factory.mktemp("ray-shared")
    cluster = LoopbackRayCluster()
    executor: RayExecutor | None = None
    try:
        head = cluster.add_node(
            "head", resources={pool_resource("ray-a"): 1, pool_resource("ray-b"): 2}, num_cpus=2
        )
        second = cluster.add_node("second", resources={pool_resource("ray-a"): 1}, num_cpus=2)
        executor = RayExecutor(cluster.address, shared_paths=[str(shared)], heartbeat_timeout_s=90.0)
        w = RayWorld(cluster, head, second, executor, shared)
        yield w
        executor = w.executor  # a test may have replaced it (control-plane restart)
    finally:
        if executor is not None:
            executor.shutdown(kill_workers=True)
        cluster.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _request(
    w: RayWorld, job_id: str, attempt: int, pool: str, world_size: int = 2, **kw: Any
) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        attempt=attempt,
        spec=kw.pop("spec", SPEC),
        world_size=world_size,
        pool=pool,
        market="on_demand",
        checkpoint_url=kw.pop("checkpoint_url", f"file://{w.shared / 'checkpoints'}"),
        checkpoint_interval_s=None,
        run_dir=str(w.shared / "runs" / job_id),
        env={"TRAINYARD_CHECKPOINT_EVERY_STEPS": str(CHECKPOINT_EVERY), "TRAINYARD_HEARTBEAT_S": "0.5"},
        **kw,
    )


def _run_until(
    ex: RayExecutor, job_id: str, stop: Any, timeout_s: float = RUN_TIMEOUT_S
) -> list[ExecutorEvent]:
    """Poll like the control loop does until ``stop(events)`` is true; every event of ``job_id``."""
    events: list[ExecutorEvent] = []
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        events.extend(e for e in ex.poll() if e.job_id == job_id)
        if stop(events):
            return events
        time.sleep(0.05)
    pytest.fail(
        f"job {job_id} did not get there within {timeout_s:.0f} s; events: {[e.kind for e in events]}"
    )


def _terminal(events: list[ExecutorEvent]) -> list[ExecutorEvent]:
    return [e for e in events if e.kind in TERMINAL]


def _committed_steps(shared: Path, job_id: str) -> list[int]:
    root = shared / "checkpoints" / job_id
    return sorted(int(p.name[5:]) for p in root.glob("step-*") if (p / MANIFEST).exists())


@pytest.fixture(scope="module")
def spread(world: RayWorld) -> tuple[list[WorkerInfo], list[ExecutorEvent]]:
    """The uninterrupted two-rank run (its weights are the reference of the node-loss test): run once
    for the module, by whichever test asks first."""
    ex = world.executor
    workers = ex.launch(_request(world, "spread", 1, "ray-a"))
    return workers, _run_until(ex, "spread", lambda evs: bool(_terminal(evs)))


def test_two_rank_job_spans_both_nodes_trains_and_checkpoints(
    world: RayWorld, spread: tuple[list[WorkerInfo], list[ExecutorEvent]]
) -> None:
    ex = world.executor
    assert isinstance(ex, Executor)
    workers, events = spread
    assert [w.rank for w in workers] == [0, 1]
    (end,) = _terminal(events)
    assert end.kind == "succeeded", end.data
    assert end.data["final_step"] == STEPS and len(end.data["model_sha256"]) == 64
    started = [e for e in events if e.kind == "started"]
    assert sorted(e.data["rank"] for e in started) == [0, 1]
    # one rank per node: the pool has one device on each
    assert {e.data["node_ip"] for e in started} == {world.head.ip, world.second.ip}
    assert {e.data["ray_node_id"] for e in started} and len({e.data["ray_node_id"] for e in started}) == 2
    ckpts = sorted({e.data["step"] for e in events if e.kind == "checkpoint"})
    assert ckpts[:3] == [CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY, 3 * CHECKPOINT_EVERY] and ckpts[-1] == STEPS
    assert _committed_steps(world.shared, "spread")[-1] == STEPS
    assert any(e.kind == "heartbeat" and e.data["step"] > 0 for e in events)
    # the control plane's run_dir holds the ranks' event files and logs, copied from the nodes
    run_dir = world.shared / "runs" / "spread"
    for r in (0, 1):
        assert '"kind":"succeeded"' in (run_dir / f"events-a1-r{r}.jsonl").read_text()
        assert f"worker rank {r} exiting with 0" in (run_dir / f"rank-{r}.log").read_text()
    assert ex.workers("spread") == []


def test_storage_that_only_one_machine_sees_is_refused(world: RayWorld, tmp_path: Path) -> None:
    ex = world.executor
    with pytest.raises(StorageError, match="not storage every Ray node reaches"):
        ex.launch(_request(world, "local-disk", 1, "ray-a", checkpoint_url=f"file://{tmp_path}/ckpt"))
    with pytest.raises(StorageError, match="relative path"):
        ex.launch(_request(world, "relative", 1, "ray-a", checkpoint_url="checkpoints"))
    assert ex.phase("local-disk") is None and ex.phase("relative") is None
    assert not [
        g
        for g in _placement_groups().values()
        if g["name"].startswith(("trainyard/local-disk/", "trainyard/relative/"))
    ]


def test_gang_that_cannot_fit_waits_without_starting_partially(world: RayWorld) -> None:
    import ray

    ex = world.executor
    res = pool_resource("ray-b")
    assert ray.available_resources().get(res) == 2.0
    ex.launch(_request(world, "too-big", 1, "ray-b", world_size=3))
    events = _run_until(ex, "too-big", lambda evs: any(e.kind == "log" for e in evs), timeout_s=60)
    assert "waiting for capacity" in events[-1].data["message"]
    time.sleep(1.0)
    events += [e for e in ex.poll() if e.job_id == "too-big"]
    assert ex.phase("too-big") == "placing"
    assert not [e for e in events if e.kind != "log"]
    assert ex.workers("too-big") == [] and all(p["node_id"] is None for p in ex.placement("too-big"))
    # nothing of the pool is held by the waiting gang: the two devices stay free for others
    assert ray.available_resources().get(res) == 2.0
    (pg,) = [g for g in _placement_groups().values() if g["name"] == "trainyard/too-big/a1"]
    assert pg["state"] == "PENDING" and pg["strategy"] == "PACK"
    ex.cancel("too-big")
    assert ex.phase("too-big") is None
    (pg,) = [g for g in _placement_groups().values() if g["name"] == "trainyard/too-big/a1"]
    assert pg["state"] == "REMOVED"


def test_node_loss_preemption_and_adoption_then_identical_weights(
    world: RayWorld, spread: tuple[list[WorkerInfo], list[ExecutorEvent]]
) -> None:
    ex = world.executor
    (end,) = _terminal(spread[1])
    assert end.kind == "succeeded", end.data
    reference = end.data["model_sha256"]
    ex.launch(_request(world, "survivor", 1, "ray-a"))

    def checkpointed_mid_run(evs: list[ExecutorEvent]) -> bool:
        return any(e.kind == "checkpoint" and CHECKPOINT_EVERY <= e.data["step"] < STEPS for e in evs)

    events = _run_until(ex, "survivor", checkpointed_mid_run)
    assert not _terminal(events)
    lost_rank = next(p for p in ex.placement("survivor") if p["node_ip"] == world.second.ip)
    killed_at = time.time()
    world.cluster.kill_raylet(world.second)
    events += _run_until(ex, "survivor", lambda evs: bool(_terminal(evs)), timeout_s=120)
    (end,) = _terminal(events)
    assert end.kind == "lost", end.data
    assert end.attempt == 1 and end.data["rank"] == lost_rank["rank"]
    detected_s = end.time_s - killed_at
    assert detected_s < 30, detected_s
    assert ex.phase("survivor") is None and ex.workers("survivor") == []
    # the lost node's worker died with its actor (no orphan keeps training)
    deadline = time.time() + 30
    while time.time() < deadline and _alive(lost_rank["pid"]):
        time.sleep(0.2)
    assert not _alive(lost_rank["pid"])
    committed = _committed_steps(world.shared, "survivor")
    assert committed and committed[-1] < STEPS

    # what the service does on "lost": a new attempt wherever there is capacity now (pool ray-b, one node)
    ex.launch(_request(world, "survivor", 2, "ray-b"))
    resume_from = committed[-1]

    def training_again(evs: list[ExecutorEvent]) -> bool:
        return any(e.kind == "heartbeat" and e.data["step"] > resume_from for e in evs) or bool(
            _terminal(evs)
        )

    resumed = _run_until(ex, "survivor", training_again)
    started = [e for e in resumed if e.kind == "started"]
    assert {e.data["resumed_from_step"] for e in started} == {resume_from}
    assert {e.data["node_ip"] for e in started} == {world.head.ip}
    assert not _terminal(resumed), resumed[-1].data

    # a preemption notice reaches the ranks through their actors: emergency checkpoint, then exit
    ex.preempt("survivor", notice_s=30.0)
    resumed += _run_until(ex, "survivor", lambda evs: bool(_terminal(evs)))
    (end,) = _terminal(resumed)
    assert end.kind == "preempted" and end.attempt == 2, end.data
    assert end.data["checkpoint_step"] == end.data["step"] > resume_from
    assert _committed_steps(world.shared, "survivor")[-1] == end.data["step"]

    ex.launch(_request(world, "survivor", 3, "ray-b"))
    final = _run_until(
        ex, "survivor", lambda evs: any(e.kind == "heartbeat" for e in evs) or bool(_terminal(evs))
    )
    assert not _terminal(final)
    assert {e.data["resumed_from_step"] for e in final if e.kind == "started"} == {end.data["step"]}

    # the control plane restarts: the gang keeps training (detached actors) and a new executor adopts it
    running = ex.workers("survivor")
    assert sorted(w.rank for w in running) == [0, 1]
    ex.shutdown()
    adopter = RayExecutor(world.cluster.address, shared_paths=[str(world.shared)], heartbeat_timeout_s=90.0)
    world.executor = adopter
    assert adopter.adopt("survivor", 3, str(world.shared / "runs" / "survivor"), running)
    final += _run_until(adopter, "survivor", lambda evs: bool(_terminal(evs)))
    (end3,) = _terminal(final)
    assert end3.kind == "succeeded" and end3.attempt == 3, end3.data
    assert end3.data["final_step"] == STEPS
    assert '"kind":"succeeded"' in (world.shared / "runs" / "survivor" / "events-a3-r0.jsonl").read_text()
    # the same weights as the uninterrupted run, after a node loss and a preemption
    assert end3.data["model_sha256"] == reference


def _placement_groups() -> dict[str, dict[str, Any]]:
    import ray

    return dict(ray.util.placement_group_table())


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
