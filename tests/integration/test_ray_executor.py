"""The Ray executor on a real two-node Ray cluster on loopback, started by this module.

Two ``ray start`` nodes in separate temporary directories stand in for two machines (node IPs
127.0.0.2 and 127.0.0.3: Ray rewrites 127.0.0.1 to the machine's routable address, other loopback
addresses are kept). Their custom resources stand in for two pools:

- ``ray-a``: one device on each node, so a 2-rank job on it must span both nodes;
- ``ray-b``: two devices on the head node only.

The executor runs every worker in the sandbox, as ``trainyard up`` does by default (TRAINYARD_SANDBOX):
the training, node-loss, preemption and adoption tests run sandboxed workers, and the attacks of
tests/integration/test_sandbox.py are tried from a Ray worker. A cluster that cannot start fails the
tests (never skips them).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox_support import (
    CREDENTIALS,
    assert_not_a_ray_client,
    assert_walled_in,
    first_attacks,
    ray_attack_report,
    ray_client_attack,
    server_home,
)
from trainyard.errors import ServiceUnavailableError, StorageError
from trainyard.executors.base import (
    CLASSIFICATION_INFRA,
    Executor,
    ExecutorEvent,
    LaunchRequest,
    WorkerInfo,
)
from trainyard.executors.ray import (
    RayExecutor,
    metrics_exporter_addresses,
    pool_resource,
    unauthenticated_cluster,
)
from trainyard.executors.ray_cluster import (
    AUTH_MODE_ENV,
    AUTH_TOKEN_PATH_ENV,
    LOOPBACK_ENV,
    LoopbackNode,
    LoopbackRayCluster,
)
from trainyard.executors.sandbox import SANDBOX_UID, SandboxSpec
from trainyard.runtime.checkpoint import MANIFEST
from trainyard.server import make_executor
from trainyard.settings import Settings

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
    home: Path  # the server's TRAINYARD_HOME: its key and database


def _executor(address: str, shared: Path, **kw: Any) -> RayExecutor:
    """A control plane's Ray executor with the sandbox, as ``trainyard up`` builds it by default."""
    kw.setdefault("sandbox", SandboxSpec())
    return RayExecutor(address, shared_paths=[str(shared)], heartbeat_timeout_s=90.0, **kw)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayWorld]:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install -y bubblewrap"
    saved = {k: os.environ.get(k) for k in (*LOOPBACK_ENV, AUTH_MODE_ENV, AUTH_TOKEN_PATH_ENV)}
    os.environ.update(LOOPBACK_ENV)
    shared = tmp_path_factory.mktemp("ray-shared")
    home = tmp_path_factory.mktemp("ray-home")
    settings = server_home(home)  # the server's settings reach the executor, never a worker
    cluster = LoopbackRayCluster()
    os.environ.update(cluster.client_env)  # the cluster requires its token; this process is the driver
    executor: RayExecutor | None = None
    try:
        head = cluster.add_node(
            "head", resources={pool_resource("ray-a"): 1, pool_resource("ray-b"): 2}, num_cpus=2
        )
        second = cluster.add_node("second", resources={pool_resource("ray-a"): 1}, num_cpus=2)
        executor = _executor(cluster.address, shared, extra_env=settings)
        w = RayWorld(cluster, head, second, executor, shared, home)
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
    # each rank trained in the sandbox on its node: its own pid namespace, the sandbox uid's files
    assert all(e.data["pid"] != e.data["pid_in_sandbox"] for e in started), [e.data for e in started]
    ckpts = sorted({e.data["step"] for e in events if e.kind == "checkpoint"})
    assert ckpts[:3] == [CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY, 3 * CHECKPOINT_EVERY] and ckpts[-1] == STEPS
    assert _committed_steps(world.shared, "spread")[-1] == STEPS
    if os.geteuid() == 0:
        step_dir = world.shared / "checkpoints" / "spread" / f"step-{STEPS}"
        assert {p.stat().st_uid for p in [step_dir, *step_dir.iterdir()]} == {SANDBOX_UID}
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
    # from what the service recorded, the started events' pids: bubblewrap's on the node's host, the
    # processes the actors watch (not the pids inside the sandboxes' namespaces)
    final += _run_until(
        ex,
        "survivor",
        lambda evs: (
            {e.data["rank"] for e in [*final, *evs] if e.kind == "started"} == {0, 1} or bool(_terminal(evs))
        ),
    )
    assert not _terminal(final)
    recorded = {e.data["rank"]: e.data for e in final if e.kind == "started"}
    running = [WorkerInfo(r, int(d["pid"]), str(d.get("host") or "")) for r, d in sorted(recorded.items())]
    assert (
        {w.rank: w.pid for w in ex.workers("survivor")}
        == {w.rank: w.pid for w in running}
        != {r: d["pid_in_sandbox"] for r, d in recorded.items()}
    )
    assert sorted(w.rank for w in running) == [0, 1]
    for w in running:
        assert b"bwrap" in Path(f"/proc/{w.pid}/cmdline").read_bytes().split(b"\0")[0]
    ex.shutdown()
    adopter = _executor(world.cluster.address, world.shared)
    world.executor = adopter
    assert adopter.adopt("survivor", 3, str(world.shared / "runs" / "survivor"), running)
    final += _run_until(adopter, "survivor", lambda evs: bool(_terminal(evs)))
    (end3,) = _terminal(final)
    assert end3.kind == "succeeded" and end3.attempt == 3, end3.data
    assert end3.data["final_step"] == STEPS
    assert '"kind":"succeeded"' in (world.shared / "runs" / "survivor" / "events-a3-r0.jsonl").read_text()
    # the same weights as the uninterrupted run, after a node loss and a preemption
    assert end3.data["model_sha256"] == reference


