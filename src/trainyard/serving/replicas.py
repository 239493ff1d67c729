"""Replica processes: start, probe, adopt and stop. A :class:`Launcher` starts and stops replicas; the
controller (service.py) knows only this protocol. :class:`LocalLauncher` runs a replica as a separate
process in its own session (it outlives a crashed server, which re-adopts it by id and port on restart);
``ray_replicas.RayLauncher`` runs it on a Ray cluster when the server runs with the Ray executor.

Sandbox: a replica serves the tenant's own files (weights, tokenizer and its chat template, adapters),
so with a :class:`~trainyard.executors.sandbox.SandboxSpec` (the one the local executor's workers run
in, ``TRAINYARD_SANDBOX``, bubblewrap by default) :class:`LocalLauncher` runs it as a training worker
runs: the sandbox uid, an environment rebuilt from the allow-list (no server setting, key, database URL
or metrics token), and a file system with only the Python installation and copies of what it serves,
staged into ``<serving dir>/replicas/<replica id>`` (``serving/staging.py``: regular files only, a
symbolic link in a model directory is not followed) and mounted read-only at :data:`REPLICA_ROOT`, so
nothing of the server's home exists inside. It shares the host's network (the gateway connects to it on
127.0.0.1). It is not tied to the server's life (no ``--die-with-parent``): a restarted server adopts
it by the stored pid (bubblewrap's, the leader of the replica's process group) and port. Where the
sandbox cannot start, the start fails with ``SandboxUnavailableError``; a bare replica runs only under
the explicit opt-out (``TRAINYARD_SANDBOX=none``).

A sandboxed replica's start records the sandbox it runs in (:data:`SANDBOX_RECORD` in its staging
directory: bubblewrap, uid, gid), so whichever server adopts it later — one run with another
``TRAINYARD_SANDBOX``, ``none`` included — stages every adapter it loads into that replica's
``/replica`` for that uid, and hands an unstaged path only to a replica that was started bare."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from trainyard.errors import SandboxUnavailableError
from trainyard.executors.sandbox import Mounts, Sandbox, SandboxSpec, scrubbed_env
from trainyard.serving.staging import safe_name, seen_at, stage_adapter, stage_replica

SCRUBBED_ENV = ("TRAINYARD_DATABASE_URL", "TRAINYARD_API_KEY", "TRAINYARD_METRICS_TOKEN")
#: what a sandboxed replica takes from the server's (or Ray node's) environment besides the sandbox's
#: allow-list: the devices it may use
REPLICA_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
#: where a sandboxed local replica sees its staged copies
REPLICA_ROOT = Path("/replica")
#: in a sandboxed replica's staging directory: the sandbox it was started in (``SandboxSpec`` fields);
#: a dot name, which no staged copy has
SANDBOX_RECORD = ".sandbox.json"


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
    """Replicas as local processes (``python -m trainyard.serving.replica``), in the sandbox when
    ``sandbox`` is set (None: the explicit opt-out, the server's user and file system)."""

    backend = "local"

    def __init__(
        self, log_dir: Path, *, sandbox: SandboxSpec | None = None, work_dir: Path | None = None
    ) -> None:
        self.log_dir = Path(log_dir)
        # the sandboxed replicas' staged copies, one directory per replica
        self.work_dir = Path(work_dir) if work_dir is not None else self.log_dir.parent / "replicas"
        self.sandbox_spec = sandbox
        self._sandbox: Sandbox | None = None
        self._recorded: dict[SandboxSpec, Sandbox] = {}  # sandboxes adopted replicas were started in

    def staged_dir(self, replica_id: str) -> Path:
        return self.work_dir / safe_name(replica_id, "replica")

    def sandbox(self) -> Sandbox:
        """This machine's sandbox, started once empty (``SandboxUnavailableError`` where it cannot)."""
        if self._sandbox is None:
            assert self.sandbox_spec is not None
            try:
                sandbox = self.sandbox_spec.build()
                sandbox.probe()
            except SandboxUnavailableError as exc:
                raise SandboxUnavailableError(
                    f"deployment replicas run only inside the sandbox: {exc.message}",
                    hint=f"{exc.hint} TRAINYARD_SANDBOX=none runs replicas (and workers) unsandboxed.",
                ) from None
            self._sandbox = sandbox
        return self._sandbox

    def start(self, spec: LaunchSpec) -> LaunchedReplica:
        """Start a replica on this machine. It is ready once :func:`probe` answers."""
        self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        port = free_port(spec.host)
        if self.sandbox_spec is None:
            cmd = replica_command(spec, port)
            env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
            env.setdefault("TOKENIZERS_PARALLELISM", "false")
            env["HF_HUB_OFFLINE"] = "1"
        else:
            cmd, env = self._sandboxed(spec, port)
        log_path = self.log_dir / f"{safe_name(spec.replica_id, 'replica')}.log"
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
        except BaseException:
            shutil.rmtree(self.staged_dir(spec.replica_id), ignore_errors=True)
            raise
        finally:
            os.close(fd)
        _CHILDREN[proc.pid] = proc
        return LaunchedReplica(pid=proc.pid, host=spec.host, port=port)

    def _sandboxed(self, spec: LaunchSpec, port: int) -> tuple[list[str], dict[str, str]]:
        """The bubblewrap command line and environment of a sandboxed replica, its files staged."""
        sandbox = self.sandbox()  # never a bare replica instead
        staged = self.staged_dir(spec.replica_id)
        try:
            self.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            inside = stage_replica(sandbox, spec, staged, inside=REPLICA_ROOT)
            self._record_sandbox(staged)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        mounts = Mounts(ro_at=((staged, REPLICA_ROOT),), chdir=REPLICA_ROOT, share_net=True)
        extra = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        extra.update({k: os.environ[k] for k in REPLICA_ENV if k in os.environ})
        env = scrubbed_env(os.environ, extra)
        return sandbox.command(replica_command(inside, port), mounts), env

    def _record_sandbox(self, staged: Path) -> None:
        """Write :data:`SANDBOX_RECORD` (the server's file, 0600) into a replica's staging directory."""
        assert self.sandbox_spec is not None
        fd = os.open(staged / SANDBOX_RECORD, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(dataclasses.asdict(self.sandbox_spec), fh)

    def replica_sandbox(self, replica_id: str) -> Sandbox | None:
        """The sandbox replica ``replica_id`` runs in, whichever server started it: the one its start
        recorded, else (a staging directory without a record) this launcher's or the default one; None
        for a replica that runs without the sandbox (it has no staging directory)."""
        staged = self.staged_dir(replica_id)
        if not staged.is_dir():
            return None
        try:
            with open(staged / SANDBOX_RECORD) as fh:
                doc = json.load(fh)
            fields = {f.name for f in dataclasses.fields(SandboxSpec)}
            recorded: SandboxSpec | None = SandboxSpec(**{k: v for k, v in doc.items() if k in fields})
        except (OSError, ValueError, TypeError, AttributeError):  # none (started before records existed)
            recorded = None
        if recorded is None or recorded == self.sandbox_spec:
            if self.sandbox_spec is not None:
                return self.sandbox()
            recorded = recorded or SandboxSpec()
        if recorded not in self._recorded:  # only its uid and gid are used: the files are staged for it
            self._recorded[recorded] = recorded.build()
        return self._recorded[recorded]

    def adapter_path(self, replica_id: str, name: str, path: str) -> str:
        """The path a running replica loads adapter ``name`` from: a copy staged into its sandbox first
        (the sandbox it was started in, even when this server runs without one), or ``path`` itself for
        a replica that runs without the sandbox."""
        sandbox = self.replica_sandbox(replica_id)
        if sandbox is None:
            return path
        staged = self.staged_dir(replica_id)
        return seen_at(stage_adapter(sandbox, staged, name, path), staged, REPLICA_ROOT)

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
        """Stop the replica's process group, then remove its staged copies (if any)."""
        try:
            self._stop_process(replica_id, pid, timeout_s)
        finally:
            self.remove_staged(replica_id)

    def _stop_process(self, replica_id: str, pid: int | None, timeout_s: float) -> None:
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

    def remove_staged(self, replica_id: str) -> None:
        shutil.rmtree(self.staged_dir(replica_id), ignore_errors=True)


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
