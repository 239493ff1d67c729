"""Storage GB-hours: each interval is billed once, whatever the tick times, repeats and restarts."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.tenancy.storage_meter import (
    MAX_BACKFILL_INTERVALS,
    StoredResource,
    accruals,
    last_boundary_s,
    usd_per_gb_hour,
)

T0 = 1_800_000_000.0


def _run(
    resources: list[StoredResource], ticks: list[float], interval_s: float, stale: set[int]
) -> dict[str, float]:
    """A ledger (source key -> GB-hours) after ticks at the given times. The watermark is recomputed
    from the ledger at every tick (a restart keeps nothing else); a tick in ``stale`` uses the watermark
    as it was before the previous tick (a second process that read it concurrently)."""
    book: dict[str, float] = {}
    prev_mark: float | None = None
    for i, now in enumerate(ticks):
        mark = max((float(k.rsplit(":", 1)[1]) + interval_s for k in book), default=None)
        use = prev_mark if i in stale else mark
        for a in accruals(resources, after_s=use, now_s=now, interval_s=interval_s):
            book.setdefault(a.source_key, a.gb_hours)  # the unique source key refuses a second write
        prev_mark = mark
    return book


def _expected_gb_hours(r: StoredResource, until_s: float) -> float:
    end = until_s if r.removed_s is None else min(until_s, r.removed_s)
    return max(0.0, end - r.created_s) / 3600.0 * r.bytes / 1e9


resource_st = st.builds(
    lambda kind, i, size, created, life: StoredResource(
        kind, str(i), "t1", size, T0 + created, removed_s=None if life is None else T0 + created + life
    ),
    st.sampled_from(["dataset", "checkpoint", "model"]),
    st.integers(0, 10_000),
    st.integers(1, 5 * 10**9),
    st.floats(0, 20_000, allow_nan=False),
    st.one_of(st.none(), st.floats(1, 30_000, allow_nan=False)),
)


@settings(max_examples=200, deadline=None)
@given(
    resources=st.lists(resource_st, max_size=6, unique_by=lambda r: (r.kind, r.key)),
    # ticks within MAX_BACKFILL_INTERVALS of the shortest interval (744 × 60 s = 44,640 s): the backfill
    # limit on a ledger with no storage entries yet has a test of its own below
    offsets=st.lists(st.floats(0, 44_000, allow_nan=False), min_size=1, max_size=12),
    interval_s=st.sampled_from([60.0, 600.0, 3600.0]),
    stale=st.sets(st.integers(0, 11), max_size=4),
    data=st.data(),
)
def test_every_interval_is_billed_once_across_arbitrary_ticks_and_restarts(
    resources: list[StoredResource],
    offsets: list[float],
    interval_s: float,
    stale: set[int],
    data: st.DataObject,
) -> None:
    assert max(offsets) < MAX_BACKFILL_INTERVALS * 60.0  # inside the backfill window of every interval
    # ticks mostly move forward, may repeat and may go back a little (clock skew between processes)
    ticks = sorted(T0 + o for o in offsets)
    if data.draw(st.booleans()):
        ticks = [*ticks, ticks[-1], ticks[-1] - data.draw(st.floats(0, 5_000))]
    book = _run(resources, ticks, interval_s, stale)
    # everything up to the last complete interval of the latest tick is billed, nothing after it
    until = last_boundary_s(max(ticks), interval_s)
    for r in resources:
        got = sum(v for k, v in book.items() if k.startswith(f"storage:{r.kind}:{r.key}:"))
        assert math.isclose(got, _expected_gb_hours(r, until), rel_tol=1e-9, abs_tol=1e-12), (r, ticks)
    for k in book:
        start = float(k.rsplit(":", 1)[1])
        assert start + interval_s <= until


def test_a_hand_computed_day_of_a_dataset_and_a_removed_checkpoint() -> None:
    h = 3600.0
    ds = StoredResource("dataset", "1", "t1", 2 * 10**9, T0 + 0.5 * h)  # 2 GB from half past
    ck = StoredResource("checkpoint", "j:1:10", "t1", 10**9, T0, removed_s=T0 + 2.25 * h)  # 1 GB, 2.25 h
    got: dict[str, float] = {}
    for a in accruals([ds, ck], after_s=T0, now_s=T0 + 3.9 * h, interval_s=h):
        got[a.source_key] = a.gb_hours
    # three complete hours: the dataset 2 GB x 2.5 h, the checkpoint 1 GB x 2.25 h
    assert math.isclose(sum(v for k, v in got.items() if ":dataset:" in k), 5.0)
    assert math.isclose(sum(v for k, v in got.items() if ":checkpoint:" in k), 2.25)
    assert f"storage:checkpoint:j:1:10:{int(T0 + 2 * h)}" in got
    assert not any(k.endswith(str(int(T0 + 3 * h))) for k in got)  # the running hour waits
    # the default price: $0.023 per GB-month, 730 hours a month
    assert math.isclose(usd_per_gb_hour(0.023), 0.023 / 730)


def test_the_first_tick_bills_at_most_the_backfill_window() -> None:
    old = StoredResource("dataset", "1", "t1", 10**9, T0 - 10 * 365 * 86400.0)
    got = list(accruals([old], after_s=None, now_s=T0, interval_s=3600.0))
    assert len(got) == MAX_BACKFILL_INTERVALS
