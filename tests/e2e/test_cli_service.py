"""The CLI against a real `trainyard up` subprocess (one server for the module): submit, jobs, tenants,
pools with --json, bad input exit codes, the key file, graceful SIGTERM.

Most commands run the real Typer app in-process (one interpreter, the real HTTP client, the real server);
a few run as real `trainyard` subprocesses to check the process-level contract (stdout holds exactly one
JSON document, exit codes, no traceback)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from controlplane_support import ROOT, ServerProcess, free_port, tiny_spec
from trainyard.cli.main import app


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("cli-home"), executor="local").start()
    yield srv
    assert srv.stop() == 0, srv.log_text()
    assert '"event": "stopped"' in srv.log_text()


def run(args: list[str], monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Any:
    for k in ("TRAINYARD_API_KEY", "TRAINYARD_URL", "TRAINYARD_HOME"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        if k.startswith("TRAINYARD_"):
            monkeypatch.setenv(k, v)
    return CliRunner().invoke(app, args)


def js(result: Any) -> Any:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def subprocess_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", *args],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_key_file_is_private_and_never_logged(server: ServerProcess) -> None:
    mode = stat.S_IMODE(os.stat(server.home / "api_key").st_mode)
    assert mode == 0o600
    assert server.api_key not in server.log_text()


def test_submit_subprocess_prints_one_json_document(server: ServerProcess, tmp_path: Path) -> None:
    spec_path = tmp_path / "tiny.yaml"
    spec_path.write_text(yaml.safe_dump(tiny_spec("cli-sub")))
    # no TRAINYARD_API_KEY: the CLI reads $TRAINYARD_HOME/api_key
    proc = subprocess_cli(["submit", str(spec_path), "--json"], server.cli_env())
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["name"] == "cli-sub" and doc["id"].startswith("job-")
    import httpx

    r = httpx.post(
        f"{server.url}/v1/jobs/{doc['id']}/cancel", headers={"Authorization": f"Bearer {server.api_key}"}
    )
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {architecture: decoder\n")
    proc = subprocess_cli(["submit", str(bad), "--json"], server.cli_env())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "malformed YAML" in proc.stderr  # the one line for people, and the document for scripts:
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == "invalid_spec" and "malformed YAML" in err["message"] and err["hint"]


def test_submit_get_cancel_events(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec_path = tmp_path / "tiny.yaml"
    spec_path.write_text(yaml.safe_dump(tiny_spec("cli-job")))
    env = server.cli_env()
    doc = js(run(["submit", str(spec_path), "--json"], monkeypatch, env))
    assert doc["name"] == "cli-job" and doc["state"] in ("pending", "queued")
    got = js(run(["jobs", "get", doc["id"], "--json"], monkeypatch, env))
    assert {"id", "state", "placement", "cost_usd", "checkpoints", "workers", "events", "result"} <= set(got)
    assert got["id"] == doc["id"] and got["result"] is None
    assert got["events"][0]["data"]["to"] == "pending"
    listed = js(run(["jobs", "list", "--json", "--name", "cli-job"], monkeypatch, env))
    assert [j["id"] for j in listed["jobs"]] == [doc["id"]]
    human = run(["jobs", "list"], monkeypatch, env)
    assert human.exit_code == 0 and "cli-job" in human.stdout
    cancelled = js(run(["jobs", "cancel", doc["id"], "--json"], monkeypatch, env))
    assert cancelled["state"] == "cancelled"
    events = js(run(["jobs", "events", doc["id"], "--json"], monkeypatch, env))
    assert [e["data"]["to"] for e in events["events"] if e["kind"] == "state"][-1] == "cancelled"
    followed = run(["jobs", "events", doc["id"], "--follow", "--json", "--poll-s", "0.1"], monkeypatch, env)
    lines = [json.loads(x) for x in followed.stdout.splitlines()]
    assert followed.exit_code == 0
    assert [e["data"]["to"] for e in lines if e["kind"] == "state"][-1] == "cancelled"
    logs = run(["jobs", "logs", doc["id"]], monkeypatch, env)
    assert logs.exit_code == 0  # the job may have started: the log holds what its rank printed
    again = run(["jobs", "cancel", doc["id"]], monkeypatch, env)
    assert again.exit_code == 4 and "cannot go from cancelled" in again.stderr


def test_real_cpu_job_runs_to_success(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DESIGN §3.5: a job with requirements.allow: [cpu] runs for real on this machine (local executor)."""
    spec_path = tmp_path / "real.yaml"
    spec_path.write_text(yaml.safe_dump(tiny_spec("real-cpu", steps=6)))
    doc = js(
        run(
            ["submit", str(spec_path), "--wait", "--timeout-s", "240", "--json"],
            monkeypatch,
            server.cli_env(),
        )
    )
    assert doc["state"] == "succeeded", doc["reason"]
    assert doc["placement"]["pool"] == "local-cpu"
    assert doc["result"]["model_sha256"] and len(doc["result"]["model_sha256"]) == 64
    assert doc["checkpoints"] and doc["checkpoints"][-1]["path"].startswith("file://")
    assert doc["workers"] and all(w["pid"] for w in doc["workers"])
    kinds = [e["kind"] for e in doc["events"]]
    assert {"placement", "workers", "started", "checkpoint", "cost"} <= set(kinds)
    states = [e["data"]["to"] for e in doc["events"] if e["kind"] == "state"]
    assert states == ["pending", "queued", "starting", "running", "succeeded"]
    logs = run(["jobs", "logs", doc["id"]], monkeypatch, server.cli_env())
    assert logs.exit_code == 0


