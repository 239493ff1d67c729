"""Local executor with real worker processes: adoption after a control-plane restart, hung workers,
failure classification, cancellation, and users' own scripts through the runtime SDK."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from trainyard.executors.base import ExecutorEvent, LaunchRequest
from trainyard.executors.local import LocalExecutor, pid_alive

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def tiny(steps: int, **workload: Any) -> dict[str, Any]:
    return {
        "name": "tiny",
        "model": {"architecture": "decoder", "n_layers": 2, "d_model": 32, "n_heads": 4, "vocab_size": 64},
        "workload": {"seq_len": 16, "global_batch": 2, "steps": steps, "precision": "fp32", **workload},
    }


def request(root: Path, job_id: str, job_spec: dict[str, Any], attempt: int = 0, **env: str) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        attempt=attempt,
        spec=job_spec,
        world_size=1,
        pool="local-cpu",
        market="spot",
        checkpoint_url=f"file://{root / 'store'}",
        checkpoint_interval_s=None,
        run_dir=str(root / "runs" / job_id),
        notice_s=10.0,
        env={"TRAINYARD_HEARTBEAT_S": "0", **env},
    )


def until(ex: LocalExecutor, pred, timeout_s: float = 90.0) -> list[ExecutorEvent]:
    seen: list[ExecutorEvent] = []
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for e in ex.poll():
            seen.append(e)
            if pred(e):
                return seen
        time.sleep(0.02)
    raise AssertionError(f"condition not met in {timeout_s} s; saw {[(e.kind, e.data) for e in seen][-5:]}")


def step_at_least(job_id: str, step: int):
    return lambda e: e.job_id == job_id and e.kind == "heartbeat" and e.data["step"] >= step


def terminal(job_id: str):
    return lambda e: e.job_id == job_id and e.kind in ("succeeded", "failed", "lost", "preempted")


@pytest.fixture(scope="module")
def ex() -> LocalExecutor:
    executor = LocalExecutor(heartbeat_timeout_s=60.0, failure_grace_s=0.5)
    assert executor.wait_until_warm(180)
    yield executor
    executor.shutdown(kill_workers=True)


def test_hung_worker_is_lost_and_killed(ex: LocalExecutor, tmp_path: Path) -> None:
    infos = ex.launch(request(tmp_path, "hang", tiny(100_000)))
    until(ex, step_at_least("hang", 3))
    pid = infos[0].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # alive, but silent
    ex.heartbeat_timeout_s = 2.0
    try:
        events = until(ex, terminal("hang"))
    finally:
        ex.heartbeat_timeout_s = 60.0
    assert events[-1].kind == "lost" and "missed heartbeats" in events[-1].data["reason"]
    assert not pid_alive(pid)


def test_user_error_is_classified_with_its_traceback(ex: LocalExecutor, tmp_path: Path) -> None:
    ex.launch(request(tmp_path, "baddata", tiny(5, dataset=str(tmp_path / "missing.jsonl"))))
    events = until(ex, terminal("baddata"))
    fail = events[-1]
    assert fail.kind == "failed" and fail.data["classification"] == "user"
    assert "does not exist" in fail.data["reason"]
    assert "DataError" in fail.data["traceback_tail"]


def test_cancel_kills_the_gang_without_a_terminal_event(ex: LocalExecutor, tmp_path: Path) -> None:
    infos = ex.launch(request(tmp_path, "cancel", tiny(100_000)))
    until(ex, step_at_least("cancel", 2))
    ex.cancel("cancel")
    assert infos[0].pid is not None and not pid_alive(infos[0].pid)
    assert ex.workers("cancel") == []
    time.sleep(0.2)
    assert not [e for e in ex.poll() if e.job_id == "cancel" and e.kind in ("succeeded", "failed", "lost")]


USER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import torch
    from safetensors.torch import save_file
    import trainyard.runtime as ty

    session = ty.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = {"model": model.state_dict()}
    start = session.load(state) or 0
    x = torch.linspace(-1, 1, 32).unsqueeze(1).repeat(1, 4)
    y = x.sum(1, keepdim=True)
    total = 60
    for step in range(start, total):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        session.report(step + 1, loss=float(loss))
        if session.should_preempt():
            session.save(step + 1, state, blocking=True)
            session.exit_preempted(step + 1)
        time.sleep(0.02)
    out = sys.argv[1]
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out)
    session.finish(model_path=out, final_step=total)
    """
)


def test_user_script_with_the_sdk_is_preempted_and_resumes(ex: LocalExecutor, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    job = tiny(1)
    job["entrypoint"] = {"command": [sys.executable, str(script), str(tmp_path / "model.safetensors")]}
    ex.launch(request(tmp_path, "sdk", job))
    until(ex, step_at_least("sdk", 20))
    ex.preempt("sdk", notice_s=10.0)
    events = until(ex, terminal("sdk"))
    pre = events[-1]
    assert pre.kind == "preempted" and pre.data["checkpoint_step"] == pre.data["step"]
    ex.launch(request(tmp_path, "sdk", job, attempt=1))
    events = until(ex, terminal("sdk"))
    first = next(e for e in events if e.kind == "heartbeat" and e.attempt == 1)
    assert first.data["step"] == pre.data["step"] + 1  # resumed right after the saved step
    done = events[-1]
    assert done.kind == "succeeded" and done.data["final_step"] == 60 and len(done.data["model_sha256"]) == 64


def test_failing_user_script_reports_a_user_error(ex: LocalExecutor, tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("import trainyard.runtime as ty\nty.init()\nraise ValueError('bad user code')\n")
    job = tiny(1)
    job["entrypoint"] = {"command": [sys.executable, str(script)]}
    ex.launch(request(tmp_path, "broken", job))
    fail = until(ex, terminal("broken"))[-1]
    assert fail.kind == "failed" and fail.data["classification"] == "user"
    assert "ValueError: bad user code" in fail.data["traceback_tail"]
    job["entrypoint"] = {"command": [str(tmp_path / "no-such-program")]}
    ex.launch(request(tmp_path, "missing", job))
    fail = until(ex, terminal("missing"))[-1]
    assert fail.kind == "failed" and fail.data["classification"] == "user"
    assert "could not start" in fail.data["reason"]


def test_adopt_workers_after_a_control_plane_restart(tmp_path: Path) -> None:
    """A control plane of its own goes away (the module's executor stays usable by any later test)."""
    first = LocalExecutor(heartbeat_timeout_s=60.0, failure_grace_s=0.5, warm_start=False)
    req = request(tmp_path, "adopt", tiny(120))
    first.launch(req)
    until(first, step_at_least("adopt", 5))
    workers = first.workers("adopt")
    first.shutdown()  # the control plane goes away; its workers keep training
    assert all(w.pid is not None and pid_alive(w.pid) for w in workers)
    second = LocalExecutor(warm_start=False)
    try:
        assert second.adopt("adopt", 0, req.run_dir, workers)
        events = until(second, terminal("adopt"))
        assert events[-1].kind == "succeeded" and events[-1].data["final_step"] == 120
        assert "started" not in {e.kind for e in events}  # the first control plane saw it
        assert any(e.kind == "heartbeat" for e in events)
        assert not second.adopt("adopt", 0, req.run_dir, workers[:0])
    finally:
        second.shutdown(kill_workers=True)
