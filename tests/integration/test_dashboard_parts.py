"""The dashboard's pure parts: SVG charts, tick choice, downsampling, sessions, formatting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard.errors import NotFoundError
from trainyard.services.domain import Principal
from trainyard.web import charts
from trainyard.web.rendering import fmt_duration_s, fmt_usd, safe_next, to_json_script
from trainyard.web.session import SessionStore
from trainyard.web.views import job_detail

P = Principal(tenant_id="tn-1", tenant_name="t", key_id="key-1", admin=False)


def test_chart_specs_keep_every_finite_point_as_json() -> None:
    pts = [(3.0, 1.125), (1.0, 3.5), (2.0, float("nan")), (2.5, 2.25)]
    spec = charts.line(
        "c", title="a & b", x_label="step", y_label="loss", series=[("<loss>", pts)], hlines=[("p", 2.0)]
    )
    assert spec["series"][0]["points"] == [[1.0, 3.5], [2.5, 2.25], [3.0, 1.125]]  # sorted, NaN dropped
    assert spec["hlines"] == [{"label": "p", "y": 2.0, "color": "#dc2626"}]
    empty = charts.line("c", title="t", x_label="x", y_label="y", series=[], hlines=[("p", None)])
    assert empty["hlines"] == [] and empty["series"] == []
    json.dumps(spec, allow_nan=False)  # valid JSON
    bars = charts.bars("b", title="t", unit="USD", values=[("a", 1.0), ("b", -1.0), ("c", float("inf"))])
    assert [(b["label"], b["value"]) for b in bars["bars"]] == [("a", 1.0), ("b", 0.0)]
    ci = charts.intervals(
        "i", title="t", unit="d", rows=[("loss", -0.5, -0.75, -0.25, "better"), ("x", None, None, None, "?")]
    )
    assert ci["rows"] == [
        {"label": "loss", "value": -0.5, "low": -0.75, "high": -0.25, "outcome": "better", "color": "#16a34a"}
    ]


def test_json_for_a_script_block_cannot_close_it() -> None:
    text = str(to_json_script({"label": "</script><script>alert(1)</script>", "amp": "a&b"}))
    assert "</script>" not in text and "<" not in text and "&" not in text
    assert json.loads(text) == {"label": "</script><script>alert(1)</script>", "amp": "a&b"}


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
    assert d.csrf and d.csrf != d.token and d.csrf_ok(d.csrf)
    assert not d.csrf_ok(b.csrf) and not d.csrf_ok("") and not d.csrf_ok(None)


def test_login_redirect_targets_stay_local() -> None:
    assert safe_next("/jobs/job-1?x=1") == "/jobs/job-1?x=1"
    for bad in (None, "", "https://evil.example", "//evil.example", "/\\evil.example", "javascript:alert(1)"):
        assert safe_next(bad) == "/"


def test_money_and_times_are_for_people() -> None:
    assert fmt_usd(None) == "–" and fmt_usd(0) == "$0.00" and fmt_usd(1234.5) == "$1,234"
    assert fmt_usd(0.00042) == "$0.00042" and fmt_usd(float("nan")) == "–"
    assert fmt_usd(7.82e-07) == "$0.00000078" and "e" not in fmt_usd(3.25e-7)
    assert fmt_duration_s(90) == "2 min" and fmt_duration_s(900) == "15 min"
    assert fmt_duration_s(36000) == "10.0 h" and fmt_duration_s(None) == "–" and fmt_duration_s(-5) == "0 s"


def test_events_read_as_sentences_not_reprs() -> None:
    from trainyard.web.events import describe

    tb = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom'
    ev = describe(7, "failed", {"attempt": 2, "message": tb, "exit_codes": {"0": 1}}, 1_800_000_000.0)
    assert ev.summary == "failed: Traceback (most recent call last):" and ev.text == tb
    assert ("exit_codes", '{"0": 1}') in ev.fields and ("attempt", "2") in ev.fields
    assert "{'" not in repr(ev.fields)  # JSON, not a Python repr
    hb = describe(8, "heartbeat", {"step": 20, "total_steps": 40, "loss": 2.125, "step_time_s": 0.13}, None)
    assert hb.summary == "step 20 of 40, loss 2.125, 0.13 s/step" and hb.fields == []
    placed = {
        "pool": "p",
        "devices": 2,
        "accelerator": "cpu",
        "market": "spot",
        "price_usd_per_device_hour": 7.82e-7,
    }
    pl = describe(9, "placement", placed, None)
    assert "$0.00000078 per device-hour" in pl.summary and "e-07" not in pl.summary


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
