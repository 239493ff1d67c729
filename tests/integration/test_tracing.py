"""One trace per job, against a real SQLite store and the real app.

The first test drives the supervisor with the scripted executor (worker reports fed by hand, the
worker's span recorder is the real one); the second runs a real sandboxed worker and receives the
whole trace over OTLP/HTTP on 127.0.0.1, configured only through ``OTEL_*`` variables."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import ScriptedPlatform, tiny_spec
from otlp_receiver import OtlpReceiver
from trainyard.api.app import create_app
from trainyard.runtime.tracing import WorkerTrace
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduling import GreedyCheapestRound
from trainyard.settings import Settings
from trainyard.tracecontext import parse_traceparent

Env = ScriptedPlatform


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    for var in (
        "TRAINYARD_TRACE_EXPORTER",
        "OTEL_TRACES_EXPORTER",
        "OTEL_SDK_DISABLED",
        "TRAINYARD_TRACE_DB_STATEMENTS",
    ):
        monkeypatch.delenv(var, raising=False)  # every trace sampled (conftest), no statement spans
    e = Env(tmp_path)
    yield e
    e.p.close()


def job_series(samples: dict[Any, float], job_id: str) -> set[str]:
    return {name for name, labels in samples if ("job_id", job_id) in labels}


def test_a_job_is_one_trace_from_submission_through_its_workers_to_completion(env: Env) -> None:
    buf = env.app.state.trace_buffer
    r = env.c.post("/v1/jobs", json={"spec": tiny_spec("traced")}, headers=env.h)
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    env.p.tick()  # admit, place, launch
    (req,) = env.ex.launches
    tp = req.env["TRACEPARENT"]
    assert req.env["TRAINYARD_TRACEPARENT"] == tp
    ctx = parse_traceparent(tp)
    assert ctx is not None
    (http,) = buf.spans("POST /v1/jobs")
    trace_id = http.context.trace_id
    assert ctx.trace_id == trace_id

    # the worker side: the real span recorder, its span events carried by the executor's event stream
    worker = WorkerTrace.from_env(
        req.env, jid, req.attempt, 0, lambda kind, **data: env.event(jid, kind, data)
    )
    assert worker is not None and worker.recording
    env.clock.now += 2
    env.event(jid, "started", {"rank": 0, "pid": 4242, "host": "fakehost", "resumed_from_step": 0})
    worker.start_training()
    for step, loss in ((1, 5.5), (10, 4.25)):
        env.clock.now += 5
        worker.emit(
            "heartbeat",
            rank=0,
            step=step,
            loss=loss,
            step_time_s=0.5,
            tokens_per_s=512.0,
            memory_gib=0.5,
            total_steps=20,
        )
    ckpt = {"step": 10, "path": f"file:///ck/{jid}/step-10", "save_s": 1.5, "bytes": 4096, "emergency": False}
    worker.emit("checkpoint", **ckpt)
    # a span event whose trace is not the attempt's is refused
    forged = {
        "name": "forged",
        "trace_id": "0" * 31 + "1",
        "span_id": "0" * 15 + "2",
        "parent_span_id": None,
        "start_ns": 1,
        "end_ns": 2,
        "attributes": {},
    }
    env.event(jid, "span", forged)
    env.p.tick()

    running = env.samples()
    labels = (("job_id", jid), ("tenant", "default"))
    assert running[("trainyard_job_step", labels)] == 10
    assert running[("trainyard_job_loss", labels)] == 4.25
    assert running[("trainyard_job_tokens_per_second", labels)] == 512.0
    assert running[("trainyard_job_step_time_seconds", labels)] == 0.5
    assert running[("trainyard_job_device_memory_bytes", labels)] == 0.5 * 2**30
    assert running[("trainyard_job_checkpoint_duration_seconds", labels)] == 1.5
    from trainyard.catalog.accelerators import get_accelerator
    from trainyard.predict.workload import training_flops_per_step
    from trainyard.spec.loader import spec_from_dict

    flops = training_flops_per_step(spec_from_dict(req.spec))
    peak = get_accelerator(req.accelerator or "cpu").peak_flops("fp32") * req.world_size
    assert running[("trainyard_job_mfu_ratio", labels)] == pytest.approx(flops / 0.5 / peak)
    assert running[("trainyard_job_preemptions_total", labels)] == 0
    assert ("trainyard_job_cost_usd_total", labels) in running
    assert running[("trainyard_checkpoint_duration_seconds_count", ())] == 1
    assert ("trainyard_tenant_cost_usd_total", (("tenant", "default"),)) in running
    assert ("process_cpu_seconds_total", ()) in running  # process and platform collectors
    assert any(name == "python_info" for name, _ in running)

    env.clock.now += 5
    worker.finish("succeeded", {"final_step": 20})
    env.event(jid, "succeeded", {"rank": 0, "model_sha256": "ab" * 32, "final_step": 20})
    env.p.tick()
    assert env.c.get(f"/v1/jobs/{jid}", headers=env.h).json()["state"] == "succeeded"

    spans = {s.name: s for s in buf.spans() if s.context.trace_id == trace_id}
    expected = {
        "POST /v1/jobs",
        "job.admit",
        "job.place",
        "job.attempt",
        "executor.launch",
        "job.checkpoint",
        "job.complete",
        "worker.rank",
        "train.steps",
        "checkpoint.save",
    }
    assert expected <= set(spans), sorted(spans)
    assert not buf.spans("forged")
    # database statements are not spans unless TRAINYARD_TRACE_DB_STATEMENTS asks for them
    assert not [
        s for s in buf.spans() if s.kind.name == "CLIENT" and "db.system.name" in (s.attributes or {})
    ]
    submit, attempt = http, spans["job.attempt"]  # the request's span is the job's root
    assert "job.submit" not in spans and http.attributes["trainyard.job_id"] == jid
    for child in ("job.admit", "job.place", "job.attempt", "job.complete"):
        assert spans[child].parent.span_id == submit.context.span_id, child
    assert spans["executor.launch"].parent.span_id == attempt.context.span_id
    assert spans["worker.rank"].parent.span_id == attempt.context.span_id
    assert spans["train.steps"].parent.span_id == spans["worker.rank"].context.span_id
    assert spans["checkpoint.save"].parent.span_id == spans["train.steps"].context.span_id
    assert spans["worker.rank"].resource.attributes["service.name"] == "trainyard-worker"
    assert attempt.attributes["trainyard.outcome"] == "succeeded"
    steps = spans["train.steps"].attributes
    assert steps["trainyard.final_step"] == 10 and steps["trainyard.loss"] == 4.25
    assert spans["job.checkpoint"].attributes["trainyard.step"] == 10
    ck = spans["job.checkpoint"]
    assert (ck.end_time - ck.start_time) / 1e9 == pytest.approx(1.5)
    assert spans["job.place"].attributes["trainyard.pool"] == "local-cpu"
    assert spans["job.complete"].attributes["trainyard.state"] == "succeeded"

    # the finished job's series are gone; the counters stay
    done = env.samples()
    assert not job_series(done, jid), job_series(done, jid)
    assert done[("trainyard_jobs_finished_total", (("state", "succeeded"),))] == 1
    assert done[("trainyard_checkpoints_total", ())] == 1

    # an idle control loop (nothing queued, nothing running) exports no span at all
    buf.clear()
    for _ in range(3):
        env.clock.now += 1
        env.p.tick()
    assert buf.spans() == [], [s.name for s in buf.spans()]


def test_a_round_that_places_nothing_exports_no_span(env: Env) -> None:
    buf = env.app.state.trace_buffer
    spec = tiny_spec("too-big")
    spec["resources"] = {"min_devices": 2}
    first = env.c.post("/v1/jobs", json={"spec": tiny_spec("holder")}, headers=env.h).json()["id"]
    env.p.tick()
    r = env.c.post("/v1/jobs", json={"spec": spec}, headers=env.h)
    assert r.status_code == 201, r.text
    waiting = r.json()["id"]
    env.p.tick()  # admitted; one of the two cpu devices is taken: it cannot be placed
    doc = env.c.get(f"/v1/jobs/{waiting}", headers=env.h).json()
    assert doc["state"] == "queued", doc
    buf.clear()
    for _ in range(3):
        env.p.tick()
    assert [s.name for s in buf.spans()] == []
    assert env.c.get(f"/v1/jobs/{first}", headers=env.h).json()["state"] in ("starting", "running")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sandboxed_workers_spans_reach_an_otlp_receiver_in_the_jobs_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainyard.executors.local import LocalExecutor
    from trainyard.executors.sandbox import Sandbox

    with OtlpReceiver() as receiver:
        monkeypatch.delenv("TRAINYARD_TRACE_EXPORTER", raising=False)
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "trainyard-test")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.setenv("TRAINYARD_TRACE_DB_STATEMENTS", "true")  # opt-in: a span per statement
        executor = LocalExecutor(sandbox=Sandbox(), heartbeat_timeout_s=120.0, warm_start=False)
        platform = Platform.open(
            Settings(home=tmp_path / "home"),
            PlatformOptions(
                executor=executor,
                schedule_round=GreedyCheapestRound(),
                cpu_count=2,
                with_catalog=False,
                loop_interval_s=0.1,
            ),
        )
        try:
            app = create_app(platform, access_log=False)
            assert app.state.trace_buffer is None  # otlp only
            h = {"Authorization": f"Bearer {platform.settings.api_key_path.read_text().strip()}"}
            c = TestClient(app, base_url="http://127.0.0.1")
            spec = tiny_spec("otlp-job", steps=6)
            spec["checkpoint"] = {"interval": "1s"}
            r = c.post("/v1/jobs", json={"spec": spec}, headers=h)
            assert r.status_code == 201, r.text
            jid = r.json()["id"]
            deadline = time.monotonic() + 400
            state = ""
            while time.monotonic() < deadline:
                platform.tick()
                state = c.get(f"/v1/jobs/{jid}", headers=h).json()["state"]
                if state in ("succeeded", "failed", "cancelled"):
                    break
                time.sleep(0.2)
            doc = c.get(f"/v1/jobs/{jid}", headers=h).json()
            assert state == "succeeded", (doc["reason"], doc["events"][-6:])
            app.state.tracer_provider.force_flush()
            posts = receiver.wait_for("POST /v1/jobs")
            assert len(posts) == 1, posts
            (http,) = posts
            assert http.service == "trainyard-test" and http.kind == 2  # SERVER
            world = int(doc["placement"]["devices"])
            ranks = receiver.wait_for("worker.rank", count=world)
            steps = receiver.wait_for("train.steps", count=world)
            saves = receiver.wait_for("checkpoint.save")
            (attempt,) = receiver.wait_for("job.attempt")
            (complete,) = receiver.wait_for("job.complete")
            for s in (*ranks, *steps, *saves, attempt, complete):
                assert s.trace_id == http.trace_id, s
            assert sorted(r.attributes["trainyard.rank"] for r in ranks) == list(range(world))
            for rank in ranks:
                assert rank.service == "trainyard-test-worker"
                assert rank.parent_span_id == attempt.span_id
                assert rank.attributes["trainyard.outcome"] == "succeeded"
            assert {st.attributes["trainyard.final_step"] for st in steps} == {6}
            assert {sv.parent_span_id for sv in saves} <= {st.span_id for st in steps}
            # database statements inside the request are its children; none is a root
            sql = [s for s in receiver.spans if s.attributes.get("db.system.name") == "sqlite"]
            assert sql and all(s.parent_span_id for s in sql)
            assert re.fullmatch(r"[0-9a-f]{32}", http.trace_id)
        finally:
            platform.close()
            executor.shutdown(kill_workers=True)
            provider = getattr(locals().get("app"), "state", None)
            if provider is not None and provider.tracer_provider is not None:
                provider.tracer_provider.shutdown()


def test_a_job_submitted_outside_a_request_gets_a_job_submit_root(env: Env) -> None:
    buf = env.app.state.trace_buffer
    principal = env.p.tenants.authenticate(env.h["Authorization"].split()[1])
    job = env.p._submit_internal(principal, tiny_spec("internal"))
    (root,) = buf.spans("job.submit")
    assert root.parent is None and root.attributes["trainyard.job_id"] == job.id
    env.p.tick()
    (admit,) = [s for s in buf.spans("job.admit") if s.attributes["trainyard.job_id"] == job.id]
    assert admit.context.trace_id == root.context.trace_id
    assert admit.parent.span_id == root.context.span_id


def test_request_spans_follow_the_http_conventions_and_continue_the_callers_trace(env: Env) -> None:
    buf = env.app.state.trace_buffer
    buf.clear()
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = {
        **env.h,
        "traceparent": f"00-{caller_trace}-{caller_span}-01",
        "user-agent": "trace-test/1.0",
    }
    r = env.c.get("/v1/jobs?limit=5", headers=headers)
    assert r.status_code == 200, r.text
    (span,) = buf.spans("GET /v1/jobs")
    assert span.kind.name == "SERVER"
    assert f"{span.context.trace_id:032x}" == caller_trace
    assert span.parent is not None and f"{span.parent.span_id:016x}" == caller_span and span.parent.is_remote
    a = dict(span.attributes or {})
    assert a["http.request.method"] == "GET" and a["http.route"] == "/v1/jobs"
    assert a["url.path"] == "/v1/jobs" and a["url.query"] == "limit=5" and a["url.scheme"] == "http"
    assert a["server.address"] == "127.0.0.1" and a["server.port"] == 80
    assert a["http.response.status_code"] == 200 and a["user_agent.original"] == "trace-test/1.0"
    assert a["network.protocol.version"] == "1.1" and "client.address" in a
    assert a["trainyard.tenant"] == "default" and span.status.status_code.name == "UNSET"
    assert env.key not in repr(a)  # no header values but the user agent

    # without a caller's context the request is a root; a client error is not a span error
    buf.clear()
    assert env.c.get("/v1/jobs/nope", headers=env.h).status_code == 404
    (missing,) = buf.spans("GET /v1/jobs/{job_id}")
    assert missing.parent is None and missing.attributes["http.response.status_code"] == 404
    assert missing.status.status_code.name == "UNSET"
    # an unmatched URL keeps the method as its name; probes and scrapes are not traced
    buf.clear()
    assert env.c.get("/no/such/route").status_code == 404
    assert env.c.get("/healthz").status_code == 200
    assert [s.name for s in buf.spans()] == ["GET"]


def test_server_errors_and_exceptions_mark_the_request_span() -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from trainyard.observability.tracing import (
        ObservabilitySettings,
        TracingMiddleware,
        make_tracer_provider,
    )

    provider, buf = make_tracer_provider(ObservabilitySettings(trace_exporter="memory"))
    assert provider is not None and buf is not None

    async def unavailable(_request: Any) -> PlainTextResponse:
        return PlainTextResponse("later", status_code=503)

    async def broken(_request: Any) -> PlainTextResponse:
        raise RuntimeError("boom")

    app = Starlette(routes=[Route("/busy", unavailable), Route("/broken/{part}", broken, methods=["PURGE"])])
    app.add_middleware(TracingMiddleware, tracer_provider=provider)
    c = TestClient(app, base_url="http://127.0.0.1:8123", raise_server_exceptions=False)
    assert c.get("/busy").status_code == 503
    (busy,) = buf.spans("GET /busy")
    assert busy.attributes["error.type"] == "503" and busy.status.status_code.name == "ERROR"
    assert busy.attributes["server.port"] == 8123
    assert c.request("PURGE", "/broken/x").status_code == 500
    (failed,) = buf.spans("HTTP /broken/{part}")
    a = failed.attributes
    assert a["http.request.method"] == "_OTHER" and a["http.request.method_original"] == "PURGE"
    assert a["error.type"] == "RuntimeError" and failed.status.status_code.name == "ERROR"
    assert [e.name for e in failed.events] == ["exception"]
    provider.shutdown()


def unsampled_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> Env:
    for var in ("TRAINYARD_TRACE_EXPORTER", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    return Env(tmp_path)


def test_a_job_whose_submission_was_not_sampled_records_only_its_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = unsampled_env(tmp_path, monkeypatch, OTEL_TRACES_SAMPLER="parentbased_always_off")
    try:
        buf = env.app.state.trace_buffer
        r = env.c.post("/v1/jobs", json={"spec": tiny_spec("unsampled")}, headers=env.h)
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        env.p.tick()  # admit, place, launch: none of it is recorded
        (req,) = env.ex.launches
        ctx = parse_traceparent(req.env["TRACEPARENT"])
        assert ctx is not None and not ctx.trace_flags.sampled
        worker = WorkerTrace.from_env(
            req.env, jid, req.attempt, 0, lambda kind, **data: env.event(jid, kind, data)
        )
        assert worker is not None and not worker.recording  # the workers follow the decision
        assert buf.spans() == [], [s.name for s in buf.spans()]
        env.event(jid, "started", {"rank": 0, "pid": 1, "host": "h"})
        env.event(jid, "failed", {"reason": "ZeroDivisionError", "classification": "user"})
        env.p.tick()
        assert env.c.get(f"/v1/jobs/{jid}", headers=env.h).json()["state"] == "failed"
        # the failure is kept, in the job's trace, under its (unrecorded) root
        (complete,) = buf.spans("job.complete")
        assert complete.context.trace_id == ctx.trace_id and complete.context.trace_flags.sampled
        assert complete.attributes["trainyard.trace.kept"] == "error"
        assert complete.attributes["trainyard.job_id"] == jid
        assert (
            complete.status.status_code.name == "ERROR" and "ZeroDivisionError" in complete.status.description
        )
        assert {s.name for s in buf.spans()} == {"job.complete"}
    finally:
        env.p.close()


def test_statement_spans_are_opt_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = unsampled_env(tmp_path, monkeypatch, TRAINYARD_TRACE_DB_STATEMENTS="true")
    try:
        buf = env.app.state.trace_buffer
        r = env.c.post("/v1/jobs", json={"spec": tiny_spec("statements")}, headers=env.h)
        assert r.status_code == 201, r.text
        (http,) = buf.spans("POST /v1/jobs")
        sql = [s for s in buf.spans() if (s.attributes or {}).get("db.system.name") == "sqlite"]
        assert sql and all(s.kind.name == "CLIENT" for s in sql)
        assert all(s.context.trace_id == http.context.trace_id and s.parent is not None for s in sql)
        buf.clear()
        for _ in range(2):
            env.p.tick()  # the control loop's own queries have no parent: not exported
        assert not [s for s in buf.spans() if s.parent is None and s.kind.name == "CLIENT"]
    finally:
        env.p.close()


def test_a_request_the_sampler_dropped_is_kept_when_it_fails_or_is_slow() -> None:
    import asyncio

    from opentelemetry import trace
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from trainyard.observability.tracing import (
        ObservabilitySettings,
        TracingMiddleware,
        make_tracer_provider,
    )
    from trainyard.tracecontext import current_traceparent

    provider, buf = make_tracer_provider(
        ObservabilitySettings(trace_exporter="memory", otel_traces_sampler="always_off")
    )
    assert provider is not None and buf is not None
    seen: list[str | None] = []

    async def fine(_request: Any) -> PlainTextResponse:
        seen.append(current_traceparent())
        trace.get_current_span().set_attribute("trainyard.tenant", "acme")
        return PlainTextResponse("ok")

    async def unavailable(_request: Any) -> PlainTextResponse:
        seen.append(current_traceparent())
        trace.get_current_span().set_attribute("trainyard.tenant", "acme")
        return PlainTextResponse("later", status_code=503)

    async def broken(_request: Any) -> PlainTextResponse:
        raise RuntimeError("boom")

    async def slow(_request: Any) -> PlainTextResponse:
        await asyncio.sleep(0.25)
        return PlainTextResponse("late")

    routes = [
        Route("/fine", fine),
        Route("/busy/{n}", unavailable),
        Route("/broken", broken),
        Route("/slow", slow),
    ]

    def client(**kw: Any) -> TestClient:
        app = Starlette(routes=routes)
        app.add_middleware(TracingMiddleware, tracer_provider=provider, **kw)
        return TestClient(app, base_url="http://127.0.0.1:8123", raise_server_exceptions=False)

    c = client(keep_slower_than_s=0.2)
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    assert c.get("/fine", headers={"user-agent": "t/1"}).status_code == 200
    assert buf.spans() == []  # dropped by the sampler and neither failed nor slow: nothing recorded
    dropped = parse_traceparent(seen[-1])  # its context still propagates, marked not sampled
    assert dropped is not None and not dropped.trace_flags.sampled
    assert c.get("/busy/1?q=2", headers={"user-agent": "t/1", "traceparent": caller}).status_code == 503
    (busy,) = buf.spans("GET /busy/{n}")
    ctx = parse_traceparent(seen[-1])
    assert ctx is not None
    assert (busy.context.trace_id, busy.context.span_id) == (ctx.trace_id, ctx.span_id)
    assert f"{busy.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert busy.parent is not None and f"{busy.parent.span_id:016x}" == "00f067aa0ba902b7"
    a = busy.attributes
    assert a["trainyard.trace.kept"] == "error" and a["error.type"] == "503"
    assert a["http.route"] == "/busy/{n}" and a["http.response.status_code"] == 503
    assert a["url.query"] == "q=2" and a["server.port"] == 8123 and a["user_agent.original"] == "t/1"
    assert a["trainyard.tenant"] == "acme"  # set while it ran, on the span that recorded nothing
    assert busy.kind.name == "SERVER" and busy.status.status_code.name == "ERROR"
    assert busy.end_time >= busy.start_time and busy.resource is provider.resource
    assert c.get("/broken").status_code == 500
    (failed,) = buf.spans("GET /broken")
    assert failed.parent is None and failed.attributes["error.type"] == "RuntimeError"
    assert [e.name for e in failed.events] == ["exception"]
    assert failed.events[0].attributes["exception.message"] == "boom"
    assert c.get("/slow").status_code == 200
    (late,) = buf.spans("GET /slow")
    assert late.attributes["trainyard.trace.kept"] == "slow" and late.status.status_code.name == "UNSET"
    assert (late.end_time - late.start_time) / 1e9 >= 0.25

    # neither kept when the settings say so
    buf.clear()
    quiet = client(keep_errors=False, keep_slower_than_s=0)
    assert quiet.get("/busy/2").status_code == 503 and quiet.get("/slow").status_code == 200
    assert buf.spans() == []
    provider.shutdown()
