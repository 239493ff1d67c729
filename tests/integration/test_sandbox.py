"""User code in the real sandbox (bubblewrap, real worker processes): it does not run as root, cannot read
the server's key or database, sees no server setting in its environment, cannot write outside its own
checkpoint directory, cannot see another job's run directory and cannot swap the files the server reads
in its run directory for links; a machine without bubblewrap refuses to launch instead of running
unsandboxed; and through a real `trainyard up`, `sh -c 'id; cat $TRAINYARD_HOME/api_key'` leaks
nothing into the tenant's own logs."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
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
from trainyard.executors.sandbox import GangNetwork, Mounts, Sandbox

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def bubblewrap() -> None:
    """tests/conftest.py installs bubblewrap on a fresh machine; without it these tests fail."""
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install -y bubblewrap"


def request(root: Path, job_id: str, command: list[str], world_size: int = 1) -> LaunchRequest:
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
        world_size=world_size,
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


GANG_PROBE = """
import os, socket, time
rank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
reached = []
for p in [int(x) for x in os.environ["HOST_PORTS"].split(",")]:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", p))
        reached.append(p)
    except OSError:
        pass
    finally:
        s.close()
print("REACHED", reached, flush=True)
if rank == 0:
    srv = socket.create_server(("127.0.0.1", port))
    srv.settimeout(120)
    conn, _ = srv.accept()
    print("GOT", conn.recv(32).decode(), flush=True)
else:
    deadline = time.time() + 120
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=2)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    conn.sendall(b"from-rank-1")
    print("SENT", flush=True)
"""


def test_a_gangs_ranks_reach_each_other_and_nothing_on_the_host(tmp_path: Path) -> None:
    """A 2-rank gang with local storage gets one network namespace of its own: its ranks meet on its
    loopback (as gloo's rendezvous does), while the host's loopback services (a listener of the test's,
    PostgreSQL, Redis, all answering on the host's 127.0.0.1) are out of reach from either rank."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    accepted: list[Any] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    host_ports = [listener.getsockname()[1], 5432, 6379]
    for port in host_ports:  # they really listen on the host's loopback: reaching them is possible
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    home = tmp_path / "home"
    settings = server_home(home)
    ex = LocalExecutor(sandbox=Sandbox(), extra_env=settings)
    try:
        req = request(home, "job-gang-net", [sys.executable, "-c", GANG_PROBE], world_size=2)
        req.env["HOST_PORTS"] = ",".join(str(p) for p in host_ports)
        end = run_to_end(ex, req)
    finally:
        ex.shutdown(kill_workers=True)
        stop.set()
        thread.join()
        listener.close()
    logs = [(home / "runs" / "job-gang-net" / f"rank-{r}.log").read_text() for r in range(2)]
    assert end["kind"] == "succeeded", (end, logs)
    assert all("REACHED []" in log for log in logs), logs
    assert "GOT from-rank-1" in logs[0] and "SENT" in logs[1], logs
    assert len(accepted) == 1  # only the test's own check above reached the listener


def test_a_gang_network_is_joined_before_bubblewrap_starts_instead_of_a_namespace_of_its_own() -> None:
    sandbox = Sandbox()
    net = GangNetwork(fds=(7,), enter=("/usr/bin/nsenter", "--net=/proc/self/fd/7"))
    joined = sandbox.command(["/bin/true"], Mounts(share_net=False), net=net)
    assert joined[3:6] == ["/usr/bin/nsenter", "--net=/proc/self/fd/7", sandbox.bwrap]
    assert "--unshare-net" not in joined
    alone = sandbox.command(["/bin/true"], Mounts(share_net=False))
    assert alone[3] == sandbox.bwrap and "--unshare-net" in alone
    assert "--unshare-net" not in sandbox.command(["/bin/true"], Mounts(share_net=True))


def test_a_gang_network_that_cannot_be_made_fails_the_launch(tmp_path: Path) -> None:
    """Where bubblewrap cannot make the namespace, the launch fails; nothing falls back to the host's."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    sandbox = Sandbox(bwrap=str(fake))
    made = sandbox.gang_network()
    with pytest.raises(SandboxUnavailableError, match="No permissions to create new namespace"):
        made.__enter__()


def test_bubblewraps_complaint_is_read_even_when_it_closes_its_info_descriptor_first(tmp_path: Path) -> None:
    """The info descriptor closes before the process exits: the failure still names bubblewrap's reason."""
    fake = tmp_path / "bwrap"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        "os.close(int(sys.argv[sys.argv.index('--info-fd') + 1]))\n"
        "time.sleep(0.5)\n"
        "sys.stderr.write('bwrap: setting up uid map: Permission denied\\n')\n"
        "sys.exit(1)\n"
    )
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailableError, match="setting up uid map: Permission denied"):
        Sandbox(bwrap=str(fake)).gang_network().__enter__()


def test_a_gang_network_lives_while_its_descriptors_are_open() -> None:
    sandbox = Sandbox()
    host = os.readlink("/proc/self/ns/net")
    with sandbox.gang_network() as net:
        inside = [os.readlink(f"/proc/self/fd/{fd}") for fd in net.fds]
        assert inside[-1].startswith("net:[") and inside[-1] != host
        out = subprocess.run(
            [*net.enter, "/bin/cat", "/proc/net/dev"],
            capture_output=True,
            text=True,
            pass_fds=net.fds,
            check=True,
        ).stdout
        assert "lo:" in out and len([ln for ln in out.splitlines() if ":" in ln]) == 1, out  # loopback only
    for fd in net.fds:
        with pytest.raises(OSError):
            os.fstat(fd)


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
