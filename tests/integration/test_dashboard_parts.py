"""The dashboard's pure parts: SVG charts, tick choice, downsampling, sessions, formatting."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.errors import NotFoundError
from trainyard.services.domain import Job, JobEvent, Principal
from trainyard.services.lifecycle import JobState
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
    assert fmt_usd(0.00042) == "$0.00042" and fmt_usd(float("nan")) == "–"
    assert fmt_duration_s(0.25) == "250 ms" and fmt_duration_s(90) == "90.0 s"
    assert (
        fmt_duration_s(900) == "15.0 min"
        and fmt_duration_s(36000) == "10.0 h"
        and fmt_duration_s(None) == "–"
    )


class PagedJobs:
    """A job service over a fixed event list, paging like the real one (at most `limit` per call)."""

    def __init__(self, job: Job, events: list[JobEvent]) -> None:
        self.job, self.all = job, events
        self.calls = 0

    def get(self, principal: Principal, job_id: str) -> Job:
        if job_id != self.job.id or principal.tenant_id != self.job.tenant_id:
            raise NotFoundError(f"no job {job_id!r}")
        return self.job

    def events(
        self, principal: Principal, job_id: str, *, after_id: int = 0, limit: int = 1000
    ) -> list[JobEvent]:
        self.calls += 1
        return [e for e in self.all if e.id > after_id][: min(limit, 5000)]


def test_job_detail_reads_every_event_page() -> None:
    job = Job(
        id="job-1",
        seq=1,
        tenant_id="tn-1",
        name="long",
        state=JobState.SUCCEEDED,
        spec={"workload": {"steps": 12_000}},
        created_at_s=0.0,
        updated_at_s=0.0,
        attempt=1,
    )
    events = [
        JobEvent(i + 1, "job-1", "heartbeat", {"attempt": 1, "step": i + 1, "loss": 1.0 / (i + 1)}, float(i))
        for i in range(12_001)
    ]
    jobs = PagedJobs(job, events)
    d = job_detail(SimpleNamespace(jobs=jobs), P, "job-1", now_s=1e6)
    assert len(d.events) == 12_001 and jobs.calls == 3
    assert d.loss_by_attempt[1][-1] == (12_001.0, 1.0 / 12_001)
    other = Principal(tenant_id="tn-2", tenant_name="o", key_id="k", admin=False)
    with pytest.raises(NotFoundError):
        job_detail(SimpleNamespace(jobs=jobs), other, "job-1", now_s=1e6)
    with pytest.raises(NotFoundError):
        job_detail(SimpleNamespace(jobs=jobs), P, "x" * 65, now_s=1e6)
