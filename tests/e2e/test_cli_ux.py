"""The CLI as a person uses it, against one real server started the way people start it
(`trainyard up --detach`, module scope): server.json and the commands that find the server through it,
`status` and `down`; the noun-verb grammar and its aliases; `jobs submit` with its placement, cost and
time, and `--dry-run` storing nothing; tables in an 80-column pseudo-terminal that keep ids whole;
`--json` error documents; human-readable events; a busy port."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane_support import ROOT, free_port, tiny_spec
from pty_support import run_in_pty
from trainyard.serverfile import pid_alive

TRAINYARD = ROOT / ".venv" / "bin" / "trainyard"


def user_env(home: Path) -> dict[str, str]:
    """The environment of a user who ran `trainyard up`: no TRAINYARD_URL, no TRAINYARD_API_KEY."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    return {**env, "TRAINYARD_HOME": str(home), "TRAINYARD_PROFILE_AT_START": "0"}


def ty(args: list[str], env: dict[str, str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TRAINYARD), *args], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=timeout_s
    )


def ok_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


class Server:
    def __init__(self, home: Path, record: dict[str, Any]) -> None:
        self.home = home
        self.record = record
        self.env = user_env(home)
        self.url: str = record["url"]
        self.port: int = record["port"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    assert TRAINYARD.exists(), f"{TRAINYARD} missing: run `make test` (it installs the console script)"
    home = tmp_path_factory.mktemp("ux") / "home"
    env = user_env(home)
    up = ["up", "--detach", "--port", "0", "--executor", "local", "--json", "--timeout-s", "240"]
    proc = ty(up, env, 300)
    record = ok_json(proc)
    srv = Server(home, record)
    yield srv
    # a server the last test did not stop is stopped here (and that test fails)
    if (home / "server.json").exists():
        ty(["down"], env)


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_spec("ux-tiny-job-with-a-long-name", steps=4)))
    return path


def test_up_records_where_it_serves(server: Server) -> None:
    path = server.home / "server.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert {"url", "pid", "port", "started_at"} <= set(doc)
    assert doc["url"] == f"http://127.0.0.1:{doc['port']}" and doc["port"] == server.port != 8080
    status = ok_json(ty(["status", "--json"], server.env))
    assert status["running"] is True and status["ready"] is True and status["pid"] == doc["pid"]
    assert status["dashboard_url"] == f"{server.url}/"
    human = ty(["status"], server.env)
    assert human.returncode == 0 and server.url in human.stdout and "api_key" in human.stdout


def test_commands_find_the_server_through_server_json(server: Server) -> None:
    # no TRAINYARD_URL: the port chosen at `up --port 0` comes from server.json
    assert "jobs" in ok_json(ty(["jobs", "list", "--json"], server.env))
    # an explicit --url (or TRAINYARD_URL) wins over server.json
    elsewhere = f"http://127.0.0.1:{free_port()}"
    for args, env in (
        (["--url", elsewhere, "jobs", "list", "--json"], server.env),
        (["jobs", "list", "--json"], {**server.env, "TRAINYARD_URL": elsewhere}),
    ):
        proc = ty(args, env)
        assert proc.returncode == 8, proc.stderr
        err = json.loads(proc.stdout)["error"]
        assert err["code"] == "unavailable" and elsewhere in err["message"]
        assert "Traceback" not in proc.stderr and proc.stderr.startswith("error: ")


def test_dry_run_quotes_and_places_and_stores_nothing(server: Server, spec_file: Path) -> None:
    before = ok_json(ty(["jobs", "list", "--json"], server.env))["jobs"]
    doc = ok_json(ty(["jobs", "submit", str(spec_file), "--dry-run", "--json"], server.env))
    assert doc["dry_run"] is True
    assert doc["placement"]["pool"] == "local-cpu" and doc["placement"]["executable"] is True
    assert doc["placement"]["expected_cost_usd"] >= 0 and doc["placement"]["expected_hours"] > 0
    assert doc["options"] and all("feasible" in o for o in doc["options"])
    # the short form is the same command
    alias = ok_json(ty(["submit", str(spec_file), "--dry-run", "--json"], server.env))
    assert alias["placement"]["pool"] == doc["placement"]["pool"]
    human = ty(["submit", str(spec_file), "--dry-run", "-v"], server.env)
    assert human.returncode == 0, human.stderr
    assert "nothing submitted" in human.stdout and "placement  local-cpu" in human.stdout
    assert "expected" in human.stdout and "options considered" in human.stdout
    assert ok_json(ty(["jobs", "list", "--json"], server.env))["jobs"] == before


