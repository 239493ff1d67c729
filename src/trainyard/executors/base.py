"""The executor protocol: how the control plane starts, watches and stops a training gang.

An executor backend (local subprocesses, a Ray cluster) starts ``world_size`` workers for one attempt
of a job. Workers never talk to the server: each rank appends JSON lines to its own event file in the
job's ``run_dir`` and the executor tails those files, so a restarted control plane can re-adopt workers
that kept running. Rank logs go to ``run_dir/rank-<r>.log``.

Event kinds and their ``data``:

- ``started``: ``{rank, pid, host, resumed_from_step, device: {type, name, count, memory_gib, accelerator}}``
- ``heartbeat``: ``{rank, step, loss, step_time_s, tokens_per_s, memory_gib}``
- ``checkpoint``: ``{step, path}`` (also ``save_s``, ``bytes``, ``emergency`` when known)
- ``preempted``: ``{step, checkpoint_step}`` (the step of the emergency checkpoint, or the last one)
- ``succeeded``: ``{model_path, model_sha256, final_step}``
- ``failed``: ``{reason, classification: "user" | "infra", traceback_tail}``
- ``lost``: ``{reason, rank}`` (a rank died or stopped heart-beating; the gang has been torn down)
- ``log``: ``{rank, message}`` (also checkpoint skips: ``{message, skipped_step, why}``)
- ``record``: rank 0's run record of the attempt (data, code, spec hash, environment, seeds)
- ``evaluation``: ``{step, split, loss, samples, tokens, dataset, final}`` (held-out loss)
- ``metrics``: ``{rank, steps: [..], time_s: [..], values: {name: [..]}}`` (step metrics at training
  resolution, packed by column; :mod:`trainyard.runtime.metrics`)
- ``span``: a finished OpenTelemetry span the worker recorded under the attempt's ``TRACEPARENT``:
  ``{name, trace_id, span_id, parent_span_id, start_ns, end_ns, attributes, status, status_message,
  host}`` (ids in hex); the server exports it into the job's trace and never stores it as a job event
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

EVENT_KINDS = (
    "started",
    "heartbeat",
    "checkpoint",
    "preempted",
    "succeeded",
    "failed",
    "lost",
    "log",
    "record",
    "evaluation",
    "metrics",
    "span",
)
TERMINAL_KINDS = ("preempted", "succeeded", "failed", "lost")
WORKER_TERMINAL_KINDS = ("succeeded", "preempted", "failed")  # what a rank reports itself ("lost" is ours)
# forwarded from a rank as they are
PASS_THROUGH_KINDS = ("started", "heartbeat", "checkpoint", "log", "record", "evaluation", "metrics", "span")
CLASSIFICATION_USER = "user"
CLASSIFICATION_INFRA = "infra"

# Worker process exit codes (events carry the details; exit codes are the fallback when a worker's
# terminal event is missing).
EXIT_OK = 0
EXIT_USER_ERROR = 65
EXIT_INFRA_ERROR = 70
EXIT_PREEMPTED = 75


@dataclass(frozen=True)
class LaunchRequest:
    job_id: str
    attempt: int
    spec: dict[str, Any]  # JobSpec document (spec.to_document())
    world_size: int
    pool: str
    market: str
    checkpoint_url: str  # e.g. file:///home/.trainyard/checkpoints ; job dir = <url>/<job_id>
    checkpoint_interval_s: float | None  # from the placement (cost model) or the spec
    run_dir: str  # local dir for this job's logs + worker event files
    notice_s: float = 30.0
    env: dict[str, str] = field(default_factory=dict)
    # The catalog accelerator the placement chose (``cpu``, ``h100``, ...): the worker trains on it and
    # fails (infra) when the device it really got is not that one. None in launch files written before
    # the field existed: treated as ``cpu``.
    accelerator: str | None = None
    # The parallelism plan the quote priced (``micro_batch``, ``activation_checkpointing``, ``fsdp``,
    # ``tensor``, ``pipeline``, ...): the built-in trainer executes it. None: the spec's pins only.
    plan: dict[str, Any] | None = None
    tenant: str = ""
    # the storage the job may use (the tenant's namespace, then granted roots; canonical URLs): the worker
    # checks its checkpoint location, dataset and base model against them again (DESIGN §3.6)
    storage_roots: list[str] = field(default_factory=list)
    code_url: str | None = None  # the uploaded code archive an entrypoint runs in
    # step metrics (``metrics`` events): every N-th step, at most this many rows a second
    metrics_every_steps: int = 1
    metrics_max_rows_per_s: float = 100.0


@dataclass(frozen=True)
class WorkerInfo:
    rank: int
    pid: int | None
    host: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExecutorEvent:
    job_id: str
    attempt: int
    kind: str  # one of EVENT_KINDS
    data: dict[str, Any]
    time_s: float  # wall-clock seconds since the epoch when the event happened

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ExecutorEvent:
        return cls(
            job_id=str(doc["job_id"]),
            attempt=int(doc["attempt"]),
            kind=str(doc["kind"]),
            data=dict(doc.get("data") or {}),
            time_s=float(doc["time_s"]),
        )


@runtime_checkable
class Executor(Protocol):
    name: str

    def launch(self, req: LaunchRequest) -> list[WorkerInfo]: ...

    def poll(self) -> list[ExecutorEvent]:  # non-blocking; drains events since the last call
        ...

    def preempt(self, job_id: str, notice_s: float) -> None:  # SIGTERM + notice; worker checkpoints and exits
        ...

    def cancel(self, job_id: str) -> None: ...

    def workers(self, job_id: str) -> list[WorkerInfo]: ...

    def adopt(self, job_id: str, attempt: int, run_dir: str, workers: list[WorkerInfo]) -> bool:
        # after a control-plane restart: resume watching live workers
        ...

    def shutdown(self) -> None: ...


# ---- file names inside run_dir (shared by workers and executors) -----------------------------------


def event_file_name(attempt: int, rank: int) -> str:
    """The JSON-lines event file one rank of one attempt appends to."""
    return f"events-a{attempt}-r{rank}.jsonl"


def launch_file_name(attempt: int) -> str:
    """The LaunchRequest of one attempt, as JSON, read by every rank at start-up."""
    return f"launch-a{attempt}.json"


def worker_argv(python: str, run_dir: str | Path, attempt: int, rank: int) -> list[str]:
    """The command line of one rank's worker (``python -m trainyard.runtime.worker``)."""
    args = ["--run-dir", str(run_dir), "--attempt", str(attempt), "--rank", str(rank)]
    return [python, "-m", "trainyard.runtime.worker", *args]


