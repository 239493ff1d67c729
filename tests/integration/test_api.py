"""Every /v1 route against a real database: SQLite and PostgreSQL (a throw-away database per module)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import database_url, tiny_spec
from trainyard.api.app import create_app
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.settings import Settings


class Api:
    def __init__(self, platform: Platform, client: TestClient) -> None:
        self.platform = platform
        self.c = client
        self.admin_key = platform.settings.api_key_path.read_text().strip()
        self.admin = {"Authorization": f"Bearer {self.admin_key}"}
        r = client.post("/v1/tenants", json={"name": "other"}, headers=self.admin)
        assert r.status_code == 201, r.text
        self.other = {"Authorization": f"Bearer {r.json()['api_key']}"}

    def submit(
        self,
        spec: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        key: str | None = None,
    ) -> Any:
        h = dict(headers or self.admin)
        if key:
            h["Idempotency-Key"] = key
        return self.c.post("/v1/jobs", json={"spec": spec or tiny_spec()}, headers=h)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    home = tmp_path_factory.mktemp(f"api-{request.param}")
    with database_url(request.param, home) as url:
        settings = Settings(home=home, database_url=url)
        platform = Platform.open(settings, PlatformOptions(cpu_count=4))
        with TestClient(create_app(platform, access_log=False)) as client:
            yield Api(platform, client)
        platform.close()


def assert_envelope(resp: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"code", "message", "hint", "details"}
    assert err["message"] and isinstance(err["hint"], str)
    if code:
        assert err["code"] == code
    return err


# ---- auth -------------------------------------------------------------------------------------------
def test_missing_and_wrong_keys_are_401(api: Api) -> None:
    assert_envelope(api.c.get("/v1/jobs"), 401, "unauthenticated")
    assert_envelope(api.c.get("/v1/jobs", headers={"Authorization": "Bearer ty_AAAAAAAA_" + "x" * 43}), 401)
    assert_envelope(api.c.get("/v1/jobs", headers={"Authorization": "Bearer nonsense"}), 401)
    assert_envelope(api.c.get("/v1/jobs", headers={"Authorization": "Basic abc"}), 401)
    real = api.admin["Authorization"]
    r = api.c.get("/v1/jobs", headers={"Authorization": real[:-1] + ("B" if real.endswith("A") else "A")})
    assert_envelope(r, 401)
    assert r.headers.get("www-authenticate") == "Bearer"


def test_whoami(api: Api) -> None:
    admin = api.c.get("/v1/whoami", headers=api.admin).json()
    other = api.c.get("/v1/whoami", headers=api.other).json()
    assert (admin["tenant"], admin["admin"], admin["allow_user_code"]) == ("default", True, True)
    assert (other["tenant"], other["admin"], other["allow_user_code"]) == ("other", False, False)
    assert other["storage_url"].endswith("/storage/tenants/other") and other["storage_roots"] == []
    assert (admin["role"], other["role"]) == ("admin", "member")


# ---- jobs -------------------------------------------------------------------------------------------
def test_submit_get_contract(api: Api) -> None:
    r = api.submit(tiny_spec("contract"))
    assert r.status_code == 201, r.text
    doc = r.json()
    assert r.headers["location"] == f"/v1/jobs/{doc['id']}"
    assert doc["state"] == "pending" and doc["name"] == "contract"
    got = api.c.get(f"/v1/jobs/{doc['id']}", headers=api.admin).json()
    for key in ("id", "state", "placement", "cost_usd", "checkpoints", "workers", "events", "result"):
        assert key in got
    assert got["result"] is None and got["checkpoints"] == [] and got["workers"] == []
    assert [e["kind"] for e in got["events"]] == ["state"]
    assert got["events"][0]["data"]["to"] == "pending"


def test_admission_quotes_and_queues(api: Api) -> None:
    job = api.submit(tiny_spec("admit")).json()
    api.platform.tick()
    got = api.c.get(f"/v1/jobs/{job['id']}", headers=api.admin).json()
    assert got["state"] == "queued", got["reason"]
    assert got["quote"], "the quote is stored with the job"
    feasible = [o for o in got["quote"] if o["feasible"]]
    assert feasible and all(o["accelerator"] == "cpu" for o in feasible)
    assert any(o["pool"] == "local-cpu" for o in feasible)
    kinds = [e["kind"] for e in got["events"]]
    assert kinds == ["state", "quote", "state"]


def test_infeasible_job_fails_at_admission(api: Api) -> None:
    spec = tiny_spec("too-big")
    spec["model"] = {"architecture": "custom", "params_b": 70.0}
    spec["resources"] = {"max_devices": 1}
    job = api.submit(spec).json()
    api.platform.tick()
    got = api.c.get(f"/v1/jobs/{job['id']}", headers=api.admin).json()
    assert got["state"] == "failed"
    assert "infeasible" in got["reason"]


def test_idempotent_submission(api: Api) -> None:
    a = api.submit(tiny_spec("idem"), key="k-123")
    b = api.submit(tiny_spec("idem"), key="k-123")
    assert a.status_code == 201 and b.status_code == 200
    assert a.json()["id"] == b.json()["id"]
    c = api.submit(tiny_spec("idem-different"), key="k-123")
    assert_envelope(c, 409, "conflict")
    # keys are per tenant
    d = api.submit(tiny_spec("idem"), headers=api.other, key="k-123")
    assert d.status_code == 201 and d.json()["id"] != a.json()["id"]


def test_list_filters_and_cursor_pagination(api: Api) -> None:
    ids = [api.submit(tiny_spec(f"page-{i}"), headers=api.other).json()["id"] for i in range(5)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = api.c.get("/v1/jobs", params=params, headers=api.other).json()
        pages += 1
        seen += [j["id"] for j in page["jobs"] if j["name"].startswith("page-")]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen[:5] == list(reversed(ids)), "newest first, each once"
    assert len(seen) == len(set(seen))
    assert pages >= 3
    by_name = api.c.get("/v1/jobs", params={"name": "page-3"}, headers=api.other).json()["jobs"]
    assert [j["id"] for j in by_name] == [ids[3]]
    pending = api.c.get("/v1/jobs", params={"state": "pending"}, headers=api.other).json()["jobs"]
    assert {j["id"] for j in pending} >= set(ids)
    none = api.c.get("/v1/jobs", params={"state": "succeeded"}, headers=api.other).json()["jobs"]
    assert none == []
    assert_envelope(api.c.get("/v1/jobs", params={"state": "nope"}, headers=api.other), 422)
    assert_envelope(api.c.get("/v1/jobs", params={"cursor": "garbage!"}, headers=api.other), 422)
    assert_envelope(api.c.get("/v1/jobs", params={"limit": 0}, headers=api.other), 422)


def test_other_tenants_jobs_are_404(api: Api) -> None:
    job = api.submit(tiny_spec("private")).json()
    for path in (f"/v1/jobs/{job['id']}", f"/v1/jobs/{job['id']}/events", f"/v1/jobs/{job['id']}/logs"):
        assert_envelope(api.c.get(path, headers=api.other), 404, "not_found")
    assert_envelope(api.c.post(f"/v1/jobs/{job['id']}/cancel", headers=api.other), 404)
    listed = api.c.get("/v1/jobs", params={"limit": 500}, headers=api.other).json()["jobs"]
    assert job["id"] not in {j["id"] for j in listed}
    # and the owner still sees it untouched
    assert api.c.get(f"/v1/jobs/{job['id']}", headers=api.admin).json()["state"] == "pending"


def test_cancel_and_events(api: Api) -> None:
    job = api.submit(tiny_spec("cancel-me")).json()
    r = api.c.post(f"/v1/jobs/{job['id']}/cancel", headers=api.admin)
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert_envelope(api.c.post(f"/v1/jobs/{job['id']}/cancel", headers=api.admin), 409, "illegal_transition")
    ev = api.c.get(f"/v1/jobs/{job['id']}/events", headers=api.admin).json()
    assert [e["data"]["to"] for e in ev["events"] if e["kind"] == "state"] == ["pending", "cancelled"]
    after = api.c.get(
        f"/v1/jobs/{job['id']}/events", params={"after": ev["next_after"]}, headers=api.admin
    ).json()
    assert after["events"] == [] and after["next_after"] == ev["next_after"]
    ids = [e["id"] for e in ev["events"]]
    assert ids == sorted(ids)


def test_logs_of_a_job_without_workers_are_empty(api: Api) -> None:
    job = api.submit(tiny_spec("no-logs")).json()
    r = api.c.get(f"/v1/jobs/{job['id']}/logs", headers=api.admin)
    assert r.status_code == 200
    assert r.json() == {
        "job_id": job["id"],
        "rank": 0,
        "attempt": None,
        "offset": 0,
        "next_offset": 0,
        "size": 0,
        "text": "",
        "attempts": [],
        "job_state": "pending",
    }


def test_unknown_job_is_404(api: Api) -> None:
    assert_envelope(api.c.get("/v1/jobs/job-000000000000", headers=api.admin), 404)


# ---- bad input ----------------------------------------------------------------------------------------
def test_invalid_spec_names_fields(api: Api) -> None:
    spec = tiny_spec("bad")
    spec["workload"] = {**spec["workload"], "precision": "fp7"}
    spec["bogus"] = 1
    err = assert_envelope(api.submit(spec), 422, "invalid_input")
    fields = {e["field"] for e in err["details"]["errors"]}
    assert "spec.workload.precision" in fields and "spec.bogus" in fields


def test_malformed_json_is_422(api: Api) -> None:
    r = api.c.post(
        "/v1/jobs", content=b'{"spec": {', headers={**api.admin, "content-type": "application/json"}
    )
    err = assert_envelope(r, 422, "invalid_input")
    assert "malformed JSON" in err["message"]


def test_oversized_body_is_413(api: Api) -> None:
    big = json.dumps({"spec": {**tiny_spec("big"), "tags": {"x": "y" * 2_000_000}}})
    r = api.c.post("/v1/jobs", content=big, headers={**api.admin, "content-type": "application/json"})
    assert_envelope(r, 413, "payload_too_large")


def test_unknown_route_and_method_use_the_envelope(api: Api) -> None:
    assert_envelope(api.c.get("/v1/nothing-here", headers=api.admin), 404, "not_found")
    assert_envelope(api.c.delete("/v1/jobs", headers=api.admin), 405, "method_not_allowed")


# ---- quotes -------------------------------------------------------------------------------------------
def test_quote_route(api: Api) -> None:
    r = api.c.post("/v1/quotes", json={"spec": tiny_spec("q")}, headers=api.other)
    assert r.status_code == 200, r.text
    options = r.json()["options"]
    assert options and options[0]["feasible"]
    contract = {
        "accelerator",
        "devices",
        "cloud",
        "region",
        "instance_type",
        "market",
        "step_time_s",
        "price_usd_per_hour",
        "usd_per_step",
        "expected_hours",
        "expected_cost_usd",
        "preemption_overhead_usd",
        "checkpoint_interval_s",
        "feasible",
        "reason",
    }
    assert contract <= set(options[0])
    costs = [o["expected_cost_usd"] for o in options if o["feasible"]]
    assert costs == sorted(costs)


def test_quote_with_explicit_pools(api: Api, examples_dir: Path) -> None:
    import yaml

    from trainyard.spec import load_spec

    spec = load_spec(examples_dir / "seed-example.yaml").to_document()
    pools = yaml.safe_load((examples_dir / "seed-pools.yaml").read_text())["pools"]
    r = api.c.post(
        "/v1/quotes", json={"spec": spec, "pools": pools, "include_catalog": False}, headers=api.admin
    )
    assert r.status_code == 200, r.text
    feasible = [o for o in r.json()["options"] if o["feasible"]]
    assert {o["pool"] for o in feasible} <= {p["name"] for p in pools}
    best = feasible[0]
    assert best["accelerator"] == "a100-40gb" and best["market"] == "spot"


# ---- pools --------------------------------------------------------------------------------------------
def test_pools_list_put_patch_delete(api: Api) -> None:
    pools = api.c.get("/v1/pools", headers=api.other).json()["pools"]
    local = next(p for p in pools if p["name"] == "local-cpu")
    assert local["accelerator"] == "cpu" and local["devices_per_node"] == 4 and local["source"] == "local"
    new = {
        "name": "a100-spot",
        "accelerator": "a100",
        "devices_per_node": 8,
        "nodes": 2,
        "market": "spot",
        "price_usd_per_device_hour": 0.7,
        "region": "us-east-1",
        "interruption_rate_per_hour": 0.05,
    }
    assert_envelope(api.c.put("/v1/pools/a100-spot", json=new, headers=api.other), 403, "forbidden")
    r = api.c.put("/v1/pools/a100-spot", json=new, headers=api.admin)
    assert r.status_code == 200, r.text
    assert r.json()["accelerator"] == "a100-40gb"
    r = api.c.patch(
        "/v1/pools/a100-spot",
        json={"available_devices": 3, "price_usd_per_device_hour": 0.9},
        headers=api.admin,
    )
    assert (
        r.status_code == 200
        and r.json()["available_devices"] == 3
        and r.json()["price_usd_per_device_hour"] == 0.9
    )
    assert_envelope(
        api.c.patch("/v1/pools/a100-spot", json={"available_devices": 99}, headers=api.admin), 422
    )
    assert_envelope(api.c.patch("/v1/pools/a100-spot", json={"color": "red"}, headers=api.admin), 422)
    assert_envelope(api.c.put("/v1/pools/x", json=new, headers=api.admin), 422)
    assert_envelope(api.c.patch("/v1/pools/nope", json={"nodes": 1}, headers=api.admin), 404)
    assert api.c.delete("/v1/pools/a100-spot", headers=api.admin).status_code == 204
    assert_envelope(api.c.get("/v1/pools/a100-spot", headers=api.admin), 404)


# ---- tenants ------------------------------------------------------------------------------------------
def test_tenants_admin_only(api: Api) -> None:
    assert_envelope(api.c.post("/v1/tenants", json={"name": "x"}, headers=api.other), 403)
    assert_envelope(api.c.get("/v1/tenants", headers=api.other), 403)
    r = api.c.post("/v1/tenants", json={"name": "research"}, headers=api.admin)
    assert r.status_code == 201
    key = r.json()["api_key"]
    assert key.startswith("ty_")
    assert_envelope(api.c.post("/v1/tenants", json={"name": "research"}, headers=api.admin), 409)
    assert_envelope(api.c.post("/v1/tenants", json={"name": "Bad Name"}, headers=api.admin), 422)
    names = [t["name"] for t in api.c.get("/v1/tenants", headers=api.admin).json()["tenants"]]
    assert {"default", "other", "research"} <= set(names)
    assert api.c.get("/v1/whoami", headers={"Authorization": f"Bearer {key}"}).json()["tenant"] == "research"
    assert api.c.get("/v1/tenants/research", headers=api.admin).json()["name"] == "research"
    assert_envelope(api.c.get("/v1/tenants/ghost", headers=api.admin), 404)


def test_keys_are_stored_hashed(api: Api) -> None:
    from sqlalchemy import text

    with api.platform.db.session() as s:
        stored = [row[0] for row in s.execute(text("SELECT key_sha256 FROM api_keys"))]
    assert api.admin_key not in stored
    assert all(len(h) == 64 for h in stored)


def test_queue_quota(api: Api) -> None:
    r = api.c.post("/v1/tenants", json={"name": "tiny-quota", "max_queued_jobs": 2}, headers=api.admin)
    h = {"Authorization": f"Bearer {r.json()['api_key']}"}
    first = api.submit(tiny_spec("q1"), headers=h, key="quota-k1")
    assert first.status_code == 201
    assert api.submit(tiny_spec("q2"), headers=h).status_code == 201
    assert_envelope(api.submit(tiny_spec("q3"), headers=h), 429, "quota_exceeded")
    # at quota, a resend of an accepted submission is answered with the original job, not a 429
    again = api.submit(tiny_spec("q1"), headers=h, key="quota-k1")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert_envelope(api.submit(tiny_spec("q1-changed"), headers=h, key="quota-k1"), 409)


# ---- catalog, health, metrics, openapi ----------------------------------------------------------------
def test_catalog(api: Api) -> None:
    acc = api.c.get("/v1/catalog", headers=api.other).json()["accelerators"]
    names = {a["name"] for a in acc}
    assert {"a100-40gb", "h100", "tpu-v4", "cpu"} <= names
    offers = api.c.get("/v1/catalog/offers", headers=api.other).json()["pools"]
    assert offers and all("/" in p["name"] for p in offers)


def test_health_ready_metrics(api: Api) -> None:
    assert api.c.get("/healthz").json() == {"status": "ok"}
    ready = api.c.get("/readyz")
    assert ready.status_code == 200 and ready.json()["database"] is True
    text = api.c.get("/metrics", headers=api.admin).text
    assert "trainyard_http_requests_total" in text
    assert 'trainyard_jobs{state="pending"}' in text


def test_openapi_has_examples_and_security(api: Api) -> None:
    doc = api.c.get("/openapi.json").json()
    paths = doc["paths"]
    for p in (
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/cancel",
        "/v1/jobs/{job_id}/events",
        "/v1/jobs/{job_id}/logs",
        "/v1/quotes",
        "/v1/pools",
        "/v1/tenants",
        "/v1/catalog",
        "/healthz",
        "/readyz",
    ):
        assert p in paths, p
    assert "HTTPBearer" in doc["components"]["securitySchemes"]
    assert doc["components"]["schemas"]["SubmitJobRequest"].get("examples")
