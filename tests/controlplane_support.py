"""Shared helpers for the control-plane tests: databases (SQLite and a throw-away PostgreSQL database),
a platform + in-process API client, free ports, a real `trainyard up` subprocess and a webhook receiver."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest

PG_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=5"
ROOT = Path(__file__).resolve().parents[1]

TINY_SPEC: dict[str, Any] = {
    "apiVersion": "trainyard/v1",
    "kind": "TrainingJob",
    "name": "tiny-cpu",
    "model": {"architecture": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 256},
    "workload": {"seq_len": 64, "global_batch": 4, "steps": 20, "precision": "fp32"},
    "requirements": {"allow": ["cpu"]},
}


def tiny_spec(name: str = "tiny-cpu", **workload: Any) -> dict[str, Any]:
    doc = {**TINY_SPEC, "name": name}
    doc["workload"] = {**TINY_SPEC["workload"], **workload}
    return doc


@contextmanager
def postgres_database() -> Iterator[str]:
    """A uniquely named PostgreSQL database, dropped afterwards. Unreachable server → the test FAILS."""
    import psycopg

    name = f"trainyard_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(PG_ADMIN_DSN, autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at 127.0.0.1:5432 is required for this test and is unreachable: {exc}")
    try:
        admin.execute(f'CREATE DATABASE "{name}"')
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@contextmanager
def postgres_db(tenants: tuple[tuple[str, str], ...] = ()) -> Iterator[Any]:
    """A migrated ``Database`` on a fresh PostgreSQL database (:func:`postgres_database`), with a tenant row
    for each ``(id, name)`` of ``tenants``; disposed and dropped afterwards."""
    from sqlalchemy import Table, insert

    from trainyard.store.db import Database
    from trainyard.store.models import TenantRow

    with postgres_database() as url:
        db = Database(url)
        db.upgrade()
        if tenants:
            with db.engine.begin() as c:
                c.execute(
                    insert(cast(Table, TenantRow.__table__)),
                    [{"id": t, "name": n, "created_at_s": 0.0} for t, n in tenants],
                )
        try:
            yield db
        finally:
            db.dispose()


@contextmanager
def database_url(kind: str, tmp: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp / 'trainyard.db'}"
    elif kind == "postgresql":
        with postgres_database() as url:
            yield url
    else:
        raise ValueError(kind)


@contextmanager
def in_process_platform(
    settings: Any,
    *,
    heartbeat_timeout_s: float = 60.0,
    price_usd_per_device_hour: float | None = None,
    schedule_round: Any = None,
) -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """A platform on ``settings`` with a real local executor and its control loop running, behind
    FastAPI's TestClient (no port): yields (platform, client, admin headers); stops everything after.
    ``schedule_round``: the scheduler (default: the greedy cheapest-option round)."""
    from fastapi.testclient import TestClient

    from trainyard.api.app import create_app
    from trainyard.executors.local import LocalExecutor
    from trainyard.services.platform import Platform, PlatformOptions
    from trainyard.services.scheduling import GreedyCheapestRound

    executor = LocalExecutor(heartbeat_timeout_s=heartbeat_timeout_s)
    platform = Platform.open(
        settings,
        PlatformOptions(
            executor=executor,
            schedule_round=schedule_round or GreedyCheapestRound(),
            cpu_count=2,
            with_catalog=False,
            loop_interval_s=0.1,
        ),
    )
    if price_usd_per_device_hour is not None:
        platform.pools.update("local-cpu", {"price_usd_per_device_hour": price_usd_per_device_hour})
    platform.start_loop()
    client = TestClient(create_app(platform, access_log=False))
    headers = {"Authorization": f"Bearer {platform.settings.api_key_path.read_text().strip()}"}
    try:
        with client:
            yield platform, client, headers
    finally:
        platform.stop_loop()
        executor.shutdown(kill_workers=True)
        platform.close()


def wait_done(client: Any, headers: dict[str, str], job_id: str, timeout_s: float = 180.0) -> dict[str, Any]:
    """Poll a job through the API until it ends; its document."""
    deadline = time.monotonic() + timeout_s
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        doc = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
        if doc["state"] in ("succeeded", "failed", "cancelled"):
            return doc
        time.sleep(0.2)
    raise AssertionError(f"{job_id} not done in {timeout_s} s: {doc.get('state')} {doc.get('progress')}")


def wait_until(pred: Callable[[], Any], timeout_s: float = 60.0, what: str = "condition") -> Any:
    """``pred()`` once it is truthy (polled every 0.1 s); an AssertionError naming ``what`` after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{what} not met in {timeout_s} s")


