"""The dashboard against a real SQLite store: jobs submitted through the API, worker reports (started,
heartbeats, checkpoints, preemption) fed through the real supervisor by the scripted executor, pages
rendered by the real app. Login/logout, tenant isolation, friendly 404s, /metrics and traces."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane_support import ScriptedPlatform, tiny_spec
from trainyard.web.session import COOKIE_NAME

PRICE_USD_PER_DEVICE_HOUR = 3.6  # $0.001 per device-second


class Env(ScriptedPlatform):
    def __init__(self, home: Path, **settings: Any) -> None:
        super().__init__(home, price_usd_per_device_hour=PRICE_USD_PER_DEVICE_HOUR, **settings)

    def checkpoint_url(self, job_id: str, step: int, *, committed: bool = True) -> str:
        """A step directory in the tenant's checkpoint area; with a manifest when ``committed``."""
        area = self.p.storage_policy.area("default", "checkpoints")
        d = Path(area.removeprefix("file://")) / job_id / f"step-{step}"
        d.mkdir(parents=True, exist_ok=True)
        if committed:
            (d / "manifest.json").write_text(json.dumps({"step": step}))
        return f"{area}/{job_id}/step-{step}"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.p.close()


HEARTBEATS = [(5, 3.25, 0.11), (10, 2.75, 0.12), (15, 2.5, 0.1), (20, 2.125, 0.13)]


def run_job(e: Env, name: str = "dash", preempt: bool = False, **workload: Any) -> str:
    """Submit, place, start, report heartbeats every 10 s (event time) and one checkpoint."""
    jid = e.submit(tiny_spec(name, **workload))
    e.p.tick()  # admit, place, launch
    e.clock.now += 4  # four seconds of start-up before the workers report
    e.event(jid, "started", {"rank": 0, "pid": 4242, "host": "fakehost", "resumed_from_step": 0})
    for i, (step, loss, st) in enumerate(HEARTBEATS):
        e.clock.now += 10
        e.event(
            jid, "heartbeat", {"rank": 0, "step": step, "loss": loss, "step_time_s": st, "total_steps": 40}
        )
        if i == 0:  # written, then removed by retention: its manifest is gone
            e.event(jid, "checkpoint", {"step": step, "path": e.checkpoint_url(jid, step, committed=False)})
        if i == 1:
            e.event(jid, "checkpoint", {"step": step, "path": e.checkpoint_url(jid, step), "stall_s": 2.0})
    e.p.tick()
    if preempt:
        e.clock.now += 6
        e.event(jid, "preempted", {"step": 20, "checkpoint_step": 10, "lost_steps": 10})
        e.p.tick()
    return jid


def chart(html: str, chart_id: str) -> dict[str, Any]:
    """The JSON spec the page hands to charts.js for ``chart_id``."""
    m = re.search(rf'<script type="application/json" id="{chart_id}-data">(.*?)</script>', html, re.S)
    assert m, f"no {chart_id} in page"
    assert f'data-chart="{chart_id}-data"' in html
    doc: dict[str, Any] = json.loads(m.group(1))
    return doc


def points(spec: dict[str, Any], series: int = 0) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in spec["series"][series]["points"]]


def csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF token in the page"
    return m.group(1)


