"""Deployments end to end: a real `trainyard up`, real replica processes serving tiny random Llamas (with
LoRA adapters), and the official `openai` client against /openai/v1."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.controlplane_support import ROOT, ServerProcess
from tests.otlp_receiver import OtlpReceiver
from tests.tiny_models import (
    BROKEN_CHAT_TEMPLATE,
    build_lora_adapter,
    build_tiny_llama,
    place_model_version,
    set_alias,
)

from trainyard.client import TrainyardClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = [{"role": "user", "content": "hello world"}]
READY_TIMEOUT_S = 300.0
POOL_PRICE_USD_PER_HOUR = 3.6


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    base = build_tiny_llama(d / "base", seed=0)
    other = build_tiny_llama(d / "broken", seed=7, chat_template=BROKEN_CHAT_TEMPLATE)
    return {
        "base": base,
        "a": build_lora_adapter(base, d / "a", seed=1),
        "b": build_lora_adapter(base, d / "b", seed=2),
        "broken": other,
    }


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    """The server's traces go to this receiver (OTLP/HTTP on 127.0.0.1)."""
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path], otlp: OtlpReceiver
) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("serving-home")
    storage = home / "storage"
    place_model_version(storage, "default", "tiny", 1, models["base"])
    place_model_version(storage, "default", "tiny", 2, models["base"])
    place_model_version(storage, "default", "tiny-a", 1, models["a"], base="tiny@1")
    place_model_version(storage, "default", "tiny-b", 1, models["b"], base="tiny@1")
    place_model_version(storage, "default", "tiny2", 1, models["broken"])
    set_alias(storage, "default", "tiny-a", "production", 1)
    srv = ServerProcess(home)
    srv.env.pop("TRAINYARD_TRACE_EXPORTER", None)
    srv.env.update(
        {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
    )
    srv.start(timeout_s=READY_TIMEOUT_S)
    try:
        yield srv
    finally:
        srv.stop()
        _kill_leftover_replicas(home)


def _kill_leftover_replicas(home: Path) -> None:
    import sqlite3

    try:
        con = sqlite3.connect(home / "trainyard.db")
        pids = [r[0] for r in con.execute("SELECT pid FROM serving_replicas") if r[0]]
        con.close()
    except sqlite3.Error:
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def tc(server: ServerProcess) -> Iterator[TrainyardClient]:
    with TrainyardClient(server.url, server.api_key, timeout_s=120) as c:
        yield c


@pytest.fixture(scope="module")
def oai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/openai/v1", api_key=server.api_key, max_retries=0, timeout=300
    )


@pytest.fixture(scope="module")
def deployed(tc: TrainyardClient) -> dict[str, dict[str, Any]]:
    """chat (tiny@1), fa (tiny-a@production), fb (tiny-b@1): three deployments over one base, on a
    local-cpu pool priced so that inference tokens cost something."""
    tc.patch_pool("local-cpu", {"price_usd_per_device_hour": POOL_PRICE_USD_PER_HOUR})
    docs = {
        "chat": tc.create_deployment("chat", "tiny@1", tags={"team": "search"}),
        "fa": tc.create_deployment("fa", "tiny-a@production"),
        "fb": tc.create_deployment("fb", "tiny-b@1"),
    }
    for name in docs:
        docs[name] = tc.wait_deployment(name, timeout_s=READY_TIMEOUT_S)
    return docs


def _chat(oai: openai.OpenAI, model: str, **kw: Any) -> str:
    r = oai.chat.completions.create(model=model, messages=PROMPT, max_tokens=8, temperature=0, **kw)
    return r.choices[0].message.content or ""


def _records(server: ServerProcess) -> list[dict[str, Any]]:
    from trainyard.serving.metering import usage_records
    from trainyard.store.db import Database

    db = Database(f"sqlite:///{server.home / 'trainyard.db'}")
    try:
        return usage_records(db)
    finally:
        db.dispose()