def test_submit_shows_placement_cost_and_time(server: Server, spec_file: Path) -> None:
    result = run_in_pty([str(TRAINYARD), "jobs", "submit", str(spec_file), "-v"], env=server.env)
    assert result.returncode == 0, result.text
    lines = result.lines
    job_id = lines[0].split()[0]
    assert job_id.startswith("job-") and len(job_id) == 16, result.text
    text = result.text
    assert "placement  local-cpu" in text or "best quote local-cpu" in text, text
    assert "expected" in text and "$" in text
    assert f"trainyard jobs events {job_id} --follow" in text
    assert all(len(ln) <= 80 for ln in lines), text
    ty(["jobs", "cancel", job_id], server.env)


def test_tables_fit_80_columns_and_keep_ids_whole(server: Server, spec_file: Path) -> None:
    ids = [ok_json(ty(["jobs", "submit", str(spec_file), "--json"], server.env))["id"] for _ in range(2)]
    for job_id in ids:
        ty(["jobs", "cancel", job_id], server.env)
    shown = run_in_pty([str(TRAINYARD), "jobs", "list"], env=server.env)
    assert shown.returncode == 0, shown.text
    assert all(len(ln) <= 80 for ln in shown.lines), shown.text
    assert "…" not in shown.text
    for job_id in ids:
        row = next(ln for ln in shown.lines if job_id in ln)  # the id whole, on one line
        assert "ux-tiny-job-with-a-long-name" in row
    assert "--wide shows all" in shown.text  # CREATED does not fit beside the rest
    wide = run_in_pty([str(TRAINYARD), "jobs", "list", "--wide"], env=server.env, columns=200)
    assert "CREATED" in wide.text and "…" not in wide.text
    assert all(len(ln) <= 80 for ln in wide.lines) is False  # every column, wider than 80
    # piped: every column at its natural width, no ellipses, whatever COLUMNS says
    piped = ty(["jobs", "list"], {**server.env, "COLUMNS": "80"})
    header = next(ln for ln in piped.stdout.splitlines() if "ID" in ln and "STATE" in ln)
    assert "CREATED" in header and "…" not in piped.stdout
    pools = run_in_pty([str(TRAINYARD), "pools", "list"], env=server.env)
    assert "local-cpu" in pools.text and "on-demand" in pools.text and "on_demand" not in pools.text
    assert all(len(ln) <= 80 for ln in pools.lines) and "…" not in pools.text
    # the pure-core tables alike: regions, instance types and pool names whole
    seed = str(ROOT / "examples" / "seed-example.yaml")
    seed_pools = str(ROOT / "examples" / "seed-pools.yaml")
    for args, whole in (
        (["catalog", "offers", "-a", "h100", "--limit", "6"], ("us-central1", "a3-highgpu-4g")),
        (["quote", seed, "--pools", seed_pools], ("a100-40gb", "on-demand", "$0.00016")),
    ):
        shown = run_in_pty([str(TRAINYARD), *args], env=server.env)
        assert shown.returncode == 0, shown.text
        assert "…" not in shown.text and all(len(ln) <= 80 for ln in shown.lines), shown.text
        for text in whole:
            assert text in shown.text, (args, text, shown.text)


def test_help_fits_80_columns_without_cutting_option_names(server: Server) -> None:
    for args in (["-h"], ["jobs", "submit", "-h"], ["tenants", "update", "--help"], ["server", "up", "-h"]):
        shown = run_in_pty([str(TRAINYARD), *args], env=server.env)
        assert shown.returncode == 0, shown.text
        assert all(len(ln) <= 80 for ln in shown.lines), shown.text
        assert "…" not in shown.text and "DESIGN" not in shown.text
    submit_help = run_in_pty([str(TRAINYARD), "jobs", "submit", "-h"], env=server.env).text
    for option in ("--dry-run", "--wait", "--timeout-s", "--idempotency-key", "--workdir", "--verbose"):
        assert option in submit_help
    update_help = run_in_pty([str(TRAINYARD), "tenants", "update", "-h"], env=server.env).text
    assert "--allow-user-code / --no-allow-user-code" in update_help
    assert "--clear-storage-roots" in update_help and "--key-rate-limit-rps" in update_help


READER_PROBE = """
import sys
from trainyard.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
else:
    code = 0
sys.stderr.write("EXIT " + str(code) + " LOADED " + ",".join(m for m in %r if m in sys.modules) + "\\n")
"""
# what a command that reads from the server and prints it has no use for: the typed documents and
# pydantic (the CLI prints the JSON it gets), httpx's own command-line tool (click, pygments), and the
# server, scheduler and training stacks
NOT_FOR_READERS = (
    "pydantic",
    "trainyard.api_models",
    "httpx._main",
    "click",
    "pygments",
    "yaml",
    "torch",
    "fastapi",
    "sqlalchemy",
    "ortools",
    "numpy",
    "scipy",
    "uvicorn",
    "ray",
)