def test_pages_need_login_and_render_on_an_empty_database(env: Env) -> None:
    c = env.client()
    for path in ("/", "/pools", "/quote", "/jobs/job-000000000000"):
        r = c.get(path, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login?next="), path
    b = env.browser()
    r = b.get("/")
    assert r.status_code == 200 and "No jobs yet" in r.text
    assert 'data-state="running"' in r.text and chart(r.text, "state-counts")["bars"] == []
    assert 'http-equiv="refresh"' not in r.text  # no full-page reloads
    r = b.get("/pools")
    assert r.status_code == 200 and "local-cpu" in r.text
    r = b.get("/quote")
    assert r.status_code == 200 and "<textarea" in r.text
    assert b.get("/static/style.css").status_code == 200
    assert b.get("/static/quote.js").status_code == 200
    for asset in (
        "charts.js",
        "job.js",
        "forms.js",
        "vendor/uplot/uPlot.iife.min.js",
        "vendor/uplot/LICENSE",
    ):
        assert b.get(f"/static/{asset}").status_code == 200, asset
    for path in ("/datasets", "/models", "/evaluations", "/deployments", "/usage"):
        r = b.get(path)
        assert r.status_code == 200 and '<script src="https://' not in r.text, path


def test_login_cookie_is_httponly_strict_and_logout_ends_the_session(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    c = env.client()
    r = c.post("/login", data={"api_key": "ty_not_a_key", "next": "/"}, follow_redirects=False)
    assert r.status_code == 401 and "not valid" in r.text and "set-cookie" not in r.headers
    r = c.post("/login", data={"api_key": env.key, "next": "//evil.example/x"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"  # no open redirect
    cookie = r.headers["set-cookie"]
    assert (
        cookie.startswith(f"{COOKIE_NAME}=") and "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
    )
    assert env.key not in cookie  # the cookie holds a session token, not the key
    page = c.get("/")
    assert page.status_code == 200 and "tenant <strong>default</strong>" in page.text
    assert c.get("/login", follow_redirects=False).status_code == 303  # already logged in
    assert c.post("/logout", follow_redirects=False).status_code == 403  # no CSRF token: still logged in
    r = c.post("/logout", data={"csrf": csrf(page.text)}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    c.cookies.clear()
    c.cookies.set(COOKIE_NAME, cookie.split(";")[0].split("=", 1)[1])  # replaying the old token fails
    assert c.get("/", follow_redirects=False).status_code == 303
    out = capsys.readouterr()
    assert env.key not in out.out + out.err


def test_job_page_plots_heartbeats_against_the_prediction(env: Env) -> None:
    jid = run_job(env)
    b = env.browser()
    r = b.get(f"/jobs/{jid}")
    assert r.status_code == 200, r.text
    html = r.text
    loss = points(chart(html, "loss-chart"))
    assert loss == [(float(s), loss_) for s, loss_, _ in HEARTBEATS]
    step = chart(html, "step-time-chart")
    assert points(step) == [(float(s), st) for s, _, st in HEARTBEATS]
    job = env.client().get(f"/v1/jobs/{jid}", headers=env.h).json()
    placed = job["placement"]
    predicted = next(
        o["step_time_s"]
        for o in job["quote"]
        if o["pool"] == placed["pool"] and o["devices"] == placed["devices"]
    )
    assert step["hlines"][0]["label"] == "predicted"
    assert step["hlines"][0]["y"] == pytest.approx(predicted)
    assert f"{jid}/step-10</td>" in html  # the checkpoint that exists
    assert f"{jid}/step-5</td>" not in html and "1 of 2 written" in html  # the one retention removed
    assert "fakehost" in html and "4242" in html  # workers
    assert "ev-heartbeat" in html and "ev-checkpoint" in html and "ev-placement" in html  # event log
    assert "20/40" in html  # progress from the heartbeats


def test_preempted_attempt_cost_breakdown(env: Env) -> None:
    jid = run_job(env, "preempt-me", preempt=True)
    b = env.browser()
    html = b.get(f"/jobs/{jid}").text
    bars = {b["label"]: b["value"] for b in chart(html, "cost-chart")["bars"]}
    devices = env.ex.launches[0].world_size
    rate = devices * PRICE_USD_PER_DEVICE_HOUR / 3600.0
    # attempt 1: placed at t0, started at +4, checkpoint at +24 (stall 2 s), preempted at +50
    assert float(bars["start-up"]) == pytest.approx(4 * rate)
    assert float(bars["checkpoints"]) == pytest.approx(2 * rate)
    assert float(bars["lost work"]) == pytest.approx(26 * rate)
    assert float(bars["compute"]) == pytest.approx((50 - 4 - 2 - 26) * rate)
    assert "preempted" in html
    doc = env.client().get(f"/v1/jobs/{jid}", headers=env.h).json()
    assert sum(float(v) for v in bars.values()) == pytest.approx(doc["cost_usd"], abs=1e-5)


def test_overview_counts_and_rows(env: Env) -> None:
    running = run_job(env, "runs")
    queued = env.submit(tiny_spec("waits"))
    b = env.browser()
    html = b.get("/").text
    assert running in html and queued in html
    assert re.search(r'data-state="running"><span class="n">1</span>', html)
    assert re.search(r'data-state="pending"><span class="n">1</span>', html)
    assert "local-cpu" in html
    only = b.get("/?state=running").text
    assert running in only and queued not in only
    assert b.get("/?cursor=not-a-cursor").status_code == 422  # friendly page, not a 500


def test_tenants_see_only_their_own_jobs(env: Env) -> None:
    _, other_key = env.p.tenants.create("other")
    mine = run_job(env, "mine")
    theirs = env.submit(tiny_spec("theirs"), key=other_key)
    other = env.browser(other_key)
    r = other.get(f"/jobs/{mine}")
    assert r.status_code == 404 and "There is no job" in r.text and "mine" not in r.text.split("<main>")[1]
    home = other.get("/").text
    assert theirs in home and mine not in home
    me = env.browser()
    assert me.get(f"/jobs/{theirs}").status_code == 404
    assert theirs not in me.get("/").text


@pytest.mark.parametrize("bad", ["x" * 300, "%00", "job-%F0%9F%92%A5", "..%2F..%2Fetc", "job-'<script>"])
def test_bad_job_ids_get_a_friendly_404(env: Env, bad: str) -> None:
    r = env.browser().get(f"/jobs/{bad}")
    assert r.status_code == 404 and "text/html" in r.headers["content-type"]
    assert "<script>" not in r.text


def test_quote_page_ranks_options_and_explains_bad_specs(env: Env) -> None:
    import yaml

    b = env.browser()
    token = csrf(b.get("/quote").text)
    r = b.post("/quote", data={"spec": yaml.safe_dump(tiny_spec("q"))})
    assert r.status_code == 403  # no CSRF token
    r = b.post("/quote", data={"spec": yaml.safe_dump(tiny_spec("q")), "csrf": token})
    assert r.status_code == 200, r.text
    assert "local-cpu" in r.text and "feasible options" in r.text
    bad = tiny_spec("q")
    bad["workload"] = {**bad["workload"], "seq_len": -1}
    r = b.post("/quote", data={"spec": yaml.safe_dump(bad), "csrf": token})
    assert r.status_code == 422 and "workload.seq_len" in r.text
    r = b.post("/quote", data={"spec": "{not yaml: [", "csrf": token})
    assert r.status_code == 422


def test_quote_form_refuses_a_yaml_alias_bomb(env: Env) -> None:
    bomb = (
        "a: &a ["
        + ",".join(["lol"] * 9)
        + "]\n"
        + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)
        )
    )
    b = env.browser()
    r = b.post("/quote", data={"spec": bomb, "csrf": csrf(b.get("/quote").text)})
    assert r.status_code == 422 and "anchors and aliases" in r.text


def test_metrics_expose_jobs_scheduler_pools_and_alerts(env: Env) -> None:
    budget = tiny_spec("burns")
    budget["objective"] = {"budget_usd": 0.5}
    jid = env.submit(budget)
    env.p.tick()
    env.event(jid, "started", {"rank": 0, "pid": 1, "host": "fakehost"})
    env.p.tick()
    env.clock.now += 3600  # an hour at $3.60/device-hour: far over the $0.50 budget, and no heartbeat
    text = env.client().get("/metrics", headers={"Authorization": f"Bearer {env.key}"}).text
    assert re.search(r'trainyard_tenant_jobs\{state="running",tenant="default"\} 1\.0', text)
    assert re.search(r"trainyard_scheduler_rounds_total [1-9]", text)
    assert re.search(r"trainyard_scheduler_placements_total 1\.0", text)
    assert re.search(r'trainyard_executor_launches_total\{outcome="ok"\} 1\.0', text)
    assert re.search(r'trainyard_pool_devices\{kind="in_use",pool="local-cpu"\} [1-9]', text)
    assert re.search(r'trainyard_alerts_firing\{rule="budget_burn",severity="critical"\} 1\.0', text)
    assert re.search(r'trainyard_alerts_firing\{rule="heartbeat_missed",severity="critical"\} 1\.0', text)
    assert re.search(
        rf'trainyard_job_last_report_age_seconds\{{job_id="{jid}",tenant="default"\}} 3600', text
    )
    html = env.browser().get("/").text
    assert "budget_burn" in html and "heartbeat_missed" in html


def test_requests_rounds_and_launches_are_traced(env: Env) -> None:
    jid = run_job(env, "traced")
    env.browser().get(f"/jobs/{jid}")
    buf = env.app.state.trace_buffer
    names = {s.name for s in buf.spans()}
    assert {"scheduler.round", "executor.launch", "GET /jobs/{job_id:path}", "POST /v1/jobs"} <= names
    launch = buf.spans("executor.launch")[0]
    assert launch.attributes["trainyard.job_id"] == jid
    rnd = buf.spans("scheduler.round")[0]
    assert rnd.attributes["trainyard.placed"] == 1
    req = buf.spans("POST /v1/jobs")[0]
    assert (
        req.attributes["http.response.status_code"] == 201 and req.attributes["trainyard.tenant"] == "default"
    )
    for s in buf.spans():
        assert env.key not in repr(dict(s.attributes or {}))


def test_trainyard_up_serves_the_dashboard(tmp_path: Path) -> None:
    import httpx

    from controlplane_support import ServerProcess

    server = ServerProcess(tmp_path / "home", executor="none").start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            r = c.get("/")
            assert r.status_code == 303 and r.headers["location"].startswith("/login")
            r = c.post("/login", data={"api_key": server.api_key, "next": "/pools"})
            assert r.status_code == 303 and r.headers["location"] == "/pools"
            pools = c.get("/pools")
            assert pools.status_code == 200 and "local-cpu" in pools.text
            assert "default-src 'self'" in pools.headers["content-security-policy"]
            assert c.get("/").status_code == 200
            admin = {"Authorization": f"Bearer {server.api_key}"}
            assert "trainyard_scheduler_queue_depth" in c.get("/metrics", headers=admin).text
        assert server.api_key not in server.log_text()
    finally:
        assert server.stop() == 0


def test_traces_page_is_for_admins(env: Env) -> None:
    jid = run_job(env, "traced-page")
    admin = env.browser()
    admin.get(f"/jobs/{jid}")
    html = admin.get("/traces").text
    assert "scheduler.round" in html and "executor.launch" in html and jid in html
    _, other_key = env.p.tenants.create("plain")
    r = env.browser(other_key).get("/traces")
    assert r.status_code == 404 and "scheduler.round" not in r.text


def test_the_webhooks_page_lists_the_tenants_webhooks_and_their_deliveries(tmp_path: Path) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Failing(BaseHTTPRequestHandler):  # a receiver on 127.0.0.1 that answers 500: a pending retry
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
    e = Env(tmp_path, webhook_allowed_networks="127.0.0.1/32", webhook_backoff_initial_s=60.0)
    try:
        api = e.client()
        _, other_key = e.p.tenants.create("other")
        mine = api.post("/v1/webhooks", json={"url": url}, headers=e.h).json()["id"]
        theirs = api.post(
            "/v1/webhooks", json={"url": url + "/theirs"}, headers={"Authorization": f"Bearer {other_key}"}
        ).json()["id"]
        assert api.post(f"/v1/webhooks/{mine}/test", headers=e.h).status_code == 200
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ds = api.get("/v1/webhooks/deliveries", headers=e.h).json()["deliveries"]
            if ds and ds[0]["attempts"] == 1:
                break
            time.sleep(0.1)
        me = e.browser()
        html = me.get("/webhooks").text
        assert mine in html and url in html and theirs not in html
        rows = html.split('id="deliveries"')[1]
        assert ds[0]["id"] in rows and "webhook_test" in rows and "HTTP 500" in rows and "1 / 5" in rows
        assert "pending" in rows and " UTC" in rows
        one = me.get(f"/webhooks/{mine}")
        assert one.status_code == 200 and ds[0]["id"] in one.text
        # another tenant's webhook is the same 404 page as a missing one
        r = me.get(f"/webhooks/{theirs}")
        assert r.status_code == 404 and "There is no webhook" in r.text and url + "/theirs" not in r.text
        other = e.browser(other_key)
        assert other.get(f"/webhooks/{mine}").status_code == 404
        page = other.get("/webhooks").text
        assert theirs in page and mine not in page and ds[0]["id"] not in page
    finally:
        e.p.close()
        receiver.shutdown()
        receiver.server_close()