def test_user_code_on_a_ray_node_is_walled_in(world: RayWorld) -> None:
    """The attacks of test_sandbox.py's test_user_code_is_walled_in, from a worker a Ray actor started."""
    ex = world.executor
    home, ckpt = world.home, world.shared / "checkpoints"
    other = world.head.temp_dir / "trainyard" / "job-other" / "a0-r0"  # another job's rank on this node
    other.mkdir(parents=True)
    (other / "rank-0.log").write_text("another job's log")
    run = "$TRAINYARD_RUN_DIR"  # the rank's node-local run directory
    gcs = (world.head.ip, world.cluster.port)  # whoever reaches the GCS runs code as the node's user
    script = (
        first_attacks(home, other) + f"ls {world.shared}/runs; "
        f"echo owned > {ckpt}/job-walls/mine; "
        f"echo escaped > {ckpt}/escaped; echo escaped > /tmp/../escaped-root; "
        f"rm -f {run}/rank-0.log; ln -s {home}/api_key {run}/rank-0.log && echo LINKED-LOG; "
        f"ln -sf {home}/api_key {run}/launch-a0.json && echo LINKED-LAUNCH; "
        f"ln -s {home}/api_key {run}/launch-a1.json.tmp && echo LINKED-TMP; "
        f"[ -L {run}/rank-0.log ] || [ -L {run}/launch-a0.json ] && echo IS-A-LINK; "
        f'python -c "import socket; socket.create_connection({gcs!r}, 2)" '
        "&& echo REACHED-RAY || echo ray-unreachable; "
        "echo done-attacking; exit 0"
    )
    spec = {**SPEC, "name": "attack", "entrypoint": {"command": ["sh", "-c", script]}}
    req = _request(world, "job-walls", 0, "ray-b", world_size=1, spec=spec)
    req.env.update(CREDENTIALS)
    ex.launch(req)
    events = _run_until(ex, "job-walls", lambda evs: bool(_terminal(evs)), timeout_s=120)
    _settle(ex, "job-walls")
    log = (world.shared / "runs" / "job-walls" / "rank-0.log").read_text()
    (end,) = _terminal(events)
    assert end.kind == "succeeded", (end.data, log)
    assert "done-attacking" in log, log
    env = assert_walled_in(log, other)
    assert not [line for line in env.splitlines() if line.startswith("RAY_")], env  # nor the node's own
    assert "another job's log" not in log, log
    assert f"ls: cannot access '{world.shared}/runs'" in log, log
    assert (ckpt / "job-walls" / "mine").read_text() == "owned\n"
    if os.geteuid() == 0:  # what the worker writes is the sandbox uid's
        assert (ckpt / "job-walls" / "mine").stat().st_uid == SANDBOX_UID
    assert not (ckpt / "escaped").exists() and not Path("/escaped-root").exists()
    # the node-local run directory's entries are the actor's: the log and launch files cannot become links
    for marker in ("LINKED-LOG", "LINKED-LAUNCH", "LINKED-TMP", "IS-A-LINK"):
        assert marker not in log, log
    # a single-rank job with file storage has no network: not even the Ray cluster's own port
    assert "REACHED-RAY" not in log and "ray-unreachable" in log, log


