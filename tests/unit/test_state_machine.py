"""The job state machine (DESIGN §3.3): one table, illegal edges are errors."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard.errors import IllegalTransitionError
from trainyard.services.lifecycle import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    JobState,
    can_transition,
    check_transition,
    is_terminal,
)

S = JobState


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(JobState)


def test_design_path_is_legal() -> None:
    path = [
        S.PENDING,
        S.QUEUED,
        S.STARTING,
        S.RUNNING,
        S.PREEMPTED,
        S.QUEUED,
        S.STARTING,
        S.RUNNING,
        S.SUCCEEDED,
    ]
    for a, b in itertools.pairwise(path):
        assert check_transition(a, b) == b


def test_terminal_states_are_absorbing() -> None:
    assert {S.SUCCEEDED, S.FAILED, S.CANCELLED} == TERMINAL_STATES
    for t in TERMINAL_STATES:
        assert is_terminal(t)
        for target in JobState:
            with pytest.raises(IllegalTransitionError):
                check_transition(t, target, job_id="job-x")


@pytest.mark.parametrize("state", [s for s in JobState if s not in (S.SUCCEEDED, S.FAILED, S.CANCELLED)])
def test_every_live_state_can_be_cancelled(state: JobState) -> None:
    assert can_transition(state, S.CANCELLED)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (S.PENDING, S.RUNNING),  # must be admitted and placed first
        (S.PENDING, S.SUCCEEDED),
        (S.QUEUED, S.RUNNING),  # must pass through starting
        (S.QUEUED, S.PREEMPTED),  # nothing to preempt
        (S.RUNNING, S.QUEUED),  # goes through preempted
        (S.RUNNING, S.STARTING),
        (S.PREEMPTED, S.RUNNING),  # must be re-placed
        (S.RUNNING, S.RUNNING),
    ],
)
def test_illegal_edges_raise_with_details(a: JobState, b: JobState) -> None:
    with pytest.raises(IllegalTransitionError) as info:
        check_transition(a, b, job_id="job-1")
    err = info.value
    assert err.http_status == 409 and err.code == "illegal_transition"
    assert err.details["from"] == a.value and err.details["to"] == b.value
    assert "job-1" in err.message


def test_strings_are_accepted() -> None:
    assert check_transition("queued", "starting") is S.STARTING
    with pytest.raises(ValueError):
        check_transition("queued", "exploded")


def test_only_placed_states_hold_capacity() -> None:
    assert frozenset({S.STARTING, S.RUNNING}) == ACTIVE_STATES


def _reachable_terminal(state: JobState) -> bool:
    seen, todo = set(), [state]
    while todo:
        s = todo.pop()
        if s in TERMINAL_STATES:
            return True
        if s not in seen:
            seen.add(s)
            todo.extend(TRANSITIONS[s])
    return False


@pytest.mark.parametrize("state", list(JobState))
def test_every_state_can_finish(state: JobState) -> None:
    assert _reachable_terminal(state)


@given(st.lists(st.sampled_from(list(JobState)), min_size=1, max_size=30))
def test_random_walks_legal_targets_advance_illegal_ones_raise(targets: list[JobState]) -> None:
    """Applying arbitrary targets: a legal one returns that target, an illegal one raises; once terminal,
    nothing moves."""
    state = S.PENDING
    for t in targets:
        if t in TRANSITIONS[state]:
            assert check_transition(state, t) is t
            state = t
        else:
            with pytest.raises(IllegalTransitionError):
                check_transition(state, t)
    if state in (S.SUCCEEDED, S.FAILED, S.CANCELLED):  # the terminal states, named independently
        assert is_terminal(state)
        for t in JobState:
            with pytest.raises(IllegalTransitionError):
                check_transition(state, t)
    else:
        assert not is_terminal(state)
