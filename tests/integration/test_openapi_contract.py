"""The OpenAPI document names every operation (`<tag>_<verb>`, unique) and declares the closed sets of
values as enums: job states, markets, dataset formats, pool backends."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import pytest

from trainyard.api.app import create_app
from trainyard.enums import DatasetFormat, JobState, Market, PoolBackend
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.settings import Settings


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        unstarted = Platform(Settings(home=Path(tmp)), PlatformOptions(with_catalog=False))
        doc = create_app(unstarted, access_log=False).openapi()
        unstarted.db.dispose()
    return doc


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m.upper(), p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]


def test_every_operation_has_a_unique_readable_id(openapi: dict[str, Any]) -> None:
    ops = _operations(openapi)
    ids = [op["operationId"] for _, _, op in ops]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    for method, path, op in ops:
        assert re.fullmatch(r"[a-z]+_[a-z][a-z_]*", op["operationId"]), (method, path, op["operationId"])
        assert op["operationId"].split("_")[0] == op["tags"][-1], (method, path)
    by_route = {(m, p): op["operationId"] for m, p, op in ops}
    assert by_route[("POST", "/v1/jobs")] == "jobs_submit"
    assert by_route[("GET", "/v1/jobs/{job_id}")] == "jobs_get"
    assert by_route[("GET", "/v1/jobs")] == "jobs_list"
    assert by_route[("POST", "/v1/jobs/{job_id}/cancel")] == "jobs_cancel"
    assert by_route[("GET", "/v1/datasets/{ref}/rows")] == "datasets_rows"
    assert by_route[("PUT", "/v1/budgets/{tenant}")] == "budgets_set"


@pytest.mark.parametrize(
    ("name", "enum"),
    [
        ("JobState", JobState),
        ("Market", Market),
        ("DatasetFormat", DatasetFormat),
        ("PoolBackend", PoolBackend),
    ],
)
def test_closed_sets_are_enums(openapi: dict[str, Any], name: str, enum: type) -> None:
    schema = openapi["components"]["schemas"][name]
    assert schema["type"] == "string" and schema["enum"] == [m.value for m in enum]  # type: ignore[attr-defined]


def test_documents_reference_the_enums(openapi: dict[str, Any]) -> None:
    schemas = openapi["components"]["schemas"]
    ref = "#/components/schemas/"
    assert schemas["JobDocument"]["properties"]["state"]["$ref"] == ref + "JobState"
    assert schemas["PlacementDoc"]["properties"]["market"]["$ref"] == ref + "Market"
    assert schemas["QuoteOptionDoc"]["properties"]["market"]["$ref"] == ref + "Market"
    assert schemas["PoolDoc"]["properties"]["backend"]["$ref"] == ref + "PoolBackend"
    assert schemas["DatasetDoc"]["properties"]["format"]["$ref"] == ref + "DatasetFormat"
    list_jobs = openapi["paths"]["/v1/jobs"]["get"]["parameters"]
    state = next(p for p in list_jobs if p["name"] == "state")
    assert ref + "JobState" in str(state["schema"])
    upload = openapi["paths"]["/v1/datasets"]["post"]["parameters"]
    fmt = next(p for p in upload if p["name"] == "format")
    assert ref + "DatasetFormat" in str(fmt["schema"])
    # every documented response model of the jobs, datasets, models and evaluations routes is named
    for path in ("/v1/datasets", "/v1/models", "/v1/evaluations"):
        ok = openapi["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok["$ref"].startswith(ref), path
