"""The vLLM engine behind the :class:`~trainyard.serving.engine.Engine` protocol (optional: this module
imports vLLM, and only :func:`trainyard.serving.engines.create_engine` imports this module, when a
deployment chooses ``engine: vllm``).

vLLM's ``LLMEngine`` does continuous batching itself: requests are added as they arrive and one
background thread calls ``step()``; each output carries the request's cumulative text, which is cut into
deltas for the sink. LoRA adapters are vLLM ``LoRARequest``s chosen per request (``enable_lora``)."""

from __future__ import annotations

import itertools
import threading
import uuid
from typing import Any

from vllm import EngineArgs, LLMEngine, SamplingParams
from vllm.lora.request import LoRARequest

from trainyard.serving.engine import EngineError, GenerationEvent, GenerationRequest, Sink


class VLLMEngine:
    name = "vllm"

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer_path: str | None = None,
        adapters: dict[str, str] | None = None,
        device: str = "auto",
        max_batch: int = 16,
        max_lora_rank: int = 64,
    ) -> None:
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path or model_path
        self.device_name = device
        self.max_batch = max_batch
        self.max_lora_rank = max_lora_rank
        self._adapters: dict[str, LoRARequest] = {}
        self._initial_adapters = dict(adapters or {})
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: dict[str, tuple[Sink, int]] = {}  # request id -> (sink, characters sent)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._stats: dict[str, Any] = {"requests": 0, "steps": 0}
        self.engine: Any = None
        self.tokenizer: Any = None

    def start(self) -> None:
        args = EngineArgs(
            model=self.model_path,
            tokenizer=self.tokenizer_path,
            enable_lora=True,
            max_lora_rank=self.max_lora_rank,
            max_num_seqs=self.max_batch,
            **({} if self.device_name == "auto" else {"device": self.device_name}),
        )
        self.engine = LLMEngine.from_engine_args(args)
        self.tokenizer = self.engine.get_tokenizer()
        for name, path in self._initial_adapters.items():
            self.load_adapter(name, path)
        self._thread = threading.Thread(target=self._loop, name="vllm-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(10)

    def load_adapter(self, name: str, path: str) -> None:
        with self._lock:
            if name not in self._adapters:
                self._adapters[name] = LoRARequest(name, next(self._ids), path)

    def adapters(self) -> list[str]:
        return sorted(self._adapters)

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def submit(self, request: GenerationRequest, sink: Sink) -> None:
        lora = None
        if request.adapter is not None:
            lora = self._adapters.get(request.adapter)
            if lora is None:
                raise EngineError(f"adapter {request.adapter!r} is not loaded")
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            stop=list(request.stop) or None,
        )
        rid = uuid.uuid4().hex
        with self._wake:
            self._pending[rid] = (sink, 0)
            self.engine.add_request(
                rid, {"prompt_token_ids": list(request.prompt_ids)}, params, lora_request=lora
            )
            self._stats["requests"] += 1
            self._wake.notify_all()

    def stats(self) -> dict[str, Any]:
        return {"engine": self.name, **self._stats, "in_engine": len(self._pending)}

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self.engine.has_unfinished_requests():
                    self._wake.wait(0.5)
                if self._stopping:
                    return
                try:
                    outputs = self.engine.step()
                except Exception as exc:  # every request in flight fails with the engine's error
                    for sink, _ in self._pending.values():
                        sink(GenerationEvent("", 0, "error", f"{type(exc).__name__}: {exc}"))
                    self._pending.clear()
                    continue
                self._stats["steps"] += 1
                for out in outputs:
                    entry = self._pending.get(out.request_id)
                    if entry is None:
                        continue
                    sink, sent = entry
                    comp = out.outputs[0]
                    delta = comp.text[sent:]
                    finish = None
                    if out.finished:
                        finish = "length" if comp.finish_reason == "length" else "stop"
                        del self._pending[out.request_id]
                    else:
                        self._pending[out.request_id] = (sink, len(comp.text))
                    if delta or finish is not None:
                        sink(GenerationEvent(delta, len(comp.token_ids), finish))
