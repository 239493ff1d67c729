"""One calibration everywhere: after `trainyard profile`, `trainyard predict`, `trainyard quote`, the
server's quoter and the scheduler's round give the same CPU step time for the same spec; and the
first-start measurement stores real CPU profiles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from controlplane_support import tiny_spec
from fakes import FakeExecutor
from trainyard.catalog.accelerators import get_accelerator
from trainyard.cli.main import app
from trainyard.cost.quote import predict_kwargs
from trainyard.predict import default_calibration, predict
from trainyard.runtime.profiler import profile_spec
from trainyard.services.domain import Principal
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.pools import local_cpu_pool
from trainyard.services.profiles import (
    STARTUP_SPECS,
    load_profiles,
    measure_local_cpu,
    profile_calibration,
    startup_gang_ranks,
    startup_profile_count,
    store_profile,
)
from trainyard.services.quoting import quote_pools
from trainyard.services.scheduler_adapter import OptimizerRound, calibrated_predictions
from trainyard.settings import Settings
from trainyard.spec.loader import spec_from_dict
from trainyard.store.repositories import TenantRepo


def _one_core(name: str, steps: int = 50_000) -> dict[str, Any]:
    return {**tiny_spec(name, steps=steps), "resources": {"max_devices": 1}}


def test_predict_quote_server_and_scheduler_agree_after_a_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    doc = _one_core("probe")
    spec = spec_from_dict(doc)
    cpu = get_accelerator("cpu")
    pool = local_cpu_pool(2).model_copy(update={"price_usd_per_device_hour": 3.6})
    before = predict(spec, cpu, 1, calibration=default_calibration(), **predict_kwargs(pool, cpu)).step_time_s

    profile = profile_spec(spec_from_dict(tiny_spec("profiled")), steps=3, warmup=1, device="cpu", threads=1)
    store_profile(home, profile)
    assert len(load_profiles(home)) == 1

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    pools_path = tmp_path / "pools.yaml"
    pools_path.write_text(yaml.safe_dump({"pools": [pool.model_dump(mode="json", exclude_none=True)]}))
    runner = CliRunner()
    r = runner.invoke(app, ["predict", str(spec_path), "--accelerator", "cpu", "--devices", "1", "--json"])
    assert r.exit_code == 0, r.output
    predicted = json.loads(r.stdout)["step_time_s"]
    assert abs(predicted / before - 1) > 0.05  # the profile moved the prediction
    r = runner.invoke(app, ["quote", str(spec_path), "--pools", str(pools_path), "--json"])
    assert r.exit_code == 0, r.output
    (quoted,) = [o for o in json.loads(r.stdout)["options"] if o["devices"] == 1 and o["feasible"]]
    assert quoted["step_time_s"] == pytest.approx(predicted, rel=0.02)

    ex = FakeExecutor()
    p = Platform.open(
        Settings(home=home, database_url=f"sqlite:///{tmp_path / 'trainyard.db'}"),
        PlatformOptions(executor=ex, cpu_count=2, with_catalog=False, schedule_round=OptimizerRound()),
    )
    try:
        p.pools.update("local-cpu", {"price_usd_per_device_hour": 3.6})
        assert p.options.quoter is not None
        options = p.options.quoter(spec, quote_pools(p.pools.pools(), with_catalog=False))
        (served,) = [o for o in options if o.pool == "local-cpu" and o.devices == 1 and o.feasible]
        assert served.step_time_s == pytest.approx(predicted, rel=0.02)

        hook = calibrated_predictions(p.feedback.calibration)
        assert hook is not None
        scheduled = hook(spec, cpu, 1, predict_kwargs(pool, cpu))
        assert scheduled is not None and scheduled.step_time_s == pytest.approx(predicted, rel=0.02)

        with p.db.session() as s:
            t = TenantRepo(s).by_name("default")
        assert t is not None
        who = Principal(tenant_id=t.id, tenant_name="default", key_id="test", admin=True)
        job, _ = p.jobs.submit(who, spec)
        p.tick()
        job = p.jobs.get(who, job.id)
        stored = [o for o in job.quote if o.get("pool") == "local-cpu" and o.get("devices") == 1]
        assert stored and stored[0]["step_time_s"] == pytest.approx(predicted, rel=0.02)
        assert job.placement is not None
        assert job.placement.expected_cost_usd == pytest.approx(stored[0]["expected_cost_usd"], rel=0.02)
    finally:
        p.close()


def test_first_start_measurement_stores_cpu_profiles(tmp_path: Path) -> None:
    paths = measure_local_cpu(tmp_path, steps=1, warmup=0)
    assert len(paths) == startup_profile_count() and all(p.exists() for p in paths)
    docs = load_profiles(tmp_path)
    assert all(d["accelerator"] == "cpu" for d in docs) and all(d["threads"] == 1 for d in docs)
    assert all(d["step_time_s"] > 0 for d in docs)
    gangs = [d for d in docs if d.get("devices", 1) > 1]
    if startup_gang_ranks():
        # the same specs again on a gang of ranks of this host: the full global batch, dealt over them
        batches = {d["name"]: d["workload"]["global_batch"] for d in STARTUP_SPECS}
        assert {d["name"]: d["spec"]["workload"]["global_batch"] for d in gangs} == batches
        assert all(d["devices"] == startup_gang_ranks() and d["host_cores"] >= d["devices"] for d in gangs)
        assert all(d["ratio_to_one_rank"] > 0 and d["solo_step_time_s"] > 0 for d in gangs)
        cal = profile_calibration(tmp_path)
        assert cal.params["cpu/torch-cpu/fp32/cpu"].gang_slowdown != 1.0  # fitted to the gang
