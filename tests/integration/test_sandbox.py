"""User code in the real sandbox (bubblewrap, real worker processes): it does not run as root, cannot read
the server's key or database, sees no server setting in its environment, cannot write outside its own
checkpoint directory, cannot see another job's run directory and cannot swap the files the server reads
in its run directory for links; a machine without bubblewrap refuses to launch instead of running
unsandboxed; and through a real `trainyard up`, `sh -c 'id; cat $TRAINYARD_HOME/api_key'` leaks
nothing into the tenant's own logs."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane_support import ServerProcess, tiny_spec
from sandbox_support import CREDENTIALS, assert_walled_in, first_attacks, server_home
from trainyard.errors import SandboxUnavailableError
from trainyard.executors.base import TERMINAL_KINDS, LaunchRequest
from trainyard.executors.local import LocalExecutor
from trainyard.executors.sandbox import Sandbox

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def bubblewrap() -> None:
    """tests/conftest.py installs bubblewrap on a fresh machine; without it these tests fail."""
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install -y bubblewrap"


def request(root: Path, job_id: str, command: list[str]) -> LaunchRequest:
    spec = {
        "name": "attack",
        "model": {"architecture": "decoder", "n_layers": 1, "d_model": 16, "n_heads": 2, "vocab_size": 32},
        "workload": {"seq_len": 8, "global_batch": 1, "steps": 1, "precision": "fp32"},
        "entrypoint": {"command": command},
    }
    return LaunchRequest(
        job_id=job_id,
        attempt=0,
        spec=spec,
        world_size=1,
        pool="local-cpu",
        market="on_demand",
        checkpoint_url=f"file://{root / 'storage'}",
        checkpoint_interval_s=None,
        run_dir=str(root / "runs" / job_id),
        notice_s=5.0,
        env=dict(CREDENTIALS),
    )


def run_to_end(ex: LocalExecutor, req: LaunchRequest, timeout_s: float = 300.0) -> dict[str, Any]:
    ex.launch(req)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for e in ex.poll():
            if e.job_id == req.job_id and e.kind in TERMINAL_KINDS:
                return {"kind": e.kind, "data": e.data}
        time.sleep(0.05)
    raise AssertionError(f"{req.job_id} did not finish in {timeout_s} s")


def test_user_code_is_walled_in(tmp_path: Path) -> None:
    home = tmp_path / "home"
    settings = server_home(home)
    other = home / "runs" / "job-other"
    other.mkdir(parents=True)
    (other / "rank-0.log").write_text("another job's log")
    ex = LocalExecutor(sandbox=Sandbox(), extra_env=settings)
    try:
        script = (
            first_attacks(home, other) + "echo owned > $CKPT_DIR/job-walls/mine; "
            f"echo escaped > {home}/storage/escaped; echo escaped > /tmp/../escaped-root; "
            f"rm -f $TRAINYARD_RUN_DIR/rank-0.log; ln -s {home}/api_key $TRAINYARD_RUN_DIR/rank-0.log; "
            f"ln -s {home}/api_key $TRAINYARD_RUN_DIR/launch-a1.json.tmp; "
            "exit 0"
        )
        req = request(home, "job-walls", ["sh", "-c", script])
        req.env["CKPT_DIR"] = str(home / "storage")
        (home / "storage").mkdir()
        end = run_to_end(ex, req)
    finally:
        ex.shutdown(kill_workers=True)
    log = (home / "runs" / "job-walls" / "rank-0.log").read_text()
    assert end["kind"] == "succeeded", (end, log)
    assert_walled_in(log, other)
    assert (home / "storage" / "job-walls" / "mine").read_text() == "owned\n"
    assert not (home / "storage" / "escaped").exists()
    assert not (tmp_path / "escaped-root").exists() and not Path("/escaped-root").exists()
    # the run directory's entries are the server's: the log and launch files cannot become links
    assert not (home / "runs" / "job-walls" / "rank-0.log").is_symlink()
    assert not (home / "runs" / "job-walls" / "launch-a1.json.tmp").exists()


def test_without_bubblewrap_nothing_runs(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailableError):
        LocalExecutor(sandbox=Sandbox(bwrap=str(tmp_path / "no-bwrap-here")))


def test_through_the_server_the_key_never_reaches_the_tenants_logs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    code = tmp_path / "code"
    code.mkdir()
    (code / "run.sh").write_text(
        f"id; cat $TRAINYARD_HOME/api_key; cat {home}/api_key; echo CODE-$(cat data.txt)\n"
    )
    (code / "data.txt").write_text("OK")
    doc = tiny_spec("cat-the-key")
    doc["entrypoint"] = {"command": ["sh", "run.sh"]}
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(doc))
    server = ServerProcess(home, executor="local").start(timeout_s=240)
    try:
        cmd = [sys.executable, "-m", "trainyard.cli.main", "submit", str(spec_file), "--workdir", str(code)]
        out = subprocess.run(
            [*cmd, "--json"], env=server.cli_env(), capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stdout + out.stderr
        job = json.loads(out.stdout)
        archive = job["spec"]["entrypoint"]["code"]
        assert archive.startswith(f"file://{(home / 'storage').resolve()}/tenants/default/code/")
        auth = {"Authorization": f"Bearer {server.api_key}"}
        with httpx.Client(base_url=server.url, timeout=30.0, headers=auth) as c:
            deadline = time.time() + 300
            state = ""
            while time.time() < deadline:
                state = c.get(f"/v1/jobs/{job['id']}").json()["state"]
                if state in ("succeeded", "failed", "cancelled"):
                    break
                time.sleep(0.5)
            text = c.get(f"/v1/jobs/{job['id']}/logs").json()["text"]
            # an archive that would unpack outside its tree is refused at upload
            bad = io.BytesIO()
            with tarfile.open(fileobj=bad, mode="w:gz") as tar:
                info = tarfile.TarInfo("../../escape.sh")
                info.size = 2
                tar.addfile(info, io.BytesIO(b"id"))
            r = c.post("/v1/code", content=bad.getvalue(), headers={"Content-Type": "application/gzip"})
            assert r.status_code == 422, r.text
        assert state == "succeeded", (state, text, server.log_text())
        assert "CODE-OK" in text, text
        assert "uid=" in text and "uid=0(" not in text, text
        assert server.api_key not in text, text
        # the server's files are its own (DESIGN §3.6)
        assert home.stat().st_mode & 0o777 == 0o700
        for name in ("api_key", "trainyard.db"):
            assert (home / name).stat().st_mode & 0o777 == 0o600, name
        for name in ("runs", "storage"):
            assert (home / name).stat().st_mode & 0o777 == 0o700, name
    finally:
        server.stop()
