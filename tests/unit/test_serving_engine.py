"""The built-in engine on a tiny random Llama: dynamic batching decodes concurrent requests together
and gives each request the same greedy answer it gets alone; multi-LoRA mixes adapters in one batch."""

from __future__ import annotations

import threading

import pytest
from tests.tiny_models import build_lora_adapter, build_tiny_llama

from trainyard.serving.engine import GenerationEvent, GenerationRequest, TransformersEngine


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> TransformersEngine:
    d = tmp_path_factory.mktemp("engine")
    base = build_tiny_llama(d / "base")
    eng = TransformersEngine(
        str(base), adapters={"a": str(build_lora_adapter(base, d / "a", seed=1))}, batch_wait_s=0.2
    )
    eng.start()
    eng.load_adapter("b", str(build_lora_adapter(base, d / "b", seed=2)))  # at run time
    yield eng
    eng.stop()


def _run(engine: TransformersEngine, reqs: list[GenerationRequest]) -> list[tuple[str, str, int]]:
    done = [threading.Event() for _ in reqs]
    out: list[list[GenerationEvent]] = [[] for _ in reqs]
    for i, r in enumerate(reqs):

        def sink(ev: GenerationEvent, i: int = i) -> None:
            out[i].append(ev)
            if ev.finish_reason is not None:
                done[i].set()

        engine.submit(r, sink)
    for d in done:
        assert d.wait(120)
    return [
        ("".join(e.text for e in evs), evs[-1].finish_reason or "", evs[-1].completion_tokens) for evs in out
    ]


def test_concurrent_requests_are_decoded_in_one_batch_with_their_solo_answers(
    engine: TransformersEngine,
) -> None:
    prompts = [
        engine.encode(p) for p in ("hello world", "the quick brown fox jumps", "one", "red green blue")
    ]
    solo = [_run(engine, [GenerationRequest(p, max_tokens=6)])[0] for p in prompts]
    before = engine.stats()["batches"]
    together = _run(engine, [GenerationRequest(p, max_tokens=6) for p in prompts])
    assert engine.stats()["batches"] == before + 1 and engine.stats()["max_batch_seen"] >= 4
    assert together == solo
    assert all(reason == "length" and n == 6 for _, reason, n in together)


def test_each_row_stops_on_its_own_budget_and_stop_string(engine: TransformersEngine) -> None:
    p = engine.encode("hello world")
    full = _run(engine, [GenerationRequest(p, max_tokens=6)])[0][0]
    words = full.split()
    cut = next(i for i in range(1, len(words)) if words[i] not in words[:i])  # first new word after the first
    out = _run(
        engine,
        [
            GenerationRequest(p, max_tokens=2),
            GenerationRequest(p, max_tokens=6, stop=[words[cut]]),
            GenerationRequest(p, max_tokens=6),
        ],
    )
    assert out[0] == (" ".join(words[:2]), "length", 2)
    assert out[1][0].split() == words[:cut] and out[1][1] == "stop"
    assert out[2] == (full, "length", 6)


def test_one_batch_mixes_adapters(engine: TransformersEngine) -> None:
    p = engine.encode_chat([{"role": "user", "content": "hello world"}])
    solo = {a: _run(engine, [GenerationRequest(p, max_tokens=6, adapter=a)])[0][0] for a in (None, "a", "b")}
    assert len(set(solo.values())) == 3
    mixed = _run(engine, [GenerationRequest(p, max_tokens=6, adapter=a) for a in ("b", None, "a")])
    assert [m[0] for m in mixed] == [solo["b"], solo[None], solo["a"]]
