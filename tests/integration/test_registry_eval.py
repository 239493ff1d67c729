"""Model registry and evaluation end to end, on real worker processes (local executor, SQLite):
import a tiny Llama → fine-tune it (full and LoRA) from the registered base → versions with lineage →
evaluations run as jobs → the production gate refuses worse and inconclusive models, accepts a better
one, admins may force with a reason → the alias history; other tenants get 404s."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn
from sqlalchemy import select

from controlplane_support import free_port
from hf_models import build_tiny_llama, completion_rows
from trainyard import errors as E
from trainyard.api.app import create_app
from trainyard.client.client import TrainyardClient
from trainyard.executors.local import LocalExecutor
from trainyard.executors.sandbox import Sandbox
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduling import GreedyCheapestRound
from trainyard.settings import Settings
from trainyard.store.registry_models import EvaluationRow
from trainyard.store.repositories import JobRepo, TenantRepo


class Live:
    def __init__(self, platform: Platform, url: str, home: Path) -> None:
        self.p = platform
        self.url = url
        self.home = home
        key = platform.settings.api_key_path.read_text().strip()
        self.c = self.client(key)

    def client(self, key: str) -> TrainyardClient:
        return TrainyardClient(self.url, key, retries=0, timeout_s=120.0)

    def wait_job(self, job_id: str, timeout_s: float = 240.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            doc = self.c.get_job(job_id)
            if doc["state"] in ("succeeded", "failed", "cancelled"):
                assert doc["state"] == "succeeded", f"{job_id}: {doc['state']} {doc['reason']}"
                return doc
            time.sleep(0.2)
        raise AssertionError(f"{job_id} did not finish in {timeout_s} s")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    home = tmp_path_factory.mktemp("registry")
    # workers in the bubblewrap sandbox, as `trainyard up` runs them: fine-tunes read a registered base
    # and evaluations read both models and the split through staged copies
    executor = LocalExecutor(heartbeat_timeout_s=120.0, sandbox=Sandbox(), warm_start=False)
    platform = Platform.open(
        Settings(home=home),
        PlatformOptions(
            executor=executor,
            schedule_round=GreedyCheapestRound(),
            cpu_count=2,
            with_catalog=False,
            loop_interval_s=0.1,
        ),
    )
    platform.pools.update("local-cpu", {"price_usd_per_device_hour": 3.6})
    platform.start_loop()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(platform, access_log=False), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the API server did not start"
    yield Live(platform, f"http://127.0.0.1:{port}", home)
    server.should_exit = True
    thread.join(10)
    platform.stop_loop()
    executor.shutdown(kill_workers=True)
    platform.close()


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def finetune_spec(name: str, base: str, dataset: Path, **workload: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainyard/v1",
        "kind": "TrainingJob",
        "name": name,
        "model": {"base": base},
        "workload": {
            "seq_len": 32,
            "global_batch": 8,
            "steps": 60,
            "precision": "fp32",
            "dataset": str(dataset),
            **workload,
        },
        "requirements": {"allow": ["cpu"]},
    }


@pytest.fixture(scope="module")
def world(live: Live, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A base model, two fine-tunes of it on the copy task and one on noise, and the eval split."""
    tmp = tmp_path_factory.mktemp("models")
    base_dir = build_tiny_llama(tmp / "base", seed=0)
    base = live.c.import_model(base_dir, "tiny")
    # training data lies in the tenant's own storage (DESIGN §3.6: a path elsewhere is refused)
    area = live.home / "storage" / "tenants" / "default" / "datasets"
    train = write_jsonl(area / "train.jsonl", completion_rows(400, seed=1))
    noise = write_jsonl(
        area / "noise.jsonl",
        [{"text": " ".join(str((i * 7919 + j) % 97) for j in range(12))} for i in range(400)],
    )
    split = write_jsonl(area / "copy-eval.jsonl", completion_rows(60, seed=99))
    full = live.c.submit(finetune_spec("copy", "tiny@1", train, steps=100))
    lora = live.c.submit(finetune_spec("copy-lora", "tiny@1", train, method="lora", lora_rank=8))
    full_doc = live.wait_job(full["id"])
    lora_doc = live.wait_job(lora["id"])
    worse = live.c.submit(finetune_spec("copy", "tiny@1", noise, steps=40))
    worse_doc = live.wait_job(worse["id"])
    return {
        "base": base,
        "base_dir": base_dir,
        "full": full_doc,
        "lora": lora_doc,
        "worse": worse_doc,
        "split": f"file://{split}",
        "train": train,
    }


