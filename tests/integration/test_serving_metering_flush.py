"""The serving controller's metering flush on a real SQLite store: a flush that fails keeps its records
(the next one writes each once, with its ledger charge), a record from a replica whose row is already
gone is priced at the pool's placement without waiting on the flush's own write lock, and a replica's
pricing is read from the database once, not on every flush."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from controlplane_support import ScriptedPlatform
from trainyard.serving.metering import usage_records
from trainyard.store.governance_models import LedgerEntryRow
from trainyard.tenancy import ledger


@pytest.fixture
def env(tmp_path: Path) -> Iterator[ScriptedPlatform]:
    e = ScriptedPlatform(tmp_path)
    yield e
    e.p.close()


def _record(env: ScriptedPlatform, request_id: str, replica_id: str | None) -> dict[str, Any]:
    principal = env.p.tenants.cached_principal(env.key) or env.p.tenants.authenticate(env.key)
    return {
        "request_id": request_id,
        "tenant_id": principal.tenant_id,
        "tenant": principal.tenant_name,
        "deployment": "dep",
        "model_version": "m@1",
        "base_version": "m@1",
        "adapter": None,
        "route": "primary",
        "endpoint": "completions",
        "status": 200,
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "latency_s": 0.01,
        "ttft_s": None,
        "stream": False,
        "replica_id": replica_id,
        "tags": {"team": "t"},
        "created_at_s": time.time(),
    }


def _token_entries(env: ScriptedPlatform) -> list[str]:
    with env.p.db.session() as s:
        rows = s.scalars(select(LedgerEntryRow).where(LedgerEntryRow.kind == ledger.KIND_TOKENS))
        return sorted(r.source_key for r in rows)


def test_a_failed_flush_keeps_its_records_and_the_next_writes_each_once(
    env: ScriptedPlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = env.p.serving
    svc.meter(_record(env, "req-1", None))
    real = ledger.charge_batch

    def broken(*_a: Any, **_k: Any) -> int:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(ledger, "charge_batch", broken)
    with pytest.raises(RuntimeError):
        svc.flush()
    assert usage_records(env.p.db) == [] and _token_entries(env) == []  # nothing half-written
    svc.meter(_record(env, "req-2", None))  # metered while the first batch waited
    monkeypatch.setattr(ledger, "charge_batch", real)
    svc.flush()
    svc.flush()
    assert [r["request_id"] for r in usage_records(env.p.db)] == ["req-1", "req-2"]
    assert len(_token_entries(env)) == 2


def test_a_gone_replica_is_priced_at_the_pool_without_waiting_on_the_write_lock(
    env: ScriptedPlatform,
) -> None:
    svc = env.p.serving
    svc.meter(_record(env, "req-gone", "replica-without-a-row"))
    started = time.monotonic()
    svc.flush()
    assert time.monotonic() - started < 5  # it used to wait for SQLite's busy timeout (30 s)
    assert [r["request_id"] for r in usage_records(env.p.db)] == ["req-gone"]
    assert len(_token_entries(env)) == 1


def test_a_replicas_pricing_is_read_once(env: ScriptedPlatform, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = env.p.serving
    svc._replica_pricing["r1"] = ({"pool": "local-cpu", "accelerator": "cpu", "devices": 1}, None)
    records = [_record(env, f"req-{i}", "r1") for i in range(3)]
    opened = 0
    session = env.p.db.session

    def counting() -> Any:
        nonlocal opened
        opened += 1
        return session()

    monkeypatch.setattr(env.p.db, "session", counting)
    for rec in records:
        svc.meter(rec)
        svc.flush()
    assert opened == 3  # the write transaction of each flush, no read of the replica's row
    monkeypatch.setattr(env.p.db, "session", session)
    assert len(usage_records(env.p.db)) == 3 and len(_token_entries(env)) == 3


def test_the_tick_flushes_once_a_second_or_when_a_batch_is_waiting(
    env: ScriptedPlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainyard.serving import service as service_module

    svc = env.p.serving
    svc.flush()  # the last flush is now
    assert not svc.flush_due()  # nothing waiting
    svc.meter(_record(env, "req-a", None))
    assert not svc.flush_due()  # waiting, but the last flush was just now
    svc.tick()
    assert usage_records(env.p.db) == []
    monkeypatch.setattr(service_module, "METER_FLUSH_EVERY_S", 0.05)
    time.sleep(0.06)
    assert svc.flush_due()
    svc.tick()
    assert [r["request_id"] for r in usage_records(env.p.db)] == ["req-a"]
    monkeypatch.setattr(service_module, "METER_FLUSH_EVERY_S", 3600.0)
    monkeypatch.setattr(service_module, "METER_FLUSH_BATCH", 3)
    for i in range(3):
        assert not svc.flush_due()
        svc.meter(_record(env, f"req-b{i}", None))
    assert svc.flush_due()  # a full batch does not wait for the second
    svc.tick()
    assert len(usage_records(env.p.db)) == 4