def test_reading_commands_import_no_documents_nor_heavy_modules(server: Server, spec_file: Path) -> None:
    """Against the real server with a job on it (answers parsed and printed, not only a refused
    connection): the commands that read and print never import the pydantic documents."""
    import sys
    import time

    from trainyard.client import TrainyardClient

    job = ok_json(ty(["jobs", "submit", str(spec_file), "--json"], server.env))
    ty(["jobs", "cancel", job["id"]], server.env)
    deadline = time.monotonic() + 60
    while ok_json(ty(["jobs", "get", job["id"], "--json"], server.env))["state"] != "cancelled":
        assert time.monotonic() < deadline, "the cancelled job did not settle"
        time.sleep(0.2)
    outputs: dict[tuple[str, ...], str] = {}
    for args in (
        ("jobs", "list"),
        ("jobs", "list", "--json"),
        ("jobs", "get", job["id"]),
        ("jobs", "get", job["id"], "--json"),
        ("jobs", "events", job["id"]),
        ("pools", "list"),
        ("tenants", "list", "--json"),
        ("status",),
    ):
        proc = subprocess.run(
            [sys.executable, "-c", READER_PROBE % (NOT_FOR_READERS,), *args],
            env=server.env,
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=120,
        )
        last = proc.stderr.splitlines()[-1]
        assert last == "EXIT 0 LOADED ", (args, proc.stderr)
        outputs[args] = proc.stdout
    assert job["id"] in outputs[("jobs", "list")] and job["id"] in outputs[("jobs", "get", job["id"])]
    # the JSON the CLI prints is what the typed client's documents hold
    with TrainyardClient(url=server.url, api_key=(server.home / "api_key").read_text().strip()) as c:
        assert json.loads(outputs[("jobs", "get", job["id"], "--json")]) == c.get_job(job["id"]).to_dict()
        listed = json.loads(outputs[("jobs", "list", "--json")])
        assert job["id"] in [j["id"] for j in listed["jobs"]]


def test_failures_with_json_print_the_error_document(server: Server, tmp_path: Path) -> None:
    cases = [
        (["jobs", "get", "job-000000000000", "--json"], 3, "not_found"),
        (["pools", "delete", "no-such-pool", "--json"], 3, "not_found"),
        (["jobs", "logs", "job-000000000000", "--json"], 3, "not_found"),
        (["jobs", "get", "--json"], 2, "usage"),  # a missing argument, too
    ]
    for args, code, error_code in cases:
        proc = ty(args, server.env)
        assert proc.returncode == code, (args, proc.stdout, proc.stderr)
        doc = json.loads(proc.stdout)
        assert set(doc) == {"error"} and doc["error"]["code"] == error_code
        assert set(doc["error"]) == {"code", "message", "hint", "details"}
        assert "Traceback" not in proc.stderr
    # an invalid spec: every problem listed, on stderr and in the document
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "name": "bad",
                "model": {"architecture": "decoder", "n_layers": -1, "d_model": 64, "n_heads": 4},
                "workload": {"seq_len": 64, "global_batch": 0, "steps": 1, "precision": "fp7"},
                "surprise": 1,
            }
        )
    )
    proc = ty(["spec", "validate", str(bad), "--json"], server.env)
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc["valid"] is False and doc["error"]["code"] == "invalid_spec"
    errors = doc["error"]["details"]["errors"]
    assert len(errors) >= 4
    listed = [ln for ln in proc.stderr.splitlines() if ln.startswith("  - ")]
    assert len(listed) == len(errors) and "more)" not in proc.stderr
    for e in errors:
        assert any(e["field"] in ln for ln in listed)
    submitted = ty(["jobs", "submit", str(bad), "--json"], server.env)
    assert submitted.returncode == 2 and json.loads(submitted.stdout)["error"]["code"] == "invalid_spec"


def test_events_are_readable_and_json_lines_with_json(server: Server, spec_file: Path) -> None:
    job = ok_json(ty(["jobs", "submit", str(spec_file), "--json"], server.env))
    ty(["jobs", "cancel", job["id"]], server.env)
    human = ty(["jobs", "events", job["id"], "--follow", "--poll-s", "0.1"], server.env)
    assert human.returncode == 0, human.stderr
    assert "→ pending: submitted" in human.stdout and "→ cancelled" in human.stdout
    assert '{"' not in human.stdout.replace('{"options"', "")  # no raw event documents
    lines = ty(["jobs", "events", job["id"], "--follow", "--json", "--poll-s", "0.1"], server.env)
    events = [json.loads(x) for x in lines.stdout.splitlines()]
    assert [e["data"]["to"] for e in events if e["kind"] == "state"][-1] == "cancelled"
    logs = ok_json(ty(["jobs", "logs", job["id"], "--json"], server.env))
    assert set(logs) == {"job_id", "rank", "text", "next_offset"} and logs["job_id"] == job["id"]
    ckpts = ok_json(ty(["checkpoints", "list", job["id"], "--json"], server.env))
    assert ckpts == {"checkpoints": []}
    same = ok_json(ty(["checkpoint", "list", job["id"], "--json"], server.env))
    assert same == ckpts


