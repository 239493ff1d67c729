"""A real (tiny) profile on this machine through the CLI, then the stored profile calibrates `cpu`."""

from __future__ import annotations

import json
import os
from pathlib import Path

from typer.testing import CliRunner

from trainyard.cli.main import app

SPEC = """apiVersion: trainyard/v1
kind: TrainingJob
name: tiny-profile
model: {n_layers: 2, d_model: 64, n_heads: 4, n_kv_heads: 2, ffn: gated, vocab_size: 256}
workload: {precision: fp32, seq_len: 32, global_batch: 4, micro_batch: 2, steps: 10}
"""


def test_profile_is_stored_and_calibrates_cpu_predictions(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    home = Path(os.environ["TRAINYARD_HOME"])  # isolated per test by conftest
    runner = CliRunner()
    r = runner.invoke(
        app, ["profile", str(spec), "--steps", "3", "--warmup", "1", "--threads", "1", "--json"]
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    stored = list((home / "profiles").glob("*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["step_time_s"] == doc["step_time_s"]
    assert doc["step_time_s"] > 0 and len(doc["step_times_s"]) == 3
    assert doc["plan"] == {"micro_batch": 2, "grad_accum": 2, "activation_checkpointing": "none"}
    assert doc["device"]["matmul_flops"] > 1e8 and doc["peak_memory_gib"] > 0
    assert doc["params"] == 2 * 256 * 64 + 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 256 + 2 * 64) + 64

    r2 = runner.invoke(app, ["predict", str(spec), "--accelerator", "cpu", "--devices", "1", "--json"])
    assert r2.exit_code == 0, r2.output
    pred = json.loads(r2.stdout)
    # Calibrated on this very configuration: the prediction reproduces the measurement.
    assert abs(pred["step_time_s"] / doc["step_time_s"] - 1) < 0.05
    r3 = runner.invoke(app, ["predict", str(spec), "--accelerator", "cpu", "--json", "--no-profiles"])
    assert json.loads(r3.stdout)["step_time_s"] != pred["step_time_s"]

    bad = runner.invoke(app, ["profile", str(tmp_path / "missing.yaml")])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
