"""A job trained on a registered dataset version with real local workers: the train split is read from
storage, the loss is masked to the completions, eval-split loss is reported, every attempt writes an
immutable run record, and `reproduce` reruns it to bit-identical weights on CPU."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from controlplane_support import in_process_platform, tiny_spec
from controlplane_support import wait_done as wait_job
from trainyard.services.platform import Platform
from trainyard.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

SEQ_LEN = 48


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Platform, TestClient, dict[str, str]]]:
    with in_process_platform(
        Settings(home=tmp_path_factory.mktemp("ds-train")), heartbeat_timeout_s=120.0
    ) as live:
        yield live


def wait_done(client: TestClient, h: dict[str, str], job_id: str, timeout_s: float = 400.0) -> dict[str, Any]:
    return wait_job(client, h, job_id, timeout_s)


def test_train_on_a_registered_version_then_reproduce(live: Any, tmp_path: Path) -> None:
    _platform, c, h = live
    rows = [{"prompt": f"What is {i} plus {i}? ", "completion": f"{2 * i}."} for i in range(80)]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    up = c.post("/v1/datasets", params={"name": "sums", "eval_fraction": 0.2}, content=body, headers=h)
    assert up.status_code == 201, up.text
    ds = up.json()
    assert ds["splits"]["eval"]["rows"] > 0

    spec = tiny_spec("on-ds", dataset=ds["id"], steps=12, seq_len=SEQ_LEN, global_batch=4, seed=5)
    spec["checkpoint"] = {"interval": "1s", "keep_last": 2}
    r = c.post("/v1/jobs", json={"spec": spec}, headers=h)
    assert r.status_code == 201, r.text
    job = wait_done(c, h, r.json()["id"])
    assert job["state"] == "succeeded", job.get("reason")
    events = c.get(f"/v1/jobs/{job['id']}/events", params={"limit": 5000}, headers=h).json()["events"]

    # the eval split's loss is reported (at the end at least), as an event the server stores
    evals = [e["data"] for e in events if e["kind"] == "evaluation"]
    assert evals and evals[-1]["final"] is True and evals[-1]["split"] == "eval"
    assert evals[-1]["loss"] > 0 and evals[-1]["dataset"] == ds["id"]

    # the run record: data version and split hashes, spec hash, environment, seeds
    rec_doc = c.get(f"/v1/jobs/{job['id']}/record", headers=h).json()
    rec = rec_doc["record"]
    assert rec_doc["attempt"] == 1 and len(rec_doc["sha256"]) == 64
    assert rec["datasets"][0]["id"] == ds["id"] and rec["datasets"][0]["sha256"] == ds["sha256"]
    assert rec["datasets"][0]["splits"]["train"]["sha256"] == ds["splits"]["train"]["sha256"]
    assert rec["datasets"][0]["splits"]["eval"]["sha256"] == ds["splits"]["eval"]["sha256"]
    assert rec["seeds"] == {"workload": 5} and rec["world_size"] == job["placement"]["devices"]
    env = rec["environment"]
    assert env["torch"] == torch.__version__ and env["device"] == "cpu"
    assert any(p.startswith("torch==") for p in env["packages"]) and len(env["lock_sha256"]) == 64
    assert len(rec["spec_sha256"]) == 64 and len(rec["code"]["trainyard_source_sha256"]) == 64

    # the loss was masked to the completions: the trainer's labelled tokens are exactly the completion
    # bytes plus one end-of-sequence token per training row
    data = rec["data"]
    assert data["kind"] == "examples" and data["examples"] == ds["splits"]["train"]["rows"]
    train_rows = c.get("/v1/datasets/sums@1/rows", params={"limit": 1000}, headers=h).json()["rows"]
    assert data["label_tokens"] == sum(len(r["completion"].encode()) + 1 for r in train_rows)
    assert data["label_tokens"] < data["tokens"] / 3

    # another tenant sees neither the record nor can it reproduce the job
    other = c.post("/v1/tenants", json={"name": "rec-other"}, headers=h).json()["api_key"]
    oh = {"Authorization": f"Bearer {other}"}
    assert c.get(f"/v1/jobs/{job['id']}/record", headers=oh).status_code == 404
    assert c.post(f"/v1/jobs/{job['id']}/reproduce", headers=oh).status_code == 404

    rep = c.post(f"/v1/jobs/{job['id']}/reproduce", headers=h)
    assert rep.status_code == 201, rep.text
    assert rep.json()["spec"]["workload"]["dataset"] == ds["id"]
    again = wait_done(c, h, rep.json()["id"])
    assert again["state"] == "succeeded", again.get("reason")
    assert again["result"]["model_sha256"] == job["result"]["model_sha256"]
    rec2 = c.get(f"/v1/jobs/{again['id']}/record", headers=h).json()["record"]
    assert rec2["datasets"] == rec["datasets"] and rec2["environment"]["lock_sha256"] == env["lock_sha256"]
