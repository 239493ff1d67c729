"""The serving controller's tick on a real SQLite store: a replica that is already ready and answers its
health probe (every second) changes no row, so the tick opens no write transaction for it; one that was
starting and answers is marked ready in one."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tests.tiny_models import build_tiny_llama

from controlplane_support import free_port
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.serving.autoscale import AutoscalingPolicy
from trainyard.settings import Settings
from trainyard.store.serving_models import ServingReplicaRow

REPLICA_ID = "rep-health"


@pytest.fixture
def health_server() -> Iterator[int]:
    """A local HTTP server answering /health as replica REPLICA_ID."""

    async def health(_request: Request) -> JSONResponse:
        return JSONResponse({"replica_id": REPLICA_ID, "adapters": []})

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            Starlette(routes=[Route("/health", health)]),
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield port
    server.should_exit = server.force_exit = True
    thread.join(10)


def test_a_ready_replica_answering_its_probe_costs_no_write_transaction(
    tmp_path: Path, health_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    platform = Platform.open(
        Settings(home=tmp_path / "home", database_url=f"sqlite:///{tmp_path / 'ty.db'}"),
        PlatformOptions(cpu_count=2, with_catalog=False),
    )
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # the replica's pid
    try:
        tenant, key = platform.tenants.create("team")
        principal = platform.tenants.authenticate(key)
        version = platform.registry.import_directory(principal, build_tiny_llama(tmp_path / "base"), "tiny")
        svc = platform.serving
        svc.create(tenant.id, tenant.name, "chat", "tiny@1", policy=AutoscalingPolicy(min_replicas=1))
        weights = version.artefacts["weights"]
        with platform.db.session() as s:
            for row in s.query(ServingReplicaRow).all():  # what create's tick started: not this test's
                svc._launcher_of(row).stop(row.id, row.pid)
                s.delete(row)
            s.add(
                ServingReplicaRow(
                    id=REPLICA_ID,
                    tenant_id=tenant.id,
                    base_version="tiny@1",
                    model_path=str(weights),
                    backend="local",
                    pid=stand_in.pid,
                    host="127.0.0.1",
                    port=health_server,
                    state="starting",
                    placement={},
                    started_at_s=time.time(),
                )
            )
        svc.tick()  # starting -> ready: one write
        with platform.db.session() as s:
            assert s.get(ServingReplicaRow, REPLICA_ID).state == "ready"  # type: ignore[union-attr]
        view = svc.lookup(tenant.id, "chat")
        assert view is not None and svc.try_acquire(view.routes[0].pool_key, None) is not None

        # the controller's clock stands still from here: a tick that re-resolves the deployment's model
        # (once a second, a read of the registry) is not what this counts, and on a loaded machine
        # three ticks can take longer than that second
        frozen_s = svc.clock()
        monkeypatch.setattr(svc, "clock", lambda: frozen_s)
        svc.tick()  # any resolution that was due is made now, at the frozen time
        opened: list[Any] = []
        session = platform.db.session

        def counting() -> Any:
            opened.append(1)
            return session()

        monkeypatch.setattr(platform.db, "session", counting)
        for _ in range(3):
            svc._health_at.clear()  # probe on this tick (the controller probes once a second)
            svc.tick()
        assert len(opened) == 3  # each tick's one read; the answered probes wrote nothing
        monkeypatch.setattr(platform.db, "session", session)
        with platform.db.session() as s:
            row = s.get(ServingReplicaRow, REPLICA_ID)
            assert row is not None and row.state == "ready"
    finally:
        stand_in.kill()
        stand_in.wait()
        svc._pending_meter.clear()
        with platform.db.session() as s:
            s.query(ServingReplicaRow).delete()
        platform.close()
