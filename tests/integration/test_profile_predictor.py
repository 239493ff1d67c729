"""A real (tiny) profile on this machine through the CLI, then the stored profile calibrates `cpu`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SPEC = """apiVersion: trainyard/v1
kind: TrainingJob
name: tiny-profile
model: {n_layers: 2, d_model: 64, n_heads: 4, n_kv_heads: 2, ffn: gated, vocab_size: 256}
workload: {precision: fp32, seq_len: 32, global_batch: 4, micro_batch: 2, steps: 10}
"""


def _cli(*args: str, env_home: Path) -> subprocess.CompletedProcess[str]:
    env = {"TRAINYARD_HOME": str(env_home), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_profile_is_stored_and_calibrates_cpu_predictions(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    home = tmp_path / "home"
    r = _cli("profile", str(spec), "--steps", "2", "--warmup", "1", "--threads", "1", "--json", env_home=home)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    stored = list((home / "profiles").glob("*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["step_time_s"] == doc["step_time_s"]
    assert doc["step_time_s"] > 0 and len(doc["step_times_s"]) == 2
    assert doc["plan"] == {"micro_batch": 2, "grad_accum": 2, "activation_checkpointing": "none"}
    assert doc["device"]["matmul_flops"] > 1e8 and doc["peak_memory_gib"] > 0
    r2 = _cli("predict", str(spec), "--accelerator", "cpu", "--devices", "1", "--json", env_home=home)
    assert r2.returncode == 0, r2.stderr
    pred = json.loads(r2.stdout)
    # Calibrated on this very configuration: the prediction reproduces the measurement closely.
    assert abs(pred["step_time_s"] / doc["step_time_s"] - 1) < 0.25
    r3 = _cli("predict", str(spec), "--accelerator", "cpu", "--json", "--no-profiles", env_home=home)
    assert json.loads(r3.stdout)["step_time_s"] != pred["step_time_s"]
    bad = _cli("profile", str(tmp_path / "missing.yaml"), env_home=home)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
