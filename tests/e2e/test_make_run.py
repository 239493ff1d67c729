"""`make run` (`python -m trainyard.demo`) end to end: a real `trainyard up` in the background, the worked
example queued, a real CPU job preempted half-way and resumed from its checkpoint, cost and model hash,
and the server stopped cleanly."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_demo(home: Path, port: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRAINYARD_HOME": str(home), "TRAINYARD_PORT": str(port), "COLUMNS": "200"}
    env.pop("TRAINYARD_API_KEY", None)
    env.pop("TRAINYARD_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "trainyard.demo"],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_make_run_trains_preempts_resumes_and_reports(tmp_path: Path) -> None:
    home = tmp_path / "home"
    port = _free_port()
    # something else holds the configured port: the demo must pick another one and say so
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen(1)
        proc = _run_demo(home, port)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    # the worked example quote of DESIGN §4, to the digits shown there
    assert "Where the numbers come from" in out and "Cheapest:" in out
    for shown in ("$0.00056", "$0.00037", "$0.00042", "$0.00016", "15 min", "Young/Daly"):
        assert shown in out, shown
    assert f"Port {port} is taken" in out
    # the worked example waits for GPUs, with a reason
    m = re.search(r"Submitted the worked example as (job-[0-9a-f]+)", out)
    assert m, out
    assert "State: queued" in out and "requirements.deny: [cpu]" in out
    # the CPU job: one injected preemption, requeued, resumed from its checkpoint, succeeded
    assert "injecting a preemption at step" in out
    assert "preemption notice sent" in out  # what `trainyard jobs preempt` printed
    assert "running -> preempted" in out and "preempted -> queued" in out
    resumed = re.search(r"resumed from step (\d+) of (\d+)", out)
    assert resumed and 0 < int(resumed.group(1)) < int(resumed.group(2)), out
    assert "running -> succeeded" in out
    assert re.search(r"finished: succeeded after 2 attempts", out), out
    # cost of both attempts at the nominal demo price, and the model hash
    assert len(re.findall(r"cost attempt \d+: [\d.]+ device-s x \$0\.05/device-h", out)) == 2, out
    cost = re.search(r"Cost: \$([\d.]+)", out)
    assert cost and float(cost.group(1)) > 0
    assert re.search(r"sha256 [0-9a-f]{64}", out), out
    assert "trainyard jobs get job-" in out
    # the server was stopped cleanly and left no pid file behind
    assert "Server stopped (exit code 0)" in out
    assert not (home / "demo-server.json").exists()


def _wait_exec(pid: int, marker: bytes) -> None:
    deadline = time.monotonic() + 10
    while marker not in Path(f"/proc/{pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_stale_demo_server_is_stopped(tmp_path: Path) -> None:
    """An interrupted earlier run left its server up: the next run stops it instead of running beside it."""
    home = tmp_path / "home"
    home.mkdir()
    stale = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "-m", "trainyard.cli.main", "up"]
    )
    try:
        _wait_exec(stale.pid, b"trainyard.cli.main")
        (home / "demo-server.json").write_text(f'{{"pid": {stale.pid}, "url": "http://127.0.0.1:1"}}')
        from rich.console import Console

        from trainyard.demo import stop_stale_server

        console = Console(record=True, width=200)
        stop_stale_server(home, console)
        assert stale.wait(30) is not None
        assert "still up" in console.export_text()
        assert not (home / "demo-server.json").exists()
        # a pid file naming some other program (the pid was reused) never gets that program killed
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        _wait_exec(other.pid, b"time.sleep")
        (home / "demo-server.json").write_text(f'{{"pid": {other.pid}, "url": "http://127.0.0.1:1"}}')
        stop_stale_server(home, console)
        assert other.poll() is None
        other.kill()
        other.wait(5)
    finally:
        if stale.poll() is None:
            stale.kill()
            stale.wait(5)


def test_a_server_already_serving_this_home_is_reused_not_duplicated(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from controlplane_support import ServerProcess
    from trainyard.demo import running_server_for
    from trainyard.settings import Settings

    srv = ServerProcess(tmp_path / "home").start()
    try:
        mine = Settings(home=srv.home, port=srv.port)
        assert running_server_for(mine) == srv.url
        # another home's key is not accepted there: that server is someone else's, start our own
        other = tmp_path / "other"
        other.mkdir()
        (other / "api_key").write_text("ty_notakey_" + "x" * 43)
        assert running_server_for(Settings(home=other, port=srv.port)) is None
        # nothing listening: start our own
        assert running_server_for(Settings(home=srv.home, port=_free_port())) is None
        # `trainyard jobs preempt` on a server that runs nothing: one line and a hint, exit 4 (conflict)
        from controlplane_support import tiny_spec
        from trainyard.client import TrainyardClient

        with TrainyardClient(srv.url, srv.api_key) as c:
            job_id = c.submit(tiny_spec("idle"))["id"]
        env = {**os.environ, "TRAINYARD_URL": srv.url, "TRAINYARD_HOME": str(srv.home)}
        env.pop("TRAINYARD_API_KEY", None)
        proc = subprocess.run(
            [sys.executable, "-m", "trainyard.cli.main", "jobs", "preempt", job_id, "--notice-s", "3"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 4, (proc.stdout, proc.stderr)
        assert "no executor" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        assert srv.stop() == 0
