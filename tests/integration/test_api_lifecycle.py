"""The control loop against a scripted executor: placement → launch → events → terminal state, costs,
preemption and requeue, restarts, cancellation of running work, and reconciliation after a restart.
SQLite and PostgreSQL both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import database_url, tiny_spec
from fakes import FakeExecutor, ManualClock
from trainyard.api.app import create_app
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduler_adapter import OptimizerRound
from trainyard.services.scheduling import GreedyCheapestRound
from trainyard.settings import Settings


class Env:
    def __init__(
        self, platform: Platform, client: TestClient, executor: FakeExecutor, clock: ManualClock
    ) -> None:
        self.p = platform
        self.c = client
        self.ex = executor
        self.clock = clock
        self.h = {"Authorization": f"Bearer {platform.settings.api_key_path.read_text().strip()}"}

    def submit(self, name: str, **workload: Any) -> str:
        r = self.c.post("/v1/jobs", json={"spec": tiny_spec(name, **workload)}, headers=self.h)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def get(self, job_id: str) -> dict[str, Any]:
        return self.c.get(f"/v1/jobs/{job_id}", headers=self.h).json()

    def tick(self) -> None:
        self.p.tick()

    def event(self, job_id: str, kind: str, data: dict[str, Any] | None = None, **kw: Any) -> None:
        self.ex.emit(job_id, kind, data, time_s=self.clock.now, **kw)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    home = tmp_path_factory.mktemp(f"life-{request.param}")
    with database_url(request.param, home) as url:
        yield url, home


def make_env(
    url: str,
    home: Path,
    schedule_round: Any = None,
    executor: FakeExecutor | None = None,
    clock: ManualClock | None = None,
) -> tuple[Env, Any]:
    clock = clock or ManualClock()
    ex = executor or FakeExecutor()
    platform = Platform.open(
        Settings(home=home, database_url=url),
        PlatformOptions(
            executor=ex,
            schedule_round=schedule_round or GreedyCheapestRound(),
            cpu_count=2,
            clock=clock,
            with_catalog=False,
        ),
    )
    client = TestClient(create_app(platform, access_log=False))
    return Env(platform, client, ex, clock), client


@pytest.fixture
def env(db_url: tuple[str, Path]) -> Iterator[Env]:
    e, client = make_env(*db_url)
    with client:
        # a priced pool so that costs are visible: $3.60 per device-hour = $0.001 per device-second
        e.p.pools.update("local-cpu", {"price_usd_per_device_hour": 3.6})
        yield e
    _drain(e)
    e.p.close()


def _drain(e: Env) -> None:
    """Cancel what a test left unfinished so that the next test starts with free capacity."""
    for doc in e.c.get("/v1/jobs", params={"limit": 500}, headers=e.h).json()["jobs"]:
        if doc["state"] not in ("succeeded", "failed", "cancelled"):
            e.c.post(f"/v1/jobs/{doc['id']}/cancel", headers=e.h)
    e.tick()


@pytest.mark.parametrize("round_name", ["greedy", "optimizer"])
def test_happy_path_to_succeeded(db_url: tuple[str, Path], round_name: str) -> None:
    rnd = GreedyCheapestRound() if round_name == "greedy" else OptimizerRound()
    e, client = make_env(*db_url, schedule_round=rnd)
    with client:
        e.p.pools.update("local-cpu", {"price_usd_per_device_hour": 3.6})
        jid = e.submit(f"happy-{round_name}")
        e.tick()  # admit + place + launch
        doc = e.get(jid)
        assert doc["state"] == "starting", doc["reason"]
        assert doc["placement"]["pool"] == "local-cpu" and doc["attempt"] == 1
        assert len(e.ex.launches) == 1
        req = e.ex.launches[0]
        assert req.job_id == jid and req.attempt == 1 and req.world_size == doc["placement"]["devices"]
        assert req.spec["name"] == f"happy-{round_name}" and req.checkpoint_url.startswith("file://")
        assert Path(req.run_dir).is_dir()
        assert [w["rank"] for w in doc["workers"]] == list(range(req.world_size))
        assert all(w["pid"] for w in doc["workers"])

        e.event(jid, "started", {"rank": 0, "pid": 999, "host": "fakehost", "resumed_from_step": 0})
        e.event(jid, "heartbeat", {"rank": 0, "step": 5, "loss": 2.5, "step_time_s": 0.1})
        e.clock.now += 10
        e.event(jid, "checkpoint", {"step": 10, "path": "file:///ck/step-10"})
        e.tick()
        doc = e.get(jid)
        assert doc["state"] == "running"
        assert doc["checkpoints"] == [{"step": 10, "path": "file:///ck/step-10"}]
        assert doc["progress"]["step"] == 5
        assert {"rank": 0, "pid": 999, "host": "fakehost"} in doc["workers"]

        e.clock.now += 10
        e.event(jid, "succeeded", {"model_path": "/m", "model_sha256": "ab" * 32, "final_step": 20})
        e.tick()
        doc = e.get(jid)
        assert doc["state"] == "succeeded"
        assert doc["result"]["model_sha256"] == "ab" * 32 and doc["result"]["model_version"]
        devices = doc["placement"]["devices"]
        assert doc["cost_usd"] == pytest.approx(20 * devices * 0.001)
        kinds = [ev["kind"] for ev in doc["events"]]
        for k in ("placement", "workers", "started", "checkpoint", "cost"):
            assert k in kinds
        states = [ev["data"]["to"] for ev in doc["events"] if ev["kind"] == "state"]
        assert states == ["pending", "queued", "starting", "running", "succeeded"]
        cost = next(ev for ev in doc["events"] if ev["kind"] == "cost")["data"]
        assert cost["attempt"] == 1 and cost["device_s"] == pytest.approx(20 * devices)
    _drain(e)
    e.p.close()


def test_preemption_requeues_and_relaunches(env: Env) -> None:
    jid = env.submit("spot-like")
    env.tick()
    env.event(jid, "started", {"rank": 0, "pid": 1, "host": "h"})
    env.event(jid, "checkpoint", {"step": 4, "path": "file:///ck/step-4"})
    env.clock.now += 5
    env.event(jid, "preempted", {"step": 6, "checkpoint_step": 6})
    env.tick()  # applies preemption → queued, and the same tick's scheduling already ran before polling
    doc = env.get(jid)
    assert doc["state"] in ("queued", "starting")
    states = [ev["data"]["to"] for ev in doc["events"] if ev["kind"] == "state"]
    assert states[-2:] == ["preempted", "queued"] or states[-3:] == ["preempted", "queued", "starting"]
    env.tick()
    doc = env.get(jid)
    assert doc["state"] == "starting" and doc["attempt"] == 2
    assert [r.attempt for r in env.ex.launches if r.job_id == jid] == [1, 2]
    assert doc["checkpoints"] == [{"step": 4, "path": "file:///ck/step-4"}]
    costs = [ev["data"] for ev in doc["events"] if ev["kind"] == "cost"]
    assert [c["attempt"] for c in costs] == [1]
    # a late event of attempt 1 is ignored
    env.event(jid, "failed", {"reason": "late", "classification": "user"}, attempt=1)
    env.tick()
    assert env.get(jid)["state"] in ("starting", "running")


def test_user_failure_fails_infra_failure_restarts(env: Env) -> None:
    user = env.submit("user-bug")
    env.tick()
    env.event(
        user, "failed", {"reason": "ZeroDivisionError", "classification": "user", "traceback_tail": "..."}
    )
    env.tick()
    doc = env.get(user)
    assert doc["state"] == "failed" and "ZeroDivisionError" in doc["reason"]

    infra = env.submit("infra-flake")
    env.tick()
    env.event(infra, "lost", {"reason": "rank 0 stopped heart-beating", "rank": 0})
    env.tick()
    env.tick()
    doc = env.get(infra)
    assert doc["attempt"] == 2 and doc["state"] in ("starting", "running")
    assert "lost" in [ev["kind"] for ev in doc["events"]]


def test_launch_failure_requeues_then_fails(env: Env) -> None:
    env.ex.fail_launch = True
    jid = env.submit("no-launch")
    for _ in range(6):
        env.tick()
    doc = env.get(jid)
    assert doc["state"] == "failed" and "launch failed" in doc["reason"]
    assert doc["attempt"] == 4  # first try + RestartPolicy.max_restarts (3)
    env.ex.fail_launch = False


def test_cancel_running_job_stops_workers_and_charges(env: Env) -> None:
    jid = env.submit("cancel-running")
    env.tick()
    env.event(jid, "started", {"rank": 0, "pid": 1, "host": "h"})
    env.tick()
    env.clock.now += 30
    r = env.c.post(f"/v1/jobs/{jid}/cancel", headers=env.h)
    assert r.json()["state"] == "cancelled"
    env.tick()
    assert jid in env.ex.cancelled
    doc = env.get(jid)
    devices = doc["placement"]["devices"]
    assert doc["cost_usd"] == pytest.approx(30 * devices * 0.001)
    env.tick()  # charged once only
    assert env.get(jid)["cost_usd"] == pytest.approx(30 * devices * 0.001)
    # a late success after cancellation does not resurrect it
    env.event(jid, "succeeded", {"model_path": "/m", "model_sha256": "x", "final_step": 1})
    env.tick()
    assert env.get(jid)["state"] == "cancelled"


def test_capacity_is_respected_and_released(env: Env) -> None:
    env.p.pools.update("local-cpu", {"nodes": 1, "available_devices": 1})
    a = env.submit("cap-a")
    b = env.submit("cap-b")
    env.tick()
    states = {j: env.get(j)["state"] for j in (a, b)}
    assert sorted(states.values()) == ["queued", "starting"]
    running = next(j for j, s in states.items() if s == "starting")
    waiting = next(j for j, s in states.items() if s == "queued")
    assert env.get(waiting)["reason"]  # says why it waits
    pools = env.c.get("/v1/pools", headers=env.h).json()["pools"]
    assert next(p for p in pools if p["name"] == "local-cpu")["devices_in_use"] == 1
    env.event(running, "succeeded", {"model_path": "/m", "model_sha256": "y", "final_step": 20})
    env.tick()
    env.tick()
    assert env.get(waiting)["state"] == "starting"
    env.p.pools.update("local-cpu", {"available_devices": None})


def test_reconcile_adopts_live_workers_and_requeues_dead_ones(db_url: tuple[str, Path]) -> None:
    url, home = db_url
    clock = ManualClock()
    e1, c1 = make_env(url, home, clock=clock)
    with c1:
        e1.p.pools.update("local-cpu", {"available_devices": None, "nodes": 1})
        alive = e1.submit("survivor")
        dead = e1.submit("casualty")
        e1.tick()
        for j in (alive, dead):
            e1.event(j, "started", {"rank": 0, "pid": 7, "host": "h"})
        e1.tick()
        assert e1.get(alive)["state"] == "running" and e1.get(dead)["state"] == "running"

    # the process "dies": no close(), a new platform on the same database with a fresh executor
    class Selective(FakeExecutor):
        def adopt(self, job_id: str, attempt: int, run_dir: str, workers: list[Any]) -> bool:
            self.adopted.append((job_id, attempt, run_dir))
            return job_id == alive

    ex2 = Selective()
    e2, c2 = make_env(url, home, executor=ex2, clock=clock)
    with c2:
        assert {a[0] for a in ex2.adopted} == {alive, dead}
        assert e2.get(alive)["state"] == "running"
        assert "adopted" in [ev["kind"] for ev in e2.get(alive)["events"]]
        doc = e2.get(dead)
        states = [ev["data"]["to"] for ev in doc["events"] if ev["kind"] == "state"]
        assert states[-2:] == ["preempted", "queued"]
        # adopted workers keep reporting into the same job
        ex2.launches.append(type("R", (), {"job_id": alive, "attempt": 1})())  # type: ignore[arg-type]
        ex2.emit(
            alive,
            "succeeded",
            {"model_path": "/m", "model_sha256": "z", "final_step": 20},
            attempt=1,
            time_s=clock.now,
        )
        e2.tick()
        assert e2.get(alive)["state"] == "succeeded"
        e2.tick()
        assert e2.get(dead)["state"] == "starting" and e2.get(dead)["attempt"] == 2
    _drain(e2)
    e2.p.close()
    e1.p.db.dispose()
