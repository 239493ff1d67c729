"""Charts as inline SVG, drawn on the server (no JavaScript, no external libraries).

Every function is pure: data in, an SVG string out. Each plotted point keeps its values in
``data-x``/``data-y`` attributes and a ``<title>`` tooltip, so the numbers stay readable by tools
and by people hovering over the chart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d")
MAX_MARKERS = 400  # above this many points a series is drawn as a line only


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    color: str | None = None
    markers: bool = True


@dataclass(frozen=True)
class HLine:
    label: str
    y: float
    color: str = "#6b7280"


@dataclass(frozen=True)
class ChartStyle:
    width_px: int = 720
    height_px: int = 280
    margin_left_px: int = 64
    margin_right_px: int = 16
    margin_top_px: int = 16
    margin_bottom_px: int = 44
    ticks: int = 5
    extra_class: str = field(default="")


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.2e}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.3g}"
    return f"{v:.3g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi] (1, 2, 5 × 10^k steps)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    out: list[float] = []
    v = start
    while v <= hi + step * 1e-9 and len(out) < 50:
        out.append(round(v, 12))
        v += step
    return out


def _extent(values: Sequence[float], pad_fraction: float = 0.05) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi == lo:
        span = abs(hi) * 0.1 or 1.0
        return lo - span, hi + span
    pad = (hi - lo) * pad_fraction
    return lo - pad, hi + pad


def line_chart(
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    title: str,
    hlines: Sequence[HLine] = (),
    style: ChartStyle | None = None,
    chart_id: str = "chart",
) -> str:
    """A line chart with markers. Series without points are skipped; no data gives an empty frame with a
    'no data yet' note."""
    st = style or ChartStyle()
    w, h = st.width_px, st.height_px
    x0, x1 = st.margin_left_px, w - st.margin_right_px
    y0, y1 = h - st.margin_bottom_px, st.margin_top_px
    pts = [(float(x), float(y)) for s in series for x, y in s.points if math.isfinite(x) and math.isfinite(y)]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {escape(st.extra_class)}"'
        f' id="{escape(chart_id)}"'
        f' viewBox="0 0 {w} {h}" width="100%" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" class="plot-bg"/>',
    ]
    if not pts:
        parts.append(
            f'<text x="{(x0 + x1) / 2}" y="{(y0 + y1) / 2}" text-anchor="middle" class="no-data">'
            "no data yet</text></svg>"
        )
        return "".join(parts)
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts] + [hl.y for hl in hlines if math.isfinite(hl.y)]
    xlo, xhi = (min(xs), max(xs)) if max(xs) > min(xs) else (min(xs) - 1, max(xs) + 1)
    ylo, yhi = _extent(ys)
    if min(ys) >= 0 and ylo < 0:
        ylo = 0.0

    def sx(x: float) -> float:
        return x0 + (x - xlo) / (xhi - xlo) * (x1 - x0)

    def sy(y: float) -> float:
        return y0 - (y - ylo) / (yhi - ylo) * (y0 - y1)

    for t in nice_ticks(ylo, yhi, st.ticks):
        yy = sy(t)
        parts.append(f'<line x1="{x0}" x2="{x1}" y1="{yy:.1f}" y2="{yy:.1f}" class="grid"/>')
        parts.append(f'<text x="{x0 - 6}" y="{yy + 4:.1f}" text-anchor="end" class="tick">{_fmt(t)}</text>')
    for t in nice_ticks(xlo, xhi, st.ticks):
        xx = sx(t)
        parts.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{y0}" y2="{y0 + 4}" class="axis"/>')
        parts.append(f'<text x="{xx:.1f}" y="{y0 + 16}" text-anchor="middle" class="tick">{_fmt(t)}</text>')
    parts.append(f'<line x1="{x0}" x2="{x1}" y1="{y0}" y2="{y0}" class="axis"/>')
    parts.append(f'<line x1="{x0}" x2="{x0}" y1="{y0}" y2="{y1}" class="axis"/>')
    parts.append(
        f'<text x="{(x0 + x1) / 2}" y="{h - 6}" text-anchor="middle" class="axis-label">'
        f"{escape(x_label)}</text>"
    )
    parts.append(
        f'<text x="14" y="{(y0 + y1) / 2}" text-anchor="middle" class="axis-label"'
        f' transform="rotate(-90 14 {(y0 + y1) / 2})">{escape(y_label)}</text>'
    )
    for hl in hlines:
        if not math.isfinite(hl.y):
            continue
        yy = sy(hl.y)
        parts.append(
            f'<line x1="{x0}" x2="{x1}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="{escape(hl.color)}"'
            f' class="hline" data-y="{hl.y!r}"><title>{escape(hl.label)}: {_fmt(hl.y)}</title></line>'
        )
        parts.append(
            f'<text x="{x1 - 4}" y="{yy - 4:.1f}" text-anchor="end" class="hline-label"'
            f' fill="{escape(hl.color)}">{escape(hl.label)} {_fmt(hl.y)}</text>'
        )
    legend_x = x0 + 8
    for i, s in enumerate(series):
        good = sorted(
            (float(x), float(y)) for x, y in s.points if math.isfinite(float(x)) and math.isfinite(float(y))
        )
        if not good:
            continue
        color = s.color or PALETTE[i % len(PALETTE)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in good)
        parts.append(
            f'<g class="series" data-label="{escape(s.label)}">'
            f'<polyline points="{path}" fill="none" stroke="{escape(color)}" stroke-width="2"/>'
        )
        if s.markers and len(good) <= MAX_MARKERS:
            for x, y in good:
                parts.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{escape(color)}"'
                    f' data-x="{x!r}" data-y="{y!r}">'
                    f"<title>{escape(x_label)} {_fmt(x)}: {_fmt(y)}</title></circle>"
                )
        parts.append("</g>")
        parts.append(
            f'<rect x="{legend_x}" y="{y1 + 6}" width="10" height="10" fill="{escape(color)}"/>'
            f'<text x="{legend_x + 14}" y="{y1 + 15}" class="legend">{escape(s.label)}</text>'
        )
        legend_x += 24 + 7 * len(s.label)
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(
    bars: Sequence[tuple[str, float]],
    *,
    title: str,
    unit: str,
    style: ChartStyle | None = None,
    chart_id: str = "bars",
    colors: Sequence[str] = PALETTE,
) -> str:
    """Horizontal bars, one per (label, value); values must be ≥ 0."""
    st = style or ChartStyle(height_px=max(60, 28 * len(bars) + 24), margin_left_px=160)
    w = st.width_px
    x0, x1 = st.margin_left_px, w - st.margin_right_px - 90
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart bars" id="{escape(chart_id)}"'
        f' viewBox="0 0 {w} {st.height_px}" width="100%" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    if not bars:
        parts.append(
            f'<text x="{w / 2}" y="30" text-anchor="middle" class="no-data">no data yet</text></svg>'
        )
        return "".join(parts)
    top = max(max(v for _, v in bars), 1e-12)
    for i, (label, value) in enumerate(bars):
        y = 12 + 28 * i
        bw = max(0.0, value) / top * (x1 - x0)
        color = colors[i % len(colors)]
        parts.append(
            f'<text x="{x0 - 8}" y="{y + 14}" text-anchor="end" class="tick">{escape(label)}</text>'
            f'<rect x="{x0}" y="{y}" width="{bw:.1f}" height="18" fill="{escape(color)}"'
            f' data-label="{escape(label)}" data-value="{value!r}"><title>{escape(label)}: {_fmt(value)} '
            f"{escape(unit)}</title></rect>"
            f'<text x="{x0 + bw + 6:.1f}" y="{y + 14}" class="tick">{_fmt(value)} {escape(unit)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def downsample(points: Sequence[tuple[float, float]], max_points: int = 600) -> list[tuple[float, float]]:
    """Keep at most ``max_points`` points, evenly spread, always including the first and the last."""
    n = len(points)
    if n <= max_points:
        return list(points)
    stride = (n - 1) / (max_points - 1)
    return [points[round(i * stride)] for i in range(max_points)]
