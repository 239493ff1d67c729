"""Local executor: a gang is ``world_size`` worker subprocesses on this machine (gloo on loopback).

Each rank runs ``trainyard.runtime.worker`` in its own session and process group, so a control
plane killed with SIGKILL does not take its workers down and a restarted one can ``adopt`` them.
Workers are forked by a warm fork server (``--fork-server``: torch and transformers imported once), so
a launch or a restart after a failure takes milliseconds instead of the interpreter start-up; without
the server (``warm_start=False``, or when it died) each rank is a fresh ``python -m`` subprocess.
Rank output goes to ``run_dir/rank-<r>.log``; ``poll()`` tails the ranks' event files.

Failure detection: a rank that exits without a terminal event, or sends no event for
``heartbeat_timeout_s`` (``startup_timeout_s`` before its first), makes the gang ``lost``: every rank
is killed and one ``lost`` event is reported. A ``failed`` event from any rank tears the gang down
too (after ``failure_grace_s`` for the other ranks to report). Exactly one terminal event
(``succeeded``, ``preempted``, ``failed`` or ``lost``) is reported per attempt, after every rank of
that attempt has exited; the service decides about restarts (``RestartPolicy``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trainyard.errors import ConflictError, NotFoundError
from trainyard.executors.base import (
    PASS_THROUGH_KINDS,
    WORKER_TERMINAL_KINDS,
    ExecutorEvent,
    LaunchRequest,
    RankEnd,
    WorkerInfo,
    event_file_name,
    first_abnormal,
    gang_outcome,
    launch_file_name,
    launch_request_to_dict,
    note_exits,
    notice_file_name,
    rank_log_name,
    signal_group,
    wait_for_terminal,
    worker_argv,
)
from trainyard.executors.sandbox import (
    GangNetwork,
    Mounts,
    Sandbox,
    job_env,
    prepare_run_dir,
    scrubbed_env,
    stage_inputs,
)
from trainyard.runtime.events import EventTail
from trainyard.runtime.worker import exit_file_name

EXIT_FILE_WAIT_S = 1.0


def detect_local_gpus(timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """This machine's CUDA GPUs: ``[{index, name, memory_gib, accelerator}]`` (empty without any).

    Asks ``nvidia-smi`` (no CUDA context in the control plane, and no torch import where there is no
    GPU); ``accelerator`` is the catalog name (``h100``, ``a100-80gb``, ...) or None for a model the
    catalog does not price. ``TRAINYARD_LOCAL_GPUS=none`` turns detection off.
    """
    import shutil

    from trainyard.executors.base import accelerator_for_cuda_device

    if os.environ.get("TRAINYARD_LOCAL_GPUS", "").lower() == "none":
        return []
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        try:
            index, name, mem_gib = int(parts[0]), parts[1], float(parts[2]) / 1024.0
        except ValueError:
            continue
        gpus.append(
            {
                "index": index,
                "name": name,
                "memory_gib": round(mem_gib, 2),
                "accelerator": accelerator_for_cuda_device(name, mem_gib),
            }
        )
    return gpus


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


@dataclass
class _Rank:
    rank: int
    pid: int
    proc: subprocess.Popen[bytes] | None  # None when adopted (not our child)
    tail: EventTail
    log: IO[bytes] | None = None
    last_seen_s: float | None = None
    exit_code: int | None = None
    exited: bool = False
    terminal: dict[str, Any] | None = None
    unreported: str | None = None  # how it died, when it died on its own without a terminal event
    exit_file: Path | None = None  # written by the fork server (the parent of a forked worker)
    dead_since_s: float | None = None

    def poll_exit(self) -> bool:
        if self.exited:
            return True
        if self.proc is not None:
            code = self.proc.poll()
            if code is not None:
                self.exited, self.exit_code = True, code
        elif not pid_alive(self.pid):
            code = _read_exit_file(self.exit_file)
            now = time.time()
            if self.dead_since_s is None:
                self.dead_since_s = now
            # the fork server writes the status right after reaping; give it a moment
            if code is not None or self.exit_file is None or now - self.dead_since_s > EXIT_FILE_WAIT_S:
                self.exited, self.exit_code = True, code
        if self.exited and self.log is not None:
            self.log.close()
        return self.exited


@dataclass
class _Gang:
    job_id: str
    attempt: int
    run_dir: Path
    world_size: int
    ranks: list[_Rank]
    started_s: float
    entrypoint: bool
    adopted_at_s: float | None = None
    preempt_deadline_s: float | None = None
    trigger: tuple[str, dict[str, Any]] | None = None  # first abnormal observation → job outcome
    teardown_at_s: float | None = None
    cancelled: bool = False
    killed: bool = False
    failures: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)  # CUDA device indices this gang holds


class LocalExecutor:
    """Serves pools with backend ``local``: the CPU (``accelerator: cpu``) and the CUDA GPUs it finds."""

    name = "local"

    def __init__(
        self,
        *,
        python: str | None = None,
        heartbeat_timeout_s: float = 60.0,
        startup_timeout_s: float = 300.0,
        failure_grace_s: float = 3.0,
        preempt_grace_s: float = 2.0,
        extra_env: dict[str, str] | None = None,
        warm_start: bool = True,
        gpus: list[dict[str, Any]] | None = None,
        sandbox: Sandbox | None = None,
    ):
        self.python = python or sys.executable
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.failure_grace_s = failure_grace_s
        self.preempt_grace_s = preempt_grace_s
        self.extra_env = dict(extra_env or {})
        self.host = socket.gethostname()
        self._gangs: dict[str, _Gang] = {}
        self._lock = threading.RLock()
        self._server: subprocess.Popen[bytes] | None = None
        self._server_is_ready = False
        self.gpus: list[dict[str, Any]] = detect_local_gpus() if gpus is None else list(gpus)
        # every worker in bubblewrap (executors.sandbox); sandboxed workers start cold (no fork server:
        # a warm parent cannot give each job its own view of the file system)
        self.sandbox = sandbox
        if sandbox is not None:
            sandbox.probe()
        elif warm_start:
            self._start_fork_server()

    # ---- what this executor serves -----------------------------------------------------------------
    def serves(self, pool: Any) -> bool:
        """A local pool (``backend: local``, or ``cloud: local`` left to default) of this machine's CPU or
        of a GPU model it has; never a cloud pool."""
        backend = pool.backend if pool.backend is not None else ("local" if pool.cloud == "local" else None)
        if backend != "local":
            return False
        if pool.accelerator == "cpu":
            return True
        return any(g.get("accelerator") == pool.accelerator for g in self.gpus)

    def _assign_gpus(self, req: LaunchRequest) -> list[int]:
        """Free GPUs of the placed accelerator for a GPU gang (lowest indices first)."""
        from trainyard.executors.base import is_gpu_accelerator

        if not is_gpu_accelerator(req.accelerator):
            return []
        held = {i for g in self._gangs.values() for i in g.gpus}
        kind = [g["index"] for g in self.gpus if g.get("accelerator") == req.accelerator]
        free = [i for i in kind if i not in held]
        if len(free) < req.world_size:
            raise RuntimeError(
                f"{req.world_size} x {req.accelerator} requested but only {len(free)} are free here"
            )
        return sorted(free)[: req.world_size]

    # ---- warm start: a fork server with torch and transformers already imported ---------------------
    def _base_env(self) -> dict[str, str]:
        env = {**os.environ, **self.extra_env, "PYTHONUNBUFFERED": "1"}
        env.setdefault("OMP_NUM_THREADS", env.get("TRAINYARD_NUM_THREADS", "1"))
        return env

    def _start_fork_server(self) -> None:
        self._server = subprocess.Popen(
            [self.python, "-m", "trainyard.runtime.worker", "--fork-server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self._base_env(),
            start_new_session=True,
        )

    def _fork(self, run_dir: Path, attempt: int, rank: int, log_path: Path) -> int | None:
        """A worker forked by the warm server (milliseconds), or None when there is no server."""
        server = self._server
        if server is None or server.poll() is not None or not self._server_ready():
            return None  # still warming up: a cold start now beats waiting for it
        assert server.stdin is not None and server.stdout is not None
        job = {"run_dir": str(run_dir), "attempt": attempt, "rank": rank, "log": str(log_path)}
        try:
            server.stdin.write((json.dumps(job) + "\n").encode())
            server.stdin.flush()
            reply = server.stdout.readline()  # the server answers once it has imported and forked
        except OSError:
            return None
        try:
            return int(json.loads(reply)["pid"])
        except (ValueError, KeyError, TypeError):
            return None

    def _server_ready(self) -> bool:
        if self._server_is_ready:
            return True
        server = self._server
        assert server is not None and server.stdout is not None
        readable, _, _ = select.select([server.stdout], [], [], 0)
        if readable:
            line = server.stdout.readline()
            with contextlib.suppress(ValueError):
                self._server_is_ready = bool(json.loads(line).get("ready"))
        return self._server_is_ready

    def wait_until_warm(self, timeout_s: float = 120.0) -> bool:
        """Block until the fork server has finished importing (benchmarks and tests use this)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self._server is None or self._server.poll() is not None:
                return False
            if self._server_ready():
                return True
            time.sleep(0.05)
        return False

    def _stop_fork_server(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        with contextlib.suppress(OSError):
            assert server.stdin is not None
            server.stdin.close()
        signal_group(server.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=5)

    # ---- launch ----------------------------------------------------------------------------------
    def launch(self, req: LaunchRequest) -> list[WorkerInfo]:
        with self._lock:
            if req.job_id in self._gangs:
                running = self._gangs[req.job_id].attempt
                raise ConflictError(
                    f"job {req.job_id} already has a running gang (attempt {running})",
                    hint="Cancel or wait for the running attempt before launching another.",
                )
            if req.world_size < 1:
                raise ValueError("world_size must be >= 1")
            run_dir = Path(req.run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            env_extra = dict(req.env)
            gpus = self._assign_gpus(req)
            if gpus:  # each rank trains on cuda:<rank> of these
                env_extra["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpus)
            if req.world_size > 1:
                env_extra.setdefault("MASTER_ADDR", "127.0.0.1")
                env_extra["MASTER_PORT"] = str(free_port())
            if self.sandbox is not None:
                stage_inputs(env_extra, run_dir / f"inputs-a{req.attempt}", self.sandbox)
            doc = launch_request_to_dict(req)
            doc["env"] = env_extra if self.sandbox is None else job_env(env_extra)
            tmp = run_dir / (launch_file_name(req.attempt) + ".tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            tmp.replace(run_dir / launch_file_name(req.attempt))
            env = {**self._base_env(), **env_extra}
            mounts: Mounts | None = None
            if self.sandbox is not None:
                mounts = prepare_run_dir(self.sandbox, req, run_dir)
                env = scrubbed_env(os.environ, {**self.extra_env, **env_extra})
            ranks: list[_Rank] = []
            # the ranks of a gang that needs no other network share one namespace of their own
            gang_net: contextlib.AbstractContextManager[GangNetwork | None] = contextlib.nullcontext()
            if self.sandbox is not None and mounts is not None and mounts.loopback_only:
                gang_net = self.sandbox.gang_network()
            try:
                with gang_net as net:
                    self._start_ranks(req, run_dir, env, mounts, net, ranks)
            except OSError:
                for rk in ranks:
                    signal_group(rk.pid, signal.SIGKILL)
                raise
            gang = _Gang(
                job_id=req.job_id,
                attempt=req.attempt,
                run_dir=run_dir,
                world_size=req.world_size,
                ranks=ranks,
                started_s=time.time(),
                entrypoint=bool((req.spec.get("entrypoint") or {}).get("command")),
                gpus=gpus,
            )
            self._gangs[req.job_id] = gang
            infos = [WorkerInfo(rk.rank, rk.pid, self.host) for rk in ranks]
            (run_dir / f"workers-a{req.attempt}.json").write_text(json.dumps([w.to_dict() for w in infos]))
            return infos

    # ---- control ---------------------------------------------------------------------------------
    def _start_ranks(
        self,
        req: LaunchRequest,
        run_dir: Path,
        env: dict[str, str],
        mounts: Mounts | None,
        net: GangNetwork | None,
        ranks: list[_Rank],
    ) -> None:
        """Start every rank of the attempt (forked from the warm server when unsandboxed), appending
        each to ``ranks`` as it starts."""
        for r in range(req.world_size):
            log_path = run_dir / rank_log_name(r)
            fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "ab") as fh:
                fh.write(f"--- attempt {req.attempt} rank {r} ---\n".encode())
            pid = None if mounts is not None else self._fork(run_dir, req.attempt, r, log_path)
            if pid is not None:
                tail = EventTail(run_dir / event_file_name(req.attempt, r))
                ranks.append(_Rank(r, pid, None, tail, exit_file=run_dir / exit_file_name(req.attempt, r)))
                continue
            log = open(log_path, "ab")  # noqa: SIM115 - closed when the rank exits
            argv = worker_argv(self.python, run_dir, req.attempt, r)
            if self.sandbox is not None and mounts is not None:
                argv = self.sandbox.command(argv, mounts, net=net)
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                pass_fds=net.fds if net is not None else (),
            )
            ranks.append(_Rank(r, proc.pid, proc, EventTail(run_dir / event_file_name(req.attempt, r)), log))

    def _gang(self, job_id: str) -> _Gang:
        gang = self._gangs.get(job_id)
        if gang is None:
            raise NotFoundError(f"no running gang for job {job_id} on the local executor")
        return gang

    def preempt(self, job_id: str, notice_s: float) -> None:
        """Deliver a preemption notice: SIGTERM now, SIGKILL after ``notice_s`` (+ a short grace)."""
        with self._lock:
            gang = self._gang(job_id)
            now = time.time()
            deadline = now + max(0.0, notice_s)
            notice = gang.run_dir / notice_file_name(gang.attempt)
            notice.write_text(json.dumps({"deadline_time_s": deadline, "notice_s": notice_s}))
            if self.sandbox is not None:
                self.sandbox.give_read(notice)
            gang.preempt_deadline_s = deadline + self.preempt_grace_s
            for rk in gang.ranks:
                if not rk.poll_exit():
                    signal_group(rk.pid, signal.SIGTERM)

    def cancel(self, job_id: str) -> None:
        """Kill every rank now; the attempt ends without a terminal event (the service knows why)."""
        with self._lock:
            gang = self._gangs.get(job_id)
            if gang is None:
                return
            gang.cancelled = True
            self._kill(gang)
            deadline = time.time() + 10.0
            while time.time() < deadline and not all(rk.poll_exit() for rk in gang.ranks):
                time.sleep(0.02)
            self._gangs.pop(job_id, None)

    def workers(self, job_id: str) -> list[WorkerInfo]:
        with self._lock:
            gang = self._gangs.get(job_id)
            if gang is None:
                return []
            return [WorkerInfo(rk.rank, rk.pid, self.host) for rk in gang.ranks if not rk.poll_exit()]

    def adopt(self, job_id: str, attempt: int, run_dir: str, workers: list[WorkerInfo]) -> bool:
        """Resume watching workers started by an earlier control plane. False when none is alive.

        Events written before adoption are not replayed (the earlier control plane saw them, or they are
        history: committed checkpoints can be listed from storage); terminal events are always reported.
        """
        with self._lock:
            if job_id in self._gangs:
                return True
            rd = Path(run_dir)
            local = [w for w in workers if w.host in (self.host, "localhost", "127.0.0.1") and w.pid]
            alive = [w for w in local if w.pid is not None and pid_alive(w.pid)]
            have_terminal = False
            ranks = []
            for w in sorted(local, key=lambda w: w.rank):
                assert w.pid is not None
                rk = _Rank(
                    w.rank,
                    w.pid,
                    None,
                    EventTail(rd / event_file_name(attempt, w.rank)),
                    exit_file=rd / exit_file_name(attempt, w.rank),
                )
                ranks.append(rk)
                have_terminal = have_terminal or _has_terminal(rk.tail.path)
            if not ranks or (not alive and not have_terminal):
                return False
            launch: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError):
                launch = json.loads((rd / launch_file_name(attempt)).read_text())
            gang = _Gang(
                job_id=job_id,
                attempt=attempt,
                run_dir=rd,
                world_size=len(ranks),
                ranks=ranks,
                started_s=time.time(),
                entrypoint=bool(((launch.get("spec") or {}).get("entrypoint") or {}).get("command")),
                adopted_at_s=time.time(),
                gpus=[
                    int(i)
                    for i in str((launch.get("env") or {}).get("CUDA_VISIBLE_DEVICES") or "").split(",")
                    if i.strip().isdigit()
                ],
            )
            now = time.time()
            for rk in ranks:
                rk.last_seen_s = now
            self._gangs[job_id] = gang
            return True

    def shutdown(self, *, kill_workers: bool = False) -> None:
        """Stop watching. Workers keep running (a later control plane can adopt them) unless
        ``kill_workers``."""
        with self._lock:
            for gang in list(self._gangs.values()):
                if kill_workers:
                    self._kill(gang)
                    deadline = time.time() + 10.0
                    while time.time() < deadline and not all(rk.poll_exit() for rk in gang.ranks):
                        time.sleep(0.02)
                for rk in gang.ranks:
                    if rk.log is not None and not rk.log.closed:
                        rk.log.close()
            self._gangs.clear()
            self._stop_fork_server()

    # ---- watching --------------------------------------------------------------------------------
    def poll(self) -> list[ExecutorEvent]:
        out: list[ExecutorEvent] = []
        with self._lock:
            for job_id in list(self._gangs):
                gang = self._gangs[job_id]
                out.extend(self._poll_gang(gang))
        return out

    def _observe_exits(self, gang: _Gang, now: float) -> None:
        """Classify the ranks' exits seen so far and record the gang's first abnormal observation (the
        first one decides the outcome), unless a preemption notice is out."""
        expected = gang.killed or gang.preempt_deadline_s is not None  # we killed it, or gave notice
        note_exits(gang.ranks, entrypoint=gang.entrypoint, expected=expected)
        if gang.trigger is None and gang.preempt_deadline_s is None:
            trigger = first_abnormal(
                gang.ranks,
                now_s=now,
                entrypoint=gang.entrypoint,
                started_s=gang.started_s,
                started_what="launch",
                startup_timeout_s=self.startup_timeout_s,
                heartbeat_timeout_s=self.heartbeat_timeout_s,
                run_dir=gang.run_dir,
            )
            if trigger is not None:
                gang.trigger, gang.teardown_at_s = trigger, now

    def _poll_gang(self, gang: _Gang) -> list[ExecutorEvent]:
        out: list[ExecutorEvent] = []
        now = time.time()
        for rk in gang.ranks:  # exits first: a rank writes its terminal event before it exits
            rk.poll_exit()
        for rk in gang.ranks:
            for doc in rk.tail.read_new():
                t = float(doc.get("time_s", now))
                rk.last_seen_s = max(rk.last_seen_s or 0.0, t)
                kind = doc.get("kind")
                data = dict(doc.get("data") or {})
                if kind in PASS_THROUGH_KINDS:
                    if gang.adopted_at_s is not None and t < gang.adopted_at_s:
                        continue
                    if kind == "started" and rk.pid:
                        # a sandboxed worker sees its own pid namespace (it is pid 2 there): the control
                        # plane records the host pid it watches, which is what a restart adopts
                        data = {**data, "pid": rk.pid, "pid_in_sandbox": data.get("pid")}
                    out.append(ExecutorEvent(gang.job_id, gang.attempt, str(kind), data, t))
                elif kind in WORKER_TERMINAL_KINDS:
                    rk.terminal = doc
                    if kind == "failed":
                        gang.failures.append({"rank": rk.rank, **data})
                        if gang.trigger is None:
                            gang.trigger = ("failed", data)
                            gang.teardown_at_s = now + self.failure_grace_s
        self._observe_exits(gang, now)
        if gang.preempt_deadline_s is not None and now >= gang.preempt_deadline_s and not gang.killed:
            self._kill(gang)
        if gang.teardown_at_s is not None and now >= gang.teardown_at_s and not gang.killed:
            self._kill(gang)
        if not all(rk.poll_exit() for rk in gang.ranks):
            return out
        # every rank is gone: drain late events, then report exactly one terminal event
        for rk in gang.ranks:
            for doc in rk.tail.read_new():
                if doc.get("kind") in WORKER_TERMINAL_KINDS and rk.terminal is None:
                    rk.terminal = doc
                    if doc["kind"] == "failed":
                        gang.failures.append({"rank": rk.rank, **(doc.get("data") or {})})
                elif doc.get("kind") in ("checkpoint", "metrics") and float(doc.get("time_s", 0.0)) >= (
                    gang.adopted_at_s or 0.0
                ):
                    out.append(
                        ExecutorEvent(
                            gang.job_id,
                            gang.attempt,
                            str(doc["kind"]),
                            dict(doc["data"]),
                            float(doc["time_s"]),
                        )
                    )
        # a rank that exited after the first look above (between the two polls) is classified now,
        # after its late events: an entrypoint's clean exit is its success, an error exit its failure
        self._observe_exits(gang, now)
        self._gangs.pop(gang.job_id, None)
        if gang.cancelled:
            return out
        kind, data = gang_outcome(
            [
                RankEnd(
                    rk.rank,
                    rk.terminal,
                    None if rk.unreported is None else f"{rk.unreported} without reporting",
                )
                for rk in gang.ranks
            ],
            failures=gang.failures,
            trigger=gang.trigger,
            entrypoint=gang.entrypoint,
            preempting=gang.preempt_deadline_s is not None,
        )
        out.append(ExecutorEvent(gang.job_id, gang.attempt, kind, data, time.time()))
        return out

    def _kill(self, gang: _Gang) -> None:
        gang.killed = True
        for rk in gang.ranks:
            if not rk.poll_exit():
                signal_group(rk.pid, signal.SIGKILL)

    # ---- helpers for callers ---------------------------------------------------------------------
    def wait(self, job_id: str, timeout_s: float, poll_s: float = 0.05) -> list[ExecutorEvent]:
        """Poll until ``job_id`` reports a terminal event (or ``timeout_s``); returns every event seen."""
        return wait_for_terminal(self.poll, lambda: job_id in self._gangs, job_id, timeout_s, poll_s)


def _read_exit_file(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        return int(json.loads(path.read_text())["exit_code"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _has_terminal(path: Path) -> bool:
    return any(d.get("kind") in WORKER_TERMINAL_KINDS for d in EventTail(path).read_new())
