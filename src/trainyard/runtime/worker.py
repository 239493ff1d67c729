"""Worker entry point, one process per rank.

``python -m trainyard.runtime.worker --run-dir D --attempt A --rank R``

Reads the attempt's LaunchRequest from ``run_dir/launch-a<A>.json``, joins the gang (gloo on loopback
when ``world_size > 1``), trains, and reports through its JSON-lines event file. SIGTERM is a
preemption notice: the step in progress finishes, an emergency checkpoint is written when it fits the
notice, and the process exits with ``EXIT_PREEMPTED``. Errors are classified: problems in the job's
own definition or code are ``user`` (not retried), everything else ``infra``.

When the spec has ``entrypoint.command``, the worker replaces itself (same pid) with the user's
command; the script uses ``trainyard.runtime.init()`` for checkpoints, preemption and reports.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainyard.executors.base import (
    CLASSIFICATION_INFRA,
    CLASSIFICATION_USER,
    EXIT_INFRA_ERROR,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_USER_ERROR,
    LaunchRequest,
    launch_file_name,
    launch_request_from_dict,
)
from trainyard.runtime.events import EventWriter

TRACEBACK_TAIL_LINES = 30
PG_TIMEOUT_S = 120.0


def read_launch(run_dir: str, attempt: int) -> LaunchRequest:
    doc = json.loads((Path(run_dir) / launch_file_name(attempt)).read_text())
    return launch_request_from_dict(doc)


def traceback_tail(lines: int = TRACEBACK_TAIL_LINES) -> str:
    return "".join(traceback.format_exc().splitlines(keepends=True)[-lines:])


def classify(exc: BaseException) -> str:
    """``user`` for errors in the job's definition, data or code; ``infra`` for the rest."""
    from pydantic import ValidationError

    from trainyard.errors import InvalidInputError
    from trainyard.runtime.data import DataError
    from trainyard.runtime.modeling import ModelBuildError
    from trainyard.runtime.trainer import PlanNotExecutable, TrainingDiverged

    user_types: tuple[type[BaseException], ...] = (
        PlanNotExecutable,
        DataError,
        ModelBuildError,
        InvalidInputError,
        ValidationError,
        TrainingDiverged,
    )
    return CLASSIFICATION_USER if isinstance(exc, user_types) else CLASSIFICATION_INFRA