def _reference_outputs(models: dict[str, Path]) -> dict[str, str]:
    """What base, adapter a and adapter b answer to PROMPT with greedy decoding, computed here with peft."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models["base"])
    text = tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    out = {}
    base = AutoModelForCausalLM.from_pretrained(models["base"]).eval()
    model = PeftModel.from_pretrained(base, models["a"], adapter_name="a")
    model.load_adapter(models["b"], adapter_name="b")
    for name in ("__base__", "a", "b"):
        gen = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=8,
            do_sample=False,
            adapter_names=[name],
            pad_token_id=tok.pad_token_id,
        )
        out[name] = tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)
    return out


# ---- the OpenAI-compatible API ------------------------------------------------------------------
def test_deployment_document_matches_the_contract(tc: TrainyardClient, deployed: dict[str, Any]) -> None:
    doc = tc.get_deployment("chat")
    assert {"name", "state", "model", "routes", "replicas", "url"} <= set(doc.to_dict())
    assert doc["state"] == "ready" and doc["replicas"] == 1 and doc["model"] == "tiny@1"
    assert doc["routes"][0]["model"] == "tiny@1" and doc["routes"][0]["shadow"] is False
    assert doc["url"].endswith("/openai/v1")
    assert doc["replica_set"][0]["placement"]["pool"] == "local-cpu"
    names = [d["name"] for d in tc.list_deployments()["deployments"]]
    assert names == ["chat", "fa", "fb"]


def test_chat_completion_and_streaming(
    oai: openai.OpenAI, deployed: dict[str, Any], server: ServerProcess
) -> None:
    r = oai.chat.completions.create(
        model="chat", messages=PROMPT, max_tokens=6, temperature=0, metadata={"experiment": "e1"}
    )
    assert r.model == "chat" and r.object == "chat.completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 6 and r.usage.prompt_tokens == 5
    text = r.choices[0].message.content
    assert text and len(text.split()) == 6

    chunks = list(
        oai.chat.completions.create(model="chat", messages=PROMPT, max_tokens=6, temperature=0, stream=True)
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text  # the same greedy answer, token by token
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        recs = [
            x for x in _records(server) if x["deployment"] == "chat" and x["tags"].get("experiment") == "e1"
        ]
        if recs:
            break
        time.sleep(0.2)
    assert recs, "the request was not metered"
    rec = recs[0]
    assert rec["tenant"] == "default" and rec["model_version"] == "tiny@1" and rec["adapter"] is None
    assert rec["prompt_tokens"] == 5 and rec["completion_tokens"] == 6 and rec["route"] == "primary"
    assert rec["tags"] == {"team": "search", "experiment": "e1"} and rec["latency_s"] > 0


def test_inference_spans_follow_the_genai_conventions_and_metrics_count_them(
    oai: openai.OpenAI, deployed: dict[str, Any], server: ServerProcess, otlp: OtlpReceiver
) -> None:
    r = oai.chat.completions.create(model="fb", messages=PROMPT, max_tokens=4, temperature=0, seed=3)
    assert r.usage is not None
    (span,) = otlp.wait_for("chat fb", timeout_s=30)
    a = span.attributes
    assert span.kind == 3  # CLIENT
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "trainyard"
    assert a["gen_ai.request.model"] == "fb" and a["gen_ai.response.model"] == "tiny-b@1"
    assert a["gen_ai.request.max_tokens"] == 4 and a["gen_ai.request.temperature"] == 0
    assert a["gen_ai.request.seed"] == 3 and a["gen_ai.response.id"] == r.id
    assert a["gen_ai.usage.input_tokens"] == r.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == r.usage.completion_tokens
    assert a["gen_ai.response.finish_reasons"] == [r.choices[0].finish_reason]
    assert not any("content" in k or "prompt" in k for k in a)  # no prompt or completion text
    # the request's span ends after the response's last byte, so it may come in a later export
    deadline = time.monotonic() + 30
    while True:
        mine = [s for s in otlp.named("POST /openai/v1/chat/completions") if s.trace_id == span.trace_id]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    (request,) = mine
    assert span.parent_span_id == request.span_id
    forwarded = [s for s in otlp.spans if s.parent_span_id == span.span_id]
    assert forwarded and forwarded[0].attributes.get("http.request.method") == "POST"  # httpx, to the replica

    text = httpx.get(
        f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.api_key}"}, timeout=30
    ).text
    values = {
        (smp.name, tuple(sorted(smp.labels.items()))): smp.value
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
    }
    labels = {"tenant": "default", "deployment": "fb", "model_version": "tiny-b@1"}

    def value(name: str, **extra: str) -> float:
        return values.get((name, tuple(sorted({**labels, **extra}.items()))), 0.0)

    assert value("trainyard_inference_requests_total", code="200", route="primary") >= 1
    assert value("trainyard_inference_request_duration_seconds_count") >= 1
    assert value("trainyard_inference_tokens_total", kind="completion") >= r.usage.completion_tokens


def test_text_completion_stop_and_stream(oai: openai.OpenAI, deployed: dict[str, Any]) -> None:
    r = oai.completions.create(model="chat", prompt="hello world", max_tokens=5, temperature=0)
    text = r.choices[0].text
    assert r.object == "text_completion" and len(text.split()) == 5 and r.usage.completion_tokens == 5
    words = text.split()
    at = next(i for i in range(1, len(words)) if words[i] not in words[:i])  # a word first seen at `at`
    cut = oai.completions.create(
        model="chat", prompt="hello world", max_tokens=5, temperature=0, stop=[words[at]]
    )
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text.split() == words[:at]
    chunks = list(
        oai.completions.create(model="chat", prompt="hello world", max_tokens=5, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def test_models_list_shows_the_base_of_a_lora_version(oai: openai.OpenAI, deployed: dict[str, Any]) -> None:
    got = {m.id: m for m in oai.models.list().data}
    assert set(got) == {"chat", "fa", "fb"}
    assert got["chat"].parent is None and got["chat"].root == "tiny@1"
    assert got["fa"].parent == "tiny@1" and got["fa"].root == "tiny-a@1"
    assert oai.models.retrieve("fb").parent == "tiny@1"


def test_openai_errors(oai: openai.OpenAI, server: ServerProcess, deployed: dict[str, Any]) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        oai.chat.completions.create(model="nope", messages=PROMPT)
    assert nf.value.code == "model_not_found" and nf.value.param == "model"
    with pytest.raises(openai.BadRequestError) as bad:
        oai.chat.completions.create(model="chat", messages=[], max_tokens=0)
    fields = {e["field"] for e in bad.value.body["details"]["errors"]}
    assert fields == {"messages", "max_tokens"}
    with pytest.raises(openai.BadRequestError) as extra:
        oai.chat.completions.create(model="chat", messages=PROMPT, extra_body={"frobnicate": 1})
    assert extra.value.param == "frobnicate"
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="chat", messages=[{"role": "robot", "content": "x"}])
    with pytest.raises(openai.AuthenticationError) as auth:
        openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key="ty_wrong", max_retries=0).models.list()
    assert auth.value.body["type"] == "authentication_error"
    r = httpx.post(
        f"{server.url}/openai/v1/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_other_tenants_deployments_are_invisible(
    server: ServerProcess, tc: TrainyardClient, deployed: dict[str, Any]
) -> None:
    key = tc.create_tenant("serving-other")["api_key"]
    other = openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=key, max_retries=0)
    assert other.models.list().data == []
    with pytest.raises(openai.NotFoundError):
        other.chat.completions.create(model="chat", messages=PROMPT, max_tokens=2)
    with TrainyardClient(server.url, key) as oc:
        from trainyard.errors import NotFoundError

        assert oc.list_deployments() == {"deployments": []}
        for call in (
            lambda: oc.get_deployment("chat"),
            lambda: oc.delete_deployment("chat"),
            lambda: oc.set_traffic("chat", [{"model": "tiny@1", "weight": 1}]),
        ):
            with pytest.raises(NotFoundError):
                call()
        with pytest.raises(NotFoundError):  # models are named in the caller's own area only
            oc.create_deployment("mine", "tiny@1")


# ---- governance: inference tokens in the usage ledger, tokens per minute ---------------------------
def test_inference_tokens_are_charged_to_the_ledger_and_shown_to_their_tenant_only(
    server: ServerProcess,
    tc: TrainyardClient,
    oai: openai.OpenAI,
    deployed: dict[str, Any],
    models: dict[str, Path],
) -> None:
    from trainyard.catalog.accelerators import get_accelerator
    from trainyard.serving.quote import serving_quote

    r = oai.chat.completions.create(
        model="chat", messages=PROMPT, max_tokens=6, temperature=0, metadata={"probe": "ledger"}
    )
    assert r.usage is not None
    total = r.usage.total_tokens
    deadline = time.monotonic() + 30
    while True:  # the gateway's records reach the database in the controller's next flush
        rows = tc.usage(by="tag:probe", tenant="default")["rows"]
        row = next((x for x in rows if x["group"] == "ledger"), None)
        if row is not None or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert row is not None, rows
    assert row["tokens"] == total and row["entries"] == 1
    lines = [
        line
        for line in tc.invoice(tenant="default")["lines"]
        if line["kind"] == "inference_tokens" and line.get("unit") == "tokens"
    ]
    assert lines, "no inference_tokens invoice line"
    unit_price = lines[0]["unit_price_usd"]
    # $/1k tokens from the predicted decode speed of the model's weights on the pool and its price
    weight_bytes = sum(f.stat().st_size for f in models["base"].glob("*.safetensors"))
    quote = serving_quote("local-cpu", get_accelerator("cpu"), weight_bytes, POOL_PRICE_USD_PER_HOUR)
    assert unit_price > 0 and abs(unit_price - quote.usd_per_1k_tokens / 1000) < 1e-15
    assert abs(row["usd"] - total * unit_price) < 1e-6  # reports round dollars to 6 places
    by_dep = {x["group"]: x for x in tc.usage(by="deployment", tenant="default")["rows"]}
    assert by_dep["chat"]["tokens"] >= total  # (a tiny model's tokens cost under $1e-6)
    by_team = {x["group"]: x for x in tc.usage(by="tag:team", tenant="default")["rows"]}
    assert by_team["search"]["tokens"] >= total  # the deployment's own tags allocate its cost too

    key = tc.create_tenant("tokens-other")["api_key"]
    with TrainyardClient(server.url, key) as oc:
        from trainyard.errors import NotFoundError

        mine = oc.usage(by="deployment")["rows"]
        assert all(x["tokens"] == 0 for x in mine) and "chat" not in {x["group"] for x in mine}
        with pytest.raises(NotFoundError):
            oc.usage(by="deployment", tenant="default")


def test_tokens_per_minute_answers_429_with_retry_after_then_admits(
    server: ServerProcess, tc: TrainyardClient, oai: openai.OpenAI, deployed: dict[str, Any]
) -> None:
    tpm = 120  # 2 tokens/s, a bucket of 120
    tc.update_tenant("default", {"tokens_per_minute": tpm})
    try:
        first = oai.completions.create(model="chat", prompt="hello", max_tokens=10, temperature=0)
        assert first.usage is not None and first.usage.total_tokens >= 10
        # a request that needs the whole bucket: the first one's tokens are still missing from it
        big = tpm - 2  # "hello" is estimated at 2 prompt tokens
        raw = httpx.post(
            f"{server.url}/openai/v1/completions",
            json={"model": "chat", "prompt": "hello", "max_tokens": big, "temperature": 0},
            headers={"Authorization": f"Bearer {server.api_key}"},
            timeout=120,
        )
        assert raw.status_code == 429, raw.text
        err = raw.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and err["type"] == "tokens"
        assert set(err) >= {"message", "type", "param", "code"}
        retry_after = int(raw.headers["Retry-After"])
        assert 1 <= retry_after <= 10
        assert raw.headers["X-RateLimit-Limit-Tokens"] == str(tpm)
        with pytest.raises(openai.RateLimitError) as exc:
            oai.completions.create(model="chat", prompt="hello", max_tokens=big, temperature=0)
        assert exc.value.code == "rate_limit_exceeded"
        time.sleep(int(exc.value.response.headers["Retry-After"]))
        ok = oai.completions.create(model="chat", prompt="hello", max_tokens=big, temperature=0)
        assert ok.usage is not None and ok.usage.completion_tokens >= 1
    finally:
        tc.update_tenant("default", {"tokens_per_minute": None})
    assert _chat(oai, "chat")  # no limit again


def test_inference_is_refused_once_a_hard_budget_is_used_up_and_admitted_when_raised(
    server: ServerProcess, tc: TrainyardClient, oai: openai.OpenAI, deployed: dict[str, Any]
) -> None:
    """A hard budget on a tag with nothing left refuses the requests it applies to (429 in OpenAI's
    ``insufficient_quota`` shape, not retried by the official client), and only those; raised, it
    admits them again on the next request."""
    tc.set_budget("default", usd=0.0, hard=True, tag="probe=budget-gate")
    try:
        with pytest.raises(openai.RateLimitError) as exc:
            oai.with_options(max_retries=3).chat.completions.create(
                model="chat", messages=PROMPT, max_tokens=4, metadata={"probe": "budget-gate"}
            )
        err = exc.value.body
        assert isinstance(err, dict) and err["type"] == "insufficient_quota", err
        assert exc.value.code == "budget_exceeded" and "used up" in exc.value.message
        assert exc.value.response.headers["x-should-retry"] == "false"
        # other requests of the tenant are not under that budget
        assert _chat(oai, "chat")
        # another tenant's identical request is not either: it gets its own 404 for the deployment
        key = tc.create_tenant("budget-gate-other")["api_key"]
        other = openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.NotFoundError):
            other.chat.completions.create(
                model="chat", messages=PROMPT, max_tokens=4, metadata={"probe": "budget-gate"}
            )
    finally:
        tc.set_budget("default", usd=1000.0, hard=True, tag="probe=budget-gate")
    r = oai.chat.completions.create(
        model="chat", messages=PROMPT, max_tokens=4, metadata={"probe": "budget-gate"}
    )
    assert r.choices[0].message.content is not None


def test_cli_deployments_get_and_list_json(server: ServerProcess, deployed: dict[str, Any]) -> None:
    env = server.cli_env()
    out = subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", "deployments", "get", "chat", "--json"],
        env=env,
        capture_output=True,
        text=True,
        cwd=str(ROOT),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["name"] == "chat" and doc["state"] == "ready" and doc["routes"][0]["weight"] == 100
    missing = subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", "deployments", "get", "nope", "--json"],
        env=env,
        capture_output=True,
        text=True,
        cwd=str(ROOT),
        timeout=120,
    )
    assert missing.returncode == 3 and "Traceback" not in missing.stderr


# ---- multi-LoRA ---------------------------------------------------------------------------------
def test_multi_lora_each_adapter_answers_with_its_own_weights_on_one_replica(
    oai: openai.OpenAI, tc: TrainyardClient, deployed: dict[str, Any], models: dict[str, Path]
) -> None:
    ref = _reference_outputs(models)
    assert len(set(ref.values())) == 3  # the adapters really change the answer
    got = {}
    results: dict[str, str] = {}

    def ask(name: str) -> None:
        results[name] = _chat(oai, name)

    threads = [threading.Thread(target=ask, args=(n,)) for n in ("chat", "fa", "fb")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = results
    assert got == {"chat": ref["__base__"], "fa": ref["a"], "fb": ref["b"]}
    replicas = {r["id"] for n in ("chat", "fa", "fb") for r in tc.get_deployment(n)["replica_set"]}
    assert len(replicas) == 1  # three versions over one base cost one replica


# ---- traffic ------------------------------------------------------------------------------------
def test_ab_split_within_tolerance_and_sticky_users(
    oai: openai.OpenAI, tc: TrainyardClient, server: ServerProcess, deployed: dict[str, Any]
) -> None:
    tc.create_deployment("ab", "tiny-a@1")
    tc.set_traffic("ab", [{"model": "tiny-a@1", "weight": 70}, {"model": "tiny-b@1", "weight": 30}])
    tc.wait_deployment("ab", timeout_s=READY_TIMEOUT_S)
    n = 120

    def one(i: int) -> None:
        oai.completions.create(
            model="ab", prompt="hello", max_tokens=1, temperature=0, extra_body={"metadata": {"ab": "split"}}
        )

    _run_concurrently(one, n, workers=6)
    for _ in range(8):
        oai.completions.create(
            model="ab", prompt="hello", max_tokens=1, user="alice", extra_body={"metadata": {"ab": "sticky"}}
        )
    recs = _wait_records(server, lambda r: r["deployment"] == "ab" and "ab" in r["tags"], n + 8)
    split = Counter(r["model_version"] for r in recs if r["tags"]["ab"] == "split")
    assert sum(split.values()) == n
    sd = (n * 0.7 * 0.3) ** 0.5
    assert abs(split["tiny-a@1"] - 0.7 * n) <= 4 * sd, split  # binomial, 4 standard deviations
    sticky = {r["model_version"] for r in recs if r["tags"]["ab"] == "sticky"}
    assert len(sticky) == 1


def test_shadow_is_mirrored_compared_and_never_returned(
    oai: openai.OpenAI, tc: TrainyardClient, server: ServerProcess, deployed: dict[str, Any]
) -> None:
    tc.create_deployment("shadowed", "tiny-a@1")
    tc.set_traffic("shadowed", [{"model": "tiny-a@1", "weight": 100}, {"model": "tiny-b@1", "shadow": True}])
    a_answer, b_answer = _chat(oai, "fa"), _chat(oai, "fb")
    assert a_answer != b_answer
    for _ in range(6):
        assert _chat(oai, "shadowed") == a_answer
    streamed = oai.chat.completions.create(
        model="shadowed", messages=PROMPT, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == a_answer
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        report = tc.shadow_report("shadowed")
        if report["comparisons"] and report["comparisons"][0]["pairs"] >= 7:
            break
        time.sleep(0.3)
    comp = report["comparisons"][0]
    assert comp["primary"] == "tiny-a@1" and comp["shadow"] == "tiny-b@1" and comp["pairs"] == 7
    assert comp["shadow_errors"] == 0 and report["dropped"] == 0
    assert comp["agreement"]["exact_match_rate"] == 0.0
    assert all(e["primary"] == a_answer and e["shadow"] == b_answer for e in comp["examples"])
    shadow_recs = _wait_records(server, lambda r: r["deployment"] == "shadowed" and r["route"] == "shadow", 7)
    assert {r["model_version"] for r in shadow_recs} == {"tiny-b@1"}


def test_alias_move_moves_the_deployment(
    oai: openai.OpenAI, tc: TrainyardClient, server: ServerProcess, deployed: dict[str, Any]
) -> None:
    storage = server.home / "storage"
    place_model_version(storage, "default", "tiny-a", 2, _adapter_dir(server, "tiny-b", 1), base="tiny@1")
    b_answer = _chat(oai, "fb")
    set_alias(storage, "default", "tiny-a", "production", 2)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        doc = tc.get_deployment("fa")
        if doc["version"] == "tiny-a@2":
            break
        time.sleep(0.2)
    assert doc["version"] == "tiny-a@2"
    assert any(e["kind"] == "model_moved" and e["data"]["to"] == "tiny-a@2" for e in doc["events"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _chat(oai, "fa") != b_answer:
        time.sleep(0.3)
    assert _chat(oai, "fa") == b_answer  # tiny-a@2 holds tiny-b@1's weights
    set_alias(storage, "default", "tiny-a", "production", 1)


def _adapter_dir(server: ServerProcess, name: str, version: int) -> Path:
    return server.home / "storage" / "tenants" / "default" / "models" / name / str(version)


def test_canary_whose_replica_fails_is_rolled_back(
    oai: openai.OpenAI, tc: TrainyardClient, deployed: dict[str, Any]
) -> None:
    tc.create_deployment("cn", "tiny@1")
    tc.set_traffic(
        "cn",
        [{"model": "tiny@1", "weight": 50}, {"model": "tiny2@1", "weight": 50, "canary": True}],
        canary={"max_error_rate": 0.2, "window_s": 600, "min_requests": 3},
    )
    failures = 0
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            _chat(oai, "cn")
        except openai.InternalServerError:
            failures += 1
        doc = tc.get_deployment("cn")
        if not any(r["canary"] for r in doc["routes"]):
            break
    assert [(r["model"], r["weight"]) for r in doc["routes"]] == [("tiny@1", 100.0)]
    rolled = [e for e in doc["events"] if e["kind"] == "canary_rolled_back"]
    assert len(rolled) == 1 and "error rate" in rolled[0]["data"]["reason"] and failures >= 3
    for _ in range(5):
        _chat(oai, "cn")  # nothing reaches the failing version any more
    tc.delete_deployment("cn")


# ---- autoscaling --------------------------------------------------------------------------------
def test_scale_up_under_load_down_when_idle_and_from_zero(oai: openai.OpenAI, tc: TrainyardClient) -> None:
    tc.create_deployment(
        "elastic", "tiny2@1", min_replicas=0, max_replicas=2, target_in_flight=1, scale_down_delay_s=2
    )
    assert tc.wait_deployment("elastic", timeout_s=30)["replicas"] == 0
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            oai.completions.create(model="elastic", prompt="hello", max_tokens=24, temperature=0)

    workers = [threading.Thread(target=load) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        peak = _wait_replicas(tc, "elastic", lambda n: n >= 2)
    finally:
        stop.set()
        for w in workers:
            w.join(120)
    assert peak == 2
    assert _wait_replicas(tc, "elastic", lambda n: n == 0) == 0
    r = oai.completions.create(model="elastic", prompt="hello", max_tokens=2, temperature=0)  # cold start
    assert r.usage is not None and r.usage.completion_tokens == 2
    tc.delete_deployment("elastic")


# ---- restart ------------------------------------------------------------------------------------
def test_deployments_survive_a_server_crash(
    server: ServerProcess, tc: TrainyardClient, deployed: dict[str, Any]
) -> None:
    before = tc.get_deployment("chat")["replica_set"][0]
    server.kill9()
    server.start(timeout_s=READY_TIMEOUT_S)
    doc = tc.wait_deployment("chat", timeout_s=READY_TIMEOUT_S)
    assert doc["replica_set"][0]["id"] == before["id"] and doc["replica_set"][0]["pid"] == before["pid"]
    oai = openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=server.api_key, max_retries=0)
    assert _chat(oai, "chat")


# ---- helpers ------------------------------------------------------------------------------------
def _run_concurrently(fn: Any, n: int, workers: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(fn, range(n)))


def _wait_records(server: ServerProcess, pred: Any, n: int, timeout_s: float = 30) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        recs = [r for r in _records(server) if pred(r)]
        if len(recs) >= n or time.monotonic() > deadline:
            return recs
        time.sleep(0.3)


def _wait_replicas(tc: TrainyardClient, name: str, pred: Any, timeout_s: float = READY_TIMEOUT_S) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        n = tc.get_deployment(name)["replicas"]
        if pred(n) or time.monotonic() > deadline:
            return int(n)
        time.sleep(0.2)
