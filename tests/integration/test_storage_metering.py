"""Storage GB-hours on a real database: a tenant's dataset, model and its job's checkpoints accrue in
the usage ledger, appear in /v1/usage by kind and by tag, only for that tenant, once across repeated
ticks and a restart of the control plane. The clock is a manual one; nothing sleeps."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import database_url, tiny_spec
from fakes import FakeExecutor, ManualClock
from trainyard.api.app import create_app
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduling import GreedyCheapestRound
from trainyard.settings import Settings

INTERVAL_S = 600.0
PRICE_PER_GB_MONTH = 0.05
GB = 10**9


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_url(request.param, tmp_path) as url:
        yield url


def _open(home: Path, url: str, clock: ManualClock, ex: FakeExecutor) -> Platform:
    settings = Settings(
        home=home,
        database_url=url,
        storage_accrual_interval_s=INTERVAL_S,
        storage_price_usd_per_gb_month=PRICE_PER_GB_MONTH,
    )
    opts = PlatformOptions(
        executor=ex, schedule_round=GreedyCheapestRound(), cpu_count=4, with_catalog=False, clock=clock
    )
    return Platform.open(settings, opts)


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _usage(c: TestClient, key: str, by: str, **params: Any) -> dict[str, dict[str, Any]]:
    r = c.get("/v1/usage", params={"by": by, **params}, headers=_h(key))
    assert r.status_code == 200, r.text
    return {row["group"]: row for row in r.json()["rows"]}


def test_dataset_and_checkpoints_accrue_gb_hours_for_their_tenant_only(db_url: str, tmp_path: Path) -> None:
    clock = ManualClock()  # 1_800_000_000: an interval boundary
    t0 = clock.now
    ex = FakeExecutor()
    home = tmp_path / "home"
    p = _open(home, db_url, clock, ex)
    try:
        _, alpha = p.tenants.create("alpha")
        _, beta = p.tenants.create("beta")
        with TestClient(create_app(p, access_log=False), base_url="http://127.0.0.1") as c:
            rows = b"".join(json.dumps({"text": f"row {i} " + "x" * 50}).encode() + b"\n" for i in range(200))
            up = c.post(
                "/v1/datasets",
                params={"name": "corpus"},
                content=rows,
                headers={**_h(alpha), "Content-Type": "application/x-ndjson"},
            )
            assert up.status_code == 201, up.text
            ds_bytes = up.json()["bytes"]
            assert ds_bytes > 0
            spec = tiny_spec("tagged")
            spec["tags"] = {"team": "vision"}
            r = c.post("/v1/jobs", json={"spec": spec}, headers=_h(alpha))
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
        from hf_models import build_tiny_llama

        model = p.registry.import_directory(
            p.tenants.authenticate(alpha), build_tiny_llama(tmp_path / "tiny", seed=0), "base"
        )
        model_dir = home / "storage" / "tenants" / "alpha" / "models" / "base" / "1"
        model_bytes = sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file())
        assert model_bytes > 0
        p.tick()
        ex.emit(job_id, "started", {"rank": 0, "pid": 1, "host": "h"}, time_s=t0 + 30)
        # the runtime's checkpoint events: size, and the steps retention deleted
        ex.emit(job_id, "checkpoint", {"step": 10, "path": "/c/step-10", "bytes": 3 * GB}, time_s=t0 + 60)
        clock.now = t0 + 100
        p.tick()
        ex.emit(
            job_id,
            "checkpoint",
            {"step": 20, "path": "/c/step-20", "bytes": 2 * GB, "removed_steps": [10]},
            time_s=t0 + 900,
        )
        clock.now = t0 + 1000
        p.tick()
        clock.now = t0 + 3 * INTERVAL_S + 5  # three complete intervals
        p.tick()
        p.tick()  # repeated: nothing new
    finally:
        p.close()

    # the control plane restarts on the same database and ticks again in the same interval
    p = _open(home, db_url, clock, ex)
    try:
        p.tick()
        end = t0 + 3 * INTERVAL_S
        hand_ckpt = (3 * (900 - 60) + 2 * (3 * INTERVAL_S - 900)) / 3600.0  # GB x s / 3600
        hand_ds = ds_bytes / GB * (end - t0) / 3600.0
        hand_model = model_bytes / GB * (end - t0) / 3600.0  # measured on disk here, once, by the test
        usd_per_gbh = PRICE_PER_GB_MONTH / 730.0
        with TestClient(create_app(p, access_log=False), base_url="http://127.0.0.1") as c:
            by_kind = _usage(c, alpha, "kind")
            storage = by_kind["storage_gb_hours"]
            total = hand_ckpt + hand_ds + hand_model
            assert storage["storage_gb_hours"] == pytest.approx(total, abs=1e-6)
            assert storage["usd"] == pytest.approx(total * usd_per_gbh, abs=1e-6)
            # one entry per resource per interval: dataset 3, model 3, step 10 two (removed in the
            # second), step 20 two
            assert storage["entries"] == 3 + 3 + 2 + 2
            by_model = _usage(c, alpha, "model")
            # (the report rounds to 6 decimals)
            assert by_model[model.id]["storage_gb_hours"] == pytest.approx(hand_model, abs=5.1e-7)
            by_team = _usage(c, alpha, "tag:team")
            assert by_team["vision"]["storage_gb_hours"] == pytest.approx(hand_ckpt, abs=1e-6)
            assert by_team["(none)"]["storage_gb_hours"] == pytest.approx(hand_ds + hand_model, abs=1e-6)
            by_job = _usage(c, alpha, "job")
            assert by_job[job_id]["storage_gb_hours"] == pytest.approx(hand_ckpt, abs=1e-6)
            # the other tenant sees none of it, and cannot ask for alpha's report
            assert _usage(c, beta, "kind") == {}
            r = c.get("/v1/usage", params={"by": "kind", "tenant": "alpha"}, headers=_h(beta))
            assert r.status_code == 404
            # an entry's time is the end of its interval: a range ending at the third's end has two
            before_third = _usage(c, alpha, "kind", to="2027-01-15T08:30:00Z")["storage_gb_hours"]
            assert before_third["entries"] == 2 + 2 + 2 + 1
            invoice = c.get("/v1/usage/invoice", headers=_h(alpha)).json()
            line = next(x for x in invoice["lines"] if x["kind"] == "storage_gb_hours")
            assert line["unit"] == "gb_hours" and line["unit_price_usd"] == pytest.approx(usd_per_gbh)
    finally:
        p.close()
