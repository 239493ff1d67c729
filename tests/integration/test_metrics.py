"""/metrics against a real SQLite store and the real app: every metric the alert rules use is exported,
the per-job series are capped, serving metrics per deployment and version are bounded, money is a
counter."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from controlplane_support import tiny_spec
from fakes import FakeExecutor, ManualClock
from trainyard.api.app import create_app
from trainyard.observability.metrics import ServingMetrics
from trainyard.observability.rules import alert_rules_text
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduling import GreedyCheapestRound
from trainyard.settings import Settings


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Platform, FakeExecutor, TestClient, dict[str, str]]]:
    clock = ManualClock()
    ex = FakeExecutor()
    p = Platform.open(
        Settings(
            home=tmp_path, database_url=f"sqlite:///{tmp_path / 'trainyard.db'}", metrics_max_job_series=1
        ),
        PlatformOptions(
            executor=ex, schedule_round=GreedyCheapestRound(), cpu_count=2, clock=clock, with_catalog=False
        ),
    )
    app = create_app(p, access_log=False)
    h = {"Authorization": f"Bearer {p.settings.api_key_path.read_text().strip()}"}
    yield p, ex, TestClient(app, base_url="http://127.0.0.1"), h
    p.close()


def families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def base_name(name: str) -> str:
    return re.sub(r"_(total|bucket|count|sum)$", "", name)


def test_every_metric_the_alert_rules_use_is_exported(
    live: tuple[Platform, FakeExecutor, TestClient, dict],
) -> None:
    _, _, c, h = live
    exported = families(c.get("/metrics", headers=h).text)
    used = set(re.findall(r"\btrainyard_[a-z_]+", alert_rules_text()))
    missing = {m for m in used if base_name(m) not in exported}
    assert not missing, sorted(missing)
    # money that only grows is a counter (exposed as *_usd_total)
    assert exported["trainyard_tenant_cost_usd"] == "counter"
    assert exported["trainyard_job_cost_usd"] == "counter"
    assert exported["process_cpu_seconds"] == "counter" and "python_info" in exported


def test_job_series_are_capped_and_the_rest_counted(
    live: tuple[Platform, FakeExecutor, TestClient, dict],
) -> None:
    p, ex, c, h = live
    ids = []
    for name in ("first", "second"):
        spec = tiny_spec(name)
        spec["resources"] = {"max_devices": 1}
        r = c.post("/v1/jobs", json={"spec": spec}, headers=h)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    p.tick()
    assert len(ex.launches) == 2
    for jid in ids:
        ex.emit(
            jid, "heartbeat", {"rank": 0, "step": 3, "loss": 2.0, "step_time_s": 0.1, "tokens_per_s": 9.0}
        )
    p.tick()
    text = c.get("/metrics", headers=h).text
    with_series = {jid for jid in ids if f'trainyard_job_loss{{job_id="{jid}"' in text}
    assert len(with_series) == 1
    assert "trainyard_job_series_dropped 1.0" in text
    # a tenant's key does not read /metrics; the admin key does (unchanged)
    _, key = p.tenants.create("other")
    assert c.get("/metrics", headers={"Authorization": f"Bearer {key}"}).status_code == 403


def test_serving_metrics_per_deployment_and_version_are_bounded() -> None:
    reg = CollectorRegistry()
    m = ServingMetrics(reg, max_series=2)

    def record(dep: str, version: str, status: int = 200, route: str = "primary") -> dict[str, object]:
        return {
            "tenant": "acme",
            "deployment": dep,
            "model_version": version,
            "status": status,
            "route": route,
            "prompt_tokens": 7,
            "completion_tokens": 3,
            "latency_s": 0.2,
            "ttft_s": 0.05,
        }

    m.observe(record("chat", "tiny@1"))
    m.observe(record("chat", "tiny@2", status=502))
    m.observe(record("chat", "tiny@2", route="shadow"))
    m.observe(record("other", "x@1"))  # over the cap: counted, but not as a new series
    labels = {"tenant": "acme", "deployment": "chat", "model_version": "tiny@2"}
    assert (
        reg.get_sample_value(
            "trainyard_inference_requests_total", {**labels, "code": "502", "route": "primary"}
        )
        == 1
    )
    assert reg.get_sample_value("trainyard_inference_tokens_total", {**labels, "kind": "prompt"}) == 14
    # shadow requests are counted, never timed as the deployment's latency
    assert reg.get_sample_value("trainyard_inference_request_duration_seconds_count", labels) == 1
    other = {"tenant": "acme", "deployment": "(other)", "model_version": "(other)"}
    assert (
        reg.get_sample_value(
            "trainyard_inference_requests_total", {**other, "code": "200", "route": "primary"}
        )
        == 1
    )
    assert reg.get_sample_value("trainyard_inference_time_to_first_token_seconds_count", other) == 1


def test_the_snapshot_reads_a_queue_narrowly_and_counts_failures_per_open_job(
    live: tuple[Platform, FakeExecutor, TestClient, dict],
) -> None:
    from trainyard.observability import snapshot
    from trainyard.store.models import JobEventRow

    p, ex, c, h = live
    running = tiny_spec("running")
    running["resources"] = {"max_devices": 1}
    jid = c.post("/v1/jobs", json={"spec": running}, headers=h).json()["id"]
    p.tick()
    ex.emit(jid, "heartbeat", {"rank": 0, "step": 3, "loss": 2.0, "step_time_s": 0.1})
    p.tick()
    waiting = tiny_spec("waiting")
    waiting["resources"] = {"min_devices": 2, "max_devices": 2}  # waits for the running job's device
    waiting["objective"] = {"budget_usd": 7.5}
    queued = [c.post("/v1/jobs", json={"spec": waiting}, headers=h).json()["id"] for _ in range(3)]
    plain = tiny_spec("plain")  # waiting too, with no budget and no failure: no rule can fire on it
    plain["resources"] = {"min_devices": 2, "max_devices": 2}
    quiet = c.post("/v1/jobs", json={"spec": plain}, headers=h).json()["id"]
    p.tick()
    with p.db.session() as s:
        for kind in ("failed", "lost", "restart", "heartbeat"):
            s.add(JobEventRow(job_id=queued[1], kind=kind, data={}, time_s=1.0))
        s.commit()
    snap = snapshot.take(p, p.options.clock())
    by_id = {j.job_id: j for j in snap.open_jobs}
    # newest first, across states; the plain waiting job is not read at all
    assert [j.job_id for j in snap.open_jobs] == [*reversed(queued), jid]
    assert quiet not in by_id and c.get(f"/v1/jobs/{quiet}", headers=h).json()["state"] == "queued"
    assert by_id[jid].state == "running" and by_id[jid].progress["step"] == 3
    assert all(by_id[q].progress == {} and by_id[q].budget_usd == 7.5 for q in queued)
    assert (by_id[queued[1]].failures, by_id[queued[1]].restarts) == (2, 1)
    assert by_id[queued[0]].failures == 0 and by_id[jid].failures == 0
    text = c.get("/metrics", headers=h).text
    firing = r'trainyard_alerts_firing\{rule="job_failing_repeatedly",severity="warning"\} 1\.0'
    assert re.search(firing, text)
