"""Helpers shared by the local and Ray executors (executors/base.py): log tails, process-group signals,
waiting for an attempt's terminal event."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from trainyard.executors.base import ExecutorEvent, log_tail, signal_group, wait_for_terminal


def test_log_tail_is_the_end_of_the_log(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"x" * 5000 + "Traceback: ValueError: é\n".encode())
    tail = log_tail(log, n_bytes=100)
    assert tail.endswith("Traceback: ValueError: é\n") and len(tail.encode()) == 100
    assert log_tail(log) == log.read_bytes()[-4000:].decode()  # 4,000 bytes by default
    assert log_tail(tmp_path / "missing.log") == ""


def test_signal_group_reaches_the_whole_group_and_ignores_the_gone() -> None:
    # a leader with a child in its own session: the signal reaches both
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen(['sleep', '60']); time.sleep(60)",
        ],
        start_new_session=True,
    )
    try:
        time.sleep(0.3)
        children = subprocess.run(
            ["pgrep", "-g", str(leader.pid)], capture_output=True, text=True
        ).stdout.split()
        assert len(children) == 2, children  # the leader and its sleep
        signal_group(leader.pid, signal.SIGTERM)
        assert leader.wait(timeout=10) == -signal.SIGTERM
        deadline = time.time() + 5
        while time.time() < deadline and subprocess.run(["pgrep", "-g", str(leader.pid)]).returncode == 0:
            time.sleep(0.05)
        assert subprocess.run(["pgrep", "-g", str(leader.pid)]).returncode == 1  # the child is gone too
    finally:
        if leader.poll() is None:
            leader.kill()
    signal_group(leader.pid, signal.SIGKILL)  # gone already: no error


def ev(job_id: str, kind: str) -> ExecutorEvent:
    return ExecutorEvent(job_id, 1, kind, {}, 0.0)


def test_wait_for_terminal_returns_every_event_up_to_the_jobs_end() -> None:
    batches = [
        [ev("a", "started")],
        [ev("b", "succeeded"), ev("a", "heartbeat")],
        [ev("a", "lost")],
        [ev("a", "log")],
    ]
    polls = iter(batches)
    seen = wait_for_terminal(lambda: next(polls), lambda: True, "a", timeout_s=10, poll_s=0)
    assert [(e.job_id, e.kind) for e in seen] == [
        ("a", "started"),
        ("b", "succeeded"),
        ("a", "heartbeat"),
        ("a", "lost"),
    ]


def test_wait_for_terminal_stops_when_the_gang_is_gone_or_time_is_up() -> None:
    calls = []

    def poll() -> list[ExecutorEvent]:
        calls.append(1)
        return [ev("a", "heartbeat")]

    assert len(wait_for_terminal(poll, lambda: len(calls) < 3, "a", timeout_s=10, poll_s=0)) == 3
    t0 = time.time()
    assert wait_for_terminal(poll, lambda: True, "a", timeout_s=0.2, poll_s=0.01)
    assert 0.2 <= time.time() - t0 < 5