def notice_file_name(attempt: int) -> str:
    """Written by the executor before it delivers a preemption notice: ``{"deadline_time_s": ...}``."""
    return f"notice-a{attempt}.json"


# ---- devices: what a placement asks for and what a worker really got --------------------------------

# CUDA device names (lower case, as torch/nvidia-smi print them) -> catalog accelerators; the first
# pattern that occurs in the name wins. A100s are told apart by memory.
_CUDA_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    ("h200", "h200"),
    ("h100", "h100"),
    ("gh200", "h200"),
    ("a100", "a100"),
    ("a10g", "a10g"),
    ("l4", "l4"),
    ("t4", "t4"),
    ("v100", "v100"),
    ("p100", "p100"),
    ("k80", "k80"),
)


def accelerator_for_cuda_device(name: str, memory_gib: float | None = None) -> str | None:
    """The catalog accelerator of a CUDA device (``"NVIDIA H200"`` -> ``h200``), or None when the
    catalog has no such model (the device is then never offered as a pool)."""
    low = name.lower()
    for pattern, acc in _CUDA_NAME_PATTERNS:
        if re.search(rf"(^|[^a-z0-9]){pattern}([^0-9]|$)", low):
            if acc == "a100":
                return "a100-80gb" if (memory_gib or 0) > 45 or "80g" in low else "a100-40gb"
            return acc
    return None


def is_gpu_accelerator(accelerator: str | None) -> bool:
    """True for accelerators the runtime drives through CUDA (NVIDIA); ``cpu`` and None are not."""
    from trainyard.catalog.names import ACCELERATOR_FAMILY

    return accelerator is not None and ACCELERATOR_FAMILY.get(accelerator) == "nvidia"


def launch_request_to_dict(req: LaunchRequest) -> dict[str, Any]:
    return asdict(req)


def launch_request_from_dict(doc: dict[str, Any]) -> LaunchRequest:
    known = set(LaunchRequest.__dataclass_fields__)
    return LaunchRequest(**{k: v for k, v in doc.items() if k in known})


def rank_log_name(rank: int) -> str:
    """Per-rank stdout/stderr log (appended across attempts)."""
    return f"rank-{rank}.log"


# ---- restart policy helpers (the service decides restarts; these keep the arithmetic in one place) --


