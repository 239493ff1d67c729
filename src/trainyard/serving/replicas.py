"""Replica processes: start, probe, adopt and stop. A :class:`Launcher` starts and stops replicas; the
controller (service.py) knows only this protocol. :class:`LocalLauncher` runs a replica as a separate
process in its own session (it outlives a crashed server, which re-adopts it by id and port on restart);
``ray_replicas.RayLauncher`` runs it on a Ray cluster when the server runs with the Ray executor."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

SCRUBBED_ENV = ("TRAINYARD_DATABASE_URL", "TRAINYARD_API_KEY", "TRAINYARD_METRICS_TOKEN")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LaunchSpec:
    replica_id: str
    model_path: str
    tokenizer_path: str
    adapters: dict[str, str]
    model_name: str
    host: str = "127.0.0.1"
    device: str = "auto"
    threads: int | None = None
    engine: str = "transformers"  # serving/engines.py
    placement: dict[str, Any] = field(default_factory=dict)  # pool, accelerator, devices, price


@dataclass(frozen=True)
class LaunchedReplica:
    """Where a started replica listens (it is ready once :func:`probe` answers there)."""

    pid: int | None
    host: str
    port: int
    placement: dict[str, Any] = field(default_factory=dict)  # what the launcher adds (node, resources)


class Launcher(Protocol):
    """Starts, checks and stops replicas. ``alive`` and ``stop`` get the replica id and the pid that were
    stored when it started, possibly by an earlier server process (adoption)."""

    backend: str

    def start(self, spec: LaunchSpec) -> LaunchedReplica: ...

    def alive(self, replica_id: str, pid: int | None) -> bool: ...

    def stop(self, replica_id: str, pid: int | None, timeout_s: float = 5.0) -> None: ...


def replica_command(spec: LaunchSpec, port: int, *, python: str | None = None) -> list[str]:
    cmd = [
        python or sys.executable,
        "-m",
        "trainyard.serving.replica",
        "--replica-id",
        spec.replica_id,
        "--model-path",
        spec.model_path,
        "--tokenizer-path",
        spec.tokenizer_path,
        "--model-name",
        spec.model_name,
        "--port",
        str(port),
        "--host",
        spec.host,
        "--device",
        spec.device,
        "--engine",
        spec.engine,
    ]
    if spec.threads:
        cmd += ["--threads", str(spec.threads)]
    for name, path in sorted(spec.adapters.items()):
        cmd += ["--adapter", f"{name}={path}"]
    return cmd


class LocalLauncher:
    """Replicas as local processes (``python -m trainyard.serving.replica``)."""

    backend = "local"

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)

    def start(self, spec: LaunchSpec) -> LaunchedReplica:
        """Start a replica on this machine. It is ready once :func:`probe` answers."""
        self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        port = free_port(spec.host)
        cmd = replica_command(spec, port)
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env["HF_HUB_OFFLINE"] = "1"
        log_path = self.log_dir / f"{spec.replica_id}.log"
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=fd,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(fd)
        _CHILDREN[proc.pid] = proc
        return LaunchedReplica(pid=proc.pid, host=spec.host, port=port)

    def alive(self, replica_id: str, pid: int | None) -> bool:
        if pid is None:
            return False
        child = _CHILDREN.get(pid)
        if child is not None:
            return child.poll() is None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:  # a zombie (exited, not reaped) is not alive
            import psutil

            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except Exception:
            return True

    def stop(self, replica_id: str, pid: int | None, timeout_s: float = 5.0) -> None:
        if pid is None:
            return
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.alive(replica_id, pid):
            time.sleep(0.05)
        if self.alive(replica_id, pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        child = _CHILDREN.pop(pid, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(2)


_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def probe(client: httpx.Client, url: str, replica_id: str, timeout_s: float = 0.5) -> dict[str, Any] | None:
    """The replica's /health document when it answers as ``replica_id``, else None."""
    try:
        r = client.get(f"{url}/health", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    try:
        doc = r.json()
    except ValueError:
        return None
    return doc if doc.get("replica_id") == replica_id else None