GANG_TRAINING = r"""
import json, os, torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                        rank=rank, world_size=world)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(1 + rank)  # each rank its own data; DDP averages the gradients
for _ in range(20):
    x = torch.randn(16, 8)
    loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
w = [round(float(v), 6) for v in model.module.weight.detach().flatten()]
print("TRAINED " + json.dumps({"rank": rank, "loss": float(loss), "weights": w}), flush=True)
dist.destroy_process_group()
"""


def _cluster_ports(cluster: LoopbackRayCluster) -> set[str]:
    """``ip:port`` of every TCP socket the cluster's processes listen on (on the nodes' addresses); not
    the sandboxed workers' (the gang's own rendezvous and collectives)."""
    import psutil

    ports: set[str] = set()
    ips = [n.ip for n in cluster.nodes]
    ours = os.readlink("/proc/self/ns/pid")
    for node in cluster.nodes:
        node.remember_processes()
        for pid in node.pids:
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") != ours:
                    continue  # inside a sandbox
            except OSError:
                continue
            try:
                conns = psutil.Process(pid).net_connections(kind="tcp")
            except psutil.Error:
                continue
            for c in conns:
                if c.status == psutil.CONN_LISTEN:
                    for ip in ips if c.laddr.ip in ("0.0.0.0", "::") else [c.laddr.ip]:
                        if ip in ips:
                            ports.add(f"{ip}:{c.laddr.port}")
    return ports


def _exporter_addresses(cluster: LoopbackRayCluster) -> list[str]:
    """Every ``host:port`` where one of Ray's Prometheus exporters listens when it runs (they answer
    without the token): each node's metrics export port (the one it was started with and the one the
    GCS records) and the head's autoscaler and dashboard metrics ports, on every node address and on
    127.0.0.1 (they bind the wildcard address)."""
    import ray
    from ray.autoscaler._private.constants import AUTOSCALER_METRIC_PORT
    from ray.dashboard.consts import DASHBOARD_METRIC_PORT

    recorded = {int(n.get("MetricsExportPort") or 0) for n in ray.nodes()}
    ports = {n.ports[3] for n in cluster.nodes} | {AUTOSCALER_METRIC_PORT, DASHBOARD_METRIC_PORT} | recorded
    ports.discard(0)
    assert AUTOSCALER_METRIC_PORT > 0 and DASHBOARD_METRIC_PORT > 0  # this process reads Ray's defaults
    hosts = ["127.0.0.1", *(n.ip for n in cluster.nodes)]
    return [f"{h}:{p}" for h in hosts for p in sorted(ports)]