@dataclass(frozen=True)
class RestartPolicy:
    """Infrastructure failures are retried up to ``max_restarts`` times with exponential backoff."""

    max_restarts: int = 3
    backoff_initial_s: float = 1.0
    backoff_factor: float = 2.0
    backoff_max_s: float = 60.0

    def should_restart(self, classification: str, restarts_so_far: int) -> bool:
        """User-code errors never restart; infrastructure failures and lost gangs do, within the budget."""
        if classification == CLASSIFICATION_USER:
            return False
        return restarts_so_far < self.max_restarts

    def backoff_s(self, restarts_so_far: int) -> float:
        """Delay before restart number ``restarts_so_far + 1``."""
        if restarts_so_far < 0:
            raise ValueError("restarts_so_far must be >= 0")
        delay = self.backoff_initial_s * math.pow(self.backoff_factor, restarts_so_far)
        return float(min(self.backoff_max_s, delay))


def failure_data(data: dict[str, Any]) -> dict[str, Any]:
    """A ``failed`` event's data with its three required keys (reason, classification, traceback tail)."""
    return {
        "reason": data.get("reason", "unknown failure"),
        "classification": data.get("classification", CLASSIFICATION_INFRA),
        "traceback_tail": data.get("traceback_tail", ""),
        **{k: v for k, v in data.items() if k not in ("reason", "classification", "traceback_tail")},
    }


