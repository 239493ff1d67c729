"""Event files, restart policy and failure classification (no worker processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard.executors.base import ExecutorEvent, RestartPolicy, event_file_name
from trainyard.runtime.events import EventTail, EventWriter


def test_tail_returns_whole_lines_and_skips_torn_ones(tmp_path: Path) -> None:
    w = EventWriter(tmp_path, "job", 2, 1)
    assert w.path.name == event_file_name(2, 1)
    w.emit("heartbeat", rank=1, step=1, loss=2.0, step_time_s=0.1, tokens_per_s=10.0, memory_gib=0.1)
    tail = EventTail(w.path)
    first = tail.read_new()
    assert [d["kind"] for d in first] == ["heartbeat"] and first[0]["data"]["step"] == 1
    with open(w.path, "a") as fh:
        fh.write('{"kind": "heartbeat", "data": {"step"')  # a writer killed mid-line
    assert tail.read_new() == []
    with open(w.path, "a") as fh:
        fh.write("\n")  # the torn line is complete but not JSON
    w.emit("checkpoint", step=4, path="file:///x/step-4")
    assert [d["kind"] for d in tail.read_new()] == ["checkpoint"]
    ev = ExecutorEvent.from_dict(json.loads(w.path.read_text().splitlines()[0]))
    assert ev.job_id == "job" and ev.attempt == 2 and ev.kind == "heartbeat"
    with pytest.raises(ValueError, match="unknown event kind"):
        w.emit("exploded")
    w.close()


@given(restarts=st.integers(0, 50))
def test_restart_policy_backoff_is_bounded_and_monotone(restarts: int) -> None:
    p = RestartPolicy(max_restarts=5, backoff_initial_s=0.5, backoff_factor=2.0, backoff_max_s=30.0)
    assert 0.5 <= p.backoff_s(restarts) <= 30.0
    assert p.backoff_s(restarts + 1) >= p.backoff_s(restarts)
    assert p.should_restart("infra", restarts) == (restarts < 5)
    assert not p.should_restart("user", 0)


def test_failures_are_classified() -> None:
    from trainyard.runtime.data import DataError
    from trainyard.runtime.modeling import ModelBuildError
    from trainyard.runtime.trainer import TrainingDiverged
    from trainyard.runtime.worker import classify

    for exc in (DataError("x"), ModelBuildError("x"), TrainingDiverged("nan")):
        assert classify(exc) == "user"
    for exc in (RuntimeError("Connection reset by peer"), OSError("disk full")):
        assert classify(exc) == "infra"
