"""Offline checkpoint conversion and the `trainyard checkpoint` commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from typer.testing import CliRunner

from trainyard.cli.main import app
from trainyard.runtime.checkpoint import CheckpointManager
from trainyard.runtime.convert import convert

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        model(torch.randn(5, 8)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _save(root: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int = 3) -> None:
    msd, osd = get_state_dict(model, opt)
    mgr = CheckpointManager(f"file://{root}", "job", world_size=2)
    meta = {"precision": {"name": "fp32", "param_dtype": "float32"}, "rng": {"0": {}, "1": {}}, "loss": 1.5}
    mgr.save(step, {"model": msd, "optim": osd}, meta, blocking=True)
    mgr.close()


def test_convert_to_bf16_params_and_load_back_into_fp32(tmp_path: Path) -> None:
    model, opt = _trained()
    _save(tmp_path / "src", model, opt)
    result = convert(f"file://{tmp_path / 'src' / 'job'}", f"file://{tmp_path / 'dst'}", precision="bf16")
    assert result["step"] == 3 and result["from_world_size"] == 2 and result["tensors_cast"]["model"] == 4
    man = json.loads((tmp_path / "dst" / "job" / "step-3" / "manifest.json").read_text())
    assert man["precision"]["param_dtype"] == "bfloat16" and man["world_size"] == 1
    assert man["converted_from"]["precision"] == "fp32" and man["rng"] == {"0": {}, "1": {}}
    # a fresh fp32 model and optimizer load the bf16 checkpoint (upcast on load)
    fresh, fresh_opt = _trained(seed=1)
    msd, osd = get_state_dict(fresh, fresh_opt)
    state = {"model": msd, "optim": osd}
    dst = CheckpointManager(f"file://{tmp_path / 'dst'}", "job")
    ref = dst.latest_valid()
    assert ref is not None
    dst.load(ref, state)
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    pairs = list(zip(model.parameters(), fresh.parameters(), strict=True))
    assert all(b.dtype == torch.float32 and torch.allclose(a, b, rtol=1e-2, atol=1e-3) for a, b in pairs)
    assert any(not torch.equal(a, b) for a, b in pairs)  # bf16 rounding really happened
    assert fresh_opt.state_dict()["state"][0]["exp_avg"].dtype == torch.float32


def test_checkpoint_cli_list_verify_convert(tmp_path: Path) -> None:
    model, opt = _trained()
    _save(tmp_path / "s", model, opt, step=3)
    _save(tmp_path / "s", model, opt, step=5)
    runner = CliRunner()
    out = runner.invoke(app, ["checkpoint", "list", str(tmp_path / "s" / "job"), "--verify", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["checkpoints"]
    assert [r["step"] for r in rows] == [5, 3] and all(r["verified"] for r in rows)
    out = runner.invoke(app, ["checkpoint", "verify", str(tmp_path / "s" / "job"), "--json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["step"] == 5
    shard = next((tmp_path / "s" / "job" / "step-5").glob("*.distcp"))
    shard.write_bytes(b"garbage" + shard.read_bytes()[7:])
    out = runner.invoke(app, ["checkpoint", "verify", str(tmp_path / "s" / "job" / "step-5"), "--json"])
    assert out.exit_code == 9 and "sha256" in json.loads(out.stdout)["why"]
    out = runner.invoke(
        app,
        [
            "checkpoint",
            "convert",
            str(tmp_path / "s" / "job"),
            "--to",
            str(tmp_path / "d"),
            "--precision",
            "bf16-mixed",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["step"] == 3  # step 5 is corrupt, so the newest good one is converted
    out = runner.invoke(
        app,
        [
            "checkpoint",
            "convert",
            str(tmp_path / "s" / "job"),
            "--to",
            str(tmp_path / "d"),
            "--precision",
            "fp8",
        ],
    )
    assert out.exit_code == 2 and "fp8" in out.output
