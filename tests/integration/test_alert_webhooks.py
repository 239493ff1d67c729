"""Alerts delivered to webhooks, against real HTTP receivers on 127.0.0.1 and a real tiny CPU job: a
diverging loss and the tenant's budget thresholds reach the tenant's webhook, signed with its secret;
a receiver that fails the first attempts gets retries with backoff, each attempt a job event; another
tenant's webhook never sees them. Stalled jobs, checkpoint failures and deployment error rates fire
from what the store holds."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.trace import SpanKind

from controlplane_support import WebhookReceiver, in_process_platform, tiny_spec, wait_until
from trainyard.executors.base import ExecutorEvent
from trainyard.observability.webhooks import SIGNATURE_HEADER, verify_signature
from trainyard.services.platform import Platform
from trainyard.settings import Settings

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def failing_first(n: int) -> WebhookReceiver:
    """A receiver that answers 503 to the first ``n`` deliveries of each alert (told apart by their
    ``Trainyard-Alert-Id``), then 200."""

    def status_for(earlier: list[dict[str, Any]], headers: Any) -> int:
        alert_id = headers.get("Trainyard-Alert-Id")
        tries = 1 + sum(1 for r in earlier if r["headers"].get("Trainyard-Alert-Id") == alert_id)
        return 503 if tries <= n else 200

    return WebhookReceiver(status_for)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Platform, TestClient, dict[str, str]]]:
    home = tmp_path_factory.mktemp("alerts")
    settings = Settings(
        home=home,
        webhook_allowed_networks="127.0.0.1/32",
        webhook_backoff_initial_s=0.2,
        webhook_backoff_max_s=2.0,
        webhook_max_attempts=4,
        alert_loss_min_steps=3,
        alert_scan_interval_s=0.0,
    )
    with in_process_platform(settings, price_usd_per_device_hour=36.0) as live:
        yield live


def tenant(c: TestClient, admin: dict[str, str], name: str) -> dict[str, str]:
    r = c.post("/v1/tenants", json={"name": name}, headers=admin)
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['api_key']}"}


def test_alerts_reach_only_their_tenants_webhook_signed_with_retries(live: Any) -> None:
    platform, c, admin = live
    ra, rb = failing_first(2), WebhookReceiver()
    try:
        alpha, beta = tenant(c, admin, "alpha"), tenant(c, admin, "beta")
        wa = c.post("/v1/webhooks", json={"url": ra.url}, headers=alpha)
        wb = c.post("/v1/webhooks", json={"url": rb.url}, headers=beta)
        assert wa.status_code == 201 and wb.status_code == 201, (wa.text, wb.text)
        secret_a, secret_b = wa.json()["signing_secret"], wb.json()["signing_secret"]
        assert secret_a != secret_b and secret_a.startswith("whsec_")
        # the webhooks are each tenant's own: listing shows no secret, another tenant's id is a 404
        assert [w["id"] for w in c.get("/v1/webhooks", headers=alpha).json()["webhooks"]] == [wa.json()["id"]]
        assert "signing_secret" not in c.get("/v1/webhooks", headers=alpha).json()["webhooks"][0]
        assert c.delete(f"/v1/webhooks/{wa.json()['id']}", headers=beta).status_code == 404
        assert c.post(f"/v1/webhooks/{wa.json()['id']}/test", headers=beta).status_code == 404
        # a budget alpha passes at once, and a job whose loss explodes (learning rate 10)
        r = c.put("/v1/budgets/alpha", json={"usd": 0.000001}, headers=admin)
        assert r.status_code == 200, r.text
        spec = tiny_spec("explodes", steps=12, seed=1, learning_rate=10.0)
        r = c.post("/v1/jobs", json={"spec": spec}, headers=alpha)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        wait_until(
            lambda: c.get(f"/v1/jobs/{job_id}", headers=alpha).json()["state"] in ("succeeded", "failed"),
            180,
            "the job ends",
        )

        def rules_ok() -> set[str]:
            with ra.lock:  # one consistent view while deliveries arrive
                done = [rq for rq in ra.requests if rq["status"] == 200]
            return {json.loads(rq["body"])["rule"] for rq in done}

        got = wait_until(
            lambda: (r := rules_ok()) >= {"budget_threshold"} and r & {"loss_diverging", "loss_nan"} and r,
            60,
            "alpha's alerts delivered",
        )
        assert got
        platform.alerts.wait_idle()
        # every request alpha's receiver got is signed with alpha's secret, none with beta's
        for rq in ra.requests:
            sig = rq["headers"][SIGNATURE_HEADER]
            assert verify_signature(secret_a, sig, rq["body"])
            assert not verify_signature(secret_b, sig, rq["body"])
            assert not verify_signature(secret_a, sig, rq["body"] + b" ")
        bodies = ra.bodies()
        assert all(b["tenant"] == "alpha" for b in bodies)
        # each alert's first two attempts got 503 and were retried, with growing gaps (exponential backoff)
        by_alert: dict[str, list[dict[str, Any]]] = {}
        for rq in ra.requests:
            by_alert.setdefault(rq["headers"]["Trainyard-Alert-Id"], []).append(rq)
        assert len(by_alert) >= 2
        for tries in by_alert.values():
            assert [rq["status"] for rq in tries] == [503, 503, 200]
            assert [rq["headers"]["Trainyard-Delivery-Attempt"] for rq in tries] == ["1", "2", "3"]
            gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(tries)]
            assert gaps[0] >= 0.2 and gaps[1] >= 0.4, gaps  # waits of 0.2 s, then 0.4 s (plus jitter)
        first = ra.requests[0]["headers"]["Trainyard-Alert-Id"]
        # each delivery attempt is an event where alpha sees it: the job's for job alerts
        events = c.get(f"/v1/jobs/{job_id}/events", headers=alpha).json()["events"]
        deliveries = [e["data"] for e in events if e["kind"] == "alert_delivery"]
        assert deliveries and all(d["url"] == ra.url for d in deliveries)
        assert any(e["kind"] == "alert" for e in events)
        # and the tenant's events for tenant alerts (budgets)
        tevents = c.get("/v1/budgets/alpha/events", headers=alpha).json()["events"]
        tdeliveries = [e["data"] for e in tevents if e["kind"] == "alert_delivery"]
        assert any(d["rule"] == "budget_threshold" for d in tdeliveries)
        mine = [d for d in deliveries + tdeliveries if d["alert_id"] == first]
        assert [(d["attempt"], d["ok"], d["status_code"]) for d in mine[:3]] == [
            (1, False, 503),
            (2, False, 503),
            (3, True, 200),
        ]
        assert mine[0]["will_retry"] is True and mine[2]["will_retry"] is False
        listed = c.get("/v1/alerts", headers=alpha).json()["alerts"]
        assert {a["rule"] for a in listed} >= {"budget_threshold"}
        assert c.get("/v1/alerts", headers=beta).json()["alerts"] == []
        # beta's receiver saw nothing of alpha's; its own test delivery arrives, signed with its secret
        assert rb.requests == []
        t = c.post(f"/v1/webhooks/{wb.json()['id']}/test", headers=beta)
        assert t.status_code == 200, t.text
        wait_until(lambda: rb.requests, 20, "beta's test delivery")
        platform.alerts.wait_idle()
        assert [b["rule"] for b in rb.bodies()] == ["webhook_test"]
        assert verify_signature(secret_b, rb.requests[0]["headers"][SIGNATURE_HEADER], rb.requests[0]["body"])
        # the delivery is a CLIENT span of OpenTelemetry's httpx instrumentation, its context sent along
        tp = rb.requests[0]["headers"].get("traceparent")
        assert tp is not None, rb.requests[0]["headers"]
        sent = [
            sp
            for sp in c.app.state.trace_buffer.spans()
            if sp.kind == SpanKind.CLIENT and (sp.attributes or {}).get("url.full") == rb.url
        ]
        assert len(sent) == 1 and sent[0].attributes["http.request.method"] == "POST"
        assert sent[0].attributes["http.response.status_code"] == 200
        assert f"{sent[0].context.span_id:016x}" == tp.split("-")[2]
        (parent,) = [
            sp
            for sp in c.app.state.trace_buffer.spans("webhook delivery")
            if sp.context.span_id == sent[0].parent.span_id
        ]
        assert parent.attributes["trainyard.delivery_attempt"] == 1
        assert all(b["tenant"] == "alpha" for b in ra.bodies())
    finally:
        ra.close()
        rb.close()


def test_webhook_urls_must_not_reach_internal_addresses(live: Any) -> None:
    _platform, c, admin = live
    gamma = tenant(c, admin, "gamma")
    for url in (
        "http://10.0.0.8/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:8080/x",
        "http://127.0.0.2:9/x",  # loopback, but only 127.0.0.1/32 is allowed here
        "http://0.0.0.0/x",
        "http://[::ffff:10.0.0.1]/x",
        "ftp://example.com/x",
        "http://user:pw@127.0.0.1/x",
        "file:///etc/passwd",
    ):
        r = c.post("/v1/webhooks", json={"url": url}, headers=gamma)
        assert r.status_code == 422, (url, r.text)
        assert r.json()["error"]["code"] == "url_not_allowed", url
        assert r.json()["error"]["details"]["errors"][0]["field"] == "url"
    bad = c.post("/v1/webhooks", json={"url": "http://10.0.0.8/", "rules": ["nope"]}, headers=gamma)
    assert {e["field"] for e in bad.json()["error"]["details"]["errors"]} == {"url", "rules"}
    assert c.get("/v1/webhooks", headers=gamma).json()["webhooks"] == []


def test_stalled_jobs_checkpoint_failures_and_deployment_errors_fire_once(live: Any) -> None:
    platform, c, admin = live
    rd = WebhookReceiver()
    try:
        delta = tenant(c, admin, "delta")
        hook = c.post(
            "/v1/webhooks",
            json={
                "url": rd.url,
                "rules": ["job_stalled", "checkpoint_failed", "deployment_error_rate", "budget_burn"],
            },
            headers=delta,
        )
        assert hook.status_code == 201, hook.text
        from trainyard.store.repositories import JobRepo, TenantRepo

        platform.stop_loop()  # the job below never starts: the scan and events are this test's own
        try:
            spec = tiny_spec("stalls", steps=5)
            spec["objective"] = {"budget_usd": 0.5}
            r = c.post("/v1/jobs", json={"spec": spec}, headers=delta)
            job_id = r.json()["id"]
            now = time.time()
            with platform.db.session() as s:
                stale = {"step": 3, "time_s": now - 3600}
                JobRepo(s).update(job_id, state="running", attempt=1, progress=stale, cost_usd=0.6)
                delta_row = TenantRepo(s).by_name("delta")
                assert delta_row is not None
                tenant_id = delta_row.id
                from trainyard.store.serving_models import ServingRequestRow

                for i in range(40):
                    s.add(
                        ServingRequestRow(
                            request_id=f"r{i}",
                            tenant_id=tenant_id,
                            tenant="delta",
                            deployment="chat",
                            model_version="m@1",
                            base_version="m@1",
                            route="primary",
                            endpoint="chat.completions",
                            status=500 if i % 4 == 0 else 200,
                            prompt_tokens=3,
                            completion_tokens=4,
                            latency_s=0.05,
                            stream=False,
                            created_at_s=now - 10,
                        )
                    )
            assert platform.alerts.scan() >= 3
            assert platform.alerts.scan() == 0  # each condition fires once
            with platform.db.session() as s:
                job = JobRepo(s).get(job_id)
            assert job is not None
            ev = ExecutorEvent(
                job_id,
                1,
                "log",
                {
                    "message": "checkpoint save failed (1/2): disk full",
                    "checkpoint_failed": True,
                    "failures": 1,
                },
                now,
            )
            platform.alerts.observe(ev, job)
            platform.alerts.observe(ev, job)  # the same failure again: no second alert
        finally:
            platform.start_loop()
        wait_until(lambda: len(rd.requests) >= 4, 20, "four deliveries")
        platform.alerts.wait_idle()
        rules = sorted(b["rule"] for b in rd.bodies())
        assert rules == ["budget_burn", "checkpoint_failed", "deployment_error_rate", "job_stalled"], rules
        burn = next(b for b in rd.bodies() if b["rule"] == "budget_burn")
        assert burn["severity"] == "critical" and burn["job_id"] == job_id  # $0.60 of a $0.50 budget
        dep = next(b for b in rd.bodies() if b["rule"] == "deployment_error_rate")
        assert dep["deployment"] == "chat" and dep["data"]["error_rate"] == pytest.approx(0.25)
        stalled = next(b for b in rd.bodies() if b["rule"] == "job_stalled")
        assert stalled["job_id"] == job_id and stalled["data"]["silent_s"] >= 3600
    finally:
        rd.close()
