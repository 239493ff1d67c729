"""The client from a clean environment: a fresh virtual environment with only `trainyard[client]`
installed (no training or serving stack) drives a real server started from the project's full
environment: submit a CPU job from a spec file, list, wait with progress. The CLI there names the
missing extra instead of failing with a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from controlplane_support import ROOT, ServerProcess, tiny_spec

pytestmark = pytest.mark.slow

HEAVY = ("torch", "transformers", "fastapi", "uvicorn", "sqlalchemy", "alembic", "ray", "peft")


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would let the venv see the project's sources
    or packages."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "TRAINYARD_"))}
    return {**env, **extra}


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("client-venv")
    project = root / "project"  # a copy, so the build leaves nothing in the work tree
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, project / name)
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", f"{project}[client]"],
        capture_output=True,
        text=True,
        timeout=1500,
        env=_clean_env(),
        cwd=root,
    )
    if install.returncode != 0:
        pytest.fail(f"pip install trainyard[client] failed ({install.returncode}):\n{install.stderr[-6000:]}")
    return python


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("client-install-home"), executor="local").start()
    yield srv
    assert srv.stop() == 0, srv.log_text()


def _run(python: Path, code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=600,
        env=_clean_env(**env),
        cwd=cwd,
    )


def test_only_the_core_is_installed(client_venv: Path, tmp_path: Path) -> None:
    r = _run(
        client_venv,
        f"""
        import importlib.util, json, sys
        import trainyard
        import trainyard.client, trainyard.spec, trainyard.cli.main
        print(json.dumps({{
            "file": trainyard.__file__,
            "installed": [m for m in {HEAVY!r} if importlib.util.find_spec(m) is not None],
            "imported": sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r})),
            "typed": (importlib.util.find_spec("trainyard").submodule_search_locations[0] + "/py.typed"),
        }}))
        """,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert str(ROOT) not in out["file"] and "site-packages" in out["file"]
    assert out["installed"] == [], f"the client install pulled in {out['installed']}"
    assert out["imported"] == []
    assert Path(out["typed"]).is_file(), "py.typed is not installed"


def test_the_clean_client_drives_a_real_server(
    client_venv: Path, server: ServerProcess, tmp_path: Path
) -> None:
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(yaml.safe_dump(tiny_spec("clean-client", steps=8)))
    r = _run(
        client_venv,
        f"""
        import json, sys
        from trainyard.client import TrainyardClient
        from trainyard.enums import JobState
        seen = []
        with TrainyardClient() as c:
            job = c.submit({str(spec_path)!r})
            listed = [j.id for j in c.iter_jobs(page_size=1)]
            report = lambda p: seen.append([p.state, p.step])
            done = c.wait(job.id, timeout_s=300, poll_s=0.2, on_progress=report)
        print(json.dumps({{
            "id": job.id, "listed": listed, "state": done.state, "pool": done.placement.pool,
            "sha256": done.result.model_sha256, "seen": seen, "is_enum": isinstance(done.state, JobState),
            "modules": sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r})),
        }}))
        """,
        tmp_path,
        TRAINYARD_URL=server.url,
        TRAINYARD_API_KEY=server.api_key,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["state"] == "succeeded" and out["is_enum"], out
    assert out["id"] in out["listed"] and out["pool"] == "local-cpu"
    assert out["sha256"] and len(out["sha256"]) == 64
    assert out["seen"][-1] == ["succeeded", 8]
    assert out["modules"] == []


def test_a_command_that_needs_an_extra_names_it(client_venv: Path, tmp_path: Path) -> None:
    cli = client_venv.parent / "trainyard"
    version = subprocess.run(
        [str(cli), "version"], capture_output=True, text=True, timeout=120, env=_clean_env(), cwd=tmp_path
    )
    assert version.returncode == 0, version.stderr
    up = subprocess.run(
        [str(cli), "up", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(TRAINYARD_HOME=str(tmp_path / "home")),
        cwd=tmp_path,
    )
    assert up.returncode == 10, (up.stdout, up.stderr)
    assert "trainyard[server]" in up.stderr and "Traceback" not in up.stderr, up.stderr
