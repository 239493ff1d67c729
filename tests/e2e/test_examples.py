"""The runnable CPU examples (examples/cpu-*.yaml) validate, and run to success through a real
`trainyard up` with the Python client, each well under a minute of training on the local CPU pool:
the base, then its full, LoRA and dataset fine-tunes, whose registered versions name it as their base."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from controlplane_support import ROOT, ServerProcess
from trainyard.client import TrainyardClient
from trainyard.enums import JobState
from trainyard.spec import load_spec

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples"
BASE = EXAMPLES / "cpu-base.yaml"
FINETUNES = ["cpu-full-finetune.yaml", "cpu-lora-finetune.yaml", "cpu-dataset-finetune.yaml"]
RUN_LIMIT_S = 60.0  # from the first step to the last, per job


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("examples-home"), executor="local").start()
    yield srv
    assert srv.stop() == 0, srv.log_text()


@pytest.mark.parametrize("name", ["cpu-base.yaml", *FINETUNES])
def test_example_specs_validate(name: str) -> None:
    spec = load_spec(EXAMPLES / name)
    assert spec.requirements.allow == ["cpu"]
    assert name == "cpu-base.yaml" or spec.model.base == "cpu-base@1"


def _training_seconds(c: TrainyardClient, job_id: str) -> float:
    """Wall time from the job entering `running` to its end, from its own event log."""
    events = list(c.iter_events(job_id))
    start = next(e.time for e in events if e.kind == "state" and e.data.get("to") == "running")
    end = next(e.time for e in reversed(events) if e.kind == "state")
    assert start and end
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _model_version(c: TrainyardClient, job_id: str) -> str:
    result = c.get_job(job_id).result
    assert result is not None and result.model_version
    return result.model_version


def test_examples_run_on_the_local_cpu_pool(server: ServerProcess) -> None:
    with TrainyardClient(server.url, server.api_key) as c:
        t0 = time.monotonic()
        base = c.wait(c.submit(BASE).id, timeout_s=600, poll_s=0.5)
        assert base.state == JobState.SUCCEEDED, base.reason
        assert base.placement is not None and base.placement.pool == "local-cpu"
        assert base.result is not None and base.result.model_version == "cpu-base@1"
        assert _training_seconds(c, base.id) < RUN_LIMIT_S, f"{time.monotonic() - t0:.0f} s in all"

        jobs = {name: c.submit(EXAMPLES / name) for name in FINETUNES}
        for name, job in jobs.items():
            done = c.wait(job.id, timeout_s=900, poll_s=0.5)
            assert done.state == JobState.SUCCEEDED, (name, done.reason)
            assert done.result is not None and done.result.model_version
            assert "registry_error" not in done.result.to_dict(), (name, done.result)
            version = c.get_model(done.result.model_version)
            assert version.base == "cpu-base@1", name
            assert _training_seconds(c, job.id) < RUN_LIMIT_S, name

        versions = {name: c.get_model(_model_version(c, job.id)) for name, job in jobs.items()}
        assert versions["cpu-lora-finetune.yaml"].adapter
        assert not versions["cpu-full-finetune.yaml"].adapter
        data_job = c.get_job(jobs["cpu-dataset-finetune.yaml"].id)
        dataset = (data_job.spec or {})["workload"]["dataset"]
        assert dataset.startswith("ds://arithmetic@"), dataset
        ds = c.get_dataset(dataset)
        assert ds.rows == 80 and ds.splits.eval.rows > 0
        assert dataset in versions["cpu-dataset-finetune.yaml"].datasets
        # a fine-tune on a dataset with an eval split is evaluated against its base automatically
        assert data_job.result is not None
        auto = data_job.result.to_dict().get("evaluation")
        assert auto and auto["baseline"] == "cpu-base@1", data_job.result
        assert c.get_evaluation(auto["id"]).model == versions["cpu-dataset-finetune.yaml"].id
