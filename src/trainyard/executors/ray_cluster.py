"""A Ray cluster of one or more nodes on this machine, bound to 127.0.0.1, for development and tests.

Each node is one ``ray start --block`` process in its own session and its own temporary directory,
labelled with trainyard's pool resources (``trainyard/pool:<name>``), so a laptop can stand in for a
cluster of several pools. Stopping a node kills exactly that node's process group (never other Ray
processes on the machine); ``kill_raylet`` simulates losing a node abruptly.

Every loopback cluster requires Ray's token authentication (``RAY_AUTH_MODE=token``, Ray ≥ 2.52): the
cluster's token is generated when it is created and kept in a file only its user reads
(``<root>/auth_token``, 0600); ``client_env`` is what a driver needs to connect. Without the token no
process reaches the GCS, a raylet or a worker of the cluster, which is what keeps a sandboxed rank that
shares the host's network (a gang's collectives) from submitting tasks, reading objects or killing actors.

Ray's Prometheus exporters are not covered by the token (they answer anyone who connects), so a loopback
cluster runs none (``NO_EXPORTERS_ENV``): no node's metrics export port, no autoscaler or dashboard
metrics server. What the cluster holds is read through the driver's authenticated connection instead
and re-exported by the API server's ``/metrics``, behind its credentials (``observability.ray_metrics``).

Production clusters are started by the operator (docs/ray.md); this module is not used there.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard.errors import ServiceUnavailableError

#: Environment for every process of a loopback cluster (and the driver that connects to it): keep Ray on
#: 127.0.0.1, detect a dead node within about a second, and keep memory and background work low.
LOOPBACK_ENV: dict[str, str] = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "300",
    "RAY_health_check_timeout_ms": "300",
    "RAY_health_check_failure_threshold": "3",
    "RAY_memory_monitor_refresh_ms": "0",
    "RAY_DEDUP_LOGS": "0",
    "RAY_BACKEND_LOG_LEVEL": "warning",
    "RAY_num_prestart_python_workers": "0",
    "RAY_prestart_worker_first_driver": "0",
}
#: Environment of a loopback cluster's processes that starts none of Ray's Prometheus exporters, which
#: answer without the cluster's token: the dashboard agent collects and exports no metrics (the raylet
#: starts it with ``--disable-metrics-collection``), and the head's autoscaler and dashboard metrics
#: servers get a port no socket can bind, so each logs one exception at start-up and goes on without.
NO_EXPORTERS_ENV: dict[str, str] = {
    "RAY_enable_metrics_collection": "0",
    "AUTOSCALER_METRIC_PORT": "-1",
    "DASHBOARD_METRIC_PORT": "-1",
}
OBJECT_STORE_BYTES = 80 * 1024 * 1024
START_TIMEOUT_S = 120.0
START_ATTEMPTS = 3
STARTUP_TIMED_OUT = "timed out during startup"  # ray start's words when the node missed its 30 s
AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"
AUTH_TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (all bound at once, so the kernel cannot hand out one twice)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _ray_cli() -> str:
    candidate = Path(sys.executable).with_name("ray")
    return str(candidate) if candidate.exists() else "ray"


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _descendants(pid: int) -> dict[int, int]:
    """Every live process whose parent chain leads to ``pid``: pid → start time (read from /proc)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        if st is not None:
            children.setdefault(st[0], []).append((int(entry), st[1]))
    out: dict[int, int] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        for c, start in children.get(p, []):
            out[c] = start
            todo.append(c)
    return out


def _same_process(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] == start


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


