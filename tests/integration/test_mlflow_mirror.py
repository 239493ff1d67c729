"""The MLflow mirror against a real MLflow tracking server started on loopback: a job's run, params,
step metrics, placement tags, cost and final status arrive; a restarted mirror resumes from its cursor
without duplicating anything; the registered model version points at the job's weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mlflow.tracking import MlflowClient

from controlplane_support import free_port, tiny_spec
from trainyard.services.domain import Principal
from trainyard.services.jobs import JobService
from trainyard.services.mlflow_mirror import MlflowMirror, flatten
from trainyard.services.tenants import TenantService
from trainyard.spec import spec_from_dict
from trainyard.store.db import Database
from trainyard.store.repositories import EventRepo, JobRepo

MLFLOW = Path(sys.executable).parent / "mlflow"


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = open(d / "server.log", "w")  # noqa: SIM115 - closed below
    store = f"sqlite:///{d / 'mlflow.db'}"
    args = [
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        store,
    ]
    proc = subprocess.Popen(
        [str(MLFLOW), *args, "--default-artifact-root", str(d / "artifacts")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "MLFLOW_TRACKING_URI": ""},
        start_new_session=True,  # the server forks workers: stop the whole group afterwards
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # a loaded 2-core machine: up to minutes
    try:
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(
                    f"the MLflow tracking server did not start:\n{(d / 'server.log').read_text()[-3000:]}"
                )
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


def test_flatten_params() -> None:
    assert flatten({"workload": {"seq_len": 64, "parallelism": {"fsdp": True}}, "x": [1, 2]}) == {
        "workload.seq_len": "64",
        "workload.parallelism.fsdp": "true",
        "x": "[1, 2]",
    }


def test_a_job_is_mirrored_as_it_happens_and_resumes_from_its_cursor(
    tracking_uri: str, tmp_path: Path
) -> None:
    db = Database(f"sqlite:///{tmp_path / 'ty.db'}")
    db.upgrade()
    tenant, _ = TenantService(db).create("acme")
    who = Principal(tenant_id=tenant.id, tenant_name="acme", key_id="k", admin=False)
    spec = spec_from_dict({**tiny_spec("mirror-me"), "tags": {"team": "support"}})
    job, _ = JobService(db).submit(who, spec)
    cursor = tmp_path / "mlflow-mirror.json"
    mirror = MlflowMirror(db, tracking_uri, cursor_path=cursor)
    t0 = time.time()
    with db.session() as s:
        ev = EventRepo(s)
        ev.append(job.id, "placement", {"attempt": 1, "pool": "local-cpu", "accelerator": "cpu",
                                        "market": "on_demand"}, t0)  # fmt: skip
        for step, loss in ((1, 5.5), (10, 4.0), (20, 3.25)):
            ev.append(job.id, "heartbeat", {"attempt": 1, "step": step, "loss": loss, "step_time_s": 0.1,
                                            "tokens_per_s": 1000.0}, t0 + step)  # fmt: skip
        ev.append(job.id, "checkpoint", {"attempt": 1, "step": 20, "path": "file:///x/step-20"}, t0 + 21)
        ev.append(job.id, "preempted", {"attempt": 1, "step": 20}, t0 + 22)
        ev.append(job.id, "cost", {"attempt": 1, "usd": 0.25, "device_s": 10.0}, t0 + 22)
    assert mirror.sync_once() >= 7
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("trainyard/acme")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`trainyard.job_id` = '{job.id}'")
    assert len(runs) == 1
    run = runs[0]
    assert run.data.params["workload.seq_len"] == str(spec.workload.seq_len)
    assert run.data.tags["spec.team"] == "support" and run.data.tags["trainyard.pool"] == "local-cpu"
    losses = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in losses] == [(1, 5.5), (10, 4.0), (20, 3.25)]
    assert run.data.metrics["preemptions"] == 1 and run.data.metrics["cost_usd"] == pytest.approx(0.25)
    assert run.info.status == "RUNNING"

    # a second attempt after the preemption, then success; a new mirror process resumes from the cursor
    with db.session() as s:
        EventRepo(s).append(job.id, "heartbeat", {"attempt": 2, "step": 30, "loss": 2.5}, t0 + 30)
        EventRepo(s).append(job.id, "cost", {"attempt": 2, "usd": 0.5, "device_s": 20.0}, t0 + 31)
        JobRepo(s).update(
            job.id, result={"model_version": f"mirror-me@{job.id}", "model_path": str(tmp_path / "m")}
        )
        EventRepo(s).append(
            job.id, "state", {"from": "running", "to": "succeeded", "reason": "done"}, t0 + 32
        )
    restarted = MlflowMirror(db, tracking_uri, cursor_path=cursor)
    assert restarted.cursor == mirror.cursor > 0
    assert restarted.sync_once() == 3
    assert restarted.sync_once() == 0
    run = client.get_run(run.info.run_id)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 10, 20, 30]
    assert run.data.metrics["cost_usd"] == pytest.approx(0.75)
    assert run.info.status == "FINISHED"
    assert run.data.tags["trainyard.model_version"] == f"mirror-me@{job.id}"
    versions = client.search_model_versions("name = 'acme.mirror-me'")
    assert len(versions) == 1 and versions[0].source == f"runs:/{run.info.run_id}/model"
    assert versions[0].run_id == run.info.run_id
    assert versions[0].tags["trainyard.model_version"] == f"mirror-me@{job.id}"
    card = client.download_artifacts(run.info.run_id, "model/trainyard-model.json", str(tmp_path))
    assert json.loads(Path(card).read_text())["model_path"] == str(tmp_path / "m")
    assert oct(cursor.stat().st_mode & 0o777) == "0o600"
    db.dispose()