def test_import_verifies_and_hashes(live: Live, world: dict[str, Any], tmp_path: Path) -> None:
    base = world["base"]
    assert base["id"] == "tiny@1" and base["version"] == 1 and base["kind"] == "base"
    assert (
        base["sha256"] == hashlib.sha256((world["base_dir"] / "model.safetensors").read_bytes()).hexdigest()
    )
    assert "tokenizer/tokenizer.json" in base["files"] and base["shape"]["n_layers"] == 2
    assert base["base"] is None and base["source_job"] is None and base["adapter"] is False
    # a directory without a tokenizer, and one with pickled weights only, are refused with every reason
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (bad / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(E.InvalidInputError) as err:
        live.c.import_model(bad, "bad")
    fields = {e["field"] for e in err.value.details["errors"]}
    assert {"weights", "tokenizer"} <= fields
    with pytest.raises(E.NotFoundError):
        live.c.get_model("bad@1")


def test_finetunes_register_versions_with_lineage(live: Live, world: dict[str, Any]) -> None:
    full, lora = world["full"], world["lora"]
    assert full["result"]["model_version"] == "copy@1"
    assert lora["result"]["model_version"] == "copy-lora@1"
    m = live.c.get_model("copy@1")
    assert m["base"] == "tiny@1" and m["source_job"] == full["id"] and m["kind"] == "full"
    assert m["datasets"] == [str(world["train"])]
    assert (
        m["run_record"]["job_id"] == full["id"] and m["run_record"]["base_sha256"] == world["base"]["sha256"]
    )
    assert Path(m["artefacts"]["tokenizer"], "tokenizer.json").is_file()  # the tokenizer is copied
    assert m["shape"]["n_layers"] == 2
    # the fine-tune started from the base's weights: its first loss is the base's, far below a random init
    assert full["spec"]["model"]["n_layers"] == 2 and full["spec"]["model"]["base"] == "tiny@1"
    la = live.c.get_model("copy-lora@1")
    assert la["adapter"] is True and la["kind"] == "adapter" and la["base"] == "tiny@1"
    adapter = Path(la["artefacts"]["adapter"])
    assert (adapter / "adapter_model.safetensors").is_file() and la["artefacts"]["weights"] is None
    assert la["sha256"] == hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()
    # merged on demand with peft: the merged weights equal the job's own merged export
    with live.p.db.session() as s:
        default = TenantRepo(s).by_name("default")
    assert default is not None
    v = live.p.registry.resolve(default.id, "copy-lora@1")
    merged = live.p.registry.local_weights_dir(v)
    from safetensors.torch import load_file

    mine = load_file(str(merged / "model.safetensors"))
    job_model = Path(str(lora["result"]["model_path"]).removeprefix("file://")) / "model.safetensors"
    theirs = load_file(str(job_model))
    assert set(mine) == set(theirs)
    assert all((mine[k] - theirs[k]).abs().max().item() < 1e-5 for k in mine)
    # lineage both ways
    lin = live.c.model_lineage("tiny@1")
    assert {"copy@1", "copy-lora@1", "copy@2"} <= set(lin["children"])
    trained = live.c.list_models(dataset=str(world["train"]))["models"]
    assert {d["id"] for d in trained} == {"copy@1", "copy-lora@1"}


def test_bases_are_resolved_at_submission(live: Live, world: dict[str, Any]) -> None:
    spec = finetune_spec("x", "nope@1", world["train"])
    with pytest.raises(E.NotFoundError) as err:
        live.c.submit(spec)
    assert err.value.details["errors"][0]["field"] == "model.base"
    spec = finetune_spec("x", "tiny@1", world["train"])
    spec["model"] = {"base": "tiny@1", "n_layers": 5, "d_model": 64, "n_heads": 4, "vocab_size": 999}
    with pytest.raises(E.InvalidInputError) as err2:
        live.c.submit(spec)
    assert {e["field"] for e in err2.value.details["errors"]} == {"model.n_layers", "model.vocab_size"}
    # an alias resolves to the concrete version at submission
    live.c.promote_model("tiny@1", "staging")
    job = live.c.submit(finetune_spec("via-alias", "tiny@staging", world["train"], steps=1))
    assert job["spec"]["model"]["base"] == "tiny@1"
    live.wait_job(job["id"])
    # another tenant cannot see or use this tenant's models
    other = live.client(live.c.create_tenant("other")["api_key"])
    with pytest.raises(E.NotFoundError):
        other.submit(finetune_spec("x", "tiny@1", world["train"]))
    with pytest.raises(E.NotFoundError):
        other.get_model("copy@1")
    assert other.list_models()["models"] == []


def test_evaluation_gate_and_alias_history(live: Live, world: dict[str, Any]) -> None:
    c = live.c
    better = c.wait_evaluation(
        c.run_evaluation(model="copy@1", baseline="tiny@1", dataset=world["split"])["id"], timeout_s=300
    )
    assert better["state"] == "succeeded", better
    assert better["n"] == 60 and better["dataset"] == world["split"] and better["split"] == "eval"
    loss = better["metrics"]["loss"]
    assert loss["delta"] < 0 and loss["ci95"][1] < 0 and loss["p_value"] < 0.01
    assert loss["test"] == "paired_permutation"
    assert {"loss", "perplexity", "exact_match"} <= set(better["metrics"])
    em = better["metrics"]["exact_match"]
    assert em["test"] == "mcnemar_exact" and em["model"] > em["baseline"]
    assert better["verdict"] == "better" and better["passed"] is True, better["reasons"]
    assert {g["name"] for g in better["guardrails"]} == {"latency_s_per_token", "cost_usd_per_1k_tokens"}
    ex = better["examples"]
    assert (
        ex
        and ex[0]["outcome"] == "win"
        and {"input", "reference", "model_output", "baseline_output"} <= set(ex[0])
    )
    # the evaluation job was placed and billed like any job
    job = c.get_job(better["job_id"])
    assert job["state"] == "succeeded" and job["cost_usd"] > 0
    # its sandboxed worker was told where its own tenant's request is, and a job of another tenant
    # naming this evaluation in its tags is told nothing
    with live.p.db.session() as s:
        row = JobRepo(s).get(better["job_id"])
        assert row is not None
        tenant_id, spec = row.tenant_id, row.spec
    evaluations = live.p.evaluations
    env = evaluations.launch_env(SimpleNamespace(spec=spec, tenant_id=tenant_id))
    assert Path(env["TRAINYARD_EVAL_REQUEST"]).is_file()
    assert evaluations.launch_env(SimpleNamespace(spec=spec, tenant_id="tnt-someone-else")) == {}
    assert c.get_model("copy@1")["evaluation"]["id"] == better["id"]
    assert c.get_job(world["full"]["id"])["result"]["evaluation"]["id"] == better["id"]

    # production: copy@1 has a passing evaluation against its base (no production yet)
    doc = c.promote_model("copy@1", "production")
    assert doc["promotion"]["from"] is None and doc["promotion"]["evaluation"] == better["id"]

    # copy@2 (trained on noise) is worse than the current production: blocked, exit code 4
    worse = c.wait_evaluation(
        c.run_evaluation(model="copy@2", baseline="copy@production", dataset=world["split"])["id"],
        timeout_s=300,
    )
    assert worse["baseline"] == "copy@1" and worse["verdict"] == "worse" and worse["passed"] is False
    with pytest.raises(E.PromotionBlockedError) as err:
        c.promote_model("copy@2", "production")
    assert err.value.exit_code == 4 and err.value.code == "promotion_blocked"
    assert err.value.details["verdict"] == "worse"

    # too few examples: inconclusive, also blocked
    small = c.wait_evaluation(
        c.run_evaluation(model="copy@2", baseline="copy@1", dataset=world["split"], max_examples=10)["id"],
        timeout_s=300,
    )
    assert small["n"] == 10 and small["verdict"] == "inconclusive" and not small["passed"]
    with pytest.raises(E.PromotionBlockedError):
        c.promote_model("copy@2", "production", evaluation=small["id"])

    # an admin may force it, with a reason, and it is recorded
    with pytest.raises(E.InvalidInputError):
        c.promote_model("copy@2", "production", force=True)
    forced = c.promote_model("copy@2", "production", force=True, reason="rollback drill")
    assert forced["promotion"]["forced"] is True
    c.promote_model("copy@1", "staging")
    hist = c.model_aliases("copy")
    assert hist["aliases"] == {"production": "copy@2", "staging": "copy@1"}
    moves = [(h["alias"], h["from"], h["to"], h["forced"]) for h in hist["history"]]
    assert moves == [
        ("production", None, "copy@1", False),
        ("production", "copy@1", "copy@2", True),
        ("staging", None, "copy@1", False),
    ]
    assert (
        hist["history"][0]["evaluation"] == better["id"] and hist["history"][1]["reason"] == "rollback drill"
    )
    assert all(h["actor"] and h["at"] for h in hist["history"])

    # another tenant: the evaluation is a 404, and so is everything of this tenant's
    other = live.client(live.c.create_tenant("other2")["api_key"])
    with pytest.raises(E.NotFoundError):
        other.get_evaluation(better["id"])
    assert other.list_evaluations()["evaluations"] == []
    with pytest.raises(E.NotFoundError):
        other.model_aliases("copy")
    # and cannot evaluate on this tenant's files
    with pytest.raises(E.InvalidInputError):
        live.c.run_evaluation(model="copy@1", baseline="tiny@1", dataset="file:///etc/passwd")


def test_public_base_models_are_readable_by_all_and_changeable_by_none(
    live: Live, world: dict[str, Any]
) -> None:
    pub = live.c.import_model(world["base_dir"], "shared-base", public=True)
    assert pub["public"] is True
    other = live.client(live.c.create_tenant("reader")["api_key"])
    assert other.get_model("shared-base@1")["sha256"] == pub["sha256"]
    assert [m["id"] for m in other.list_models()["models"]] == ["shared-base@1"]
    # the reader trains on data in its own storage (another tenant's area is refused, DESIGN §3.6)
    own = live.home / "storage" / "tenants" / "reader" / "datasets" / "train.jsonl"
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_bytes(Path(world["train"]).read_bytes())
    job = other.submit(finetune_spec("mine", "shared-base@1", own, steps=1))
    assert job["spec"]["model"]["base"] == "shared-base@1"
    with pytest.raises(E.PermissionDeniedError):
        other.promote_model("shared-base@1", "staging")
    with pytest.raises(E.PermissionDeniedError):
        other.import_model(world["base_dir"], "x", public=True)
    with pytest.raises(E.ConflictError):
        other.import_model(world["base_dir"], "shared-base")


def test_a_guardrail_dataset_blocks_the_gate_unless_its_margin_is_loose(
    live: Live, world: dict[str, Any], tmp_path: Path
) -> None:
    """copy@1 beats the noise-trained copy@2 on the copy split, but copy@2 is far better on noise text:
    with the noise dataset as a guardrail (its train split, in the same sandboxed job) a tight margin
    blocks the gate and names the dataset, and a loose one lets it pass."""
    c = live.c
    noise = write_jsonl(
        tmp_path / "noise-guard.jsonl",
        [{"text": " ".join(str((i * 7919 + j) % 97) for j in range(12))} for i in range(400, 440)],
    )
    ds = c.upload_dataset(noise, name="noise-guard", eval_fraction=0.1)
    ref = f"ds://noise-guard@{ds['version']}"
    n_guard = ds["splits"]["train"]["rows"]
    assert n_guard >= 30

    def run(margin: float) -> dict[str, Any]:
        doc = c.run_evaluation(
            model="copy@1",
            baseline="copy@2",
            dataset=world["split"],
            max_examples=40,
            # timing is not under test here (a busy CPU varies it by more than 10x): wide thresholds
            guardrails={"latency_s_per_token": 10.0, "cost_usd_per_1k_tokens": 10.0},
            guardrail_datasets=[{"dataset": ref, "split": "train", "metric": "loss", "margin": margin}],
        )
        assert doc["gate"]["guardrail_datasets"] == [
            {"dataset": ref, "split": "train", "metric": "loss", "margin": margin}
        ]
        return c.wait_evaluation(doc["id"], timeout_s=300)

    tight = run(0.05)
    assert tight["state"] == "succeeded", tight
    assert tight["metrics"]["loss"]["verdict"] == "better" and tight["verdict"] == "better"
    assert tight["passed"] is False
    (g,) = [g for g in tight["guardrails"] if g.get("dataset")]
    assert g["dataset"] == ref and g["split"] == "train" and g["name"] == "loss" and g["passed"] is False
    assert g["n"] == n_guard and g["delta"] > 0.05  # copy@1's loss on the noise is higher
    assert tight["reasons"][0].startswith(f"loss on {ref} (train split): not shown non-inferior within")
    (summary,) = tight["guardrail_datasets"]
    assert summary["dataset"] == ref and summary["n"] == n_guard
    assert summary["model"]["mean_loss"] > summary["baseline"]["mean_loss"]
    # per-example results kept per dataset, beside the request
    with live.p.db.session() as s:
        row = s.scalars(select(EvaluationRow).where(EvaluationRow.id == tight["id"])).one()
        out_dir = Path(row.doc["out_dir"])
    kept = json.loads((out_dir / "results.json").read_text())
    assert [(d["dataset"], len(d["model"]["loss"])) for d in kept["guardrail_datasets"]] == [(ref, n_guard)]
    with pytest.raises(E.PromotionBlockedError):
        c.promote_model("copy@1", "production", evaluation=tight["id"])

    loose = run(50.0)
    assert loose["passed"] is True, loose["reasons"]
    assert any(
        r.startswith(f"loss on {ref} (train split): non-inferior within margin 50") for r in loose["reasons"]
    )

    # tenant walls: another tenant's dataset, an unknown one and a file outside the storage area
    other = live.client(c.create_tenant("guard-other")["api_key"])
    theirs = other.upload_dataset(noise, name="theirs", eval_fraction=0.1)
    before = len(c.list_evaluations()["evaluations"])
    for bad, error in (
        (f"ds://theirs@{theirs['version']}", E.NotFoundError),
        ("ds://nope@1", E.NotFoundError),
        ("file:///etc/passwd", E.InvalidInputError),
    ):
        with pytest.raises(error):
            c.run_evaluation(
                model="copy@1",
                baseline="copy@2",
                dataset=world["split"],
                guardrail_datasets=[{"dataset": bad, "metric": "loss", "margin": 0.1}],
            )
    assert len(c.list_evaluations()["evaluations"]) == before  # nothing stored for a refused one
