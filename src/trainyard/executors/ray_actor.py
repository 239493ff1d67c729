"""The per-rank Ray actor: runs one rank of a gang as a worker subprocess on whatever node Ray chose.

The actor is a thin host around the same worker the local executor starts
(``python -m trainyard.runtime.worker``): it writes the attempt's launch file into a node-local
directory, starts the worker there (in its own session, killed when the actor process dies), and lets
the executor on the control plane pull the worker's event file and log by byte offset (``drain``). The
executor mirrors those bytes into the job's ``run_dir`` on the control plane, so the event files there
are byte-identical copies of the ones on the nodes and the offsets double as delivery cursors.

With a :class:`~trainyard.executors.sandbox.SandboxSpec` the actor builds the sandbox on its own node
(``hello`` reports when bubblewrap cannot start there; the executor then fails the attempt and nothing
starts) and runs the worker inside it exactly as the local executor does: the node-local directory is
the worker's run directory (inputs staged into it, entries the server's), the environment is scrubbed,
and bubblewrap dies with the actor (``--die-with-parent``) as an unsandboxed worker does.

The cluster's token (Ray's token authentication, which the executor requires of a cluster it runs
sandboxed workers on) never reaches a worker: not in its environment (rebuilt from an allow-list) and
not in its file system — a node whose token file would lie inside a mount of the sandbox (the Python
installation, the node's work directory) refuses to start workers (``hello``'s ``sandbox_error``).

This module does not import Ray: the executor wraps :class:`RankHost` with ``ray.remote`` when it
launches a gang, and every node imports this module from the same trainyard installation.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from trainyard.errors import SandboxUnavailableError
from trainyard.executors.base import (
    event_file_name,
    launch_file_name,
    launch_request_from_dict,
    notice_file_name,
    rank_log_name,
    signal_group,
    worker_argv,
)
from trainyard.executors.sandbox import (
    Mounts,
    Sandbox,
    SandboxSpec,
    job_env,
    prepare_run_dir,
    scrubbed_env,
    stage_inputs,
)

PR_SET_PDEATHSIG = 1
DRAIN_CHUNK_BYTES = 1024 * 1024
WORKDIR_ENV = "TRAINYARD_RAY_WORKDIR"


def node_workdir_root() -> Path:
    """Where ranks keep their launch file, event file and log on a node (``$TRAINYARD_RAY_WORKDIR``,
    else ``<tmp>/trainyard-ray``)."""
    return Path(os.environ.get(WORKDIR_ENV) or Path(tempfile.gettempdir()) / "trainyard-ray")


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: the child only calls into it


def _die_with_parent() -> None:
    """preexec hook: SIGKILL this child when the actor process that started it dies."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def ray_token_files() -> list[Path]:
    """The files this node's Ray processes may read the cluster's token from (``RAY_AUTH_TOKEN_PATH``,
    Ray's default ``~/.ray/auth_token``) that exist."""
    paths = [Path(os.environ["RAY_AUTH_TOKEN_PATH"])] if os.environ.get("RAY_AUTH_TOKEN_PATH") else []
    paths.append(Path.home() / ".ray" / "auth_token")
    return [p for p in paths if p.exists()]


def exposed_token(sandbox: Sandbox, mounts: Mounts) -> str | None:
    """Why a sandbox with ``mounts`` would show the cluster's token to its worker, or None."""
    for path in ray_token_files():
        if sandbox.exposes(path, mounts):
            return (
                f"the Ray cluster's token file {path} would be visible inside the sandbox; keep it "
                "outside the Python installation and the node's work directory"
            )
    return None


def read_probe(url: str) -> str | None:
    """The text of a small file at ``url`` (any fsspec URL), or None when this node cannot read it."""
    try:
        import fsspec

        with fsspec.open(url, "rt") as fh:
            return str(fh.read())
    except Exception:
        return None


