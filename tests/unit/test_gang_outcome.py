"""Watching a gang, shared by the local and Ray executors: first_abnormal (what went wrong first, the
gang's trigger) and gang_outcome (the one terminal event of an attempt)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard.executors.base import (
    CLASSIFICATION_INFRA,
    CLASSIFICATION_USER,
    EXIT_PREEMPTED,
    TERMINAL_KINDS,
    RankEnd,
    first_abnormal,
    gang_outcome,
    note_exits,
    rank_log_name,
)

USER_FAIL = {"rank": 1, "reason": "ValueError: bad batch", "classification": CLASSIFICATION_USER}
INFRA_FAIL = {"rank": 1, "reason": "NCCL timeout", "classification": CLASSIFICATION_INFRA}


def ok(rank: int, step: int = 10) -> RankEnd:
    return RankEnd(rank, {"kind": "succeeded", "data": {"final_step": step, "model_path": "/m"}})


def preempted(rank: int, step: int = 7) -> RankEnd:
    return RankEnd(rank, {"kind": "preempted", "data": {"step": step, "checkpoint_step": step}})


def failed(rank: int, doc: dict[str, Any]) -> RankEnd:
    return RankEnd(rank, {"kind": "failed", "data": doc})


def died(rank: int, how: str = "exited with code 1 without reporting", node_ip: str | None = None) -> RankEnd:
    return RankEnd(rank, None, how, node_ip)


LOST_TRIGGER = ("lost", {"reason": "rank 1 missed heartbeats for 61 s", "rank": 1})
FORCED = {"step": None, "checkpoint_step": None, "forced": True}

# (case, ranks, keyword arguments besides the ranks, expected kind, expected data or a subset of it)
CASES: list[tuple[str, list[RankEnd], dict[str, Any], str, dict[str, Any]]] = [
    ("all succeeded: rank 0's data", [ok(0), ok(1)], {}, "succeeded", {"final_step": 10, "model_path": "/m"}),
    (
        "rank 0 is found by number, not position",
        [ok(1, step=99), ok(0, step=10)],
        {},
        "succeeded",
        {"final_step": 10, "model_path": "/m"},
    ),
    (
        "one rank without a terminal event: lost, naming it",
        [ok(0), RankEnd(1)],
        {},
        "lost",
        {"reason": "ranks [1] exited without reporting", "rank": 1},
    ),
    (
        "user failure wins over a rank that died and a lost trigger",
        [died(0), failed(1, USER_FAIL)],
        {"failures": [INFRA_FAIL, USER_FAIL], "trigger": LOST_TRIGGER, "preempting": True},
        "failed",
        {"reason": "ValueError: bad batch", "classification": CLASSIFICATION_USER, "traceback_tail": ""},
    ),
    (
        "a user-classified trigger (entrypoint exit) fails the job",
        [RankEnd(0)],
        {
            "trigger": (
                "failed",
                {"reason": "rank 0 of the entrypoint exited with code 2", "classification": "user"},
            )
        },
        "failed",
        {"reason": "rank 0 of the entrypoint exited with code 2", "classification": CLASSIFICATION_USER},
    ),
    (
        "rank died unreported: lost, it explains its peers' infra failures",
        [failed(0, INFRA_FAIL), died(1)],
        {"failures": [INFRA_FAIL], "trigger": ("failed", INFRA_FAIL)},
        "lost",
        {"reason": "rank 1 exited with code 1 without reporting", "rank": 1},
    ),
    (
        "the node of a rank that died is reported when known",
        [ok(0), died(1, "lost its Ray actor (node died)", node_ip="10.0.0.7")],
        {},
        "lost",
        {"reason": "rank 1 lost its Ray actor (node died)", "rank": 1, "node_ip": "10.0.0.7"},
    ),
    (
        "an entrypoint's dead ranks are not 'lost' by themselves",
        [ok(0), died(1)],
        {"entrypoint": True},
        "lost",
        {"reason": "ranks [1] exited without reporting", "rank": 1},
    ),
    (
        "preempted with a checkpoint: rank 0's data",
        [preempted(0), preempted(1)],
        {"preempting": True},
        "preempted",
        {"step": 7, "checkpoint_step": 7},
    ),
    (
        "forced preemption: no preempted report from rank 0",
        [RankEnd(0), RankEnd(1)],
        {"preempting": True},
        "preempted",
        FORCED,
    ),
    (
        "a trigger wins over the notice",
        [preempted(0), RankEnd(1)],
        {"preempting": True, "trigger": LOST_TRIGGER},
        "lost",
        LOST_TRIGGER[1],
    ),
    (
        "the notice wins over a trigger when the notice overrides (gang not yet running)",
        [RankEnd(0), RankEnd(1)],
        {"preempting": True, "trigger": LOST_TRIGGER, "preempt_overrides_trigger": True},
        "preempted",
        FORCED,
    ),
    ("lost trigger", [ok(0), RankEnd(1)], {"trigger": LOST_TRIGGER}, "lost", LOST_TRIGGER[1]),
    (
        "infra failure trigger gets the failure fields",
        [failed(0, INFRA_FAIL)],
        {"trigger": ("failed", {"reason": "NCCL timeout", "classification": "infra"})},
        "failed",
        {"reason": "NCCL timeout", "classification": CLASSIFICATION_INFRA, "traceback_tail": ""},
    ),
    (
        "an infra failure report without a trigger fails the job",
        [ok(0), failed(1, INFRA_FAIL)],
        {"failures": [INFRA_FAIL]},
        "failed",
        {"reason": "NCCL timeout", "classification": CLASSIFICATION_INFRA, "rank": 1},
    ),
    (
        "rank 0 preempted without a notice (spot reclaim seen by the worker)",
        [preempted(0), ok(1)],
        {},
        "preempted",
        {"step": 7, "checkpoint_step": 7},
    ),
]


@pytest.mark.parametrize(("case", "ranks", "kwargs", "kind", "expected"), CASES, ids=[c[0] for c in CASES])
def test_outcome_table(
    case: str, ranks: list[RankEnd], kwargs: dict[str, Any], kind: str, expected: dict[str, Any]
) -> None:
    args: dict[str, Any] = {"failures": [], "trigger": None, "entrypoint": False, "preempting": False}
    got_kind, got = gang_outcome(ranks, **{**args, **kwargs})
    assert got_kind == kind, case
    assert {k: got.get(k) for k in expected} == expected, case


def test_no_lost_node_ip_unless_known() -> None:
    _, data = gang_outcome([ok(0), died(1)], failures=[], trigger=None, entrypoint=False, preempting=False)
    assert "node_ip" not in data


def test_returned_data_is_a_copy_of_the_rank_report() -> None:
    rank0 = ok(0)
    _, data = gang_outcome([rank0], failures=[], trigger=None, entrypoint=False, preempting=False)
    data["final_step"] = -1
    assert rank0.terminal is not None and rank0.terminal["data"]["final_step"] == 10


def test_a_gang_has_ranks() -> None:
    with pytest.raises(ValueError):
        gang_outcome([], failures=[], trigger=None, entrypoint=False, preempting=False)


terminal_docs = st.one_of(
    st.none(),
    st.sampled_from(
        [
            {"kind": "succeeded", "data": {"final_step": 3}},
            {"kind": "preempted", "data": {"step": 2, "checkpoint_step": 2}},
            {"kind": "failed", "data": {"reason": "x", "classification": CLASSIFICATION_INFRA}},
            {"kind": "failed", "data": {"reason": "y", "classification": CLASSIFICATION_USER}},
        ]
    ),
)


@st.composite
def gangs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    ranks = [
        RankEnd(r, draw(terminal_docs), draw(st.sampled_from([None, "exited with code 1 without reporting"])))
        for r in range(n)
    ]
    failures = [
        {"rank": rk.rank, **rk.terminal["data"]}
        for rk in ranks
        if rk.terminal and rk.terminal["kind"] == "failed"
    ]
    trigger = draw(
        st.sampled_from([None, LOST_TRIGGER, ("failed", dict(INFRA_FAIL)), ("failed", dict(USER_FAIL))])
    )
    return {
        "ranks": ranks,
        "failures": failures,
        "trigger": trigger,
        "entrypoint": draw(st.booleans()),
        "preempting": draw(st.booleans()),
        "preempt_overrides_trigger": draw(st.booleans()),
    }


@given(gangs())
def test_outcome_is_one_well_formed_terminal_event(gang: dict[str, Any]) -> None:
    kind, data = gang_outcome(**gang)
    assert kind in TERMINAL_KINDS
    if kind == "failed":
        assert {"reason", "classification", "traceback_tail"} <= set(data)
    if kind == "lost":
        assert isinstance(data["reason"], str) and isinstance(data["rank"], int)
    user_failed = any(f["classification"] == CLASSIFICATION_USER for f in gang["failures"]) or (
        gang["trigger"] is not None and gang["trigger"][1].get("classification") == CLASSIFICATION_USER
    )
    # a user-code error is never retried as an infrastructure failure, whatever else happened
    assert (kind == "failed" and data["classification"] == CLASSIFICATION_USER) == user_failed
    if kind == "succeeded":
        assert all(rk.terminal and rk.terminal["kind"] == "succeeded" for rk in gang["ranks"])


# ---- first_abnormal ------------------------------------------------------------------------------------


@dataclass
class Seen:
    """A rank as an executor sees it (the RankState protocol)."""

    rank: int
    exited: bool = False
    exit_code: int | None = None
    terminal: dict[str, Any] | None = None
    last_seen_s: float | None = 129.0  # a second ago
    unreported: str | None = None


NOW_S = 130.0


def abnormal(
    ranks: list[Seen], tmp_path: Path, entrypoint: bool = False
) -> tuple[str, dict[str, Any]] | None:
    return first_abnormal(
        ranks,
        now_s=NOW_S,
        entrypoint=entrypoint,
        started_s=0.0,
        started_what="launch",
        startup_timeout_s=60.0,
        heartbeat_timeout_s=20.0,
        run_dir=tmp_path,
    )


def test_a_healthy_gang_has_nothing_abnormal(tmp_path: Path) -> None:
    done = {"kind": "succeeded", "data": {}}
    assert abnormal([Seen(0), Seen(1, last_seen_s=NOW_S - 19.0)], tmp_path) is None
    assert abnormal([Seen(0, exited=True, exit_code=0, terminal=done), Seen(1)], tmp_path) is None


def test_a_rank_that_exits_without_reporting_loses_the_gang(tmp_path: Path) -> None:
    assert abnormal([Seen(0), Seen(1, exited=True, exit_code=-9)], tmp_path) == (
        "lost",
        {"reason": "rank 1 was killed by SIGKILL without reporting", "rank": 1},
    )
    # it comes before a lower rank's missed heartbeats
    trigger = abnormal([Seen(0, last_seen_s=0.0), Seen(1, exited=True, exit_code=1)], tmp_path)
    assert trigger is not None and trigger[1]["rank"] == 1


def test_an_entrypoint_rank_that_exits_with_an_error_is_the_users_failure(tmp_path: Path) -> None:
    (tmp_path / rank_log_name(1)).write_text("Traceback (most recent call last):\nKeyError: 'x'\n")
    trigger = abnormal([Seen(0), Seen(1, exited=True, exit_code=2)], tmp_path, entrypoint=True)
    assert trigger == (
        "failed",
        {
            "reason": "rank 1 of the entrypoint exited with code 2",
            "classification": CLASSIFICATION_USER,
            "traceback_tail": "Traceback (most recent call last):\nKeyError: 'x'\n",
            "rank": 1,
        },
    )
    # preempted, or an exit status nobody knows (an adopted worker), is no user error
    for code in (EXIT_PREEMPTED, None):
        trigger = abnormal([Seen(0, exited=True, exit_code=code)], tmp_path, entrypoint=True)
        assert trigger is not None and trigger[0] == "lost"


def test_silent_ranks_are_lost_after_the_startup_or_heartbeat_timeout(tmp_path: Path) -> None:
    assert abnormal([Seen(0), Seen(1, last_seen_s=None)], tmp_path) == (
        "lost",
        {"reason": "rank 1 sent no event within 60 s of launch", "rank": 1},
    )
    assert abnormal([Seen(0, last_seen_s=NOW_S - 25.0)], tmp_path) == (
        "lost",
        {"reason": "rank 0 missed heartbeats for 25 s", "rank": 0},
    )
    # within the timeouts: nothing yet
    early = first_abnormal(
        [Seen(0, last_seen_s=None)],
        now_s=NOW_S,
        entrypoint=False,
        started_s=NOW_S - 59.0,
        started_what="launch",
        startup_timeout_s=60.0,
        heartbeat_timeout_s=20.0,
        run_dir=tmp_path,
    )
    assert early is None


def test_note_exits_records_unreported_ends_unless_expected() -> None:
    died, ok_exit, reported = Seen(0, exited=True, exit_code=1), Seen(1, exited=True, exit_code=0), Seen(2)
    note_exits([died, ok_exit, reported], entrypoint=False, expected=False)
    assert died.unreported == "exited with code 1" and died.terminal is None
    assert ok_exit.unreported == "exited with code 0"  # the SDK trainer always reports; silence is a loss
    assert reported.unreported is None
    lost = Seen(0, exited=True, exit_code=-9, unreported="lost its Ray actor (node died)")
    note_exits([lost], entrypoint=False, expected=False)
    assert lost.unreported == "lost its Ray actor (node died)"  # the first account stays


def test_note_exits_an_entrypoint_exiting_0_succeeded_and_expected_ends_are_no_loss() -> None:
    ok_exit, failed_exit = Seen(0, exited=True, exit_code=0), Seen(1, exited=True, exit_code=3)
    note_exits([ok_exit, failed_exit], entrypoint=True, expected=False)
    assert (
        ok_exit.terminal == {"kind": "succeeded", "data": {"final_step": None}} and ok_exit.unreported is None
    )
    assert failed_exit.unreported == "exited with code 3"
    killed = Seen(0, exited=True, exit_code=-9)
    note_exits([killed], entrypoint=False, expected=True)  # we tore it down or gave notice
    assert killed.unreported is None and killed.terminal is None
