"""The completion routes served in front of the framework (trainyard.api.fastpath): against the real app
on a real SQLite store and a stand-in replica (a local HTTP server answering like one), a completion
never reaches the framework's stack and keeps what the framework path gave it: the replica's bytes
passed through, metering, tenant walls (another tenant's deployment is a 404), the request metrics,
access log and SERVER span under the route template, the 413 body limit, and a request the sampler
dropped starts no GenAI or forwarding span while its context still reaches the replica."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route as HttpRoute

from controlplane_support import ScriptedPlatform, default_traced_platform, free_port
from trainyard.api.fastpath import CompletionFastPath
from trainyard.serving.autoscale import AutoscalingPolicy
from trainyard.serving.models import ResolvedModel
from trainyard.serving.service import DeploymentView, PoolView, ReplicaView, RouteView
from trainyard.serving.traffic import Route

# deliberately odd spacing: the gateway must hand back these bytes, not a re-serialised document
ANSWER = (
    b'{"id":  "cmpl-fast", "object": "text_completion", "model": "__base__", '
    b'"choices": [{"index": 0, "text": "hi", "finish_reason": "length"}], '
    b'"usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}'
)
PATH = "/openai/v1/completions"


class _Replica:
    """A local HTTP server that answers completions like a replica and remembers the headers it got."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

        async def completions(request: Request) -> Response:
            self.seen.append(dict(request.headers))
            await request.body()
            return Response(ANSWER, media_type="application/json")

        app = Starlette(routes=[HttpRoute("/v1/completions", completions, methods=["POST"])])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_config=None, access_log=False)
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _Replica:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the stand-in replica did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = self.server.force_exit = True  # no wait for the gateway's idle connection
        self.thread.join(10)


def _deploy(env: ScriptedPlatform, tenant_id: str, tenant: str, name: str, replica_url: str) -> None:
    """A ready deployment of ``tenant`` in the gateway's views, served by the replica at ``replica_url``."""
    svc = env.p.serving
    resolved = ResolvedModel(version_id="m@1", path="/nowhere", tokenizer_path="/nowhere")
    key = (tenant_id, resolved.base_version)
    pool = PoolView(key, "/nowhere", "/nowhere", {}, AutoscalingPolicy())
    pool.replicas["r-" + name] = ReplicaView("r-" + name, replica_url)
    view = DeploymentView(
        id="d-" + name,
        tenant_id=tenant_id,
        tenant=tenant,
        name=name,
        model="m@1",
        routes=(RouteView(Route("m@1", 100.0), resolved, key),),
        tags={"team": "t"},
        created_at_s=0.0,
    )
    with svc._lock:
        svc._pools = {**svc._pools, key: pool}
        svc._deployments = {**svc._deployments, (tenant_id, name): view}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedPlatform]:
    yield from default_traced_platform(tmp_path, monkeypatch)


@pytest.fixture
def replica() -> Iterator[_Replica]:
    with _Replica() as r:
        yield r