class RankHost:
    """One rank of one attempt. Created by the executor inside the gang's placement group."""

    def __init__(
        self,
        job_id: str,
        attempt: int,
        rank: int,
        orphan_timeout_s: float = 1800.0,
        sandbox: SandboxSpec | None = None,
    ):
        self.job_id = job_id
        self.attempt = attempt
        self.rank = rank
        self.sandbox_spec = sandbox
        self.sandbox: Sandbox | None = None
        self.dir = node_workdir_root() / job_id / f"a{attempt}-r{rank}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None
        self.last_contact_s = time.time()
        self.orphan_timeout_s = orphan_timeout_s
        self._watchdog = threading.Thread(target=self._watch_orphan, name="trainyard-orphan", daemon=True)
        self._watchdog.start()

    # ---- start-up ---------------------------------------------------------------------------------
    def hello(self, probe_url: str | None = None, probe_token: str | None = None) -> dict[str, Any]:
        """Where this rank landed, a free port for the rendezvous (used from rank 0), and whether this
        node reads the checkpoint storage (the probe file the executor wrote)."""
        import ray

        self.last_contact_s = time.time()
        ctx = ray.get_runtime_context()
        ip = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
            port = int(s.getsockname()[1])
        storage_ok = True
        if probe_url is not None:
            storage_ok = read_probe(probe_url) == probe_token
        sandbox_error = None
        try:
            sandbox = self._sandbox()
            if sandbox is not None:
                sandbox_error = exposed_token(sandbox, Mounts(rw=(node_workdir_root(),)))
        except SandboxUnavailableError as exc:
            sandbox_error = exc.message
        return {
            "rank": self.rank,
            "node_id": ctx.get_node_id(),
            "node_ip": ip,
            "host": socket.gethostname(),
            "actor_pid": os.getpid(),
            "port": port,
            "storage_ok": storage_ok,
            "sandbox_error": sandbox_error,
            "workdir": str(self.dir),
        }

    def _sandbox(self) -> Sandbox | None:
        """This node's sandbox (built and probed once per actor), or None when the gang runs bare."""
        if self.sandbox_spec is not None and self.sandbox is None:
            sandbox = self.sandbox_spec.build()
            sandbox.probe()
            self.sandbox = sandbox
        return self.sandbox

    def start(self, launch_doc: dict[str, Any], env: dict[str, str], python: str | None = None) -> int:
        """Write the launch file (``run_dir`` = this node's directory) and start the worker; its pid
        (on this node's host: bubblewrap's, when the worker runs in the sandbox)."""
        self.last_contact_s = time.time()
        if self.proc is not None:
            return self.proc.pid
        sandbox = self._sandbox()  # SandboxUnavailableError: never a bare worker instead
        env = dict(env)
        if sandbox is not None:  # what the worker reads from the server's storage, copied for it
            stage_inputs(env, self.dir / f"inputs-a{self.attempt}", sandbox)
            env = job_env(env)
        doc = {**launch_doc, "run_dir": str(self.dir), "env": env}
        tmp = self.dir / (launch_file_name(self.attempt) + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(self.dir / launch_file_name(self.attempt))
        # Same thread count as a local worker (Ray sets OMP_NUM_THREADS from the actor's CPUs): results
        # on CPU are bit-identical only with the same number of threads.
        threads = env.get("TRAINYARD_NUM_THREADS") or os.environ.get("TRAINYARD_NUM_THREADS") or "1"
        argv = worker_argv(python or sys.executable, self.dir, self.attempt, self.rank)
        if sandbox is None:
            full_env = {**os.environ, "OMP_NUM_THREADS": threads, **env, "PYTHONUNBUFFERED": "1"}
        else:
            mounts = prepare_run_dir(sandbox, launch_request_from_dict(doc), self.dir, ranks=[self.rank])
            exposed = exposed_token(sandbox, mounts)
            if exposed is not None:  # e.g. a dataset directory that holds it
                raise SandboxUnavailableError(exposed)
            full_env = scrubbed_env(os.environ, {"OMP_NUM_THREADS": threads, **env})
            argv = sandbox.command(argv, mounts, die_with_parent=True)
        log_path = self.dir / rank_log_name(self.rank)
        with open(log_path, "ab") as log:
            log.write(f"--- attempt {self.attempt} rank {self.rank} ---\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=str(self.dir),
                start_new_session=True,
                preexec_fn=_die_with_parent,  # only calls prctl between fork and exec
            )
        return self.proc.pid

    # ---- watching ---------------------------------------------------------------------------------
    def _exited(self) -> bool:
        if self.proc is None:
            return False
        if self.exit_code is None:
            code = self.proc.poll()
            if code is None:
                return False
            self.exit_code = code
        return True

    def drain(self, event_offset: int, log_offset: int, wait_s: float = 0.0) -> dict[str, Any]:
        """Bytes of the event file and the log from the given offsets (events: whole lines only).

        Waits up to ``wait_s`` for something new, so the executor can keep one call in flight per rank
        without spinning. ``exited`` is read before the files, so once it is true the bytes returned
        include everything the worker wrote.
        """
        self.last_contact_s = time.time()
        events_path = self.dir / event_file_name(self.attempt, self.rank)
        log_path = self.dir / rank_log_name(self.rank)
        deadline = time.time() + max(0.0, wait_s)
        while True:
            exited = self._exited()
            events = _read_from(events_path, event_offset, whole_lines=True)
            log = _read_from(log_path, log_offset, whole_lines=False)
            if events or log or exited or time.time() >= deadline:
                break
            time.sleep(0.05)
        return {
            "events": events,
            "log": log,
            "exited": exited,
            "exit_code": self.exit_code,
            "pid": None if self.proc is None else self.proc.pid,
        }

    # ---- control ----------------------------------------------------------------------------------
    def preempt(self, deadline_time_s: float, notice_s: float) -> bool:
        """Deliver a preemption notice: the deadline file, then SIGTERM. False when the worker is gone."""
        self.last_contact_s = time.time()
        notice = self.dir / notice_file_name(self.attempt)
        notice.write_text(json.dumps({"deadline_time_s": deadline_time_s, "notice_s": notice_s}))
        if self.sandbox is not None:
            self.sandbox.give_read(notice)
        if self.proc is None or self._exited():
            return False
        signal_group(self.proc.pid, signal.SIGTERM)
        return True

    def kill_worker(self) -> None:
        if self.proc is not None and not self._exited():
            signal_group(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            self._exited()

    def close(self, remove_files: bool = True) -> None:
        """Kill the worker if it still runs and remove this rank's node-local directory."""
        self.kill_worker()
        if remove_files:
            shutil.rmtree(self.dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.dir.parent.rmdir()  # the job's directory, once its last rank is gone

    def _watch_orphan(self) -> None:
        """A detached actor whose control plane never comes back must not hold capacity forever."""
        while True:
            time.sleep(min(30.0, self.orphan_timeout_s))
            if time.time() - self.last_contact_s < self.orphan_timeout_s:
                continue
            self.close()
            with contextlib.suppress(Exception):
                import ray
                from ray.util import get_current_placement_group, remove_placement_group

                pg = get_current_placement_group()
                if pg is not None:
                    remove_placement_group(pg)
                ray.actor.exit_actor()
            os._exit(0)


def _read_from(path: Path, offset: int, *, whole_lines: bool) -> bytes:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read(DRAIN_CHUNK_BYTES)
    except FileNotFoundError:
        return b""
    if whole_lines:
        end = chunk.rfind(b"\n")
        return b"" if end < 0 else chunk[: end + 1]
    return chunk
