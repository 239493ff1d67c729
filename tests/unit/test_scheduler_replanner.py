"""The re-planning debouncer (``Replanner``) as worked timelines: which events count, when a round is
due, and what a round leaves pending. Defaults: debounce 5 s, at most 30 s after the first pending event,
a periodic round every 300 s, price moves under 5 % ignored."""

from __future__ import annotations

from trainyard.schedule import EventKind, Replanner, SchedulerEvent


def _price(t: float, old: float | None, new: float | None) -> SchedulerEvent:
    return SchedulerEvent(EventKind.PRICE_CHANGE, t, pool="a", old_price_usd_per_hour=old,
                          new_price_usd_per_hour=new)  # fmt: skip


def _arrival(t: float, **kw) -> SchedulerEvent:
    return SchedulerEvent(EventKind.ARRIVAL, t, job_id=f"j{t}", **kw)


def test_price_moves_are_weighed_relative_to_the_old_price() -> None:
    rp = Replanner()
    assert not rp.observe(_price(1.0, 4.0, 4.1))  # 2.5 % of $4
    assert rp.observe(_price(2.0, 0.5, 0.6))  # 20 % of $0.50 (the same 10 ¢ would be 2.5 % of $4)
    assert not Replanner(min_price_change=0.25).observe(_price(1.0, 2.0, 2.4))  # 20 % < 25 %
    assert Replanner(min_price_change=0.25).observe(_price(1.0, 2.0, 2.5))  # exactly 25 % counts
    assert Replanner(min_price_change=0.25).observe(_price(1.0, 2.0, 1.5))  # a drop counts alike
    # a pool that was free, or a price not given, always asks for a round
    assert Replanner().observe(_price(1.0, 0.0, 0.01))
    assert Replanner().observe(_price(1.0, None, 1.0))
    assert Replanner().observe(_price(1.0, 1.0, None))
    assert [e.time_s for e in rp.pending] == [2.0]


def test_a_fresh_replanner_is_due_at_once() -> None:
    rp = Replanner()
    assert rp.due(0.0) and rp.next_due_s() == 0.0


def test_the_periodic_round_counts_from_the_last_round() -> None:
    rp = Replanner(period_s=300.0)
    assert rp.planned(1000.0) == []
    assert rp.next_due_s() == 1300.0
    assert not rp.due(1100.0) and not rp.due(1299.0)
    assert rp.due(1300.0)


def test_a_burst_is_due_at_the_cap_after_its_first_event() -> None:
    rp = Replanner(debounce_s=5.0, max_delay_s=30.0)
    rp.planned(0.0)
    for t in (10.0, 14.0, 18.0, 22.0, 26.0, 30.0, 34.0, 38.0):
        rp.observe(_arrival(t))
    assert rp.next_due_s() == 40.0  # 10 + 30, before 38 + 5
    assert not rp.due(39.9)
    assert rp.due(40.0)


def test_a_late_delivered_event_does_not_move_the_quiet_period_back() -> None:
    rp = Replanner(debounce_s=5.0)
    rp.planned(0.0)
    rp.observe(_arrival(10.0))
    rp.observe(_arrival(6.0))  # stamped earlier, delivered later
    assert rp.last_event_s == 10.0
    assert not rp.due(14.0) and rp.due(15.0)
    assert rp.next_due_s() == 15.0


def test_a_late_delivered_event_starts_the_burst_it_belongs_to() -> None:
    rp = Replanner(debounce_s=5.0, max_delay_s=30.0)
    rp.planned(0.0)
    rp.observe(_arrival(30.0))
    rp.observe(_arrival(6.0))  # stamped earlier, delivered later: the cap counts from 6 s, not 30 s
    rp.observe(_arrival(34.0))
    assert rp.first_pending_s == 6.0
    assert rp.next_due_s() == 36.0  # before the quiet period's 34 + 5
    assert not rp.due(35.9) and rp.due(36.0)
    # the round covers all three, in the order they arrived
    assert [e.time_s for e in rp.planned(36.0)] == [30.0, 6.0, 34.0]


def test_an_urgent_event_is_due_from_its_own_time() -> None:
    rp = Replanner()
    rp.planned(0.0)
    rp.observe(SchedulerEvent(EventKind.PREEMPTION, 7.0, job_id="p"))
    assert rp.due(7.0) and rp.next_due_s() == 7.0
    at_zero = Replanner()
    at_zero.observe(_arrival(0.0, urgent=True))
    assert at_zero.next_due_s() == 0.0


def test_a_round_covers_the_events_up_to_its_time_and_keeps_the_later_ones() -> None:
    rp = Replanner(debounce_s=5.0)
    early, at, later = _arrival(10.0), _arrival(15.0), _arrival(20.0)
    for e in (early, at, later):
        rp.observe(e)
    assert rp.planned(15.0) == [early, at]  # an event at the round's own time is covered
    assert rp.pending == [later]
    assert (rp.first_pending_s, rp.last_event_s, rp.urgent_pending) == (20.0, 20.0, False)
    assert not rp.due(24.0) and rp.due(25.0) and rp.next_due_s() == 25.0
    assert rp.planned(25.0) == [later] and rp.pending == []
    assert rp.next_due_s() == 325.0


def test_an_urgent_event_left_pending_keeps_the_next_round_urgent() -> None:
    for urgent in (SchedulerEvent(EventKind.PREEMPTION, 20.0, job_id="p"), _arrival(20.0, urgent=True)):
        rp = Replanner()
        rp.observe(_arrival(10.0))
        rp.observe(urgent)
        rp.planned(15.0)
        assert rp.urgent_pending and rp.due(16.0), urgent
    rp = Replanner()
    rp.observe(SchedulerEvent(EventKind.PREEMPTION, 10.0, job_id="p"))
    rp.observe(_arrival(20.0))
    rp.planned(15.0)  # the preemption was covered; what is left is an ordinary arrival
    assert not rp.urgent_pending and not rp.due(16.0)
