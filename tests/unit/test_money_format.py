"""Money and durations as people read them (the CLI, the dashboard, the demo): worked examples at every
boundary of cost/money.py."""

from __future__ import annotations

import math

import pytest

from trainyard.cost.money import format_duration_s, format_usd


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "$0.00"),  # zero is cents, not a logarithm, and has no sign
        (-0.0, "$0.00"),
        (1.0, "$1.00"),
        (12.345, "$12.35"),
        (999.994, "$999.99"),
        (999.996, "$1,000.00"),  # still below 1000: cents, rounded up
        (1000.0, "$1,000"),  # from $1000 whole dollars, with thousands separators
        (1234.5, "$1,234"),
        (1235.5, "$1,236"),
        (1_234_567.0, "$1,234,567"),
        (0.5, "$0.50"),  # below $1: two significant digits, at least cents
        (0.1, "$0.10"),
        (0.05, "$0.050"),
        (0.0123, "$0.012"),
        (0.00056, "$0.00056"),
        (0.000123456, "$0.00012"),
        (-2.5, "-$2.50"),
        (-1500.0, "-$1,500"),
        (-0.00056, "-$0.00056"),
    ],
)
def test_dollars_are_cents_from_one_dollar_whole_dollars_from_a_thousand(value: float, text: str) -> None:
    assert format_usd(value) == text


@pytest.mark.parametrize(
    ("value", "significant", "text"),
    [
        (0.00056, 3, "$0.000560"),
        (0.123456, 4, "$0.1235"),
        (0.5, 1, "$0.50"),  # never fewer than cents
        (0.05, 1, "$0.05"),
        (12.345, 4, "$12.35"),  # from $1 the digits asked for do not matter
        (1.0, 4, "$1.00"),
        (1.5, 4, "$1.50"),
        (-0.0123, 3, "-$0.0123"),
    ],
)
def test_significant_digits_below_one_dollar(value: float, significant: int, text: str) -> None:
    assert format_usd(value, significant) == text
    assert format_usd(value, significant=significant) == text


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_money_that_is_not_a_number_is_a_dash(value: float) -> None:
    assert format_usd(value) == "-"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 s"),
        (45.0, "45 s"),
        (89.4, "89 s"),
        (89.6, "90 s"),  # still below 90 s: seconds, rounded
        (90.0, "2 min"),  # from 90 s minutes (1.5 rounds to even: 2)
        (150.0, "2 min"),
        (900.0, "15 min"),
        (5399.0, "90 min"),
        (5400.0, "1.5 h"),  # from 90 min hours, one decimal
        (16_200.0, "4.5 h"),
        (36_185.0, "10.1 h"),  # 10.0514 h: the hour is 3600 s exactly
        (3 * 86400 - 360, "71.9 h"),
        (3 * 86400.0, "3.0 d"),  # from three days days, one decimal
        (276_480.0, "3.2 d"),
        (868_325.0, "10.1 d"),  # 10.05006 d: the day is 86,400 s exactly
        (30 * 86400.0, "30.0 d"),
    ],
)
def test_durations_in_seconds_minutes_hours_and_days(seconds: float, text: str) -> None:
    assert format_duration_s(seconds) == text


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf])
def test_a_duration_that_is_not_a_number_is_a_dash(seconds: float) -> None:
    assert format_duration_s(seconds) == "-"