def entrypoint_env(req: LaunchRequest, rank: int, run_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(req.env)
    env.update(
        {
            "TRAINYARD_RUN_DIR": run_dir,
            "TRAINYARD_JOB_ID": req.job_id,
            "TRAINYARD_ATTEMPT": str(req.attempt),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(req.world_size),
            "TRAINYARD_CHECKPOINT_URL": req.checkpoint_url,
            "TRAINYARD_NOTICE_S": str(req.notice_s),
        }
    )
    if req.checkpoint_interval_s is not None:
        env["TRAINYARD_CHECKPOINT_INTERVAL_S"] = str(req.checkpoint_interval_s)
    return env


def in_process_python_script(command: list[str]) -> str | None:
    """The script of ``[python, script.py, ...]`` when ``python`` is this very interpreter.

    Such entrypoints run inside this (already warm) process with ``runpy`` instead of a new
    interpreter that would import torch again; anything else is ``exec``-ed.
    """
    if len(command) < 2 or command[1].startswith("-"):
        return None
    exe = shutil.which(command[0])
    if exe is None or os.path.realpath(exe) != os.path.realpath(sys.executable):
        return None
    return command[1] if command[1].endswith(".py") and os.path.isfile(command[1]) else None


def run_python_in_process(
    script: str, command: list[str], env: dict[str, str], req: LaunchRequest, rank: int, run_dir: str
) -> int:
    import runpy

    os.environ.clear()
    os.environ.update(env)
    sys.argv = [script, *command[2:]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException as exc:
        events = EventWriter(run_dir, req.job_id, req.attempt, rank)
        events.emit(
            "failed",
            rank=rank,
            reason=f"{exc.__class__.__name__}: {exc}",
            classification=CLASSIFICATION_USER,
            traceback_tail=traceback_tail(),
        )
        events.close()
        sys.stderr.write(traceback.format_exc())
        return EXIT_USER_ERROR
    return EXIT_OK


def check_storage(req: LaunchRequest) -> None:
    """Check again, inside the worker, that every location the launch request names lies under the
    job's storage roots (the server checked at submission; DESIGN §3.6). A request without roots comes
    from a caller that uses the executor directly, without a server (tests, benchmarks)."""
    if not req.storage_roots:
        return
    from trainyard.tenancy.storage import check_under, is_model_reference, is_registered_dataset

    roots = req.storage_roots
    check_under(req.checkpoint_url, roots, purpose="checkpoint.storage")
    if req.code_url:
        check_under(req.code_url, roots, purpose="entrypoint.code")
    workload = req.spec.get("workload") or {}
    dataset = workload.get("dataset")
    if dataset and not is_registered_dataset(dataset):
        check_under(dataset, roots, purpose="workload.dataset")
    resolved = req.env.get("TRAINYARD_DATASET_PATH") or os.environ.get("TRAINYARD_DATASET_PATH")
    if resolved:
        check_under(resolved, roots, purpose="workload.dataset")
    base = (req.spec.get("model") or {}).get("base")
    if base and not is_model_reference(base):
        check_under(base, roots, purpose="model.base")


def init_process_groups(req: LaunchRequest, rank: int, backend: str = "gloo") -> tuple[Any, Any]:
    """The gang's process group (``backend``: NCCL on CUDA, gloo on CPU) and a gloo group of its own
    for checkpoint collectives (they run on CPU-staged state, from a background thread)."""
    if req.world_size <= 1:
        return None, None
    import torch.distributed as dist

    addr = req.env.get("MASTER_ADDR", "127.0.0.1")
    port = req.env.get("MASTER_PORT")
    if not port:
        raise RuntimeError("MASTER_PORT is not set for a multi-rank launch")
    dist.init_process_group(
        backend,
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=req.world_size,
        timeout=timedelta(seconds=PG_TIMEOUT_S),
    )
    # checkpoints run their collectives on a group of their own, from a background thread
    return dist.group.WORLD, dist.new_group(backend="gloo")


def run(run_dir: str, attempt: int, rank: int) -> int:
    os.umask(0o077)  # what a worker writes (events, checkpoints, the model) is its owner's only
    req = read_launch(run_dir, attempt)
    os.environ.update(req.env)
    events = EventWriter(run_dir, req.job_id, attempt, rank)
    from trainyard.errors import StorageNotAllowedError

    try:
        check_storage(req)
    except StorageNotAllowedError as exc:
        events.emit(
            "failed",
            rank=rank,
            reason=exc.message,
            classification=CLASSIFICATION_USER,
            traceback_tail="",
        )
        events.close()
        return EXIT_USER_ERROR
    entry = (req.spec.get("entrypoint") or {}).get("command")
    if entry:
        events.emit("log", rank=rank, message=f"running entrypoint {entry[0]!r}")
        env = entrypoint_env(req, rank, run_dir)
        script = in_process_python_script(list(entry))
        if script is not None:
            from trainyard.runtime.trainer import PreemptionNotice

            PreemptionNotice(req.notice_s, run_dir, attempt).install()
            events.close()
            return run_python_in_process(script, list(entry), env, req, rank, run_dir)
        events.close()
        try:
            import signal

            for sig in (signal.SIGTERM, signal.SIGINT):  # the user's program gets default dispositions
                signal.signal(sig, signal.SIG_DFL)
            os.execvpe(entry[0], list(entry), env)
        except OSError as exc:
            events = EventWriter(run_dir, req.job_id, attempt, rank)
            events.emit(
                "failed",
                rank=rank,
                reason=f"entrypoint {entry[0]!r} could not start: {exc}",
                classification=CLASSIFICATION_USER,
                traceback_tail="",
            )
            return EXIT_USER_ERROR

    from trainyard.runtime.trainer import PreemptionNotice

    notice = PreemptionNotice(req.notice_s, run_dir, attempt)
    notice.install()
    events.echo = sys.stdout  # the built-in trainer logs readable lines (progress, checkpoints, resume)
    from trainyard.runtime.determinism import configure_determinism

    configure_determinism(int(req.env.get("TRAINYARD_NUM_THREADS", "1")))
    from trainyard.runtime.tracing import WorkerTrace

    spans = WorkerTrace.from_env(req.env, req.job_id, attempt, rank, events.emit)
    emit = spans.emit if spans is not None else events.emit
    trainer = None
    try:
        from trainyard.runtime.device import check_report, device_report, plan_device
        from trainyard.runtime.trainer import (
            DEFAULT_STORAGE_OUTAGE_BUDGET_S,
            Outcome,
            StorageFailure,
            Trainer,
        )

        placed = plan_device(req.accelerator, rank)
        if placed.device.type == "cuda":
            import torch

            torch.cuda.set_device(placed.device)
        report = device_report(placed.device)
        check_report(req.accelerator, report)
        pg, ckpt_pg = init_process_groups(req, rank, placed.backend)
        every = req.env.get("TRAINYARD_CHECKPOINT_EVERY_STEPS")
        from trainyard.runtime.metrics import MetricsStream

        metrics = MetricsStream(
            events.emit,
            rank,
            every_steps=req.metrics_every_steps,
            max_rows_per_s=req.metrics_max_rows_per_s,
        )
        trainer = Trainer(
            req,
            rank,
            emit=emit,
            notice=notice,
            process_group=pg,
            checkpoint_group=ckpt_pg,
            heartbeat_s=float(req.env.get("TRAINYARD_HEARTBEAT_S", "1.0")),
            checkpoint_every_steps=int(every) if every else None,
            fallback_url=f"file://{Path(run_dir).resolve()}/checkpoints",
            device=placed.device,
            device_info=report,
            metrics=metrics if rank == 0 else None,
            storage_outage_budget_s=float(
                req.env.get("TRAINYARD_STORAGE_OUTAGE_BUDGET_S") or DEFAULT_STORAGE_OUTAGE_BUDGET_S
            ),
        )
        if spans is not None:
            spans.start_training()
        try:
            outcome: Outcome = trainer.run()
        except StorageFailure as exc:
            outcome = trainer.fail_to_fallback(str(exc))
    except Exception as exc:
        if trainer is not None and trainer.metrics is not None:
            with contextlib.suppress(Exception):
                trainer.metrics.flush()  # the steps before the failure (a diverging loss, say)
        kind = classify(exc)
        if spans is not None:
            spans.finish("failed", {"reason": f"{exc.__class__.__name__}: {exc}"})
        events.emit(
            "failed",
            rank=rank,
            reason=f"{exc.__class__.__name__}: {exc}",
            classification=kind,
            traceback_tail=traceback_tail(),
        )
        sys.stderr.write(traceback.format_exc())
        events.close()
        return EXIT_USER_ERROR if kind == CLASSIFICATION_USER else EXIT_INFRA_ERROR
    data = {"rank": rank, **outcome.data}
    if spans is not None:
        spans.finish(outcome.kind, data)
    events.emit(outcome.kind, **data)
    events.close()
    if outcome.kind == "succeeded":
        return EXIT_OK
    if outcome.kind == "preempted":
        return EXIT_PREEMPTED
    return EXIT_USER_ERROR if outcome.data.get("classification") == CLASSIFICATION_USER else EXIT_INFRA_ERROR


def warm_up() -> None:
    """Import everything a worker needs (torch, transformers, DCP): the slow part of starting one."""
    import torch.distributed.checkpoint  # noqa: F401
    import transformers.models.arcee.modeling_arcee
    import transformers.models.bert.modeling_bert
    import transformers.models.llama.modeling_llama  # noqa: F401
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # noqa: F401
    from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: F401

    importlib.import_module("trainyard.runtime.trainer")


def exit_file_name(attempt: int, rank: int) -> str:
    """Where the fork server records a forked worker's exit status (it is the worker's parent)."""
    return f"exit-a{attempt}-r{rank}.json"


def fork_server() -> None:
    """A warm parent for workers: import once, then fork one worker per request.

    Once warm it prints ``{"ready": true}``. Requests arrive on stdin as JSON lines
    ``{"run_dir", "attempt", "rank", "log"}``; the reply on stdout is ``{"pid": ...}``.
    Each child starts its own session (so it survives this server and the executor), sends its
    output to ``log`` and runs ``run()``. A reaper thread records each child's exit status in
    ``run_dir/exit-a<A>-r<R>.json``. End of input (the executor went away) ends the
    server; running workers keep going and can be adopted.
    """
    import threading

    warm_up()
    children: dict[int, tuple[str, int, int]] = {}
    lock = threading.Lock()

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                time.sleep(0.05)
                continue
            with lock:
                info = children.pop(pid, None)
            if info is None:
                continue
            run_dir, attempt, rank = info
            with contextlib.suppress(OSError):
                path = Path(run_dir) / exit_file_name(attempt, rank)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps({"pid": pid, "exit_code": os.waitstatus_to_exitcode(status)}))
                tmp.replace(path)

    threading.Thread(target=reap, name="reaper", daemon=True).start()
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        with lock:
            pid = os.fork()
            if pid == 0:  # the worker
                code = EXIT_INFRA_ERROR
                try:
                    os.setsid()
                    devnull = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(devnull, 0)
                    log_fd = os.open(job["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                    os.dup2(log_fd, 1)
                    os.dup2(log_fd, 2)
                    code = run(str(job["run_dir"]), int(job["attempt"]), int(job["rank"]))
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            children[pid] = (str(job["run_dir"]), int(job["attempt"]), int(job["rank"]))
        sys.stdout.write(json.dumps({"pid": pid}) + "\n")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainyard.runtime.worker", description=__doc__)
    parser.add_argument("--run-dir")
    parser.add_argument("--attempt", type=int)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--fork-server", action="store_true", help="warm up, then fork workers on request")
    args = parser.parse_args(argv)
    if args.fork_server:
        fork_server()
        os._exit(0)
    if args.run_dir is None or args.attempt is None or args.rank is None:
        parser.error("--run-dir, --attempt and --rank are required (or --fork-server)")
    t0 = time.time()
    code = run(args.run_dir, args.attempt, args.rank)
    sys.stdout.write(f"worker rank {args.rank} exiting with {code} after {time.time() - t0:.1f} s\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: process groups and threads are done


if __name__ == "__main__":
    main()
