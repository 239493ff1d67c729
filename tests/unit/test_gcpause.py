"""schedule.gcpause: the cyclic collector is off while a round runs and comes back as it was."""

from __future__ import annotations

import contextlib
import gc
import random
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard.schedule import SchedulerConfig, schedule_round
from trainyard.schedule.gcpause import gc_paused

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_is_off_inside_and_back_on_after() -> None:
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_it_comes_back_after_an_exception() -> None:
    with pytest.raises(KeyError), gc_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_nested_pauses_end_with_the_outermost() -> None:
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_pauses_in_two_threads_end_with_the_last() -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with gc_paused():
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # this thread's pause ended first; the other still runs
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_a_scheduling_round_runs_with_the_collector_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a collection due at almost every allocation, a round sets off only the few collections of
    entering and leaving it; the same round without the pause sets off thousands."""
    import trainyard.schedule.round as round_module

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_scheduler_distinct import make_distinct_jobs, make_pools

    rng = random.Random(3)
    pools, jobs = make_pools(10, rng), make_distinct_jobs(20, rng)
    config = SchedulerConfig()
    schedule_round(jobs, pools, now_s=0.0, config=config)  # imports and memos out of the way

    def collections() -> int:
        count = [0]

        def seen(phase: str, info: dict[str, int]) -> None:
            count[0] += phase == "start"

        thresholds = gc.get_threshold()
        gc.set_threshold(1, 1, 1)
        gc.callbacks.append(seen)
        try:
            assert schedule_round(jobs, pools, now_s=0.0, config=config).placements
        finally:
            gc.callbacks.remove(seen)
            gc.set_threshold(*thresholds)
        return count[0]

    paused = collections()
    assert gc.isenabled()
    monkeypatch.setattr(round_module, "gc_paused", contextlib.nullcontext)
    plain = collections()
    assert paused < 50 < 1000 < plain
