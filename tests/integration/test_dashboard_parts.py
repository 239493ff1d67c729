"""The dashboard's pure parts: SVG charts, tick choice, downsampling, sessions, formatting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.errors import NotFoundError
from trainyard.services.domain import Principal
from trainyard.web import charts
from trainyard.web.routes import safe_next
from trainyard.web.session import SessionStore
from trainyard.web.views import fmt_duration_s, fmt_usd, job_detail

P = Principal(tenant_id="tn-1", tenant_name="t", key_id="key-1", admin=False)


def test_line_chart_keeps_every_point_and_escapes_labels() -> None:
    pts = [(1.0, 3.5), (2.0, 2.25), (3.0, 1.125)]
    svg = charts.line_chart(
        [charts.Series("<loss>", pts)],
        x_label="step",
        y_label="loss",
        title="a & b",
        hlines=[charts.HLine("predicted", 2.0)],
        chart_id="c",
    )
    found = [(float(x), float(y)) for x, y in re.findall(r'data-x="([^"]+)" data-y="([^"]+)"', svg)]
    assert found == pts
    assert "&lt;loss&gt;" in svg and "<loss>" not in svg and "a &amp; b" in svg
    assert 'data-y="2.0"' in svg and svg.startswith("<svg") and svg.endswith("</svg>")


def test_empty_and_degenerate_charts_render() -> None:
    assert "no data yet" in charts.line_chart([], x_label="x", y_label="y", title="t")
    assert "no data yet" in charts.line_chart([charts.Series("s", [])], x_label="x", y_label="y", title="t")
    one = charts.line_chart([charts.Series("s", [(5, 5)])], x_label="x", y_label="y", title="t")
    assert 'data-x="5.0"' in one and "nan" not in one
    nan = charts.line_chart(
        [charts.Series("s", [(1, float("nan")), (2, 1)])], x_label="x", y_label="y", title="t"
    )
    assert "nan" not in nan.lower().replace("no data", "")
    assert "no data yet" in charts.bar_chart([], title="t", unit="u")
    bars = charts.bar_chart([("a", 1.0), ("b", 0.0)], title="t", unit="USD")
    assert 'data-label="a" data-value="1.0"' in bars and 'data-label="b" data-value="0.0"' in bars


@settings(max_examples=80, deadline=None)
@given(lo=st.floats(-1e6, 1e6), span=st.floats(1e-6, 1e6), n=st.integers(2, 10))
def test_nice_ticks_cover_the_range_with_round_steps(lo: float, span: float, n: int) -> None:
    hi = lo + span
    ticks = charts.nice_ticks(lo, hi, n)
    assert ticks and all(lo - 1e-9 * max(1, abs(lo)) <= t <= hi + 1e-9 * max(1, abs(hi)) for t in ticks)
    assert ticks == sorted(ticks) and len(ticks) <= 4 * n + 2


@given(n=st.integers(0, 3000), cap=st.integers(2, 700))
def test_downsample_keeps_ends_and_bounds_size(n: int, cap: int) -> None:
    pts = [(float(i), float(i * i)) for i in range(n)]
    out = charts.downsample(pts, cap)
    assert len(out) == min(n, cap)
    if n:
        assert out[0] == pts[0] and out[-1] == pts[-1]
        assert out == sorted(out)


def test_sessions_expire_and_close() -> None:
    now = [1000.0]
    store = SessionStore(ttl_s=60, max_sessions=2, clock=lambda: now[0])
    a = store.open(P)
    assert store.get(a.token) == a and store.get(None) is None and store.get("nope") is None
    now[0] += 61
    assert store.get(a.token) is None
    b, c, d = store.open(P), store.open(P), store.open(P)
    assert (
        store.get(b.token) is None and store.get(c.token) == c and store.get(d.token) == d
    )  # oldest evicted
    store.close(c.token)
    assert store.get(c.token) is None and len(store) == 1


def test_login_redirect_targets_stay_local() -> None:
    assert safe_next("/jobs/job-1?x=1") == "/jobs/job-1?x=1"
    for bad in (None, "", "https://evil.example", "//evil.example", "/\\evil.example", "javascript:alert(1)"):
        assert safe_next(bad) == "/"


def test_formatting() -> None:
    assert fmt_usd(None) == "–" and fmt_usd(0) == "$0" and fmt_usd(1234.5) == "$1,234.50"
    assert fmt_usd(0.00042) == "$0.00042" and fmt_usd(float("nan")) == "–" and fmt_usd(3.25e-7) == "$3.25e-07"
    assert fmt_duration_s(0.25) == "250 ms" and fmt_duration_s(90) == "90.0 s"
    assert (
        fmt_duration_s(900) == "15.0 min"
        and fmt_duration_s(36000) == "10.0 h"
        and fmt_duration_s(None) == "–"
    )


def test_job_detail_reads_all_events_of_a_long_job(tmp_path: Path) -> None:
    from controlplane_support import tiny_spec
    from trainyard.services.platform import Platform, PlatformOptions
    from trainyard.settings import Settings
    from trainyard.spec.loader import spec_from_dict
    from trainyard.store.repositories import EventRepo

    p = Platform.open(Settings(home=tmp_path), PlatformOptions(with_catalog=False, cpu_count=1))
    try:
        admin = p.tenants.authenticate(p.settings.api_key_path.read_text().strip())
        job, _ = p.jobs.submit(admin, spec_from_dict(tiny_spec("long")))
        n = 5_500  # more than one page of the events API (5,000)
        with p.db.session() as s:
            repo = EventRepo(s)
            for i in range(n):
                repo.append(
                    job.id, "heartbeat", {"attempt": 1, "step": i + 1, "loss": 1.0 / (i + 1)}, float(i)
                )
        d = job_detail(p, admin, job.id, now_s=1e6)
        assert len(d.events) == n + 1  # the submission's state event too
        assert len(d.loss_by_attempt[1]) == n and d.loss_by_attempt[1][-1] == (float(n), 1.0 / n)
        _, other_key = p.tenants.create("other")
        other = p.tenants.authenticate(other_key)
        with pytest.raises(NotFoundError):
            job_detail(p, other, job.id, now_s=1e6)
        with pytest.raises(NotFoundError):
            job_detail(p, admin, "x" * 65, now_s=1e6)
    finally:
        p.close()


def test_job_page_compares_with_the_prediction_for_the_pool_the_job_is_on(tmp_path: Path) -> None:
    """A placement outside the stored quote's best options is priced again on its own pool, never
    compared with another pool's prediction; the measured side is the latest attempt's steps."""
    from dataclasses import replace

    from controlplane_support import tiny_spec
    from trainyard.cost.quote import option_for
    from trainyard.services.domain import Placement
    from trainyard.services.platform import Platform, PlatformOptions
    from trainyard.settings import Settings
    from trainyard.spec.loader import spec_from_dict
    from trainyard.web.views import _predicted

    p = Platform.open(Settings(home=tmp_path), PlatformOptions(with_catalog=False, cpu_count=1))
    try:
        admin = p.tenants.authenticate(p.settings.api_key_path.read_text().strip())
        spec = spec_from_dict(tiny_spec("placed"))
        job, _ = p.jobs.submit(admin, spec)
        pool = next(q for q in p.pools.pools() if q.name == "local-cpu")
        other = {"pool": "elsewhere", "devices": 1, "feasible": True, "step_time_s": 123.0}
        placed = replace(
            job,
            quote=[other],
            placement=Placement(pool=pool.name, devices=1, market="on_demand", accelerator="cpu",
                                price_usd_per_device_hour=0.0),
        )  # fmt: skip
        st_s, source, doc = _predicted(placed, p)
        want = option_for(spec, pool.model_copy(update={"available_devices": None}), 1).step_time_s
        assert st_s == pytest.approx(want) and st_s != 123.0
        assert "local-cpu × 1" in source and doc is not None and doc["pool"] == "local-cpu"
        gone = replace(placed, placement=replace(placed.placement, pool="no-such-pool"))
        assert _predicted(gone, p)[0] is None  # no prediction rather than another pool's
        queued = replace(placed, placement=None)
        assert _predicted(queued, p)[0] == 123.0  # before placement: the best quoted option
    finally:
        p.close()
