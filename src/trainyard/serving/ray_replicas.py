"""Replicas on a Ray cluster: one detached, named Ray actor per replica, hosting the same replica HTTP
server a local replica runs (``python -m trainyard.serving.replica``) as a subprocess on the node Ray
chose, so the gateway forwards to it exactly as to a local one (docs/serving.md says why this is not Ray
Serve's HTTP proxy).

Placement follows jobs (executors/ray.py): the actor takes one unit of the pool's node resource
``trainyard/pool:<pool>``, the pool's common accelerator label, one ``GPU`` when the pool's nodes have
GPUs (Ray then sets ``CUDA_VISIBLE_DEVICES`` for it), and one CPU. The actor is named
``serving/<replica id>`` in the executor's namespace and is detached, so a restarted control plane finds
it again by the replica id it stored; the replica subprocess dies with its actor (``PR_SET_PDEATHSIG``).

:class:`ReplicaActor` does not import Ray at module level; :class:`RayLauncher` wraps it with
``ray.remote`` on first use.

Sandbox: the model a replica loads is the tenant's (weights, tokenizer, chat template, adapters), so with
the executor's :class:`~trainyard.executors.sandbox.SandboxSpec` (``TRAINYARD_SANDBOX``, bubblewrap by
default) the replica runs under the same policy as a training worker: the sandbox uid, an environment
rebuilt from an allow-list (no server setting, key, database URL or Ray token), and a file system with
only the Python installation and copies of what it serves — the model, tokenizer and adapter files are
staged into ``<node work dir>/serving/<replica id>`` (``serving/staging.py``, shared with the local
launcher: regular files only, a symbolic link in a model directory is not followed), readable by the
sandbox uid, and mounted read-only. It keeps the node's network (the gateway connects to it on the
node's address); the cluster itself answers nobody without its token (the executor requires token
authentication when it sandboxes). Adapters loaded at run time are staged the same way first
(:meth:`RayLauncher.adapter_path`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from trainyard.errors import ServiceUnavailableError
from trainyard.executors.ray_actor import exposed_token, node_workdir_root
from trainyard.executors.sandbox import Mounts, Sandbox, SandboxSpec, scrubbed_env
from trainyard.serving.replicas import (
    REPLICA_ENV,
    SCRUBBED_ENV,
    LaunchedReplica,
    LaunchSpec,
    replica_command,
)
from trainyard.serving.staging import stage_adapter, stage_replica

PR_SET_PDEATHSIG = 1
ACTOR_PREFIX = "serving/"
_LIBC = ctypes.CDLL(None, use_errno=True)


def actor_name(replica_id: str) -> str:
    return f"{ACTOR_PREFIX}{replica_id}"


def _die_with_parent() -> None:
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class ReplicaActor:
    """Hosts one replica process on a Ray node."""

    def __init__(self, replica_id: str, sandbox: SandboxSpec | None = None) -> None:
        self.replica_id = replica_id
        self.dir = node_workdir_root() / "serving"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sandbox_spec = sandbox
        self.sandbox: Sandbox | None = None
        self.staged = self.dir / replica_id  # the sandbox's copies of what it serves
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = ""
        self.port = 0
        self._lock = threading.Lock()

    def start(self, spec_doc: dict[str, Any]) -> dict[str, Any]:
        """Start the replica on this node's address and a free port on it; where it listens."""
        import ray

        with self._lock:
            if self.proc is not None:
                return self.where()
            self.host = ray.util.get_node_ip_address()
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((self.host, 0))
                self.port = int(s.getsockname()[1])
            spec = LaunchSpec(**{**spec_doc, "host": self.host})
            extra = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
            if self.sandbox_spec is None:
                env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
                env = {**extra, **env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
                argv = replica_command(spec, self.port, python=sys.executable)
            else:
                sandbox = self._sandbox()  # SandboxUnavailableError: never a bare replica instead
                spec = stage_replica(sandbox, spec, self.staged)
                mounts = Mounts(ro=(self.staged,), chdir=self.staged, share_net=True)
                exposed = exposed_token(sandbox, mounts)
                if exposed is not None:
                    raise ServiceUnavailableError(exposed)
                extra.update({k: os.environ[k] for k in REPLICA_ENV if k in os.environ})
                env = scrubbed_env(os.environ, extra)
                argv = sandbox.command(
                    replica_command(spec, self.port, python=sys.executable), mounts, die_with_parent=True
                )
            log_path = self.dir / f"{self.replica_id}.log"
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            return self.where()

    def _sandbox(self) -> Sandbox:
        if self.sandbox is None:
            assert self.sandbox_spec is not None
            sandbox = self.sandbox_spec.build()
            sandbox.probe()
            self.sandbox = sandbox
        return self.sandbox

    def stage_adapter(self, name: str, path: str) -> str:
        """Where the sandboxed replica reads adapter ``name`` (a staged copy of ``path``); ``path`` itself
        when the replica runs without the sandbox."""
        if self.sandbox_spec is None:
            return path
        return str(stage_adapter(self._sandbox(), self.staged, name, path))

    def where(self) -> dict[str, Any]:
        import ray

        return {
            "host": self.host,
            "port": self.port,
            "pid": self.proc.pid if self.proc is not None else None,
            "node_id": ray.get_runtime_context().get_node_id(),
            "log": str(self.dir / f"{self.replica_id}.log"),
        }

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop_process(timeout_s)
        shutil.rmtree(self.staged, ignore_errors=True)

    def _stop_process(self, timeout_s: float) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


class RayLauncher:
    """The replica launcher of a server that runs with the Ray executor (it shares its connection)."""

    backend = "ray"

    def __init__(self, executor: Any, *, start_timeout_s: float = 60.0, call_timeout_s: float = 5.0) -> None:
        self.executor = executor
        self.namespace = str(getattr(executor, "namespace", "trainyard"))
        # replicas in the sandbox the executor runs its workers in (None: the explicit opt-out)
        self.sandbox: SandboxSpec | None = getattr(executor, "sandbox", None)
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        self._cls: Any = None
        self._handles: dict[str, Any] = {}

    def _actor_class(self) -> Any:
        if self._cls is None:
            import ray

            self._cls = ray.remote(ReplicaActor)
        return self._cls

    def resources(self, pool: str) -> dict[str, float]:
        """What one replica on ``pool`` takes: a job rank's bundle with one CPU."""
        from trainyard.executors.ray import bundle_for

        nodes = [n["resources"] for n in self.executor.cluster_nodes()]
        bundle, per_node = bundle_for(pool, nodes, cpus_per_rank=1.0)
        if per_node < 1:
            raise ServiceUnavailableError(
                f"no alive node of the Ray cluster has room for a replica on pool {pool}",
                hint="Label a node with the pool's resource (docs/ray.md) or free capacity on it.",
                details={"pool": pool, "bundle": bundle},
            )
        return bundle

    def start(self, spec: LaunchSpec) -> LaunchedReplica:
        import ray

        pool = str(spec.placement.get("pool") or "")
        if not pool:
            raise ServiceUnavailableError(
                "no pool of the Ray cluster to place a replica on",
                hint="Add a pool with backend ray whose label some node carries (docs/ray.md).",
            )
        bundle = self.resources(pool)
        name = actor_name(spec.replica_id)
        actor = (
            self._actor_class()
            .options(
                name=name,
                namespace=self.namespace,
                lifetime="detached",
                max_restarts=0,
                num_cpus=bundle.get("CPU", 1.0),
                num_gpus=bundle.get("GPU", 0.0),
                resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")},
            )
            .remote(spec.replica_id, self.sandbox)
        )
        doc = {k: v for k, v in spec.__dict__.items() if k != "placement"}
        try:
            where = ray.get(actor.start.remote(doc), timeout=self.start_timeout_s)
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            raise ServiceUnavailableError(
                f"replica {spec.replica_id} did not start on the Ray cluster within "
                f"{self.start_timeout_s:.0f} s: {type(exc).__name__}: {exc}"[:500],
                hint="Check that the pool's nodes have a free CPU (and GPU) and run this trainyard.",
                details={"pool": pool, "bundle": bundle},
            ) from exc
        self._handles[spec.replica_id] = actor
        return LaunchedReplica(
            pid=where.get("pid"),
            host=str(where["host"]),
            port=int(where["port"]),
            placement={"node_id": where.get("node_id"), "resources": bundle, "log": where.get("log")},
        )

    def _handle(self, replica_id: str) -> Any:
        import ray

        actor = self._handles.get(replica_id)
        if actor is None:
            try:
                actor = ray.get_actor(actor_name(replica_id), namespace=self.namespace)
            except ValueError:  # no such actor: it died, or a cluster restart lost it
                return None
            self._handles[replica_id] = actor
        return actor

    def adapter_path(self, replica_id: str, name: str, path: str) -> str:
        """The path a running replica loads adapter ``name`` from (staged into its sandbox first)."""
        import ray

        actor = self._handle(replica_id)
        if actor is None:
            raise ServiceUnavailableError(f"replica {replica_id} is gone")
        return str(ray.get(actor.stage_adapter.remote(name, path), timeout=120))

    def alive(self, replica_id: str, pid: int | None) -> bool:
        import ray

        actor = self._handle(replica_id)
        if actor is None:
            return False
        try:
            return bool(ray.get(actor.alive.remote(), timeout=self.call_timeout_s))
        except ray.exceptions.GetTimeoutError:
            return True  # a busy node; the HTTP probe decides
        except Exception:
            self._handles.pop(replica_id, None)
            return False

    def stop(self, replica_id: str, pid: int | None, timeout_s: float = 5.0) -> None:
        import ray

        actor = self._handle(replica_id)
        self._handles.pop(replica_id, None)
        if actor is None:
            return
        with contextlib.suppress(Exception):
            ray.get(actor.stop.remote(timeout_s), timeout=timeout_s + self.call_timeout_s)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


def wait_gone(launcher: RayLauncher, replica_id: str, timeout_s: float = 10.0) -> bool:
    """True once the replica's actor no longer exists (for tests and tooling)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if launcher._handle(replica_id) is None:
            return True
        launcher._handles.pop(replica_id, None)
        time.sleep(0.2)
    return False