def test_tenants_isolation_and_pools(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaves the shared server as it found it (a tenant of its own, pools put back), so the module's
    other tests pass in any order."""
    env = server.cli_env()
    name = f"team-{uuid.uuid4().hex[:8]}"
    created = js(run(["tenants", "create", name, "--json"], monkeypatch, env))
    assert set(created) >= {"name", "api_key"} and created["name"] == name
    team = {**env, "TRAINYARD_API_KEY": created["api_key"]}
    assert js(run(["jobs", "list", "--json"], monkeypatch, team))["jobs"] == []
    denied = run(["tenants", "create", f"{name}-b", "--json"], monkeypatch, team)
    assert denied.exit_code == 5 and "admin" in denied.stderr
    tenants = js(run(["tenants", "list", "--json"], monkeypatch, env))["tenants"]
    assert {"default", name} <= {t["name"] for t in tenants}
    pools = js(run(["pools", "list", "--json"], monkeypatch, env))["pools"]
    local = next(p for p in pools if p["name"] == "local-cpu")
    assert local["accelerator"] == "cpu" and local["devices_per_node"] == (os.cpu_count() or 1)
    # absent means every device is free: put back that many
    free_before = local.get("available_devices", local["nodes"] * local["devices_per_node"])
    before = {p["name"] for p in pools}
    seeded = {"a100-on-demand", "a100-spot", "trainium", "tpu-v4"}
    try:
        one = ["pools", "set", "local-cpu", "--available-devices", "1", "--json"]
        changed = js(run(one, monkeypatch, env))
        assert changed["available_devices"] == 1
        pools_file = ROOT / "examples" / "seed-pools.yaml"
        loaded = js(run(["pools", "set", "--file", str(pools_file), "--json"], monkeypatch, env))
        assert {p["name"] for p in loaded["pools"]} == seeded
        table = run(["pools", "list"], monkeypatch, env)
        assert table.exit_code == 0 and "a100-spot" in table.stdout
    finally:
        restore = ["pools", "set", "local-cpu", "--available-devices", str(free_before)]
        assert run([*restore, "--json"], monkeypatch, env).exit_code == 0
        for pool in seeded - before:
            assert run(["pools", "delete", pool], monkeypatch, env).exit_code == 0
    after = js(run(["pools", "list", "--json"], monkeypatch, env))["pools"]
    assert {p["name"] for p in after} == before


def test_bad_key_and_unknown_job(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = run(
        ["jobs", "list"], monkeypatch, {**server.cli_env(), "TRAINYARD_API_KEY": "ty_AAAAAAAA_" + "b" * 43}
    )
    assert wrong.exit_code == 5 and "invalid API key" in wrong.stderr
    missing = run(["jobs", "get", "job-000000000000"], monkeypatch, server.cli_env())
    assert missing.exit_code == 3


def test_no_server_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"TRAINYARD_URL": f"http://127.0.0.1:{free_port()}", "TRAINYARD_API_KEY": "x"}
    result = run(["jobs", "list"], monkeypatch, env)
    assert result.exit_code == 8 and "cannot reach" in result.stderr
