"""Chart specifications for the dashboard: plain JSON documents that ``static/charts.js`` draws with the
vendored uPlot library (``static/vendor/uplot``), in the browser, from the same page or from a polled
JSON endpoint.

Every function is pure: data in, a dict out. Non-finite values are dropped, so the documents are valid
JSON. A spec keeps every plotted value, so tests and tools can read the numbers a chart shows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d")
MAX_POINTS = 2000  # per series on a page; the live endpoint pages the rest


def _finite(*vs: Any) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in vs)


def points(pts: Iterable[tuple[float, float]]) -> list[list[float]]:
    """Finite (x, y) pairs as JSON arrays, sorted by x."""
    return sorted([float(x), float(y)] for x, y in pts if _finite(x, y))


def line(
    chart_id: str,
    *,
    title: str,
    x_label: str,
    y_label: str,
    series: Sequence[tuple[str, Iterable[tuple[float, float]]]],
    hlines: Sequence[tuple[str, float | None]] = (),
    y_unit: str = "",
) -> dict[str, Any]:
    """A line chart: one line per (label, points); ``hlines`` are dashed reference levels."""
    return {
        "id": chart_id,
        "kind": "line",
        "title": title,
        "x_label": x_label,
        "y_label": y_label,
        "y_unit": y_unit,
        "series": [
            {"label": label, "color": PALETTE[i % len(PALETTE)], "points": points(pts)}
            for i, (label, pts) in enumerate(series)
        ],
        "hlines": [
            {"label": label, "y": float(y), "color": "#dc2626"}
            for label, y in hlines
            if y is not None and _finite(y)
        ],
    }


def bars(
    chart_id: str,
    *,
    title: str,
    unit: str,
    values: Sequence[tuple[str, float]],
    colors: Sequence[str] = PALETTE,
) -> dict[str, Any]:
    """Vertical bars, one per (label, value ≥ 0)."""
    kept = [(label, float(v)) for label, v in values if _finite(v)]
    return {
        "id": chart_id,
        "kind": "bars",
        "title": title,
        "unit": unit,
        "bars": [
            {"label": label, "value": max(0.0, v), "color": colors[i % len(colors)]}
            for i, (label, v) in enumerate(kept)
        ],
    }


def intervals(
    chart_id: str,
    *,
    title: str,
    unit: str,
    rows: Sequence[tuple[str, float | None, float | None, float | None, str]],
) -> dict[str, Any]:
    """Estimates with their 95 % intervals: (label, value, low, high, outcome) per row; a zero line marks
    'no difference'. ``outcome`` (better | worse | inconclusive) colours the row."""
    colors = {"better": "#16a34a", "worse": "#dc2626"}
    out: list[dict[str, Any]] = []
    for label, v, lo, hi, outcome in rows:
        if v is None or not _finite(v):
            continue
        row: dict[str, Any] = {
            "label": label,
            "value": float(v),
            "outcome": outcome,
            "color": colors.get(outcome, "#6b7280"),
        }
        if lo is not None and hi is not None and _finite(lo, hi):
            row["low"], row["high"] = float(min(lo, hi)), float(max(lo, hi))
        out.append(row)
    return {"id": chart_id, "kind": "intervals", "title": title, "unit": unit, "rows": out}


def downsample(pts: Sequence[tuple[float, float]], max_points: int = MAX_POINTS) -> list[tuple[float, float]]:
    """Keep at most ``max_points`` points, evenly spread, always including the first and the last."""
    n = len(pts)
    if n <= max_points:
        return list(pts)
    stride = (n - 1) / (max_points - 1)
    return [pts[round(i * stride)] for i in range(max_points)]
