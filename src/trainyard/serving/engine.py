"""Inference engines. The rest of serving talks to :class:`Engine` only, so another engine (vLLM on GPUs)
can sit behind the same replica without the gateway or the controller knowing.

The built-in :class:`TransformersEngine` runs ``transformers`` generation on CPU or CUDA with

* **dynamic batching**: requests that arrive while the model is busy (or within ``batch_wait_s`` of an
  idle model) are decoded together in one ``generate`` call, left-padded; each row stops on its own
  (end of sequence, its own ``max_tokens``, its own stop strings);
* **multi-LoRA**: any number of LoRA adapters over one resident base model (peft); every request names
  its adapter (or none), and one batch mixes adapters through peft's ``adapter_names``.

Requests with different sampling settings (greedy vs temperature/top-p) go into separate batches.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed batch


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int = 16
    adapter: str | None = None  # a loaded adapter's name, or None for the base model
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)


@dataclass
class GenerationEvent:
    """A piece of one request's output. ``finish_reason`` is set on the last event only."""

    text: str
    completion_tokens: int
    finish_reason: str | None = None  # "stop" | "length" | "error"
    error: str | None = None


Sink = Callable[[GenerationEvent], None]


class Engine(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def submit(self, request: GenerationRequest, sink: Sink) -> None:
        """Queue a request; ``sink`` receives its events from the engine's thread, the last one with a
        ``finish_reason``."""
        ...

    def load_adapter(self, name: str, path: str) -> None: ...

    def adapters(self) -> list[str]: ...

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...

    def stats(self) -> dict[str, Any]: ...


class EngineError(Exception):
    pass


@dataclass
class _Job:
    request: GenerationRequest
    sink: Sink
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    enqueued_s: float = field(default_factory=time.monotonic)


class _Rows:
    """Streamer and per-row stopping criterion of one batch: ``put`` receives each step's new tokens of
    every row (transformers calls it from inside ``generate``)."""

    def __init__(self, jobs: list[_Job], tokenizer: Any, eos_ids: set[int]) -> None:
        self.jobs = jobs
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self._prompt_seen = False

    # -- streamer protocol --
    def put(self, value: Any) -> None:
        if not self._prompt_seen:  # generate first hands over the prompt itself
            self._prompt_seen = True
            return
        column = value.reshape(-1).tolist()
        for job, token in zip(self.jobs, column, strict=False):
            if job.finished:
                continue
            if token in self.eos_ids:
                self._finish(job, "stop")
                continue
            job.tokens.append(int(token))
            full = self.tokenizer.decode(job.tokens, skip_special_tokens=True)
            stop_at = _first_stop(full, job.request.stop)
            if stop_at is not None:
                full = full[:stop_at]
            delta = full[len(job.text) :] if full.startswith(job.text) else ""
            if delta.endswith("\ufffd") and stop_at is None:  # an incomplete UTF-8 sequence: wait
                delta = ""
            else:
                job.text += delta
            if stop_at is not None:
                if delta:
                    job.sink(GenerationEvent(delta, len(job.tokens)))
                self._finish(job, "stop")
            elif len(job.tokens) >= job.request.max_tokens:
                if delta:
                    job.sink(GenerationEvent(delta, len(job.tokens)))
                self._finish(job, "length")
            elif delta:
                job.sink(GenerationEvent(delta, len(job.tokens)))

    def end(self) -> None:
        for job in self.jobs:
            if not job.finished:
                self._finish(job, "length")

    def _finish(self, job: _Job, reason: str) -> None:
        job.finished = True
        job.sink(GenerationEvent("", len(job.tokens), finish_reason=reason))

    # -- stopping criterion --
    def __call__(self, input_ids: Any, scores: Any, **_kw: Any) -> Any:
        import torch

        return torch.tensor([j.finished for j in self.jobs], dtype=torch.bool, device=input_ids.device)


def _first_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


class TransformersEngine:
    """``transformers`` generation with dynamic batching and peft multi-LoRA (see the module docstring)."""

    name = "transformers"

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer_path: str | None = None,
        adapters: dict[str, str] | None = None,
        device: str = "auto",
        max_batch: int = 16,
        batch_wait_s: float = 0.002,
        threads: int | None = None,
    ) -> None:
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path or model_path
        self._initial_adapters = dict(adapters or {})
        self.device_name = device
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.threads = threads
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards the model while adapters load
        self._adapters: dict[str, str] = {}
        self._stats: dict[str, Any] = {"requests": 0, "batches": 0, "batched_rows": 0, "max_batch_seen": 0}
        self._batch_sizes: list[int] = []
        self.model: Any = None
        self.tokenizer: Any = None
        self.device: Any = None

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.threads:
            torch.set_num_threads(self.threads)
        if self.device_name == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(self.device_name)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        self.model = model.to(self.device).eval()
        for name, path in self._initial_adapters.items():
            self.load_adapter(name, path)
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(10)
            self._thread = None

    # ---- adapters ----------------------------------------------------------------------------
    def load_adapter(self, name: str, path: str) -> None:
        from peft import PeftModel

        with self._lock:
            if name in self._adapters:
                return
            if not self._adapters and not isinstance(self.model, PeftModel):
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name).eval()
            else:
                self.model.load_adapter(path, adapter_name=name)
            self.model.to(self.device)
            self._adapters[name] = path

    def adapters(self) -> list[str]:
        return sorted(self._adapters)

    # ---- encoding ----------------------------------------------------------------------------
    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise EngineError("the model's tokenizer has no chat template; use completions")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    # ---- requests ----------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, sink: Sink) -> None:
        if request.adapter is not None and request.adapter not in self._adapters:
            raise EngineError(f"adapter {request.adapter!r} is not loaded")
        if self._thread is None:
            raise EngineError("engine is not started")
        self._queue.put(_Job(request, sink))

    def stats(self) -> dict[str, Any]:
        sizes = list(self._batch_sizes[-1000:])
        return {
            **self._stats,
            "mean_batch": (sum(sizes) / len(sizes)) if sizes else 0.0,
            "queued": self._queue.qsize(),
            "device": str(self.device),
            "adapters": self.adapters(),
        }

    # ---- the batching loop -------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while len(jobs) < self.max_batch:
                timeout = deadline - time.monotonic()
                try:
                    nxt = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                jobs.append(nxt)
            groups: dict[tuple[float, float], list[_Job]] = {}
            for j in jobs:
                key = (0.0, 1.0) if j.request.temperature <= 0 else (j.request.temperature, j.request.top_p)
                groups.setdefault(key, []).append(j)
            for group in groups.values():
                try:
                    self._run(group)
                except Exception as exc:
                    for j in group:
                        if not j.finished:
                            j.finished = True
                            j.sink(GenerationEvent("", len(j.tokens), finish_reason="error", error=str(exc)))

    def _run(self, jobs: list[_Job]) -> None:
        import torch
        from peft import PeftModel

        pad = int(self.tokenizer.pad_token_id)
        width = max(len(j.request.prompt_ids) for j in jobs)
        ids = [[pad] * (width - len(j.request.prompt_ids)) + j.request.prompt_ids for j in jobs]
        mask = [[0] * (width - len(j.request.prompt_ids)) + [1] * len(j.request.prompt_ids) for j in jobs]
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        attention = torch.tensor(mask, dtype=torch.long, device=self.device)
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(int(self.tokenizer.eos_token_id))
        rows = _Rows(jobs, self.tokenizer, eos_ids)
        req = jobs[0].request
        kwargs: dict[str, Any] = {
            "max_new_tokens": max(j.request.max_tokens for j in jobs),
            "pad_token_id": pad,
            "streamer": rows,
            "stopping_criteria": [rows],
        }
        if req.temperature > 0:
            kwargs.update(do_sample=True, temperature=req.temperature, top_p=req.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with self._lock:
            if isinstance(self.model, PeftModel):
                kwargs["adapter_names"] = [j.request.adapter or BASE_ADAPTER for j in jobs]
            self._stats["requests"] += len(jobs)
            self._stats["batches"] += 1
            self._stats["batched_rows"] += len(jobs)
            self._stats["max_batch_seen"] = max(self._stats["max_batch_seen"], len(jobs))
            self._batch_sizes.append(len(jobs))
            with torch.inference_mode():
                self.model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        rows.end()
