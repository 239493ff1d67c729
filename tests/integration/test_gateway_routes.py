"""The OpenAI-compatible hot routes (POST /openai/v1/chat/completions and /completions) are answered in
front of the framework with authentication done by one direct call (trainyard.api.fastpath): against
the real app on a real SQLite store, they keep
every contract of the documented routes without a replica behind them: OpenAI-shaped errors, keys that
stop working the moment they are revoked, the viewer role, tenant scoping, request metrics and spans
labelled with the route template, and the OpenAPI document."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane_support import ScriptedPlatform, default_traced_platform

CHAT = {"model": "nowhere", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
PATHS = ("/openai/v1/chat/completions", "/openai/v1/completions")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedPlatform]:
    yield from default_traced_platform(tmp_path, monkeypatch)


def _error(r: object) -> dict[str, object]:
    doc = r.json()["error"]  # type: ignore[attr-defined]
    assert set(doc) >= {"code", "message", "hint", "details", "type", "param"}, doc
    return dict(doc)


def test_the_hot_routes_are_answered_in_front_and_keep_the_documented_ones_in_the_schema(
    env: ScriptedPlatform,
) -> None:
    from trainyard.api.fastpath import CompletionFastPath

    env.c.get("/healthz")  # builds the middleware stack
    stack = env.app.middleware_stack
    assert isinstance(stack, CompletionFastPath) and sorted(stack.routes) == sorted(PATHS)
    doc = env.c.get("/openapi.json").json()
    for path in PATHS:
        post = doc["paths"][path]["post"]
        assert {"401", "429"} <= set(post["responses"]), path
    r = env.c.get(PATHS[1], headers=env.h)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["code"] == "method_not_allowed"


def test_errors_keep_the_openai_shape(env: ScriptedPlatform) -> None:
    r = env.c.post(PATHS[0], json=CHAT)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    e = _error(r)
    assert e["type"] == "authentication_error" and e["code"] == "unauthenticated"
    r = env.c.post(PATHS[0], json=CHAT, headers={"Authorization": "Basic abc"})
    assert r.status_code == 401 and "malformed Authorization header" in str(_error(r)["message"])
    r = env.c.post(PATHS[0], json=CHAT, headers={"Authorization": "Bearer ty_not_a_key"})
    assert r.status_code == 401
    r = env.c.post(PATHS[0], content=b"{not json", headers={**env.h, "content-type": "application/json"})
    assert r.status_code == 400 and _error(r)["code"] == "invalid_json"
    r = env.c.post(PATHS[1], json={"model": "x", "prompt": "p", "best_of": 3}, headers=env.h)
    assert r.status_code == 400 and _error(r)["param"] == "best_of"
    # an unknown deployment and another tenant's look the same: 404 model_not_found
    r = env.c.post(PATHS[0], json=CHAT, headers=env.h)
    assert r.status_code == 404 and _error(r)["code"] == "model_not_found"


def test_a_revoked_key_stops_working_at_once_and_a_viewer_cannot_post(env: ScriptedPlatform) -> None:
    rec, key = env.p.tenants.create_key_record("default")
    h = {"Authorization": f"Bearer {key}"}
    assert env.c.post(PATHS[0], json=CHAT, headers=h).status_code == 404  # authenticated (and cached)
    assert env.p.tenants.cached_principal(key) is not None
    env.p.tenants.revoke_key("default", rec.id)
    r = env.c.post(PATHS[0], json=CHAT, headers=h)
    assert r.status_code == 401 and _error(r)["type"] == "authentication_error"
    viewer = env.p.tenants.create_key("default", role="viewer")
    r = env.c.post(
        PATHS[1], json={"model": "x", "prompt": "p"}, headers={"Authorization": f"Bearer {viewer}"}
    )
    assert r.status_code == 403 and _error(r)["type"] == "permission_error"


def test_requests_are_counted_and_traced_under_the_route_template(env: ScriptedPlatform) -> None:
    buf = env.app.state.trace_buffer
    buf.clear()
    for path in PATHS:
        assert env.c.post(path, json={**CHAT, "prompt": "p"}, headers=env.h).status_code in (400, 404)
    names = [s.name for s in buf.spans() if s.kind.name == "SERVER"]
    assert names == [f"POST {p}" for p in PATHS]
    server = [s for s in buf.spans() if s.kind.name == "SERVER"]
    assert all(s.attributes["trainyard.tenant"] == "default" for s in server)
    text = env.c.get("/metrics", headers=env.h).text
    routes = {
        smp.labels["route"]
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
        if smp.name == "trainyard_http_requests_total"
    }
    assert set(PATHS) <= routes and "(unmatched)" not in routes