class WebhookReceiver:
    """A webhook endpoint on 127.0.0.1 that keeps every request (``headers``, ``body``, ``status``,
    ``t``: monotonic arrival) and answers the status ``status_for(earlier_requests, headers)`` picks
    (200 by default)."""

    def __init__(
        self, status_for: Callable[[list[dict[str, Any]], Any], int] = lambda _earlier, _headers: 200
    ) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    status = status_for(receiver.requests, self.headers)
                    receiver.requests.append(
                        {"headers": dict(self.headers), "body": body, "status": status, "t": time.monotonic()}
                    )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def seen(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.requests)

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r["body"]) for r in self.seen()]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """`trainyard up` as a real subprocess on 127.0.0.1:<free port> with its own TRAINYARD_HOME."""

    def __init__(
        self, home: Path, *, database_url: str | None = None, executor: str = "none", port: int | None = None
    ) -> None:
        self.home = home
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # the first-start CPU measurement has a test of its own (tests/integration/test_calibration.py)
        self.env = {**os.environ, "TRAINYARD_HOME": str(home), "TRAINYARD_PROFILE_AT_START": "0"}
        self.env.pop("TRAINYARD_API_KEY", None)
        if database_url:
            self.env["TRAINYARD_DATABASE_URL"] = database_url
        self.executor = executor
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = home / f"server-{self.port}.log"

    def start(self, timeout_s: float = 180.0) -> ServerProcess:
        import httpx

        self.home.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainyard.cli.main",
                "up",
                "--port",
                str(self.port),
                "--executor",
                self.executor,
                "--loop-interval-s",
                "0.2",
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(ROOT),
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"trainyard up exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"trainyard up did not become ready in {timeout_s} s:\n{self.log_text()}")

    @property
    def api_key(self) -> str:
        return (self.home / "api_key").read_text().strip()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError("trainyard up did not stop on SIGTERM") from None

    def cli_env(self) -> dict[str, str]:
        return {**self.env, "TRAINYARD_URL": self.url}


TRACE_VARIABLES = ("TRAINYARD_TRACE_EXPORTER", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED")


def default_traced_platform(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedPlatform]:
    """A :class:`ScriptedPlatform` with tracing as the server's defaults set it (none of the test
    process's tracing variables), closed afterwards: the body of a fixture."""
    for var in TRACE_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    e = ScriptedPlatform(home)
    yield e
    e.p.close()


class ScriptedPlatform:
    """A platform on a real SQLite store under ``home`` whose executor is the scripted
    :class:`~fakes.FakeExecutor` (the tests feed the worker reports) and whose clock is a
    :class:`~fakes.ManualClock`, with the real app in front of it (TestClient, no port). ``settings``
    go to :class:`~trainyard.settings.Settings`; ``price_usd_per_device_hour`` prices the local pool."""

    def __init__(
        self, home: Path, *, price_usd_per_device_hour: float | None = None, **settings: Any
    ) -> None:
        from fakes import FakeExecutor, ManualClock
        from trainyard.api.app import create_app
        from trainyard.services.platform import Platform, PlatformOptions
        from trainyard.services.scheduling import GreedyCheapestRound
        from trainyard.settings import Settings

        self.clock = ManualClock()
        self.ex = FakeExecutor()
        self.p = Platform.open(
            Settings(home=home, database_url=f"sqlite:///{home / 'trainyard.db'}", **settings),
            PlatformOptions(
                executor=self.ex,
                schedule_round=GreedyCheapestRound(),
                cpu_count=2,
                clock=self.clock,
                with_catalog=False,
            ),
        )
        self.app = create_app(self.p, access_log=False)
        self.key = self.p.settings.api_key_path.read_text().strip()
        self.h = {"Authorization": f"Bearer {self.key}"}
        if price_usd_per_device_hour is not None:
            self.p.pools.update("local-cpu", {"price_usd_per_device_hour": price_usd_per_device_hour})
        self.c = self.client()

    def client(self) -> Any:
        from fastapi.testclient import TestClient

        return TestClient(self.app, base_url="http://127.0.0.1")

    def browser(self, key: str | None = None) -> Any:
        """A client logged in to the dashboard (with the admin key unless ``key`` says otherwise)."""
        c = self.client()
        r = c.post("/login", data={"api_key": key or self.key, "next": "/"}, follow_redirects=False)
        assert r.status_code == 303, r.text
        return c

    def submit(self, spec: dict[str, Any], key: str | None = None) -> str:
        h = {"Authorization": f"Bearer {key}"} if key else self.h
        r = self.client().post("/v1/jobs", json={"spec": spec}, headers=h)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def event(self, job_id: str, kind: str, data: dict[str, Any]) -> None:
        """A worker report of ``job_id``'s current attempt, at the manual clock's time."""
        self.ex.emit(job_id, kind, data, time_s=self.clock.now)

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """One /metrics scrape: (sample name, sorted labels) -> value."""
        from prometheus_client.parser import text_string_to_metric_families

        text = self.c.get("/metrics", headers=self.h).text
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def close(self) -> None:
        self.p.close()
