"""Cost governance against real `trainyard up` processes: one rate-limit bucket shared by two server
processes, admin changes made through one process enforced by the other within a second, and the
usage ledger equal to the jobs' costs after kill -9 of the server mid-run."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from controlplane_support import ServerProcess, database_url, tiny_spec
from trainyard.cli.main import app as cli_app

BURST = 30


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    "kind", [pytest.param("postgresql", marks=pytest.mark.postgres), "sqlite-database-buckets"]
)
def test_two_server_processes_share_one_bucket(kind: str, tmp_path: Path) -> None:
    with database_url("postgresql" if kind == "postgresql" else "sqlite", tmp_path) as url:
        a = ServerProcess(tmp_path / "a", database_url=url)
        b = ServerProcess(tmp_path / "b", database_url=url)
        if kind != "postgresql":  # on SQLite the buckets are in process unless told otherwise
            a.env["TRAINYARD_RATE_LIMIT_BACKEND"] = b.env["TRAINYARD_RATE_LIMIT_BACKEND"] = "database"
        a.start(timeout_s=240)
        b.start(timeout_s=240)
        try:
            admin = a.api_key
            key = httpx.post(f"{a.url}/v1/tenants", json={"name": "shared"}, headers=_h(admin)).json()[
                "api_key"
            ]
            r = httpx.patch(
                f"{b.url}/v1/tenants/shared",
                json={"rate_limit_rps": 0.01, "rate_limit_burst": BURST},
                headers=_h(b.api_key),
            )
            assert r.status_code == 200, r.text
            statuses: list[int] = []
            retry_after: list[str] = []
            with httpx.Client(timeout=10) as c:
                for i in range(2 * BURST):
                    resp = c.get(f"{(a if i % 2 else b).url}/v1/jobs", headers=_h(key))
                    statuses.append(resp.status_code)
                    if resp.status_code == 429:
                        retry_after.append(resp.headers.get("Retry-After", ""))
            # both processes drew from one bucket: exactly BURST admitted in all, not BURST each
            assert statuses.count(200) == BURST and statuses.count(429) == BURST, statuses
            assert all(v.isdigit() and int(v) >= 1 for v in retry_after)
        finally:
            a.stop()
            b.stop()


PROMPT_S = 1.0  # an admin change through one process is enforced by every other one after this


def _after_change(c: httpx.Client, url: str, key: str, changed_at: float, until_s: float) -> list[Any]:
    """(seconds after the change the request was sent, response) for requests sent through ``url``
    with ``key`` for ``until_s`` seconds after ``changed_at``."""
    out: list[Any] = []
    while time.monotonic() - changed_at < until_s:
        sent = time.monotonic() - changed_at
        out.append((sent, c.get(f"{url}/v1/whoami", headers=_h(key))))
        time.sleep(0.02)
    return out


@pytest.mark.parametrize("kind", [pytest.param("postgresql", marks=pytest.mark.postgres), "sqlite"])
def test_admin_changes_through_one_process_reach_the_other_within_a_second(kind: str, tmp_path: Path) -> None:
    """A rate limit set, and then a key revoked, through server B is enforced by server A for every
    request sent more than PROMPT_S after B answered, although A had the tenant's key cached (the
    principal cache lives AUTH_CACHE_TTL_S = 30 s)."""
    with database_url(kind, tmp_path) as url:
        a = ServerProcess(tmp_path / "a", database_url=url)
        b = ServerProcess(tmp_path / "b", database_url=url)
        a.start(timeout_s=240)
        b.start(timeout_s=240)
        try:
            with httpx.Client(timeout=30) as c:
                made = c.post(f"{a.url}/v1/tenants", json={"name": "tuned"}, headers=_h(a.api_key))
                assert made.status_code in (200, 201), made.text
                key = made.json()["api_key"]
                for _ in range(5):  # A authenticates the key and caches its principal: no rate limit
                    r = c.get(f"{a.url}/v1/whoami", headers=_h(key))
                    assert r.status_code == 200 and "X-RateLimit-Limit" not in r.headers, r.headers
                r = c.patch(
                    f"{b.url}/v1/tenants/tuned",
                    json={"rate_limit_rps": 0.01, "rate_limit_burst": 2},
                    headers=_h(b.api_key),
                )
                assert r.status_code == 200, r.text
                changed = time.monotonic()
                seen = _after_change(c, a.url, key, changed, PROMPT_S + 1.0)
                late = [(t, resp) for t, resp in seen if t >= PROMPT_S]
                assert late, seen
                # every request sent after PROMPT_S is under the new limit: its headers, and (the burst
                # of 2 spent) refused
                assert all(resp.headers.get("X-RateLimit-Limit") == "0.01" for _, resp in late), [
                    (round(t, 3), resp.status_code, resp.headers.get("X-RateLimit-Limit")) for t, resp in seen
                ]
                assert late[-1][1].status_code == 429, [(round(t, 3), r.status_code) for t, r in seen]
                first = next(t for t, resp in seen if resp.headers.get("X-RateLimit-Limit") == "0.01")
                print(f"{kind}: the other process enforced the new rate limit {first:.3f} s after the change")

                keys_doc = c.get(f"{b.url}/v1/tenants/tuned/keys", headers=_h(b.api_key)).json()
                [only] = keys_doc["keys"]  # the tenant's one key, created with it
                key_id = only["id"]
                r = c.post(f"{b.url}/v1/tenants/tuned/keys/{key_id}/revoke", headers=_h(b.api_key))
                assert r.status_code == 200, r.text
                changed = time.monotonic()
                seen = _after_change(c, a.url, key, changed, PROMPT_S + 0.5)
                late = [resp.status_code for t, resp in seen if t >= PROMPT_S]
                trail = [(round(t, 3), r.status_code) for t, r in seen]
                assert late and all(code == 401 for code in late), trail
        finally:
            a.stop()
            b.stop()


def _cli(args: list[str], monkeypatch: pytest.MonkeyPatch, url: str, key: str) -> Any:
    monkeypatch.delenv("TRAINYARD_HOME", raising=False)
    monkeypatch.setenv("TRAINYARD_URL", url)
    monkeypatch.setenv("TRAINYARD_API_KEY", key)
    return CliRunner().invoke(cli_app, args)


def _wait(predicate: Any, timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError("condition not reached in time")


def test_ledger_equals_job_costs_after_kill9_mid_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    srv = ServerProcess(home, database_url=url, executor="local").start(timeout_s=240)
    try:
        admin = srv.api_key
        with httpx.Client(base_url=srv.url, headers=_h(admin), timeout=30) as c:
            r = c.patch("/v1/pools/local-cpu", json={"price_usd_per_device_hour": 36.0})
            assert r.status_code == 200, r.text
            spec = tiny_spec("long-run", steps=2_000_000)
            spec["tags"] = {"team": "support"}
            job = c.post("/v1/jobs", json={"spec": spec}).json()
            short = tiny_spec("short-run", steps=30)
            short["tags"] = {"team": "research"}
            done = c.post("/v1/jobs", json={"spec": short}).json()
            _wait(lambda: c.get(f"/v1/jobs/{job['id']}").json()["state"] == "running")
            _wait(lambda: c.get(f"/v1/jobs/{done['id']}").json()["state"] in ("succeeded", "failed"), 180)
            time.sleep(2.0)  # the long job accrues cost
        srv.kill9()  # mid-run: the long job's attempt is open
        srv = ServerProcess(home, database_url=url, executor="local", port=srv.port).start(timeout_s=240)
        with httpx.Client(base_url=srv.url, headers=_h(admin), timeout=30) as c:
            c.post(f"/v1/jobs/{job['id']}/cancel")
            _wait(lambda: c.get(f"/v1/jobs/{job['id']}").json()["cost_usd"] > 0)
            rec = c.get("/v1/usage/reconcile")
            assert rec.status_code == 200, rec.text
            assert rec.json()["mismatches"] == []
            costs = {j: c.get(f"/v1/jobs/{j}").json()["cost_usd"] for j in (job["id"], done["id"])}
            by_job = {r["group"]: r["usd"] for r in c.get("/v1/usage", params={"by": "job"}).json()["rows"]}
            assert by_job == pytest.approx(costs, abs=0.005)
            assert all(v > 0 for v in costs.values())
        res = _cli(["usage", "--by", "tag:team", "--csv"], monkeypatch, srv.url, admin)
        assert res.exit_code == 0, res.output
        rows = {r["group"]: float(r["usd"]) for r in csv.DictReader(io.StringIO(res.stdout))}
        assert rows == pytest.approx({"support": costs[job["id"]], "research": costs[done["id"]]}, abs=0.005)
        res = _cli(["usage", "reconcile", "--json"], monkeypatch, srv.url, admin)
        assert res.exit_code == 0 and json.loads(res.stdout)["mismatches"] == []
        res = _cli(
            ["budgets", "set", "default", "--usd", "0.01", "--hard", "--json"], monkeypatch, srv.url, admin
        )
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["spent_usd"] == pytest.approx(sum(costs.values()), abs=0.005)
        refused = _cli(["submit", "--json", str(_spec_file(tmp_path))], monkeypatch, srv.url, admin)
        assert refused.exit_code == 6 and "would pass the month budget" in refused.output
    finally:
        srv.stop()


def _spec_file(tmp: Path) -> Path:
    p = tmp / "spec.json"
    p.write_text(json.dumps(tiny_spec("over-budget", steps=50)))
    return p
