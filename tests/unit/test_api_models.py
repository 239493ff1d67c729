"""API documents: typed attributes, dict-style reads for scripts written against the JSON, the exact
JSON back from to_dict(), fields of a newer server kept, enums that compare equal to their strings;
importing them loads no web framework, database or training stack."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from trainyard.api_models import JobDocument, PlacementDoc, QuoteResponse
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
    # httpx (most of the client's import time) comes with the first client, asyncio with the async one
    lazy = "import sys, trainyard.client\nprint(sorted({'httpx', 'asyncio'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", lazy], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