def test_a_gang_shares_the_network_but_is_no_client_of_the_ray_cluster(world: RayWorld) -> None:
    """Two sandboxed ranks (pool ray-b: both on the head node, which outlives the node-loss test) share
    the host's network for their collectives, so they reach every port of the Ray cluster; tenant code
    in each tries to be a Ray client: read the token, call
    ray.init, call every method of Ray's gRPC services on every listening socket. Nothing answers
    without the cluster's token and the token is nowhere to be read; the gang still rendezvouses and
    trains."""
    ex = world.executor
    cluster = world.cluster
    token = cluster.token_path.read_text()
    hosts = [n.ip for n in cluster.nodes]
    exporters = _exporter_addresses(cluster)
    attack = ray_client_attack(cluster.address, [str(cluster.token_path)], hosts, exporters)
    script = f"{attack}\n{GANG_TRAINING}"
    spec = {**SPEC, "name": "gang-attack", "entrypoint": {"command": ["python", "-c", script]}}
    req = _request(world, "gang-attack", 0, "ray-b", world_size=2, spec=spec)
    req.env.update(CREDENTIALS)
    ex.launch(req)
    seen: set[str] = set()
    sampled = [0.0]

    def done(evs: list[ExecutorEvent]) -> bool:
        if not _terminal(evs) and time.monotonic() - sampled[0] > 1.0:
            seen.update(_cluster_ports(cluster))  # the actors' own servers too, while they live
            sampled[0] = time.monotonic()
        return bool(_terminal(evs))

    events = _run_until(ex, "gang-attack", done, timeout_s=RUN_TIMEOUT_S)
    _settle(ex, "gang-attack")
    run = world.shared / "runs" / "gang-attack"
    logs = {r: (run / f"rank-{r}.log").read_text() for r in (0, 1)}
    (end,) = _terminal(events)
    assert end.kind == "succeeded", (end.data, logs)
    reports = {r: ray_attack_report(logs[r]) for r in (0, 1)}
    assert all(len(v) == 1 for v in reports.values()), logs
    for r in (0, 1):
        assert token not in logs[r], logs[r]
        assert_not_a_ray_client(reports[r][0], token, cluster.address, scanned=r == 0)
    # rank 0 tried every socket the cluster listened on while the gang ran (the GCS, the raylets and
    # object managers, the agents, every actor's worker): none answered without the token
    probed = set(reports[0][0]["ports"])
    assert seen and seen <= probed, (sorted(seen - probed), sorted(probed))
    # and the ranks rendezvoused and trained: the same weights on both, after 20 DDP steps
    trained = [
        json.loads(line.split(" ", 1)[1])
        for r in (0, 1)
        for line in logs[r].splitlines()
        if line.startswith("TRAINED ")
    ]
    assert sorted(t["rank"] for t in trained) == [0, 1], logs
    assert trained[0]["weights"] == trained[1]["weights"], trained


def test_the_clusters_metrics_are_read_only_through_the_api_servers_credentials(
    world: RayWorld, tmp_path: Path
) -> None:
    """No exporter of the cluster answers a plain local process (nothing listens where Ray's would,
    and no socket the cluster listens on serves metrics without the token); the API server's
    ``/metrics`` re-exports the cluster's nodes and resources, read over its driver connection, to the
    metrics token only."""
    import urllib.error
    import urllib.request

    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from trainyard.api.app import create_app
    from trainyard.services.platform import Platform, PlatformOptions

    cluster = world.cluster
    exporters = _exporter_addresses(cluster)
    listening = sorted(_cluster_ports(cluster))
    answered: dict[str, Any] = {}
    for where in [*exporters, *listening]:
        try:
            with urllib.request.urlopen(f"http://{where}/metrics", timeout=3) as resp:
                answered[where] = (resp.status, resp.read(200))
        except urllib.error.HTTPError as exc:
            assert exc.code >= 400  # the agents' HTTP servers: 401 without the token
        except Exception as exc:  # not an HTTP server (gRPC), or nothing listening
            reason = getattr(exc, "reason", exc)
            if where in exporters:  # nothing listens where an exporter would
                assert isinstance(reason, ConnectionRefusedError), (where, exc)
    assert not answered, answered
    # the executor's own check at connect looked where the GCS says they are and found none answering
    executor = _executor(cluster.address, world.shared)
    advertised = metrics_exporter_addresses()
    assert {a.rsplit(":", 1)[0] for a in advertised} >= {n.ip for n in cluster.nodes if n.alive}, advertised
    assert set(advertised) - {f"{n.ip}:{n.ports[3]}" for n in cluster.nodes} <= {
        f"{world.head.ip}:-1"  # the head's autoscaler and dashboard metrics servers, which cannot bind
    }, advertised
    assert executor.open_exporters == []

    platform = Platform.open(
        Settings(
            home=tmp_path / "home",
            database_url=f"sqlite:///{tmp_path / 'trainyard.db'}",
            metrics_token="ray-metrics-token",
        ),
        PlatformOptions(executor=executor, with_catalog=False),
    )
    try:
        client = TestClient(create_app(platform, access_log=False), base_url="http://127.0.0.1")
        assert client.get("/metrics").status_code == 401
        r = client.get("/metrics", headers={"Authorization": "Bearer ray-metrics-token"})
        assert r.status_code == 200, r.text
    finally:
        platform.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(r.text)
        for s in f.samples
        if s.name.startswith("trainyard_ray_")
    }
    assert samples[("trainyard_ray_cluster_up", ())] == 1
    alive = samples[("trainyard_ray_nodes", (("state", "alive"),))]
    assert alive >= 1
    head = {
        dict(labels)["resource"]: value
        for (name, labels), value in samples.items()
        if name == "trainyard_ray_node_resource" and dict(labels)["ip"] == world.head.ip
    }
    assert head[pool_resource("ray-b")] == 2 and head[pool_resource("ray-a")] == 1 and head["CPU"] == 2
    pool_b = (("resource", pool_resource("ray-b")),)
    assert samples[("trainyard_ray_resource_total", pool_b)] == 2
    assert 0 <= samples[("trainyard_ray_resource_available", pool_b)] <= 2


