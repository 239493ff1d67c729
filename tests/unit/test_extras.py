"""Every module the CLI may report missing maps to an install extra that pyproject.toml defines, and the
core install's dependencies are exactly what the client, CLI and pure core need."""

from __future__ import annotations

import tomllib
from pathlib import Path

from trainyard.errors import MissingExtraError
from trainyard.extras import EXTRA_OF_MODULE, missing_extra

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_each_module_names_a_defined_extra() -> None:
    extras = PROJECT["optional-dependencies"]
    assert set(EXTRA_OF_MODULE.values()) <= set(extras)
    dev = " ".join(extras["dev"])
    for extra in ("server", "train", "ray", "serve", "mlflow"):
        assert extra in dev, f"dev does not install the {extra} extra"


def test_missing_extra_names_the_extra_and_the_install_command() -> None:
    err = missing_extra(ModuleNotFoundError("No module named 'torch'", name="torch"))
    assert isinstance(err, MissingExtraError) and err.extra == "train" and err.exit_code == 10
    assert "trainyard[train]" in err.message and "pip install 'trainyard[train]'" in err.hint
    sub = missing_extra(ModuleNotFoundError(name="sqlalchemy.orm"))
    assert sub is not None and sub.extra == "server"
    assert missing_extra(ModuleNotFoundError(name="no_such_module_anywhere")) is None


def test_the_core_install_has_no_server_or_training_stack() -> None:
    core = {d.split("==")[0].split("[")[0].lower() for d in PROJECT["dependencies"]}
    assert core == {
        "pydantic",
        "pydantic-settings",
        "pyyaml",
        "typer",
        "rich",
        "httpx",
        "numpy",
        "scipy",
        "ortools",
    }
    assert all("==" in d for d in PROJECT["dependencies"])
    for extra, deps in PROJECT["optional-dependencies"].items():
        assert all("==" in d or d.startswith("trainyard[") for d in deps), extra
