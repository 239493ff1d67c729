"""Inputs that used to answer 500 answer a 4xx envelope naming the field (SQLite and PostgreSQL)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import database_url, tiny_spec
from trainyard.api.app import create_app
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.settings import Settings
from trainyard.store.repositories import JobRepo


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    home = tmp_path_factory.mktemp(f"bad-{request.param}")
    with database_url(request.param, home) as url:
        platform = Platform.open(Settings(home=home, database_url=url), PlatformOptions(cpu_count=2))
        headers = {"Authorization": f"Bearer {platform.settings.api_key_path.read_text().strip()}"}
        with TestClient(create_app(platform, access_log=False), raise_server_exceptions=False) as c:
            yield platform, c, headers, home
        platform.close()


def _error(r: Any, status: int = 422) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"code", "message", "hint", "details"}
    return dict(err)


@pytest.mark.parametrize("interval", [{}, [], None, True, 5e-324, "0s"])
@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/quotes"])
def test_bad_checkpoint_interval_is_a_422_naming_the_field(api: Any, interval: Any, path: str) -> None:
    _, c, headers, _ = api
    spec = {**tiny_spec("bad-interval"), "checkpoint": {"interval": interval}}
    err = _error(c.post(path, json={"spec": spec}, headers=headers))
    assert "checkpoint.interval" in err["message"]


def test_numeric_checkpoint_interval_is_accepted(api: Any) -> None:
    _, c, headers, _ = api
    spec = {**tiny_spec("num-interval"), "checkpoint": {"interval": 900}}
    r = c.post("/v1/jobs", json={"spec": spec}, headers=headers)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["checkpoint"]["interval"] == "900.0s"


DENORMAL = 5e-324
FIELDS = {
    "objective.budget_usd": lambda s: s.__setitem__("objective", {"budget_usd": DENORMAL}),
    "objective.deadline": lambda s: s.__setitem__("objective", {"deadline": DENORMAL}),
    "workload.learning_rate": lambda s: s["workload"].__setitem__("learning_rate", DENORMAL),
    "resources.min_memory_per_device_gib": lambda s: s.__setitem__(
        "resources", {"min_memory_per_device_gib": DENORMAL}
    ),
    "resources.accelerator_hours": lambda s: s.__setitem__("resources", {"accelerator_hours": DENORMAL}),
    "measured.step_time_s": lambda s: s.__setitem__("measured", {"step_time_s": {"cpu": DENORMAL}}),
}


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/quotes"])
def test_denormal_numbers_are_refused(api: Any, field: str, path: str) -> None:
    _, c, headers, _ = api
    spec = tiny_spec("denormal")
    FIELDS[field](spec)
    err = _error(c.post(path, json={"spec": spec}, headers=headers))
    assert field in err["message"] or any(field in e.get("field", "") for e in err["details"]["errors"])


@pytest.mark.parametrize("seq", [2**63 - 1, 2**63, 2**64, 10**30])
def test_cursor_beyond_64_bits_is_a_422(api: Any, seq: int) -> None:
    _, c, headers, _ = api
    cursor = base64.urlsafe_b64encode(f"s:{seq}".encode()).decode().rstrip("=")
    r = c.get("/v1/jobs", params={"cursor": cursor}, headers=headers)
    if seq < 2**63:
        assert r.status_code == 200, r.text
    else:
        assert _error(r)["details"]["errors"][0]["field"] == "cursor"


def test_log_offset_past_the_end_of_a_real_log(api: Any, tmp_path: Path) -> None:
    from trainyard.executors.base import rank_log_name

    platform, c, headers, _ = api
    job_id = c.post("/v1/jobs", json={"spec": tiny_spec("logs")}, headers=headers).json()["id"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / rank_log_name(0)).write_text("step 1\nstep 2\n")
    with platform.db.session() as s:
        JobRepo(s).update(job_id, run_dir=str(run_dir))
    ok = c.get(f"/v1/jobs/{job_id}/logs", params={"offset": 5}, headers=headers)
    assert ok.status_code == 200 and ok.json()["text"] == "1\nstep 2\n"
    for offset in (14, 2**44, 2**50, 2**53):
        r = c.get(f"/v1/jobs/{job_id}/logs", params={"offset": offset}, headers=headers)
        assert r.status_code == 200, (offset, r.text)
        assert r.json()["text"] == "" and r.json()["next_offset"] == offset