def test_a_cluster_without_token_authentication_is_refused(world: RayWorld) -> None:
    """The executor runs sandboxed gangs only on a cluster that requires its token: a server not in
    token mode is refused before it connects, and so is a cluster whose GCS answers without a token."""
    address = world.cluster.address
    assert unauthenticated_cluster(address) is None  # the loopback cluster requires its token
    os.environ.pop(AUTH_MODE_ENV)
    try:
        assert unauthenticated_cluster(address) == "this server does not run with RAY_AUTH_MODE=token"
        with pytest.raises(ServiceUnavailableError, match="must require token authentication"):
            _executor(address, world.shared)
    finally:
        os.environ[AUTH_MODE_ENV] = "token"
    # a cluster that lets anyone in: the GCS answers a call that carries no token
    open_cluster = LoopbackRayCluster(env={AUTH_MODE_ENV: "disabled"})
    try:
        open_cluster.add_node("open", resources={}, num_cpus=1)
        problem = unauthenticated_cluster(open_cluster.address)
        assert problem == "its GCS answers calls that carry no token", problem
        with pytest.raises(ServiceUnavailableError, match="GCS answers calls that carry no token"):
            _executor(open_cluster.address, world.shared, connect=True)
    finally:
        open_cluster.stop()
    # without the sandbox (an explicit opt-out) nothing is required
    assert _executor(address, world.shared, sandbox=None).sandbox is None


def test_a_node_without_bubblewrap_starts_nothing(world: RayWorld, tmp_path: Path) -> None:
    # the server builds the Ray executor from the same setting as the local one (TRAINYARD_SANDBOX)
    address = world.cluster.address
    assert make_executor(Settings(executor="ray", ray_address=address)).sandbox == SandboxSpec()
    assert make_executor(Settings(executor="ray", ray_address=address, sandbox="none")).sandbox is None

    ex = _executor(address, world.shared, sandbox=SandboxSpec(bwrap=str(tmp_path / "no-bwrap")))
    try:
        ex.launch(_request(world, "no-bwrap", 0, "ray-b", world_size=2))
        events = _run_until(ex, "no-bwrap", lambda evs: bool(_terminal(evs)), timeout_s=120)
        _settle(ex, "no-bwrap")
    finally:
        ex.shutdown()
    (end,) = _terminal(events)
    assert end.kind == "failed" and end.data["classification"] == CLASSIFICATION_INFRA, end.data
    assert f"the sandbox cannot start on Ray node(s) {world.head.ip}" in end.data["reason"], end.data
    assert "bubblewrap" in end.data["reason"], end.data
    assert not [e for e in events if e.kind in ("started", "heartbeat", "checkpoint")]
    # no worker ever ran: nothing came back from the node
    run_dir = world.shared / "runs" / "no-bwrap"
    assert not list(run_dir.glob("events-a0-r*.jsonl"))
    assert "--- attempt 0 rank 0 ---" not in (run_dir / "rank-0.log").read_text()


def _settle(ex: RayExecutor, job_id: str, timeout_s: float = 30.0) -> None:
    """Poll until the job's placement groups are removed (the pools are free for the next test)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        ex.poll()
        groups = [g for g in _placement_groups().values() if g["name"].startswith(f"trainyard/{job_id}/")]
        if all(g["state"] == "REMOVED" for g in groups):
            return
        time.sleep(0.1)
    pytest.fail(f"the placement groups of {job_id} were not removed within {timeout_s:.0f} s")


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
