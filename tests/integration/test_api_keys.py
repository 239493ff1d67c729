"""API key listing and revocation on SQLite and PostgreSQL: a revoked key answers 401 on the very next
request (the auth cache forgets it), another tenant's key id is 404, keys are listed without their hash;
and the `trainyard tenants keys list|revoke` commands against a real `trainyard up`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from controlplane_support import ServerProcess, database_url
from trainyard.api.app import create_app
from trainyard.cli.main import app as cli_app
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.settings import Settings
from trainyard.tenancy import keys

KEY_FIELDS = {"id", "prefix", "admin", "role", "created_at", "expires_at", "revoked"}


class Api:
    def __init__(self, platform: Platform, client: TestClient) -> None:
        self.platform = platform
        self.c = client
        self.admin = self.bearer(platform.settings.api_key_path.read_text().strip())

    @staticmethod
    def bearer(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def tenant(self, name: str) -> tuple[str, str]:
        """A new tenant with two keys: (first key, second key)."""
        r = self.c.post("/v1/tenants", json={"name": name}, headers=self.admin)
        assert r.status_code == 201, r.text
        return r.json()["api_key"], self.platform.tenants.create_key(name)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    home = tmp_path_factory.mktemp(f"keys-{request.param}")
    with database_url(request.param, home) as url:
        platform = Platform.open(Settings(home=home, database_url=url), PlatformOptions(cpu_count=2))
        with TestClient(create_app(platform, access_log=False)) as client:
            yield Api(platform, client)
        platform.close()


def key_id_of(api: Api, tenant: str, plaintext: str, headers: dict[str, str]) -> str:
    listed = api.c.get(f"/v1/tenants/{tenant}/keys", headers=headers).json()["keys"]
    prefix = keys.key_prefix(plaintext)
    return next(k["id"] for k in listed if k["prefix"] == prefix)


def test_a_tenant_lists_its_keys_without_hashes(api: Api) -> None:
    first, second = api.tenant("lister")
    r = api.c.get("/v1/tenants/lister/keys", headers=api.bearer(first))
    assert r.status_code == 200, r.text
    listed = r.json()["keys"]
    assert [set(k) for k in listed] == [KEY_FIELDS, KEY_FIELDS]
    assert [k["prefix"] for k in listed] == [keys.key_prefix(first), keys.key_prefix(second)]
    assert not any(k["revoked"] or k["admin"] for k in listed)
    text = r.text
    for plaintext in (first, second):
        assert keys.hash_key(plaintext) not in text and plaintext not in text
    # an admin key sees any tenant's keys
    assert api.c.get("/v1/tenants/lister/keys", headers=api.admin).json() == r.json()


def test_a_revoked_key_is_401_on_the_next_request(api: Api) -> None:
    first, second = api.tenant("revoker")
    mine, other = api.bearer(first), api.bearer(second)
    assert api.c.get("/v1/whoami", headers=other).status_code == 200  # now in the auth cache
    key_id = key_id_of(api, "revoker", second, mine)
    r = api.c.post(f"/v1/tenants/revoker/keys/{key_id}/revoke", headers=mine)
    assert r.status_code == 200, r.text
    assert r.json()["id"] == key_id and r.json()["revoked"] is True
    for path in ("/v1/whoami", "/v1/jobs"):
        resp = api.c.get(path, headers=other)
        assert resp.status_code == 401, resp.text
        assert resp.json()["error"]["code"] == "unauthenticated"
    assert api.c.get("/v1/whoami", headers=mine).status_code == 200  # the other key still works
    listed = {
        k["id"]: k["revoked"] for k in api.c.get("/v1/tenants/revoker/keys", headers=mine).json()["keys"]
    }
    assert listed[key_id] is True and list(listed.values()).count(False) == 1
    again = api.c.post(f"/v1/tenants/revoker/keys/{key_id}/revoke", headers=mine)
    assert again.status_code == 200 and again.json()["revoked"] is True  # revoking twice changes nothing


def test_a_tenant_can_revoke_the_key_it_is_using(api: Api) -> None:
    first, _second = api.tenant("self-revoker")
    mine = api.bearer(first)
    key_id = key_id_of(api, "self-revoker", first, mine)
    assert api.c.post(f"/v1/tenants/self-revoker/keys/{key_id}/revoke", headers=mine).status_code == 200
    assert api.c.get("/v1/whoami", headers=mine).status_code == 401


def test_an_admin_revokes_any_tenants_key(api: Api) -> None:
    first, _second = api.tenant("admin-target")
    key_id = key_id_of(api, "admin-target", first, api.admin)
    assert api.c.get("/v1/whoami", headers=api.bearer(first)).status_code == 200
    r = api.c.post(f"/v1/tenants/admin-target/keys/{key_id}/revoke", headers=api.admin)
    assert r.status_code == 200 and r.json()["revoked"] is True
    assert api.c.get("/v1/whoami", headers=api.bearer(first)).status_code == 401


def test_another_tenants_keys_are_404(api: Api) -> None:
    a_key, _ = api.tenant("tenant-a")
    b_key, _ = api.tenant("tenant-b")
    a, b = api.bearer(a_key), api.bearer(b_key)
    a_id = key_id_of(api, "tenant-a", a_key, a)
    # B names A's key id under its own tenant: unknown there
    r = api.c.post(f"/v1/tenants/tenant-b/keys/{a_id}/revoke", headers=b)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    # B addresses tenant A directly: A does not exist for B
    assert api.c.post(f"/v1/tenants/tenant-a/keys/{a_id}/revoke", headers=b).status_code == 404
    assert api.c.get("/v1/tenants/tenant-a/keys", headers=b).status_code == 404
    # the same answer as for a tenant that really does not exist
    assert api.c.get("/v1/tenants/no-such-tenant/keys", headers=b).status_code == 404
    assert api.c.get("/v1/tenants/no-such-tenant/keys", headers=api.admin).status_code == 404
    assert api.c.post("/v1/tenants/tenant-b/keys/key-0000/revoke", headers=b).status_code == 404
    # and A's key was not touched
    assert api.c.get("/v1/whoami", headers=a).status_code == 200
    assert api.c.get("/v1/tenants/tenant-a/keys", headers=b).status_code == 404
    assert api.c.get("/v1/tenants/tenant-b/keys", headers=b).status_code == 200


def test_keys_routes_need_a_key(api: Api) -> None:
    assert api.c.get("/v1/tenants/default/keys").status_code == 401
    assert api.c.post("/v1/tenants/default/keys/key-x/revoke").status_code == 401


# ---- CLI ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("keys-cli")).start()
    yield srv
    assert srv.stop() == 0, srv.log_text()


def cli(args: list[str], monkeypatch: pytest.MonkeyPatch, server: ServerProcess, key: str) -> Any:
    monkeypatch.delenv("TRAINYARD_HOME", raising=False)
    monkeypatch.setenv("TRAINYARD_URL", server.url)
    monkeypatch.setenv("TRAINYARD_API_KEY", key)
    return CliRunner().invoke(cli_app, args)


def test_cli_keys_list_and_revoke(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    created = cli(["tenants", "create", "cli-keys", "--json"], monkeypatch, server, server.api_key)
    assert created.exit_code == 0, created.output
    key = json.loads(created.stdout)["api_key"]
    listed = cli(["tenants", "keys", "list", "cli-keys", "--json"], monkeypatch, server, key)
    assert listed.exit_code == 0, listed.output
    docs = json.loads(listed.stdout)["keys"]
    assert len(docs) == 1 and set(docs[0]) == KEY_FIELDS and docs[0]["prefix"] == keys.key_prefix(key)
    table = cli(["tenants", "keys", "list", "cli-keys"], monkeypatch, server, key)
    assert table.exit_code == 0 and docs[0]["id"] in table.stdout and key not in table.stdout
    missing = cli(["tenants", "keys", "revoke", "cli-keys", "key-nope"], monkeypatch, server, key)
    assert missing.exit_code != 0 and "no API key" in missing.output
    revoked = cli(
        ["tenants", "keys", "revoke", "cli-keys", docs[0]["id"], "--json"], monkeypatch, server, key
    )
    assert revoked.exit_code == 0, revoked.output
    assert json.loads(revoked.stdout)["revoked"] is True
    after = cli(["tenants", "keys", "list", "cli-keys", "--json"], monkeypatch, server, key)
    assert after.exit_code != 0, "the revoked key no longer authenticates"
    by_admin = cli(["tenants", "keys", "list", "cli-keys", "--json"], monkeypatch, server, server.api_key)
    assert json.loads(by_admin.stdout)["keys"][0]["revoked"] is True
