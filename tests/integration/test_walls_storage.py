"""Tenant walls at submission, against a real `trainyard up` on SQLite and PostgreSQL: every storage
location a tenant names goes through the storage policy (chained URLs, paths anywhere, http storage,
``..``, relative paths, another tenant's area and the server's own files are 422 storage_not_allowed,
with the same message whether the path exists or not), user code needs an admin's allowance, and
`PATCH /v1/tenants/{name}` / `trainyard tenants update` grant roots and user code (admin only)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane_support import ServerProcess, database_url, tiny_spec


class Walls:
    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.http = httpx.Client(base_url=server.url, timeout=30.0)
        self.admin = self.bearer(server.api_key)
        self.storage = (server.home / "storage").resolve()

    @staticmethod
    def bearer(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def tenant(self, name: str) -> dict[str, str]:
        r = self.http.post("/v1/tenants", json={"name": name}, headers=self.admin)
        assert r.status_code == 201, r.text
        return self.bearer(r.json()["api_key"])

    def submit(self, headers: dict[str, str], spec: dict[str, Any]) -> httpx.Response:
        return self.http.post("/v1/jobs", json={"spec": spec}, headers=headers)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def walls(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walls]:
    home = tmp_path_factory.mktemp(f"walls-{request.param}")
    with database_url(request.param, home) as url:
        server = ServerProcess(home, database_url=url).start(timeout_s=240)
        try:
            yield Walls(server)
        finally:
            server.stop()


def with_storage(name: str, storage: str) -> dict[str, Any]:
    doc = tiny_spec(name)
    doc["checkpoint"] = {"storage": storage}
    return doc


def refused(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "storage_not_allowed", err
    return err


def test_storage_attacks_are_refused_without_revealing_what_exists(walls: Walls, tmp_path: Path) -> None:
    mallory = walls.tenant("mallory")
    walls.tenant("victim")
    victim_area = walls.storage / "tenants" / "victim" / "checkpoints"
    victim_area.mkdir(parents=True, exist_ok=True)
    home = walls.server.home.resolve()
    attacks = {
        "chained": f"file://{victim_area}/job-x::file:///x",
        "anywhere": "file:///tmp/anywhere",
        "http": f"{walls.server.url}/v1/jobs",
        "https": "https://127.0.0.1:1/x",
        "dotdot": f"file://{walls.storage}/tenants/mallory/../victim/checkpoints",
        "encoded-dotdot": f"file://{walls.storage}/tenants/mallory/%2e%2e/victim",
        "relative-url": "file://relative/path",
        "other-tenant": f"file://{victim_area}",
        "server-home": f"file://{home}",
        "server-db": f"file://{home / 'trainyard.db'}",
        "server-runs": f"file://{home / 'runs'}",
    }
    for name, url in attacks.items():
        err = refused(walls.submit(mallory, with_storage(f"atk-{name}", url)))
        assert err["details"]["errors"][0]["field"] == "checkpoint.storage", (name, err)
        assert url not in err["message"], (name, err)
    # the same answer for a path that exists and one that does not
    exists = refused(walls.submit(mallory, with_storage("e1", "file:///etc/passwd")))
    missing = refused(walls.submit(mallory, with_storage("e2", "file:///etc/no-such-file-here")))
    assert exists["message"] == missing["message"] and exists["details"] == missing["details"]
    # a symbolic link in the tenant's own area that points out of it is refused too
    own = walls.storage / "tenants" / "mallory" / "checkpoints"
    own.mkdir(parents=True, exist_ok=True)
    (own / "escape").symlink_to(victim_area)
    refused(walls.submit(mallory, with_storage("symlink", f"file://{own / 'escape'}")))
    # datasets and base models given as paths go through the same wall; every refused field is listed
    doc = tiny_spec("data-attack", dataset="file:///etc/passwd")
    doc["model"] = {**doc["model"], "base": f"file://{walls.storage}/tenants/victim/models/m"}
    err = refused(walls.submit(mallory, doc))
    assert {e["field"] for e in err["details"]["errors"]} == {"workload.dataset", "model.base"}
    for dataset in ("../train.jsonl", "train.jsonl", "/etc/passwd", "http://127.0.0.1:1/d.jsonl"):
        refused(walls.submit(mallory, tiny_spec("ds-attack", dataset=dataset)))
    # nothing was stored
    r = walls.http.get("/v1/jobs", headers=mallory)
    assert r.status_code == 200 and r.json()["jobs"] == []


def test_own_area_is_accepted_in_canonical_form(walls: Walls) -> None:
    alice = walls.tenant("alice")
    me = walls.http.get("/v1/whoami", headers=alice).json()
    assert me["storage_url"] == f"file://{walls.storage}/tenants/alice"
    url = f"{me['storage_url']}/checkpoints//run-1/"
    r = walls.submit(alice, with_storage("own", url))
    assert r.status_code == 201, r.text
    job = walls.http.get(f"/v1/jobs/{r.json()['id']}", headers=alice).json()
    assert job["spec"]["checkpoint"]["storage"] == f"{me['storage_url']}/checkpoints/run-1"
    ds = walls.submit(alice, tiny_spec("own-data", dataset=f"{me['storage_url']}/datasets/d.jsonl"))
    assert ds.status_code == 201, ds.text
    # a dataset id passes the storage policy and is resolved by the dataset registry at submission: an id
    # nobody uploaded is an invalid spec, not a storage refusal
    unknown = walls.submit(alice, tiny_spec("by-id", dataset="ds://corpus@1"))
    assert unknown.status_code == 422, unknown.text
    assert unknown.json()["error"]["code"] == "invalid_spec", unknown.text


def test_user_code_needs_an_admin_allowance(walls: Walls) -> None:
    bob = walls.tenant("bob")
    doc = tiny_spec("code")
    doc["entrypoint"] = {"command": ["sh", "-c", "id"]}
    r = walls.submit(bob, doc)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "user_code_not_allowed"
    # a non-admin cannot allow itself
    r = walls.http.patch("/v1/tenants/bob", json={"allow_user_code": True}, headers=bob)
    assert r.status_code == 403, r.text
    r = walls.http.patch("/v1/tenants/bob", json={"allow_user_code": True}, headers=walls.admin)
    assert r.status_code == 200 and r.json()["allow_user_code"] is True, r.text
    assert walls.submit(bob, doc).status_code == 201
    # the embedded tenant may run user code
    assert walls.http.get("/v1/whoami", headers=walls.admin).json()["allow_user_code"] is True


def test_granted_roots_and_the_cli(walls: Walls, tmp_path: Path) -> None:
    carol = walls.tenant("carol")
    shared = tmp_path / "shared-data"
    url = f"file://{shared}"
    refused(walls.submit(carol, with_storage("before", f"{url}/ckpt")))
    env = walls.server.cli_env()
    out = subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", "tenants", "update", "carol", "--storage-root", url,
         "--storage-root", "s3://carol-bucket/runs", "--allow-user-code", "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["storage_roots"] == [url, "s3://carol-bucket/runs"] and doc["allow_user_code"] is True
    assert walls.submit(carol, with_storage("after", f"{url}/ckpt")).status_code == 201
    assert walls.submit(carol, with_storage("s3", "s3://carol-bucket/runs/a")).status_code == 201
    refused(walls.submit(carol, with_storage("s3-other", "s3://carol-bucket/other")))
    # an admin cannot grant the server's own files, the shared tree or http
    home = walls.server.home.resolve()
    for bad in (
        f"file://{home}",
        f"file://{home / 'logs'}",
        f"file://{walls.storage}",
        "http://127.0.0.1:1/",
    ):
        r = walls.http.patch("/v1/tenants/carol", json={"storage_roots": [bad]}, headers=walls.admin)
        refused(r)
    # a non-admin key gets 403 from the CLI too; an unknown tenant 404
    r = walls.http.patch("/v1/tenants/carol", json={"storage_roots": ["file:///"]}, headers=carol)
    assert r.status_code == 403
    r = walls.http.patch("/v1/tenants/nobody-here", json={"allow_user_code": True}, headers=walls.admin)
    assert r.status_code == 404
    out = subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", "tenants", "update", "carol", "--clear-storage-roots",
         "--no-allow-user-code", "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["storage_roots"] == []
    refused(walls.submit(carol, with_storage("revoked", f"{url}/ckpt")))
