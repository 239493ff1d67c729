"""A client generated from the live /openapi.json by openapi-python-client works against a real server:
its operations carry the API's names (jobs_submit, jobs_get, jobs_list) and its models the enums.

The generator needs an older typer than trainyard, so `make test` installs it into an environment of its
own (.venv-openapi); the generated package only needs httpx and attrs, and is imported here."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from controlplane_support import ROOT, ServerProcess, tiny_spec

pytestmark = pytest.mark.slow

GENERATOR = ROOT / ".venv-openapi" / "bin" / "openapi-python-client"
PACKAGE = "trainyard_generated"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("openapi-home"), executor="none").start()
    yield srv
    assert srv.stop() == 0, srv.log_text()


@pytest.fixture(scope="module")
def generated(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not (ROOT / ".venv-openapi" / ".installed").exists():
        pytest.fail(f"{GENERATOR} is missing: `make test` installs openapi-python-client there for this test")
    out = tmp_path_factory.mktemp("openapi-client")
    config = out / "config.yaml"
    config.write_text(f"package_name_override: {PACKAGE}\nproject_name_override: {PACKAGE}\n")
    r = subprocess.run(
        [
            str(GENERATOR),
            "generate",
            "--url",
            f"{server.url}/openapi.json",
            "--meta",
            "none",
            "--config",
            str(config),
            "--output-path",
            str(out / PACKAGE),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / PACKAGE / "api" / "jobs" / "jobs_submit.py").is_file(), r.stdout
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(out))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def test_generated_client_submits_gets_and_lists(generated: Any, server: ServerProcess) -> None:
    jobs_submit = importlib.import_module(f"{PACKAGE}.api.jobs.jobs_submit")
    jobs_get = importlib.import_module(f"{PACKAGE}.api.jobs.jobs_get")
    jobs_list = importlib.import_module(f"{PACKAGE}.api.jobs.jobs_list")
    models = importlib.import_module(f"{PACKAGE}.models")

    client = generated.AuthenticatedClient(base_url=server.url, token=server.api_key)
    body = models.SubmitJobRequest.from_dict({"spec": tiny_spec("generated")})
    created = jobs_submit.sync_detailed(client=client, body=body)
    assert created.status_code == 201, created.content
    job = created.parsed
    assert isinstance(job, models.JobDocument)
    assert isinstance(job.state, models.JobState)
    assert job.state.value in ("pending", "queued")

    got = jobs_get.sync(client=client, job_id=job.id)
    assert isinstance(got, models.JobDocument) and got.id == job.id and got.name == "generated"

    page = jobs_list.sync(client=client, state=[models.JobState.PENDING, models.JobState.QUEUED])
    assert isinstance(page, models.JobList)
    assert job.id in [j.id for j in page.jobs]

    missing = jobs_get.sync_detailed(client=client, job_id="job-000000000000")
    assert missing.status_code == 404
    assert isinstance(missing.parsed, models.ErrorEnvelope) and missing.parsed.error.code == "not_found"

    # another tenant's key sees no such job (tenant walls hold for generated clients too)
    other = httpx.post(
        f"{server.url}/v1/tenants",
        json={"name": "generated-other"},
        headers={"Authorization": f"Bearer {server.api_key}"},
    ).json()["api_key"]
    theirs = generated.AuthenticatedClient(base_url=server.url, token=other)
    assert jobs_get.sync_detailed(client=theirs, job_id=job.id).status_code == 404
