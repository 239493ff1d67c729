"""One serving replica: a process that loads a base model (and its LoRA adapters) once and serves it over
HTTP on 127.0.0.1 in the OpenAI wire format. The gateway in the API server is its only client.

    python -m trainyard.serving.replica --replica-id ID --model-path DIR [--adapter NAME=DIR ...] --port N

Routes: ``GET /health`` (identity, loaded adapters), ``GET /stats`` (in-flight, batches),
``POST /adapters`` (load an adapter at run time), ``POST /v1/chat/completions`` and
``POST /v1/completions`` (``model`` names an adapter, or ``__base__``; ``stream: true`` answers server-sent
events ending with a usage chunk and ``[DONE]``). The header ``X-Trainyard-Model`` sets the model name
echoed in responses (the deployment's name), so the gateway forwards bytes without rewriting them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from trainyard.errors import TrainyardError
from trainyard.serving.engine import (
    BASE_ADAPTER,
    Engine,
    EngineError,
    GenerationEvent,
    GenerationRequest,
)
from trainyard.serving.engines import DEFAULT_ENGINE, ENGINES, create_engine

MODEL_HEADER = "x-trainyard-model"


def _error(
    status: int, message: str, kind: str = "invalid_request_error", code: str = "invalid_input"
) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": kind, "param": None, "code": code}},
    )


def create_replica_app(engine: Engine, *, replica_id: str, model_name: str) -> Any:
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title=f"trainyard replica {replica_id}", docs_url=None, redoc_url=None)
    state = {"in_flight": 0, "served": 0, "errors": 0, "started_at_s": time.time()}

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "replica_id": replica_id,
                "model": model_name,
                "engine": engine.name,
                "adapters": engine.adapters(),
                "pid": os.getpid(),
            }
        )

    @app.get("/stats")
    async def stats() -> JSONResponse:
        return JSONResponse({**state, **engine.stats(), "replica_id": replica_id})

    @app.post("/adapters")
    async def load_adapter(request: Request) -> JSONResponse:
        body = await request.json()
        await asyncio.to_thread(engine.load_adapter, str(body["name"]), str(body["path"]))
        return JSONResponse({"adapters": engine.adapters()})

    async def _generate(request: Request, chat: bool) -> Any:
        body = await request.json()
        public_name = request.headers.get(MODEL_HEADER) or str(body.get("model", model_name))
        adapter = body.get("model")
        adapter = None if adapter in (None, "", BASE_ADAPTER, model_name) else str(adapter)
        try:
            if chat:
                prompt_ids = await asyncio.to_thread(engine.encode_chat, list(body["messages"]))
            else:
                prompt = body["prompt"]
                prompt_ids = (
                    [int(t) for t in prompt]
                    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
                    else engine.encode(prompt if isinstance(prompt, str) else "".join(prompt))
                )
        except Exception as exc:  # a model whose chat template fails is a server-side fault
            state["errors"] += 1
            return _error(500, f"cannot build the prompt: {exc}", "server_error", "prompt_failed")
        stop = body.get("stop") or []
        gen = GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=int(body.get("max_completion_tokens") or body.get("max_tokens") or 16),
            adapter=adapter,
            temperature=float(body.get("temperature") if body.get("temperature") is not None else 1.0),
            top_p=float(body.get("top_p") if body.get("top_p") is not None else 1.0),
            stop=[stop] if isinstance(stop, str) else list(stop),
        )
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[GenerationEvent] = asyncio.Queue()

        def sink(ev: GenerationEvent) -> None:
            loop.call_soon_threadsafe(events.put_nowait, ev)

        try:
            engine.submit(gen, sink)
        except EngineError as exc:
            return _error(400, str(exc), code="adapter_not_loaded")
        state["in_flight"] += 1
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        n_prompt = len(prompt_ids)

        def usage(n_completion: int) -> dict[str, int]:
            return {
                "prompt_tokens": n_prompt,
                "completion_tokens": n_completion,
                "total_tokens": n_prompt + n_completion,
            }

        if not body.get("stream"):
            parts: list[str] = []
            try:
                while True:
                    ev = await events.get()
                    parts.append(ev.text)
                    if ev.finish_reason is not None:
                        break
            finally:
                state["in_flight"] -= 1
            if ev.finish_reason == "error":
                state["errors"] += 1
                return _error(500, f"generation failed: {ev.error}", "server_error", "generation_failed")
            state["served"] += 1
            text = "".join(parts)
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text, "logprobs": None}
            )
            choice["finish_reason"] = ev.finish_reason
            return JSONResponse(
                {
                    "id": rid,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": created,
                    "model": public_name,
                    "choices": [choice],
                    "usage": usage(ev.completion_tokens),
                }
            )

        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: str | None, finish: str | None, first: bool = False) -> bytes:
            if chat:
                d: dict[str, Any] = {}
                if first:
                    d["role"] = "assistant"
                if delta is not None:
                    d["content"] = delta
                c: dict[str, Any] = {"index": 0, "delta": d, "finish_reason": finish}
            else:
                c = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
            doc = {"id": rid, "object": obj, "created": created, "model": public_name, "choices": [c]}
            return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

        async def stream() -> AsyncIterator[bytes]:
            try:
                if chat:
                    yield chunk("", None, first=True)
                while True:
                    ev = await events.get()
                    if ev.finish_reason == "error":
                        state["errors"] += 1
                        err = {"error": {"message": f"generation failed: {ev.error}", "type": "server_error"}}
                        yield b"data: " + json.dumps(err).encode() + b"\n\n"
                        return
                    if ev.text:
                        yield chunk(ev.text, None)
                    if ev.finish_reason is not None:
                        yield chunk(None if chat else "", ev.finish_reason)
                        tail = {
                            "id": rid,
                            "object": obj,
                            "created": created,
                            "model": public_name,
                            "choices": [],
                            "usage": usage(ev.completion_tokens),
                        }
                        yield b"data: " + json.dumps(tail, separators=(",", ":")).encode() + b"\n\n"
                        yield b"data: [DONE]\n\n"
                        state["served"] += 1
                        return
            finally:
                state["in_flight"] -= 1

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await _generate(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await _generate(request, chat=False)

    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="A trainyard serving replica.")
    ap.add_argument("--replica-id", required=True)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--tokenizer-path")
    ap.add_argument("--model-name", default="model")
    ap.add_argument("--adapter", action="append", default=[], help="NAME=DIR, repeatable")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--engine", default=DEFAULT_ENGINE, choices=ENGINES)
    args = ap.parse_args(argv)
    adapters = dict(a.split("=", 1) for a in args.adapter)
    try:
        engine = create_engine(
            args.engine,
            args.model_path,
            tokenizer_path=args.tokenizer_path,
            adapters=adapters,
            device=args.device,
            max_batch=args.max_batch,
            threads=args.threads,
        )
    except TrainyardError as exc:  # e.g. engine_unavailable: say why, not a traceback
        print(f"error ({exc.code}): {exc.message}\nhint: {exc.hint}", file=sys.stderr, flush=True)
        raise SystemExit(exc.exit_code) from None
    engine.start()
    import uvicorn

    app = create_replica_app(engine, replica_id=args.replica_id, model_name=args.model_name)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False, loop="auto")


if __name__ == "__main__":
    main()
