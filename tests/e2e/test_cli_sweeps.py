"""`trainyard sweeps create|get|list|cancel --json` and the Python client's sweep calls against a real
`trainyard up` subprocess with the local executor: a two-trial sweep runs to its best trial's model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from controlplane_support import ServerProcess, tiny_spec
from trainyard.cli.main import app


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("sweeps-home"), executor="local").start()
    yield srv
    assert srv.stop() == 0, srv.log_text()


def run(args: list[str], monkeypatch: pytest.MonkeyPatch, srv: ServerProcess) -> Any:
    for k in ("TRAINYARD_API_KEY", "TRAINYARD_URL", "TRAINYARD_HOME"):
        monkeypatch.delenv(k, raising=False)
    for k, v in srv.cli_env().items():
        if k.startswith("TRAINYARD_"):
            monkeypatch.setenv(k, v)
    return CliRunner().invoke(app, args)


def js(result: Any) -> Any:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def sweep_file(tmp_path: Path, name: str, steps: int) -> Path:
    doc = {
        "apiVersion": "trainyard/v1",
        "kind": "Sweep",
        "name": name,
        "parameters": {"workload.learning_rate": {"values": [1e-3, 1e-6]}},
        "max_parallel": 2,
        "budget_usd": 10,
        "metric": {"name": "loss", "goal": "minimize"},
        "template": tiny_spec(name, steps=steps, seed=1),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_cli_runs_a_sweep_to_its_best_model(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    doc = js(
        run(
            ["sweeps", "create", str(sweep_file(tmp_path, "cli-lr", 40)), "--wait", "--json"],
            monkeypatch,
            server,
        )
    )
    assert doc["state"] == "succeeded", doc
    assert [t["state"] for t in doc["trials"]] == ["completed", "completed"]
    assert doc["best_trial"]["parameters"] == {"workload.learning_rate": 1e-3}  # 1e-6 barely trains
    model = js(run(["models", "get", doc["model_version"], "--json"], monkeypatch, server))
    assert model["sweep"]["id"] == doc["id"] and model["source_job"] == doc["best_trial"]["job_id"]
    got = js(run(["sweep", "get", doc["id"], "--json"], monkeypatch, server))
    assert got["id"] == doc["id"] and got["model_version"] == doc["model_version"]
    table = run(["sweeps", "get", doc["id"]], monkeypatch, server)  # the human-readable report
    assert table.exit_code == 0, table.stdout
    assert "cli-lr-t000" in table.stdout and "cli-lr-t001" in table.stdout
    assert f"model {doc['model_version']}" in table.stdout
    listed = js(run(["sweeps", "list", "--json"], monkeypatch, server))
    assert [s["id"] for s in listed["sweeps"]] == [doc["id"]]
    missing = run(["sweeps", "get", "sweep-000000000000", "--json"], monkeypatch, server)
    assert missing.exit_code == 3 and json.loads(missing.stdout)["error"]["code"] == "not_found"


def test_client_creates_and_cancels_a_sweep(server: ServerProcess, tmp_path: Path) -> None:
    from trainyard.client import TrainyardClient

    with TrainyardClient(url=server.url, api_key=server.api_key) as c:
        doc = c.create_sweep(sweep_file(tmp_path, "client-lr", 5000))
        assert doc.state == "running" and doc.quote["expected_cost_usd"] is not None
        assert c.cancel_sweep(doc.id).state in ("cancelling", "cancelled")
        done = c.wait_sweep(doc.id, timeout_s=120, poll_s=0.5)
        assert done.state == "cancelled"
        assert {t["state"] for t in done.trials or []} <= {"cancelled", "skipped"}
        assert doc.id in [s.id for s in c.list_sweeps().sweeps]