@dataclass
class LoopbackNode:
    name: str
    ip: str
    resources: dict[str, float]
    num_cpus: int
    temp_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    ports: list[int]
    pids: dict[int, int] = field(default_factory=dict)  # pid → start time of every process seen (teardown)

    def remember_processes(self) -> None:
        if self.proc.poll() is None:
            self.pids.update(_descendants(self.proc.pid))

    def raylet_pid(self) -> int | None:
        self.remember_processes()
        for pid, start in sorted(self.pids.items()):
            if _comm(pid) == "raylet" and _same_process(pid, start):
                return pid
        return None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class LoopbackRayCluster:
    """``with LoopbackRayCluster() as c: c.add_node(...)`` — a head node plus workers on 127.0.0.1."""

    def __init__(self, *, root: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None):
        self.root = Path(tempfile.mkdtemp(prefix="tyray-", dir=root or "/tmp"))  # short: socket paths
        self.token_path = self.root / "auth_token"
        fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
        base = {k: v for k, v in os.environ.items() if k != AUTH_TOKEN_ENV}  # the token comes from the file
        self.env = {**base, **LOOPBACK_ENV, **NO_EXPORTERS_ENV, **self.client_env, **(env or {})}
        self.port: int | None = None
        self.head_ip = "127.0.0.2"
        self.nodes: list[LoopbackNode] = []

    @property
    def client_env(self) -> dict[str, str]:
        """What a driver's environment needs to connect to this cluster (token authentication)."""
        return {AUTH_MODE_ENV: "token", AUTH_TOKEN_PATH_ENV: str(self.token_path)}

    @property
    def address(self) -> str:
        if self.port is None:
            raise RuntimeError("the cluster has no head node yet")
        return f"{self.head_ip}:{self.port}"

    def __enter__(self) -> LoopbackRayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_node(self, name: str, *, resources: dict[str, float], num_cpus: int = 2) -> LoopbackNode:
        """Start a node (the first one is the head) and wait until the cluster lists it as alive.

        ``ray start`` gives a node 30 s (not configurable) to register with the GCS; on a machine
        busy enough to miss that, the node is stopped and started again, up to ``START_ATTEMPTS``."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return self._start_node(name, resources=resources, num_cpus=num_cpus)
            except ServiceUnavailableError as exc:
                failed = self.nodes.pop()
                self._stop_nodes([failed], 5.0)
                if not self.nodes:  # it was the head: the next try picks new ports
                    self.port = None
                if attempt == START_ATTEMPTS or STARTUP_TIMED_OUT not in exc.message:
                    raise
        raise AssertionError("unreachable")

    def _start_node(self, name: str, *, resources: dict[str, float], num_cpus: int) -> LoopbackNode:
        head = self.port is None
        taken = {self.port} | {p for n in self.nodes for p in n.ports}
        ports = [p for p in _free_ports(12) if p not in taken][:6]
        if head:
            self.port = ports[5]
        temp_dir = self.root / name
        temp_dir.mkdir(parents=True, exist_ok=True)
        args = [
            _ray_cli(),
            "start",
            "--block",
            f"--num-cpus={num_cpus}",
            "--num-gpus=0",
            f"--resources={json.dumps(resources)}",
            f"--temp-dir={temp_dir}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--dashboard-agent-listen-port={ports[0]}",
            f"--dashboard-agent-grpc-port={ports[1]}",
            f"--runtime-env-agent-port={ports[2]}",
            f"--metrics-export-port={ports[3]}",  # nothing listens there (NO_EXPORTERS_ENV)
            "--include-log-monitor=false",
            "--disable-usage-stats",
        ]
        env = dict(self.env)
        env["TRAINYARD_RAY_WORKDIR"] = str(temp_dir / "trainyard")  # ranks' files, removed with the node
        ip = f"127.0.0.{len(self.nodes) + 2}"
        args.append(f"--node-ip-address={ip}")
        if head:
            self.head_ip = ip
            args += [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--ray-client-server-port={ports[4]}",
            ]
        else:
            args += [f"--address={self.address}"]
        log_path = self.root / f"{name}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        node = LoopbackNode(name, ip, dict(resources), num_cpus, temp_dir, proc, log_path, ports)
        self.nodes.append(node)
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            node.remember_processes()
            if not node.alive:
                raise ServiceUnavailableError(
                    f"ray start for node {name!r} exited with {proc.returncode}: "
                    f"{log_path.read_text(errors='replace')[-2000:]}",
                    hint="Check that Ray is installed in this environment and that /tmp is writable.",
                )
            if "Ray runtime started" in log_path.read_text(errors="replace"):
                node.remember_processes()
                return node
            time.sleep(0.2)
        raise ServiceUnavailableError(
            f"node {name!r} did not join the Ray cluster within {START_TIMEOUT_S:.0f} s: "
            f"{log_path.read_text(errors='replace')[-2000:]}"
        )

    def kill_raylet(self, node: LoopbackNode) -> int:
        """SIGKILL the node's raylet: the node and everything on it goes away as in a machine loss."""
        pid = node.raylet_pid()
        if pid is None:
            raise RuntimeError(f"node {node.name!r} has no raylet process")
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop_node(self, node: LoopbackNode, *, timeout_s: float = 5.0) -> None:
        self._stop_nodes([node], timeout_s)

    def _stop_nodes(self, nodes: list[LoopbackNode], timeout_s: float) -> None:
        """SIGTERM each node's process group, SIGKILL what is left after ``timeout_s``."""
        for node in nodes:
            node.remember_processes()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.proc.pid, signal.SIGTERM)
        deadline = time.time() + timeout_s
        while time.time() < deadline and any(n.proc.poll() is None for n in nodes):
            time.sleep(0.1)
        for node in nodes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=5)
            for pid, start in node.pids.items():  # processes that left the group (reparented workers)
                if _same_process(pid, start):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stop every node, then remove the temporary directories."""
        self._stop_nodes(list(self.nodes), 5.0)
        shutil.rmtree(self.root, ignore_errors=True)

    def describe(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "nodes": [{"name": n.name, "resources": n.resources, "alive": n.alive} for n in self.nodes],
        }
