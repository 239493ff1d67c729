"""Webhook deliveries are durable: a real `trainyard up` is killed (SIGKILL) while deliveries wait for
their retry, and a new process on the same home sends them, with the same delivery id, to receivers on
127.0.0.1; a delivery that keeps failing ends as a dead letter after its attempts; another tenant sees
none of it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from controlplane_support import ServerProcess, WebhookReceiver, wait_until
from trainyard.cli.main import app


def answering(statuses: list[int]) -> WebhookReceiver:
    """A receiver that answers ``statuses[i]`` to the i-th request (the last one from then on)."""
    return WebhookReceiver(lambda earlier, _headers: statuses[min(len(earlier), len(statuses) - 1)])


@pytest.fixture
def receivers() -> Iterator[tuple[WebhookReceiver, WebhookReceiver]]:
    flaky, broken = answering([503, 200]), answering([503])
    yield flaky, broken
    flaky.close()
    broken.close()


def server(home: Path, backoff_initial_s: float) -> ServerProcess:
    srv = ServerProcess(home)
    srv.env.update(
        TRAINYARD_WEBHOOK_ALLOWED_NETWORKS="127.0.0.1/32",
        TRAINYARD_WEBHOOK_MAX_ATTEMPTS="3",
        TRAINYARD_WEBHOOK_BACKOFF_INITIAL_S=str(backoff_initial_s),
        TRAINYARD_WEBHOOK_BACKOFF_MAX_S="30",
        TRAINYARD_WEBHOOK_TIMEOUT_S="5",
    )
    return srv.start()


def cli(args: list[str], monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Any:
    for k in ("TRAINYARD_API_KEY", "TRAINYARD_URL", "TRAINYARD_HOME"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        if k.startswith("TRAINYARD_"):
            monkeypatch.setenv(k, v)
    return CliRunner().invoke(app, args)


def js(result: Any) -> Any:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_pending_deliveries_survive_a_kill_and_dead_letter_after_their_attempts(
    tmp_path: Path, receivers: tuple[WebhookReceiver, WebhookReceiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    flaky, broken = receivers
    home = tmp_path / "home"
    first = server(home, backoff_initial_s=60.0)  # the retries are due long after the kill
    try:
        c = httpx.Client(base_url=first.url, timeout=30)
        admin = {"Authorization": f"Bearer {first.api_key}"}
        r = c.post("/v1/tenants", json={"name": "other"}, headers=admin)
        assert r.status_code == 201, r.text
        other = {"Authorization": f"Bearer {r.json()['api_key']}"}
        hooks = {}
        for name, rec in (("flaky", flaky), ("broken", broken)):
            r = c.post("/v1/webhooks", json={"url": rec.url}, headers=admin)
            assert r.status_code == 201, r.text
            hooks[name] = r.json()["id"]
            assert c.post(f"/v1/webhooks/{hooks[name]}/test", headers=admin).status_code == 200
        wait_until(lambda: flaky.seen() and broken.seen(), 30, "the first attempts")

        def waiting() -> list[dict[str, Any]]:
            ds = c.get("/v1/webhooks/deliveries", headers=admin).json()["deliveries"]
            return [d for d in ds if d["state"] == "pending" and d["attempts"] == 1]

        pending = wait_until(lambda: len(waiting()) == 2 and waiting(), 30, "both waiting for a retry")
        assert all(d["last_status_code"] == 503 and d["next_attempt_at"] for d in pending)
    finally:
        first.kill9()
    assert len(flaky.seen()) == 1 and len(broken.seen()) == 1

    second = server(home, backoff_initial_s=0.2)
    try:
        c = httpx.Client(base_url=second.url, timeout=30)
        admin = {"Authorization": f"Bearer {second.api_key}"}
        wait_until(lambda: len(flaky.seen()) >= 2, 30, "the flaky receiver's retry after the restart")
        wait_until(lambda: len(broken.seen()) >= 3, 30, "the broken receiver's last attempt")

        def states() -> dict[str, dict[str, Any]]:
            ds = c.get("/v1/webhooks/deliveries", headers=admin).json()["deliveries"]
            return {d["webhook_id"]: d for d in ds}

        done = wait_until(
            lambda: (s := states()) and {d["state"] for d in s.values()} == {"delivered", "dead"} and s,
            30,
            "a delivered and a dead delivery",
        )
        time.sleep(1.0)  # a dead letter gets no further attempt
        assert len(flaky.seen()) == 2 and len(broken.seen()) == 3
        assert done[hooks["flaky"]]["state"] == "delivered" and done[hooks["flaky"]]["attempts"] == 2
        dead = done[hooks["broken"]]
        assert (dead["state"], dead["attempts"], dead["last_status_code"]) == ("dead", 3, 503)
        # every attempt of one delivery carries its id and its number, before and after the restart
        for rec, hook in ((flaky, "flaky"), (broken, "broken")):
            reqs = rec.seen()
            assert {rq["headers"]["Trainyard-Delivery-Id"] for rq in reqs} == {done[hooks[hook]]["id"]}
            assert [rq["headers"]["Trainyard-Delivery-Attempt"] for rq in reqs] == [
                str(i + 1) for i in range(len(reqs))
            ]
        # one webhook's deliveries; another tenant's webhook is a 404 and it has no deliveries of its own
        mine = c.get(f"/v1/webhooks/{hooks['broken']}/deliveries", headers=admin).json()["deliveries"]
        assert [d["id"] for d in mine] == [dead["id"]]
        assert c.get(f"/v1/webhooks/{hooks['broken']}/deliveries", headers=other).status_code == 404
        assert c.get("/v1/webhooks/deliveries", headers=other).json()["deliveries"] == []

        # the CLI: webhooks create/list/test/deliveries/delete, each tenant its own
        env = second.cli_env()
        other_env = {**env, "TRAINYARD_API_KEY": other["Authorization"].split()[1]}
        made = js(
            cli(["webhooks", "create", flaky.url, "--rule", "webhook_test", "--json"], monkeypatch, env)
        )
        assert made["signing_secret"].startswith("whsec_") and made["rules"] == ["webhook_test"]
        listed = js(cli(["webhooks", "list", "--json"], monkeypatch, env))["webhooks"]
        assert made["id"] in {w["id"] for w in listed} and all("signing_secret" not in w for w in listed)
        assert js(cli(["webhooks", "test", made["id"], "--json"], monkeypatch, env))["rule"] == "webhook_test"
        wait_until(
            lambda: any(rq["headers"]["Trainyard-Webhook-Id"] == made["id"] for rq in flaky.seen()),
            30,
            "the CLI's test delivery",
        )
        got = wait_until(
            lambda: [
                d
                for d in js(cli(["webhooks", "deliveries", made["id"], "--json"], monkeypatch, env))[
                    "deliveries"
                ]
                if d["state"] == "delivered"
            ],
            30,
            "the test delivery recorded as delivered",
        )
        assert [d["webhook_id"] for d in got] == [made["id"]]
        assert cli(["webhooks", "delete", made["id"]], monkeypatch, other_env).exit_code == 3  # not found
        assert cli(["webhooks", "test", made["id"]], monkeypatch, other_env).exit_code == 3
        assert js(cli(["webhooks", "list", "--json"], monkeypatch, other_env)) == {"webhooks": []}
        gone = js(cli(["webhooks", "delete", made["id"], "--json"], monkeypatch, env))
        assert gone == {"id": made["id"], "deleted": True}
        listed = js(cli(["webhooks", "list", "--json"], monkeypatch, env))["webhooks"]
        assert made["id"] not in {w["id"] for w in listed}
    finally:
        assert second.stop() == 0
