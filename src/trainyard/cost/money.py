"""Display formatting for money and durations. Values keep full precision everywhere else."""

from __future__ import annotations

import math


def format_usd(value: float, significant: int = 2) -> str:
    """Dollars for people: cents for amounts from $1, ``significant`` digits below ($0.00056)."""
    if not math.isfinite(value):
        return "-"
    sign = "-" if value < 0 else ""
    v = abs(value)
    if v >= 1000:
        return f"{sign}${v:,.0f}"
    if v >= 1 or v == 0:
        return f"{sign}${v:,.2f}"
    decimals = max(2, significant - 1 - math.floor(math.log10(v)))
    return f"{sign}${v:.{decimals}f}"


def format_duration_s(seconds: float) -> str:
    """``45 s``, ``15 min``, ``4.5 h``, ``3.2 d``."""
    if not math.isfinite(seconds):
        return "-"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
