"""The OpenAI-compatible gateway: validate, pick a route and a replica, forward with aiohttp, meter,
mirror to shadows. It runs on the API server's event loop and reads only in-memory views.

aiohttp forwards rather than httpx: on one keep-alive connection it spends about a fifth of httpx's CPU
per request (benchmarks/bench_serving.py, docs/benchmarks.md), and forwarding is the gateway's whole cost.
Each forward is a CLIENT span (HTTP semantic conventions) under the request's GenAI span, and carries
``traceparent`` to the replica.

* ``model`` is a deployment name of the caller's tenant (another tenant's is unknown: 404).
* Routes: weighted choice, sticky per ``X-Trainyard-Sticky`` header or the ``user`` field.
* Shadow routes get the same request *after* the primary answered, from a bounded queue drained by a
  few background tasks; a full queue drops (and counts) instead of waiting. Shadow answers are never
  returned; each is stored next to the primary's for the shadow report.
* A pool scaled to zero wakes on the first request, which waits for a replica up to the deployment's
  ``cold_start_timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import structlog
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import ValidationError
from starlette.responses import JSONResponse, Response, StreamingResponse

from trainyard.serving import genai
from trainyard.serving.openai_schemas import ChatCompletionRequest, CompletionRequest
from trainyard.serving.replica import MODEL_HEADER
from trainyard.serving.service import DeploymentView, ReplicaView, RouteView, ServingService
from trainyard.serving.traffic import choose_route, compare_answers
from trainyard.tenancy.ratelimit import TokenBuckets

log = structlog.get_logger("trainyard.gateway")

STICKY_HEADER = "x-trainyard-sticky"
SHADOW_QUEUE_SIZE = 256
SHADOW_WORKERS = 2
REPLICA_TIMEOUT_S = 300.0


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str = "invalid_input",
        param: str | None = None,
        hint: str = "",
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param
        self.hint, self.details, self.headers = hint, details or {}, headers or {}

    def response(self) -> JSONResponse:
        return openai_error(
            self.status,
            self.message,
            kind=self.kind,
            code=self.code,
            param=self.param,
            hint=self.hint,
            details=self.details,
        )


def _budget_exhausted(b: dict[str, Any]) -> GatewayError:
    """429 in OpenAI's shape for a hard budget with nothing left (``insufficient_quota``, as OpenAI
    answers an exhausted quota; ``x-should-retry: false`` so the official clients do not retry it)."""
    scope = f"tag {b['tag_key']}={b['tag_value']}" if b["tag_key"] else "tenant"
    return GatewayError(
        429,
        f"The {scope} hard {b['period']} budget of ${b['usd']:.2f} is used up "
        f"(${b['spent_usd']:.2f} spent, ${b['reserved_usd']:.2f} reserved): inference is refused.",
        kind="insufficient_quota",
        code="budget_exceeded",
        hint="Raise the budget (`trainyard budgets set TENANT --usd N --hard`) or wait for the next period.",
        details={k: b[k] for k in ("id", "period", "usd", "spent_usd", "reserved_usd")},
        headers={"x-should-retry": "false"},
    )


def openai_error(
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    code: str = "invalid_input",
    param: str | None = None,
    hint: str = "",
    details: dict[str, Any] | None = None,
) -> JSONResponse:
    """OpenAI's error body (``message, type, param, code``) plus the platform's ``hint`` and ``details``."""
    return JSONResponse(
        status_code=status,
        content={
            "error": {
                "message": message,
                "type": kind,
                "param": param,
                "code": code,
                "hint": hint,
                "details": details or {},
            }
        },
    )


def _validation_error(exc: ValidationError) -> GatewayError:
    errors = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e.get("loc", ()) if not str(p).startswith(("function-", "literal[")))
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        if e.get("type") == "extra_forbidden":
            msg = "unrecognized request argument"
        elif e.get("type") == "missing":
            msg = "required"
        errors.append({"field": loc or "(body)", "message": msg})
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return GatewayError(
        400,
        f"{first['field']}: {first['message']}{more}",
        param=first["field"].split(".")[0] if first["field"] != "(body)" else None,
        hint="See the OpenAI API reference; unsupported options are listed in docs/serving.md.",
        details={"errors": errors},
    )


@dataclass
class _Shadow:
    deployment: DeploymentView
    route: RouteView
    endpoint: str
    body: dict[str, Any]
    request_id: str
    primary_model: str
    primary_text: str
    primary_latency_s: float
    primary_tokens: int
    tags: dict[str, Any]


class Gateway:
    def __init__(self, service: ServingService, *, shadow_queue_size: int = SHADOW_QUEUE_SIZE) -> None:
        self.service = service
        self.shadow_queue_size = shadow_queue_size
        self._client: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shadow_q: asyncio.Queue[_Shadow] | None = None
        self._workers: list[asyncio.Task[None]] = []
        # set by observability.install_observability: GenAI and forwarding spans, serving metrics
        self.tracer: Any = None
        # the tracer provider drops the children of an unsampled span: an unsampled request starts none
        self.skip_unsampled = False
        self.observe: Callable[[dict[str, Any]], None] | None = None
        self.token_buckets = TokenBuckets()  # the platform gives it the rate limiter's store
        # the platform's InferenceBudgetGate: inference refused once a hard budget has nothing left
        self.budget_gate: Any = None

    def _ensure(self) -> tuple[aiohttp.ClientSession, asyncio.Queue[_Shadow]]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._shadow_q is None:
            self._loop = loop
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=REPLICA_TIMEOUT_S, connect=5.0),
                connector=aiohttp.TCPConnector(limit=1000, limit_per_host=0, keepalive_timeout=30.0),
                skip_auto_headers=("User-Agent",),
            )
            self._shadow_q = asyncio.Queue(maxsize=self.shadow_queue_size)
            self._workers = [loop.create_task(self._shadow_worker()) for _ in range(SHADOW_WORKERS)]
        return self._client, self._shadow_q

    async def aclose(self) -> None:
        for w in self._workers:
            w.cancel()
        if self._client is not None:
            await self._client.close()
        self._client = None

    def _forward_span(self, parent: Any, url: str, headers: dict[str, str]) -> Any:
        """A CLIENT span for one forward (HTTP semantic conventions) whose context goes to the replica
        as ``traceparent``; None without tracing."""
        if self.tracer is None:
            return None
        if parent is None and self.skip_unsampled and _unsampled():
            propagate.inject(headers)  # the unsampled request's context, as its dropped span would send
            return None
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        rest = url.split("://", 1)[-1]
        hostport = rest.split("/", 1)[0]
        host, _, port = hostport.rpartition(":")
        span = self.tracer.start_span(
            "POST",
            context=ctx,
            kind=SpanKind.CLIENT,
            attributes={
                "http.request.method": "POST",
                "url.full": url,
                "server.address": host or hostport,
                "server.port": int(port) if port.isdigit() else 80,
            },
        )
        propagate.inject(headers, context=trace.set_span_in_context(span))
        return span

    @staticmethod
    def _end_forward_span(span: Any, status: int | None, error: str | None = None) -> None:
        if span is None:
            return
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if error is not None or (status is not None and status >= 500):
            span.set_attribute("error.type", error or str(status))
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    # ---- models ---------------------------------------------------------------------------
    def models(self, tenant_id: str) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [self._model_doc(d) for d in self.service.deployments_of(tenant_id)],
        }

    def model(self, tenant_id: str, name: str) -> dict[str, Any]:
        dep = self.service.lookup(tenant_id, name)
        if dep is None:
            raise self._unknown(name)
        return self._model_doc(dep)

    @staticmethod
    def _model_doc(dep: DeploymentView) -> dict[str, Any]:
        primary = dep.primary()
        res = primary.resolved if primary is not None else None
        return {
            "id": dep.name,
            "object": "model",
            "created": int(dep.created_at_s),
            "owned_by": dep.tenant,
            "root": res.version_id if res else None,
            "parent": res.base_ref if res else None,
        }

    @staticmethod
    def _unknown(name: str) -> GatewayError:
        return GatewayError(
            404,
            f"The model `{name}` does not exist or you do not have access to it.",
            code="model_not_found",
            param="model",
            hint="`model` is a deployment name; list them with GET /openai/v1/models.",
        )

    # ---- completions ----------------------------------------------------------------------
    async def handle(
        self,
        tenant_id: str,
        endpoint: str,
        raw: bytes,
        headers: dict[str, str],
        *,
        tokens_per_minute: int | None = None,
    ) -> Response:
        try:
            return await self._handle(tenant_id, endpoint, raw, headers, tokens_per_minute)
        except GatewayError as exc:
            resp = exc.response()
            if exc.headers:
                resp.headers.update(exc.headers)
            return resp

    async def _admit_tokens(
        self, tenant_id: str, tokens_per_minute: int, req: Any, body: dict[str, Any]
    ) -> Callable[[dict[str, Any] | None, int], None]:
        """Reserve the request's estimated prompt tokens plus ``max_tokens`` from the tenant's
        tokens-per-minute bucket (429 when it has not got them); the returned function settles the
        reservation with the usage the replica reported (none on a failed request: all returned)."""
        key = f"tpm:{tenant_id}"
        want = estimate_prompt_tokens(req) + int(body.get("max_tokens") or 16)
        decision, reserved = await self.token_buckets.areserve(  # from memory unless a lease is due
            key, tokens_per_minute=tokens_per_minute, n=want
        )
        if not decision.allowed:
            hdrs = decision.headers()
            raise GatewayError(
                429,
                f"Rate limit reached for tokens per minute: limit {tokens_per_minute}, requested {want}. "
                f"Please try again in {hdrs['Retry-After']}s.",
                kind="tokens",
                code="rate_limit_exceeded",
                hint="Wait for Retry-After seconds, send fewer or shorter requests, or raise the limit "
                "(`trainyard tenants update NAME --tokens-per-minute N`).",
                details={
                    "limit_tokens_per_minute": tokens_per_minute,
                    "requested_tokens": want,
                    "retry_after_s": round(decision.retry_after_s, 3),
                },
                headers={
                    "Retry-After": hdrs["Retry-After"],
                    "X-RateLimit-Limit-Tokens": str(tokens_per_minute),
                    "X-RateLimit-Remaining-Tokens": hdrs["X-RateLimit-Remaining"],
                    "X-RateLimit-Reset-Tokens": f"{decision.reset_s:.3f}s",
                },
            )

        def settle(usage: dict[str, Any] | None, status: int) -> None:
            if usage:
                used = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
            elif status >= 400:
                used = 0
            else:
                return  # answered without usage: the reservation stands
            self.token_buckets.settle(key, tokens_per_minute=tokens_per_minute, reserved=reserved, used=used)

        return settle

    async def _handle(
        self,
        tenant_id: str,
        endpoint: str,
        raw: bytes,
        headers: dict[str, str],
        tokens_per_minute: int | None = None,
    ) -> Response:
        started = time.perf_counter()
        try:
            doc = orjson.loads(raw)  # parsed once, here; the router passes the body through unread
        except ValueError as exc:
            raise GatewayError(
                400, f"the request body is not valid JSON: {exc}", code="invalid_json"
            ) from None
        if not isinstance(doc, dict):
            raise GatewayError(400, "the request body must be a JSON object", code="invalid_json")
        schema = ChatCompletionRequest if endpoint == "chat.completions" else CompletionRequest
        try:
            req = schema.model_validate(doc)
        except ValidationError as exc:
            raise _validation_error(exc) from None
        dep = self.service.lookup(tenant_id, req.model)
        if dep is None:
            raise self._unknown(req.model)
        served = [r for r in dep.routes if not r.route.shadow and r.route.weight > 0]
        if not served:
            raise GatewayError(
                503, f"deployment {dep.name!r} has no route to serve", kind="server_error", code="no_route"
            )
        sticky = headers.get(STICKY_HEADER) or req.user
        chosen = choose_route([r.route for r in served], sticky)
        rv = next(r for r in served if r.route is chosen)
        body = req.forward()
        body["model"] = rv.adapter or "__base__"
        stream = bool(req.stream)
        if stream:
            body["stream_options"] = {"include_usage": True}
        tags = {**dep.tags, **(req.metadata or {})}
        if self.budget_gate is not None:
            exhausted = await self.budget_gate.refusal(tenant_id, tags)
            if exhausted is not None:
                raise _budget_exhausted(exhausted)
        settle = (
            await self._admit_tokens(tenant_id, tokens_per_minute, req, body) if tokens_per_minute else None
        )
        request_id = uuid.uuid4().hex
        client, shadow_q = self._ensure()
        span = (
            genai.start_span(self.tracer, endpoint, req, dep.name, rv.resolved.version_id)
            if self.tracer is not None and not (self.skip_unsampled and _unsampled())
            else None
        )
        try:
            replica = await self._acquire(dep, rv)
        except GatewayError as exc:
            if span is not None:
                genai.end_span(span, exc.status, None, "primary")
            if settle is not None:
                settle(None, exc.status)
            raise
        path = "/v1/chat/completions" if endpoint == "chat.completions" else "/v1/completions"
        fwd_headers = {MODEL_HEADER: dep.name}
        route_kind = "canary" if rv.route.canary else "primary"
        shadows = [r for r in dep.routes if r.route.shadow]

        shadow_body = (
            {k: v for k, v in req.forward().items() if k not in ("stream", "stream_options")}
            if shadows
            else {}
        )

        def finish(status: int, usage: dict[str, Any] | None, text: str, ttft_s: float | None) -> None:
            latency = time.perf_counter() - started
            if span is not None:
                genai.end_span(span, status, usage, route_kind, replica.url, ttft_s)
            self.service.release(rv.pool_key, replica)
            if settle is not None:
                settle(usage, status)
            ok = status < 500
            self.service.record_outcome(dep.id, rv.route.model, ok, latency)
            self._meter(
                dep,
                rv,
                endpoint,
                request_id,
                status,
                usage,
                latency,
                ttft_s,
                stream,
                replica.id,
                tags,
                route_kind,
            )
            if ok and shadows:
                for srv in shadows:
                    item = _Shadow(
                        dep,
                        srv,
                        endpoint,
                        {**shadow_body, "model": srv.adapter or "__base__"},
                        request_id,
                        rv.resolved.version_id,
                        text,
                        latency,
                        int((usage or {}).get("completion_tokens", 0)),
                        tags,
                    )
                    try:
                        shadow_q.put_nowait(item)
                        self.service.shadow_sent[dep.id] = self.service.shadow_sent.get(dep.id, 0) + 1
                    except asyncio.QueueFull:
                        self.service.shadow_dropped[dep.id] = self.service.shadow_dropped.get(dep.id, 0) + 1

        url = f"{replica.url}{path}"
        payload = orjson.dumps(body)
        fwd_headers["Content-Type"] = "application/json"
        fspan = self._forward_span(span, url, fwd_headers)
        if not stream:
            try:
                async with client.post(url, data=payload, headers=fwd_headers) as resp:
                    content = await resp.read()
                    status_code = resp.status
            except (TimeoutError, aiohttp.ClientError) as exc:
                self._end_forward_span(fspan, None, type(exc).__name__)
                finish(502, None, "", None)
                raise GatewayError(
                    502,
                    f"the replica serving {dep.name!r} failed: {type(exc).__name__}",
                    kind="server_error",
                    code="replica_unavailable",
                ) from None
            self._end_forward_span(fspan, status_code)
            usage: dict[str, Any] | None = None
            text = ""
            if status_code == 200:
                try:
                    out = orjson.loads(content)
                    usage = out.get("usage")
                    if span is not None:
                        genai.record_response(span, out)
                    if shadows:
                        ch = out["choices"][0]
                        text = ch.get("text") or (ch.get("message") or {}).get("content") or ""
                except (ValueError, KeyError, IndexError, AttributeError):
                    pass
            finish(status_code, usage, text, None)
            return Response(content=content, status_code=status_code, media_type="application/json")

        try:
            upstream = await client.post(url, data=payload, headers=fwd_headers)
        except (TimeoutError, aiohttp.ClientError) as exc:
            self._end_forward_span(fspan, None, type(exc).__name__)
            finish(502, None, "", None)
            raise GatewayError(
                502,
                f"the replica serving {dep.name!r} failed: {type(exc).__name__}",
                kind="server_error",
                code="replica_unavailable",
            ) from None
        if upstream.status != 200:
            try:
                content = await upstream.read()
            finally:
                upstream.release()
            self._end_forward_span(fspan, upstream.status)
            finish(upstream.status, None, "", None)
            return Response(content=content, status_code=upstream.status, media_type="application/json")

        async def relay() -> AsyncIterator[bytes]:
            usage: dict[str, Any] | None = None
            ttft: float | None = None
            parts: list[str] = []
            buf = b""
            status = 200
            try:
                async for chunk in upstream.content.iter_any():
                    if ttft is None:
                        ttft = time.perf_counter() - started
                    yield chunk
                    buf += chunk
                    while b"\n\n" in buf:
                        event, buf = buf.split(b"\n\n", 1)
                        if b'"usage"' in event or b'"error"' in event or (shadows and b'"choices"' in event):
                            usage, status = _scan(event, usage, status, parts if shadows else None)
            except (TimeoutError, aiohttp.ClientError):
                status = 502
            finally:
                upstream.release()
                self._end_forward_span(fspan, status)
                finish(status, usage, "".join(parts), ttft)

        return StreamingResponse(
            relay(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    async def _acquire(self, dep: DeploymentView, rv: RouteView) -> ReplicaView:
        replica = self.service.try_acquire(rv.pool_key, rv.adapter)
        if replica is not None:
            return replica
        pool = self.service.pool(rv.pool_key)
        timeout = pool.policy.cold_start_timeout_s if pool is not None else 30.0
        deadline = time.monotonic() + timeout
        self.service.mark_waiting(rv.pool_key, +1)
        try:
            while time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                replica = self.service.try_acquire(rv.pool_key, rv.adapter)
                if replica is not None:
                    return replica
        finally:
            self.service.mark_waiting(rv.pool_key, -1)
        raise GatewayError(
            503,
            f"no replica of {dep.name!r} became ready within {timeout:.0f} s",
            kind="server_error",
            code="no_replica",
            hint="The deployment is starting or scaled to zero; retry, or raise --min-replicas.",
        )

    def _meter(
        self,
        dep: DeploymentView,
        rv: RouteView,
        endpoint: str,
        request_id: str,
        status: int,
        usage: dict[str, Any] | None,
        latency_s: float,
        ttft_s: float | None,
        stream: bool,
        replica_id: str | None,
        tags: dict[str, Any],
        route_kind: str,
    ) -> None:
        u = usage or {}
        record: dict[str, Any] = {
            "request_id": request_id,
            "tenant_id": dep.tenant_id,
            "tenant": dep.tenant,
            "deployment": dep.name,
            "model_version": rv.resolved.version_id,
            "base_version": rv.resolved.base_version,
            "adapter": rv.resolved.version_id if rv.resolved.adapter_path else None,
            "route": route_kind,
            "endpoint": endpoint,
            "status": status,
            "prompt_tokens": int(u.get("prompt_tokens", 0)),
            "completion_tokens": int(u.get("completion_tokens", 0)),
            "latency_s": latency_s,
            "ttft_s": ttft_s,
            "stream": stream,
            "replica_id": replica_id,
            "tags": tags,
            "created_at_s": self.service.clock(),
        }
        self.service.meter(record)
        if self.observe is not None:
            self.observe(record)

    # ---- shadows --------------------------------------------------------------------------
    async def _shadow_worker(self) -> None:
        assert self._shadow_q is not None
        while True:
            item = await self._shadow_q.get()
            try:
                await self._mirror(item)
            except Exception:
                log.exception("shadow_failed", deployment=item.deployment.name)

    async def _mirror(self, item: _Shadow) -> None:
        assert self._client is not None
        rv = item.route
        started = time.perf_counter()
        replica = self.service.try_acquire(rv.pool_key, rv.adapter)
        status, text, tokens, usage = 503, None, None, None
        if replica is not None:
            path = "/v1/chat/completions" if item.endpoint == "chat.completions" else "/v1/completions"
            try:
                async with self._client.post(
                    f"{replica.url}{path}",
                    data=orjson.dumps(item.body),
                    headers={MODEL_HEADER: item.deployment.name, "Content-Type": "application/json"},
                ) as resp:
                    status = resp.status
                    content = await resp.read()
                if status == 200:
                    out = orjson.loads(content)
                    usage = out.get("usage") or {}
                    tokens = int(usage.get("completion_tokens", 0))
                    ch = out["choices"][0]
                    text = ch.get("text") or (ch.get("message") or {}).get("content") or ""
            except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, IndexError):
                status = 502
            finally:
                self.service.release(rv.pool_key, replica)
        latency = time.perf_counter() - started
        self._meter(
            item.deployment,
            rv,
            item.endpoint,
            item.request_id,
            status,
            usage,
            latency,
            None,
            False,
            replica.id if replica else None,
            item.tags,
            "shadow",
        )
        exact, sim = compare_answers(item.primary_text, text or "") if text is not None else (False, 0.0)
        self.service.record_pair(
            {
                "deployment_id": item.deployment.id,
                "request_id": item.request_id,
                "primary_model": item.primary_model,
                "shadow_model": rv.resolved.version_id,
                "primary_latency_s": item.primary_latency_s,
                "shadow_latency_s": latency if status == 200 else None,
                "primary_completion_tokens": item.primary_tokens,
                "shadow_completion_tokens": tokens,
                "primary_text": item.primary_text,
                "shadow_text": text,
                "shadow_status": status,
                "exact_match": exact,
                "similarity": sim,
                "created_at_s": self.service.clock(),
            }
        )


def _unsampled() -> bool:
    """Whether the current span is a request's span the sampler dropped (valid, not sampled)."""
    ctx = trace.get_current_span().get_span_context()
    return ctx.is_valid and not ctx.trace_flags.sampled


def _scan(
    event: bytes, usage: dict[str, Any] | None, status: int, parts: list[str] | None
) -> tuple[dict[str, Any] | None, int]:
    line = event.strip()
    if not line.startswith(b"data: ") or line == b"data: [DONE]":
        return usage, status
    try:
        doc = json.loads(line[6:])
    except ValueError:
        return usage, status
    if "error" in doc:
        return usage, 500
    if doc.get("usage"):
        usage = doc["usage"]
    if parts is not None:
        for ch in doc.get("choices") or []:
            piece = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
            if piece:
                parts.append(piece)
    return usage, status


def estimate_prompt_tokens(req: Any) -> int:
    """The prompt's tokens before tokenizing (about 4 characters a token, plus a few per chat message
    for its template); the reservation is settled with the replica's exact count afterwards."""
    messages = getattr(req, "messages", None)
    if messages is not None:
        return sum(len(m.text()) // 4 + 4 for m in messages) + 2
    prompt = req.prompt
    if isinstance(prompt, list):
        if prompt and isinstance(prompt[0], int):
            return len(prompt)
        return sum(len(p) // 4 + 1 for p in prompt)
    return len(prompt) // 4 + 1