def _framework_refuses(env: ScriptedPlatform) -> None:
    """Replace the framework's stack behind the fast path by one that fails every request."""
    env.c.get("/healthz")  # builds the middleware stack
    stack = env.app.middleware_stack
    assert isinstance(stack, CompletionFastPath)

    async def refuse(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise AssertionError(f"{scope['method']} {scope['path']} reached the framework")

    stack.app = refuse


def test_a_completion_never_reaches_the_framework_and_is_passed_through_and_metered(
    env: ScriptedPlatform, replica: _Replica
) -> None:
    assert env.c.post(PATH, json={"model": "x", "prompt": "p"}, headers=env.h).status_code == 404
    principal = env.p.tenants.cached_principal(env.key)
    assert principal is not None
    _deploy(env, principal.tenant_id, principal.tenant_name, "fast", replica.url)
    _framework_refuses(env)
    r = env.c.post(PATH, json={"model": "fast", "prompt": "hello", "max_tokens": 1}, headers=env.h)
    assert r.status_code == 200 and r.content == ANSWER
    with pytest.raises(AssertionError, match="reached the framework"):
        env.c.get(PATH, headers=env.h)  # other methods on the path still go to the framework
    with env.p.serving._lock:
        (rec,) = [m for m in env.p.serving._pending_meter if m["deployment"] == "fast"]
    assert rec["tenant_id"] == principal.tenant_id and rec["status"] == 200
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (3, 1)
    assert rec["tags"] == {"team": "t"} and rec["replica_id"] == "r-fast"


def test_another_tenants_deployment_is_a_404_on_the_fast_path(
    env: ScriptedPlatform, replica: _Replica
) -> None:
    _, other_key = env.p.tenants.create("other")
    other = {"Authorization": f"Bearer {other_key}"}
    assert env.c.post(PATH, json={"model": "x", "prompt": "p"}, headers=other).status_code == 404
    principal = env.p.tenants.cached_principal(other_key)
    assert principal is not None
    _deploy(env, principal.tenant_id, principal.tenant_name, "theirs", replica.url)
    _framework_refuses(env)
    body = {"model": "theirs", "prompt": "hello", "max_tokens": 1}
    assert env.c.post(PATH, json=body, headers=other).status_code == 200
    r = env.c.post(PATH, json=body, headers=env.h)
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error"
    assert set(err) >= {"code", "message", "hint", "details", "type", "param"}
    assert len(replica.seen) == 1  # the default tenant's request never reached the replica


def test_metrics_span_and_body_limit_on_the_fast_path(env: ScriptedPlatform, replica: _Replica) -> None:
    principal = env.p.tenants.cached_principal(env.key) or env.p.tenants.authenticate(env.key)
    _deploy(env, principal.tenant_id, principal.tenant_name, "fast", replica.url)
    _framework_refuses(env)
    buf = env.app.state.trace_buffer
    buf.clear()
    r = env.c.post(PATH, json={"model": "fast", "prompt": "hello", "max_tokens": 1}, headers=env.h)
    assert r.status_code == 200
    server = [s for s in buf.spans() if s.kind.name == "SERVER"]
    assert [s.name for s in server] == [f"POST {PATH}"]
    assert server[0].attributes["trainyard.tenant"] == "default"
    assert server[0].attributes["http.response.status_code"] == 200
    (genai,) = [s for s in buf.spans() if s.name == "text_completion fast"]
    assert genai.parent is not None and genai.parent.span_id == server[0].context.span_id
    assert genai.attributes["gen_ai.usage.output_tokens"] == 1
    assert genai.attributes["gen_ai.response.id"] == "cmpl-fast"
    big = b'{"model": "fast", "prompt": "' + b"x" * 1_100_000 + b'"}'
    r = env.c.post(PATH, content=big, headers={**env.h, "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    env.app.middleware_stack = None  # /metrics through the framework again
    text = env.c.get("/metrics", headers=env.h).text
    counted = {
        (smp.labels["route"], smp.labels["status"]): smp.value
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
        if smp.name == "trainyard_http_requests_total"
    }
    assert counted[(PATH, "200")] == 1 and counted[(PATH, "413")] == 1


def test_an_unsampled_request_starts_no_gateway_spans_but_its_context_reaches_the_replica(
    env: ScriptedPlatform, replica: _Replica
) -> None:
    principal = env.p.tenants.cached_principal(env.key) or env.p.tenants.authenticate(env.key)
    _deploy(env, principal.tenant_id, principal.tenant_name, "fast", replica.url)
    gateway = env.p.serving_gateway
    assert gateway.skip_unsampled  # the tests' sampler is parent-based
    buf = env.app.state.trace_buffer
    buf.clear()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    unsampled = {**env.h, "traceparent": f"00-{trace_id}-00f067aa0ba902b7-00"}
    body = {"model": "fast", "prompt": "hello", "max_tokens": 1}
    assert env.c.post(PATH, json=body, headers=unsampled).status_code == 200
    assert not [s for s in buf.spans() if s.name in ("text_completion fast", "POST")]
    sent = replica.seen[-1]["traceparent"].split("-")
    assert sent[1] == trace_id and sent[3] == "00"
    # a sampled one gets both, the forward carrying its own span's context
    sampled = {**env.h, "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    assert env.c.post(PATH, json=body, headers=sampled).status_code == 200
    (genai,) = [s for s in buf.spans() if s.name == "text_completion fast"]
    (fwd,) = [s for s in buf.spans() if s.name == "POST" and s.kind.name == "CLIENT"]
    assert fwd.parent is not None and fwd.parent.span_id == genai.context.span_id
    assert replica.seen[-1]["traceparent"].split("-")[2] == f"{fwd.context.span_id:016x}"
