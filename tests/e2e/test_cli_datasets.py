"""`trainyard datasets upload|list|get|rows` and `submit` with a local dataset, against `trainyard up`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane_support import ROOT, ServerProcess, tiny_spec


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("cli-ds") / "home", executor="none").start(timeout_s=240)
    try:
        yield srv
    finally:
        srv.stop()


def cli(server: ServerProcess, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", *args],
        env=server.cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(cwd or ROOT),
    )


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_datasets_cli_contract(server: ServerProcess, tmp_path: Path) -> None:
    rows = [{"prompt": f"say {i}", "completion": f"{i}"} for i in range(30)]
    good = write_jsonl(tmp_path / "good.jsonl", rows)
    r = cli(server, "datasets", "upload", str(good), "--name", "calc", "--eval-fraction", "0.2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["id"] == "ds://calc@1" and doc["format"] == "completion" and doc["rows"] == 30
    assert set(doc) >= {"id", "name", "version", "sha256", "format", "rows", "bytes", "duplicates_removed"}
    assert set(doc["splits"]) == {"train", "eval"} and set(doc["splits"]["train"]) >= {"rows", "sha256"}
    assert set(doc) >= {"derived_from", "created_at"}

    bad = write_jsonl(
        tmp_path / "bad.jsonl", [*rows[:3], "{oops", {"prompt": "x"}, {"prompt": "y", "completion": ""}]
    )
    r = cli(server, "datasets", "upload", str(bad), "--name", "calc", "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    err = json.loads(r.stdout)["error"]
    assert err["code"] == "invalid_dataset"
    assert [e["line"] for e in err["details"]["errors"]] == [4, 5, 6]
    assert all(set(e) >= {"line", "message"} for e in err["details"]["errors"])
    r = cli(server, "datasets", "upload", str(bad), "--name", "calc")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "invalid" in r.stderr

    listed = json.loads(cli(server, "datasets", "list", "--json").stdout)["datasets"]
    assert [d["id"] for d in listed] == ["ds://calc@1"]  # the rejected upload stored nothing
    got = json.loads(cli(server, "datasets", "get", "ds://calc@1", "--json").stdout)
    assert got == doc
    page = json.loads(cli(server, "datasets", "rows", "ds://calc@1", "--split", "eval", "--json").stdout)
    assert len(page["rows"]) == doc["splits"]["eval"]["rows"]
    r = cli(server, "datasets", "get", "ds://calc@7", "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["error"]["code"] == "unknown_dataset"


def test_submit_uploads_a_local_dataset_first(server: ServerProcess, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "My Train.jsonl", [f"line {i} of text" for i in range(20)])
    spec = tiny_spec("local-data", dataset="My Train.jsonl")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    r = cli(server, "submit", str(tmp_path / "job.yaml"), "--json", cwd=ROOT)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["spec"]["workload"]["dataset"] == "ds://my-train@1"
    spec["workload"]["dataset"] = str(tmp_path / "missing.jsonl")
    (tmp_path / "job2.yaml").write_text(yaml.safe_dump(spec))
    r = cli(server, "submit", str(tmp_path / "job2.yaml"))
    assert r.returncode == 2 and "not a file" in r.stderr


def test_upload_with_a_base_model_shows_its_cost_per_epoch(server: ServerProcess, tmp_path: Path) -> None:
    """`datasets upload --base` counts with the base model's tokenizer and prints what an epoch costs;
    `datasets cost --json` is the estimate (steps × predicted step time × price, cheapest placement)."""
    from hf_models import build_tiny_llama, completion_rows

    model_dir = build_tiny_llama(tmp_path / "tiny", seed=0)
    r = cli(server, "models", "import", str(model_dir), "--name", "tinyc", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    data = write_jsonl(tmp_path / "c.jsonl", completion_rows(40, seed=3))
    r = cli(server, "datasets", "upload", str(data), "--name", "priced", "--base", "tinyc@1", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tokenizer"] == "tinyc@1"
    r = cli(server, "datasets", "cost", doc["id"], "--seq-len", "64", "--global-batch", "4", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    est = json.loads(r.stdout)
    assert est["dataset"] == doc["id"] and est["model"] == "tinyc@1"
    assert est["steps_per_epoch"] == -(-doc["splits"]["train"]["rows"] // 4)
    assert est["step_time_s"] > 0 and est["placement"]["accelerator"] and est["usd_per_hour"] >= 0
    # the cheapest placement may be this machine's own (free) pool; the cost is never below the bare
    # steps × step time × price (the quote adds checkpoint and preemption overhead)
    bare = est["steps_per_epoch"] * est["step_time_s"] / 3600 * est["usd_per_hour"]
    assert bare <= est["usd_per_epoch"] + 1e-12
    r = cli(server, "datasets", "get", doc["id"])
    assert r.returncode == 0 and "per epoch" in r.stdout, r.stdout + r.stderr
    r = cli(server, "datasets", "upload", str(data), "--name", "priced-bytes", "--json")
    assert r.returncode == 0, r.stderr
    r = cli(server, "datasets", "cost", "ds://priced-bytes@1", "--json")  # counted in bytes: needs --model
    assert r.returncode != 0 and json.loads(r.stdout)["error"]["details"]["errors"][0]["field"] == "model"
