"""Budget period keys: kept per UTC day; the period a key names holds the instant it was made from."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from trainyard.tenancy import ledger


def _formatted(period: str, time_s: float) -> str:
    t = datetime.fromtimestamp(time_s, tz=UTC)
    return t.strftime("%Y-%m") if period == "month" else t.strftime("%Y-%m-%d")


@given(
    period=st.sampled_from(ledger.PERIODS),
    time_s=st.floats(min_value=0.0, max_value=4_102_444_800.0, allow_nan=False),  # 1970 .. 2100
)
def test_period_key_names_the_period_holding_the_instant(period: str, time_s: float) -> None:
    key = ledger.period_key(period, time_s)
    start, end = ledger.period_bounds_s(period, key)
    assert start <= time_s < end
    if (time_s + 1e-6) // 86400 == time_s // 86400:  # (formatting rounds to the microsecond first)
        assert key == _formatted(period, time_s)


def test_period_key_changes_at_utc_midnight_and_month_end() -> None:
    midnight = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    assert ledger.period_key("day", midnight - 1e-3) == "2026-12-31"
    assert ledger.period_key("day", midnight) == "2027-01-01"
    assert ledger.period_key("month", midnight - 1e-3) == "2026-12"
    assert ledger.period_key("month", midnight) == "2027-01"
    start, end = ledger.period_bounds_s("month", ledger.period_key("month", midnight))
    assert start == midnight and ledger.period_key("month", end) == "2027-02"