def test_submit_wait_shows_live_progress_preemption_and_resume(server: Server, tmp_path: Path) -> None:
    """A real CPU job followed with `jobs submit --wait` in a terminal while a preemption is injected:
    the bar (steps, loss, tokens/s, ETA, cost) and the preemption and the resume as they happen."""
    import threading
    import time

    spec = tmp_path / "long.yaml"
    # long enough that a quiet machine does not finish it before the first 2 s checkpoint is seen
    doc = tiny_spec("ux-wait", steps=2000)
    doc["checkpoint"] = {"interval": "2s"}
    spec.write_text(yaml.safe_dump(doc))
    box: dict[str, Any] = {}

    def follow() -> None:
        box["result"] = run_in_pty(
            [str(TRAINYARD), "jobs", "submit", str(spec), "--wait", "--timeout-s", "500"],
            env=server.env,
            timeout_s=560,
        )

    thread = threading.Thread(target=follow)
    thread.start()
    deadline = time.monotonic() + 300
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:  # running, with a committed checkpoint to resume from
        jobs = ok_json(ty(["jobs", "list", "--name", "ux-wait", "--json"], server.env))["jobs"]
        if jobs:
            job = ok_json(ty(["jobs", "get", jobs[0]["id"], "--json"], server.env))
            if job["state"] == "running" and job["checkpoints"]:
                break
        time.sleep(0.5)
    assert job.get("state") == "running" and job["checkpoints"], job
    preempted = ty(["jobs", "preempt", job["id"], "--notice-s", "5", "--json"], server.env)
    assert preempted.returncode == 0, preempted.stderr
    thread.join(600)
    result = box["result"]
    text = result.text
    assert result.returncode == 0, text
    assert "placement  local-cpu" in text
    assert "preemption notice" in text and "preempted at step" in text, text
    assert "resumed from step" in text and "→ succeeded" in text, text
    bar = [ln for ln in result.lines if "tok/s" in ln and "ETA" in ln and "cost $" in ln and "/2000" in ln]
    assert bar, text  # the live bar was drawn
    assert f"{job['id']} succeeded" in text and "ux-wait@" in text


def test_version_and_json_everywhere(server: Server) -> None:
    version = ty(["--version"], server.env)
    assert version.returncode == 0 and version.stdout.startswith("trainyard ")
    doc = ok_json(ty(["version", "--json"], server.env))
    assert doc["version"] == version.stdout.split()[1]
    trace = ok_json(ty(["trace", "generate", "--jobs", "3", "--json"], server.env))
    assert trace["jobs"] == 3 and len(trace["trace"]) == 3


def test_busy_port_is_one_line(server: Server, tmp_path: Path) -> None:
    other = user_env(tmp_path / "other-home")
    proc = ty(["up", "--port", str(server.port)], other, 60)
    assert proc.returncode == 8
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[0] == f"error: port {server.port} on 127.0.0.1 is already in use", proc.stderr
    assert lines[1].startswith("hint: ") and len(lines) == 2 and "{" not in proc.stderr
    doc = json.loads(ty(["up", "--port", str(server.port), "--json"], other, 60).stdout)
    assert doc["error"]["code"] == "port_in_use" and doc["error"]["details"]["port"] == server.port
    # and a port taken by anything else, the same way
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = ty(["up", "--detach", "--port", str(port)], other, 60)
    assert proc.returncode == 8 and "already in use" in proc.stderr and "Traceback" not in proc.stderr
    # a second `up` of the same home is refused before it touches the port
    again = ty(["up", "--port", "0"], server.env, 60)
    assert again.returncode == 8 and f"already up at {server.url}" in again.stderr


def test_down_stops_the_server_cleanly(server: Server) -> None:
    pid = server.record["pid"]
    doc = ok_json(ty(["down", "--json"], server.env))
    assert doc == {"stopped": True, "pid": pid, "url": server.url}
    assert not (server.home / "server.json").exists()
    assert not pid_alive(pid)
    log = (server.home / "server.log").read_text()
    assert '"event": "stopped"' in log
    status = ty(["status", "--json"], server.env)
    assert status.returncode == 8 and json.loads(status.stdout)["running"] is False
    again = ty(["down", "--json"], server.env)
    assert again.returncode == 3 and json.loads(again.stdout)["error"]["code"] == "not_found"
