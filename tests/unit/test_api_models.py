"""API documents: typed attributes, dict-style reads for scripts written against the JSON, the exact
JSON back from to_dict(), fields of a newer server kept, enums that compare equal to their strings;
importing them loads no web framework, database or training stack."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import ValidationError

from trainyard.api_models import ApiKeyList, JobDocument, PlacementDoc, QuoteResponse
from trainyard.enums import JobState, Market

JOB: dict[str, Any] = {
    "id": "job-1",
    "name": "n",
    "state": "running",
    "placement": {
        "pool": "local-cpu",
        "devices": 1,
        "market": "on_demand",
        "accelerator": "cpu",
        "price_usd_per_device_hour": 0.0,
    },
    "cost_usd": 0.25,
    "checkpoints": [{"step": 10, "path": "file:///c/step-10"}],
    "workers": [],
    "events": [{"id": 1, "kind": "state", "time": None, "data": {"to": "running"}}],
    "result": None,
    "attempt": 1,
    "reason": "",
    "progress": {"step": 12, "loss": 2.5},
    "created_at": None,
    "updated_at": None,
    "spec": {"workload": {"steps": 40}},
    "added_by_a_newer_server": {"x": 1},
}


def test_typed_attributes_and_enums() -> None:
    job = JobDocument.model_validate(JOB)
    assert job.state is JobState.RUNNING and job.state == "running" and f"{job.state}" == "running"
    assert isinstance(job.placement, PlacementDoc) and job.placement.market is Market.ON_DEMAND
    assert job.step == 12 and job.total_steps == 40 and not job.done
    assert job.added_by_a_newer_server == {"x": 1}  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):
        JobDocument.model_validate({**JOB, "state": "exploded"})


def test_dict_style_reads_and_exact_json() -> None:
    job = JobDocument.model_validate(JOB)
    assert job["state"] == "running" and job["placement"]["pool"] == "local-cpu"
    assert job.get("quote") is None and job.get("nope", 7) == 7
    assert "spec" in job and "quote" not in job and "nope" not in job  # quote: not sent
    with pytest.raises(KeyError):
        job["nope"]
    assert job.to_dict() == JOB
    assert json.loads(json.dumps(job.to_dict())) == JOB
    assert job == JOB and job != {**JOB, "cost_usd": 1.0}
    assert dict(job.items())["added_by_a_newer_server"] == {"x": 1}


def test_a_document_is_a_read_only_mapping_of_what_the_server_sent() -> None:
    job = JobDocument.model_validate(JOB)
    assert isinstance(job, Mapping)
    assert list(job) == list(JOB) and set(job) == set(JOB) and len(job) == len(JOB)  # names, not pairs
    assert "quote" not in list(job)  # declared, not sent: not a key (it still reads as its default)
    assert job.keys() == list(JOB) and job.values() == [job[k] for k in JOB]
    assert dict(job).keys() == JOB.keys() and dict(job)["placement"] is job.placement  # values stay typed
    assert {k: v for k, v in job.items()} == dict(job)
    assert dict(job.placement) == JOB["placement"] and set(job.events[0]) == set(JOB["events"][0])
    keys = ApiKeyList.model_validate({"keys": [], "next": 1})  # its `keys` field wins over the method
    assert keys.keys == [] and list(keys) == ["keys", "next"] and keys.to_dict() == {"keys": [], "next": 1}
    assert ApiKeyList.model_fields["keys"].is_required()  # not defaulted to the inherited method


def test_every_client_call_parses_into_a_document_that_exists() -> None:
    """The client names its answers' document types as strings (the models are imported on the first
    answer, not with the client); each name is one of trainyard.api_models' documents."""
    import re
    from pathlib import Path

    from trainyard import api_models
    from trainyard.client import _calls

    names = set(re.findall(r'_doc\("(\w+)"\)', Path(_calls.__file__).read_text()))
    assert len(names) >= 25
    for name in names:
        assert name in api_models.__all__ and issubclass(getattr(api_models, name), api_models.Document)
    parsed = _calls.get_job("job-1").parse(JOB)
    assert type(parsed) is JobDocument and parsed == JOB


def test_helpers() -> None:
    quote = QuoteResponse.model_validate(
        {
            "options": [
                {"accelerator": "cpu", "devices": 1, "region": "local", "market": "spot", "feasible": False},
                {"accelerator": "a100-80gb", "devices": 1, "region": "r", "market": "spot", "feasible": True},
            ]
        }
    )
    assert [o.accelerator for o in quote.feasible()] == ["a100-80gb"]


def test_importing_the_models_and_the_client_stays_light() -> None:
    probe = (
        "import sys, trainyard.api_models, trainyard.client, trainyard.spec\n"
        "heavy = {'torch', 'fastapi', 'starlette', 'sqlalchemy', 'ray', 'transformers', 'uvicorn'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    # httpx (most of the client's import time) comes with the first client, asyncio with the async one,
    # the documents (and pydantic) with the first answer parsed; the CLI's modules import none of them
    later = {"httpx", "asyncio", "pydantic", "trainyard.api_models"}
    for modules in (
        "trainyard.client",
        "trainyard.client.aio",
        "trainyard.cli",
        "trainyard.cli.main",
        "trainyard.cli._remote",
        "trainyard.cli.jobs_cmd",
        "trainyard.cli.pools_cmd",
    ):
        lazy = f"import sys, {modules}\nprint(sorted({later!r} & set(sys.modules)))"
        out = subprocess.run([sys.executable, "-c", lazy], capture_output=True, text=True, check=True)
        expected = ["asyncio"] if modules == "trainyard.client.aio" else []
        assert out.stdout.strip() == repr(expected), (modules, out.stdout)
