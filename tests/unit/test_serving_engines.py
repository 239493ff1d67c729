"""Engine selection: the built-in transformers engine by default, vLLM only when a deployment asks for it,
imported only then, and a clear engine_unavailable error (the one error hierarchy) when it is missing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.errors import EngineUnavailableError, InvalidInputError, TrainyardError
from trainyard.serving.engine import TransformersEngine
from trainyard.serving.engines import ENGINES, check_engine, create_engine
from trainyard.serving.replicas import LaunchSpec, replica_command

ROOT = Path(__file__).resolve().parents[2]


def _vllm_absent() -> None:
    assert importlib.util.find_spec("vllm") is None, "these tests need an environment without vllm"


def test_vllm_missing_is_an_engine_unavailable_error_with_a_hint() -> None:
    _vllm_absent()
    with pytest.raises(EngineUnavailableError) as info:
        check_engine("vllm")
    err = info.value
    assert isinstance(err, TrainyardError) and isinstance(err, InvalidInputError)
    assert err.code == "engine_unavailable" and err.http_status == 422
    assert "vllm" in err.message and "pip install vllm" in err.hint and "--engine transformers" in err.hint
    assert err.details == {"engine": "vllm", "package": "vllm"}


def test_create_engine_vllm_fails_the_same_way_and_imports_nothing_of_vllm() -> None:
    _vllm_absent()
    with pytest.raises(EngineUnavailableError):
        create_engine("vllm", "/nonexistent/model")
    assert "vllm" not in sys.modules and "trainyard.serving.vllm_engine" not in sys.modules


def test_a_node_without_the_check_accepts_vllm_by_name_only() -> None:
    check_engine("vllm", installed=False)  # Ray nodes have their own environment
    with pytest.raises(InvalidInputError) as info:
        check_engine("tgi", installed=False)
    assert info.value.code == "invalid_input"
    assert info.value.details["errors"][0]["field"] == "engine"
    assert "transformers" in info.value.hint and "vllm" in info.value.hint


def test_default_engine_is_the_built_in_one() -> None:
    engine = create_engine("transformers", "/some/model", adapters={"a": "/a"}, max_batch=4, threads=1)
    assert isinstance(engine, TransformersEngine) and engine.name == "transformers"
    assert engine.max_batch == 4 and engine.model is None  # not started: nothing loaded yet
    assert ENGINES[0] == "transformers"


def test_replica_command_carries_the_engine() -> None:
    spec = LaunchSpec("rep-1", "/m", "/m", {}, "tiny@1", engine="vllm")
    cmd = replica_command(spec, 1234)
    assert cmd[cmd.index("--engine") + 1] == "vllm"
    assert replica_command(LaunchSpec("rep-2", "/m", "/m", {}, "x"), 1)[-1] == "transformers"


def test_the_serving_stack_does_not_import_vllm() -> None:
    code = (
        "import sys, trainyard.serving.replica, trainyard.serving.gateway, trainyard.serving.service;"
        "print(sorted(m for m in sys.modules if m == 'vllm' or m.endswith('vllm_engine')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_a_replica_asked_for_vllm_exits_with_the_error() -> None:
    _vllm_absent()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainyard.serving.replica",
            "--replica-id",
            "r",
            "--model-path",
            "/m",
            "--port",
            "1",
            "--engine",
            "vllm",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == EngineUnavailableError.exit_code
    assert "error (engine_unavailable)" in out.stderr and "pip install vllm" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_deployment_asking_for_a_missing_vllm_is_refused_and_one_without_it_records_its_engine(
    tmp_path: Path,
) -> None:
    _vllm_absent()
    from sqlalchemy import select

    from trainyard.serving.autoscale import AutoscalingPolicy
    from trainyard.serving.models import StorageModelSource
    from trainyard.serving.service import ServingService, deployment_document
    from trainyard.store.db import Database
    from trainyard.store.models import TenantRow
    from trainyard.store.serving_models import DeploymentRow

    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    db.upgrade()
    with db.session() as s:
        s.add(TenantRow(id="t1", name="default", created_at_s=0.0))
    svc = ServingService(db, StorageModelSource(tmp_path / "storage"), home=tmp_path)
    policy = AutoscalingPolicy(min_replicas=0, max_replicas=1)
    try:
        with pytest.raises(EngineUnavailableError):
            svc.create("t1", "default", "chat", "tiny@1", policy=policy, engine="vllm")
        with db.session() as s:
            assert list(s.scalars(select(DeploymentRow))) == []
        with db.session() as s:  # a deployment written before engines existed reads as the built-in one
            row = DeploymentRow(
                id="dep-1",
                tenant_id="t1",
                name="old",
                model="tiny@1",
                routes=[],
                autoscaling=policy.doc(),
                tags={},
                resolved={},
                state="starting",
                created_at_s=0.0,
                updated_at_s=0.0,
            )
            s.add(row)
        with db.session() as s:
            row = s.get(DeploymentRow, "dep-1")
            assert row is not None and row.engine == "transformers"
        doc = deployment_document(svc, row, "http://127.0.0.1:1/openai/v1")
        assert doc["engine"] == "transformers"
    finally:
        svc.close(stop_replicas=False)
        db.dispose()