def describe_exit(code: int | None) -> str:
    """A process exit status in words: 'exited with code 1', 'was killed by SIGKILL'."""
    if code is None:
        return "exited (status unknown)"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def log_tail(path: Path, n_bytes: int = 4000) -> str:
    """The last ``n_bytes`` of a rank's log ('' when it cannot be read): a failure's traceback tail."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - n_bytes))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group a worker leads (its own session), or to the process alone;
    a process that is gone already is not an error."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_for_terminal(
    poll: Callable[[], list[ExecutorEvent]],
    watching: Callable[[], bool],
    job_id: str,
    timeout_s: float,
    poll_s: float = 0.05,
) -> list[ExecutorEvent]:
    """Call an executor's ``poll`` until ``job_id`` reports a terminal event, ``watching()`` turns
    False (the gang is gone, e.g. cancelled) or ``timeout_s`` passes; every event seen, in order."""
    events: list[ExecutorEvent] = []
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        batch = poll()
        events.extend(batch)
        if any(e.job_id == job_id and e.kind in TERMINAL_KINDS for e in batch):
            return events
        if not watching():
            return events
        time.sleep(poll_s)
    return events


# ---- watching a gang: what went wrong first, and the one terminal event of an attempt ----------------


class RankState(Protocol):
    """What an executor knows about one rank of a running gang (both executors' ``_Rank`` have it)."""

    rank: int
    exited: bool
    exit_code: int | None
    terminal: dict[str, Any] | None  # its terminal event, once it reported one
    last_seen_s: float | None  # time of its newest event; None before its first
    unreported: str | None  # how it ended on its own without a terminal event, in words


def note_exits(ranks: Sequence[RankState], *, entrypoint: bool, expected: bool) -> None:
    """Account for ranks that exited without a terminal event: an entrypoint's rank that exited with 0
    succeeded (a user command need not report), and unless the gang's end was ``expected`` (the executor
    killed it, or delivered a preemption notice) any other such rank's exit goes into ``unreported``."""
    for rk in ranks:
        if entrypoint and rk.exited and rk.terminal is None and rk.exit_code == 0:
            rk.terminal = {"kind": "succeeded", "data": {"final_step": None}}
        if rk.exited and rk.terminal is None and rk.unreported is None and not expected:
            rk.unreported = describe_exit(rk.exit_code)


def first_abnormal(
    ranks: Sequence[RankState],
    *,
    now_s: float,
    entrypoint: bool,
    started_s: float,
    started_what: str,
    startup_timeout_s: float,
    heartbeat_timeout_s: float,
    run_dir: Path,
) -> tuple[str, dict[str, Any]] | None:
    """The first abnormal observation of a running gang under no preemption notice, or None: the gang's
    trigger (it is torn down, and the observation decides the attempt's outcome).

    In order: a rank that exited without a terminal event (an entrypoint's rank that exited with an
    error is the user's failure, with the tail of its log; otherwise the gang is ``lost``); then a rank
    that sent no event within ``startup_timeout_s`` of ``started_s`` (``started_what`` names that moment,
    e.g. "launch"), or none for ``heartbeat_timeout_s``.
    """
    for rk in ranks:
        if rk.exited and rk.terminal is None:
            how = describe_exit(rk.exit_code)
            if entrypoint and rk.exit_code not in (None, EXIT_PREEMPTED):
                return "failed", {
                    "reason": f"rank {rk.rank} of the entrypoint {how}",
                    "classification": CLASSIFICATION_USER,
                    "traceback_tail": log_tail(run_dir / rank_log_name(rk.rank)),
                    "rank": rk.rank,
                }
            return "lost", {"reason": f"rank {rk.rank} {how} without reporting", "rank": rk.rank}
    for rk in ranks:
        if rk.exited:
            continue
        if rk.last_seen_s is None:
            if now_s - started_s > startup_timeout_s:
                return "lost", {
                    "reason": f"rank {rk.rank} sent no event within {startup_timeout_s:.0f} s "
                    f"of {started_what}",
                    "rank": rk.rank,
                }
        elif now_s - rk.last_seen_s > heartbeat_timeout_s:
            return "lost", {
                "reason": f"rank {rk.rank} missed heartbeats for {now_s - rk.last_seen_s:.0f} s",
                "rank": rk.rank,
            }
    return None


@dataclass(frozen=True)
class RankEnd:
    """How one rank of a finished attempt ended, as its executor observed it."""

    rank: int
    terminal: dict[str, Any] | None = None  # its terminal event ``{"kind", "data"}``; None when it sent none
    unreported: str | None = None  # how it ended on its own without one ("exited with code 1 without ...")
    node_ip: str | None = None  # the node it ran on, added to a ``lost`` outcome's data when known


def gang_outcome(
    ranks: Sequence[RankEnd],
    *,
    failures: Sequence[dict[str, Any]],
    trigger: tuple[str, dict[str, Any]] | None,
    entrypoint: bool,
    preempting: bool,
    preempt_overrides_trigger: bool = False,
) -> tuple[str, dict[str, Any]]:
    """The one terminal event ``(kind, data)`` of an attempt whose ranks have all exited.

    ``failures`` are the ``failed`` reports of the ranks (``{"rank", ...data}``, first first),
    ``trigger`` the first abnormal observation (``("failed" | "lost", data)``) that tore the gang down,
    ``entrypoint`` whether the job runs a user command (whose ranks' exits are the user's),
    ``preempting`` whether a preemption notice was delivered. A trigger normally wins over the notice;
    with ``preempt_overrides_trigger`` (a gang preempted before it was running) the notice wins.

    In order: a user-code failure from any rank; a rank that died without reporting (it explains its
    peers' errors: they see connection resets); the preemption (rank 0's ``preempted`` data, or
    ``forced`` when it could not checkpoint); the trigger; any other failure; every rank succeeded
    (rank 0's data); rank 0 preempted; otherwise the ranks that exited without reporting are ``lost``.
    """
    if not ranks:
        raise ValueError("a gang has at least one rank")
    user = [f for f in failures if f.get("classification") == CLASSIFICATION_USER]
    if user:
        return "failed", failure_data(user[0])
    if (
        trigger is not None
        and trigger[0] == "failed"
        and trigger[1].get("classification") == CLASSIFICATION_USER
    ):
        return "failed", failure_data(trigger[1])
    dead = [rk for rk in ranks if rk.unreported is not None and not entrypoint]
    if dead:
        lost: dict[str, Any] = {"reason": f"rank {dead[0].rank} {dead[0].unreported}", "rank": dead[0].rank}
        if dead[0].node_ip is not None:
            lost["node_ip"] = dead[0].node_ip
        return "lost", lost
    t0 = next((rk for rk in ranks if rk.rank == 0), ranks[0]).terminal
    if preempting and (trigger is None or preempt_overrides_trigger):
        if t0 is not None and t0["kind"] == "preempted":
            return "preempted", dict(t0["data"])
        return "preempted", {"step": None, "checkpoint_step": None, "forced": True}
    if trigger is not None:
        kind, data = trigger
        return ("failed", failure_data(data)) if kind == "failed" else (kind, data)
    if failures:
        return "failed", failure_data(failures[0])
    kinds = {rk.terminal["kind"] if rk.terminal else None for rk in ranks}
    if t0 is not None and t0["kind"] == "succeeded" and kinds == {"succeeded"}:
        return "succeeded", dict(t0["data"])
    if t0 is not None and t0["kind"] == "preempted":
        return "preempted", dict(t0["data"])
    missing = [rk.rank for rk in ranks if rk.terminal is None]
    return "lost", {
        "reason": f"ranks {missing} exited without reporting",
        "rank": missing[0] if missing else 0,
    }
