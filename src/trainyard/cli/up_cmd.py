"""`trainyard server up|status|down` (aliases `trainyard up`, `status`, `down`): the platform on embedded
defaults, in the foreground or detached, where it serves ($TRAINYARD_HOME/server.json), and a clean stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer

from trainyard import serverfile
from trainyard.cli.common import console, duration, err_console, handle_errors, print_json
from trainyard.errors import NotFoundError, ServiceUnavailableError

app = typer.Typer(help="Start, inspect and stop the platform (up, status, down).", no_args_is_help=True)


def banner(record: dict[str, Any], *, detached: bool = False) -> str:
    url = record["url"]
    stop = "trainyard down" if detached else "Ctrl-C (or `trainyard down`)"
    return "\n".join(
        [
            f"trainyard is up at {url}  (pid {record['pid']}, executor {record.get('executor', '-')})",
            f"  dashboard  {url}/",
            f"  API docs   {url}/docs",
            f"  API key    {record.get('api_key_file')}",
            f"  recorded   {serverfile.server_file(Path(record['home'])) if record.get('home') else ''}",
            f"  next       trainyard jobs submit SPEC --wait      stop: {stop}",
        ]
    )


def _up_args(
    port: int | None,
    host: str | None,
    executor: str | None,
    ray_address: str | None,
    ray_shared_paths: str | None,
    loop_interval_s: float,
) -> list[str]:
    args = ["up", "--loop-interval-s", str(loop_interval_s)]
    for flag, value in (
        ("--port", port),
        ("--host", host),
        ("--executor", executor),
        ("--ray-address", ray_address),
        ("--ray-shared-paths", ray_shared_paths),
    ):
        if value is not None:
            args += [flag, str(value)]
    return args


@app.command("up")
@handle_errors
def up(
    port: int = typer.Option(
        None,
        "--port",
        help="TCP port (default 8080, or TRAINYARD_PORT; 0 picks a free one).",
        min=0,
        max=65535,
    ),
    host: str = typer.Option(None, "--host", help="Interface to bind (default 127.0.0.1)."),
    executor: str = typer.Option(
        None,
        "--executor",
        help="Executor backend: local (default), ray, or none (queue jobs without running).",
    ),
    ray_address: str = typer.Option(
        None, "--ray-address", help="Ray cluster to run on with --executor ray (or TRAINYARD_RAY_ADDRESS)."
    ),
    ray_shared_paths: str = typer.Option(
        None,
        "--ray-shared-paths",
        help="Comma-separated local paths every Ray node mounts (or TRAINYARD_RAY_SHARED_PATHS); "
        "file:// checkpoint storage must lie under one of them.",
    ),
    loop_interval_s: float = typer.Option(
        0.5, "--loop-interval-s", min=0.05, max=60.0, help="Seconds between control-loop ticks."
    ),
    detach: bool = typer.Option(
        False,
        "--detach",
        "-d",
        help="Run in the background (log: $TRAINYARD_HOME/server.log); stop with down.",
    ),
    timeout_s: float = typer.Option(
        120.0, "--timeout-s", min=1, help="With --detach: how long to wait for the server to be ready."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the server record {url, pid, port, started_at, ...} as JSON once ready."
    ),
) -> None:
    """Start the API, the scheduler loop, the executor and the dashboard (Ctrl-C stops gracefully)."""
    running = serverfile.read_live()
    if running is not None:  # one server per TRAINYARD_HOME (they would share its database and files)
        from trainyard.errors import PortInUseError

        raise PortInUseError(
            f"trainyard is already up at {running['url']} (pid {running['pid']})",
            hint="Stop it with `trainyard down`, or start another on a free port with --port N.",
            details={"url": running["url"], "pid": running["pid"]},
        )
    args = _up_args(port, host, executor, ray_address, ray_shared_paths, loop_interval_s)
    if detach:
        record = _start_detached(args, timeout_s)
        if as_json:
            print_json(record)
        else:
            console.print(banner(record, detached=True), markup=False, soft_wrap=True)
        return
    from trainyard.server import serve
    from trainyard.settings import load_settings

    settings = load_settings()
    updates: dict[str, str] = {}
    if ray_address:
        updates["ray_address"] = ray_address
    if ray_shared_paths:
        updates["ray_shared_paths"] = ray_shared_paths
    if updates:
        settings = settings.model_copy(update=updates)

    def ready(record: dict[str, Any]) -> None:
        if as_json:
            print_json(record)
        else:
            err_console.print(banner(record), markup=False, soft_wrap=True)

    serve(
        settings,
        host=host or settings.host,
        port=settings.port if port is None else port,
        executor=executor,
        loop_interval_s=loop_interval_s,
        on_ready=ready,
    )


def _start_detached(args: list[str], timeout_s: float) -> dict[str, Any]:
    """Start `trainyard up` in its own session with output to $TRAINYARD_HOME/server.log, and return its
    server record once it answers /readyz."""
    home = serverfile.home()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path = home / "server.log"
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    start = log_path.stat().st_size
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainyard.cli.main", *args],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            tail = _log_tail(log_path, start)
            raise ServiceUnavailableError(
                f"trainyard up exited with status {code} before it was ready" + (f": {tail}" if tail else ""),
                hint=f"The whole log is in {log_path}.",
            )
        record = serverfile.read(home)
        if record is not None and record.get("pid") == proc.pid and _ready(record["url"]):
            return record
        time.sleep(0.1)
    raise ServiceUnavailableError(
        f"trainyard up (pid {proc.pid}) was not ready after {timeout_s:.0f} s",
        hint=f"It may still be starting: `trainyard status`; its log is {log_path}.",
    )


def _log_tail(path: Path, start: int) -> str:
    """The last meaningful line the server wrote (its error), for a one-line report."""
    try:
        with path.open("rb") as f:
            f.seek(start)
            lines = [x.strip() for x in f.read().decode("utf-8", "replace").splitlines() if x.strip()]
    except OSError:
        return ""
    errors = [x for x in lines if x.startswith("error:")]
    return (errors[-1].removeprefix("error:").strip() if errors else lines[-1] if lines else "")[:300]


def _ready(url: str, timeout_s: float = 1.0) -> bool:
    """Whether the server answers /readyz with 200 (the standard library: `status` stays light)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _since(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return (datetime.now(UTC) - datetime.fromisoformat(iso.replace("Z", "+00:00"))).total_seconds()
    except ValueError:
        return None


@app.command("status")
@handle_errors
def status(
    as_json: bool = typer.Option(
        False, "--json", help="Print {running, url, pid, port, started_at, uptime_s, ready, ...} as JSON."
    ),
) -> None:
    """Whether a `trainyard up` of this TRAINYARD_HOME is serving, where, and since when (exit 8 if not)."""
    record = serverfile.read()
    alive = record is not None and serverfile.pid_alive(int(record.get("pid") or 0))
    if record is None or not alive:
        doc: dict[str, Any] = {
            "running": False,
            "server_file": str(serverfile.server_file()),
            "stale": record is not None,
        }
        if as_json:
            print_json(doc)
        else:
            extra = " (the recorded server is gone)" if record is not None else ""
            console.print(f"trainyard is not running{extra}; start it with `trainyard up`", soft_wrap=True)
        raise SystemExit(ServiceUnavailableError.exit_code)
    ready = _ready(record["url"])
    doc = {
        "running": True,
        "ready": ready,
        **record,
        "uptime_s": _since(record.get("started_at")),
        "dashboard_url": f"{record['url']}/",
        "server_file": str(serverfile.server_file()),
    }
    if as_json:
        print_json(doc)
        return
    state = "ready" if ready else "starting (not ready yet)"
    console.print(
        f"trainyard is up at {record['url']}: {state}, pid {record['pid']}, "
        f"up {duration(doc['uptime_s'])} (since {record.get('started_at')})",
        soft_wrap=True,
        markup=False,
    )
    console.print(f"  dashboard  {doc['dashboard_url']}", soft_wrap=True, markup=False)
    console.print(f"  API key    {record.get('api_key_file')}", soft_wrap=True, markup=False)


@app.command("down")
@handle_errors
def down(
    timeout_s: float = typer.Option(30.0, "--timeout-s", min=1, help="Seconds to wait for a clean stop."),
    as_json: bool = typer.Option(False, "--json", help="Print {stopped, pid, url} as JSON."),
) -> None:
    """Stop the server recorded in $TRAINYARD_HOME/server.json cleanly (SIGTERM; it finishes in-flight
    requests and closes the database)."""
    record = serverfile.read()
    if record is None or not serverfile.pid_alive(int(record.get("pid") or 0)):
        if record is not None:
            serverfile.server_file().unlink(missing_ok=True)
        raise NotFoundError(
            "no trainyard server is running for this TRAINYARD_HOME",
            hint="`trainyard status` shows what is recorded; a server started elsewhere stops with Ctrl-C.",
        )
    pid = int(record["pid"])
    if not _is_trainyard(pid):
        raise NotFoundError(
            f"pid {pid} in {serverfile.server_file()} is not a trainyard server",
            hint="Remove the stale server.json and check `trainyard status`.",
        )
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while serverfile.pid_alive(pid):
        if time.monotonic() > deadline:
            raise ServiceUnavailableError(
                f"trainyard (pid {pid}) did not stop within {timeout_s:.0f} s",
                hint=f"It may be finishing requests; wait, or `kill -9 {pid}` as a last resort.",
            )
        time.sleep(0.1)
    serverfile.remove_if_mine(pid)
    if as_json:
        print_json({"stopped": True, "pid": pid, "url": record["url"]})
    else:
        console.print(f"trainyard at {record['url']} (pid {pid}) stopped", soft_wrap=True, markup=False)


def _is_trainyard(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return True  # no /proc: trust the record
    return b"trainyard" in cmdline
