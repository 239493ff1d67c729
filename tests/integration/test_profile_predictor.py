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


def test_the_profile_times_the_trainers_own_step(monkeypatch) -> None:
    """A profile is the step a job runs: Trainer.train_step on the model build_model builds (here the
    plain-MLP FFN, which the trainer builds as its own class), timed around the call as the job's step
    metrics are."""
    from trainyard.runtime.modeling import build_model
    from trainyard.runtime.profiler import profile_spec
    from trainyard.runtime.trainer import Trainer
    from trainyard.spec.loader import spec_from_dict

    calls: list[int] = []
    real = Trainer.train_step

    def counted(self: Trainer, step: int, ckpt_flag: bool):  # type: ignore[no-untyped-def]
        calls.append(step)
        return real(self, step, ckpt_flag)

    monkeypatch.setattr(Trainer, "train_step", counted)
    doc = {
        "apiVersion": "trainyard/v1",
        "kind": "TrainingJob",
        "name": "mlp-profile",
        "model": {"n_layers": 2, "d_model": 32, "n_heads": 4, "ffn": "mlp", "vocab_size": 128},
        "workload": {"precision": "fp32", "seq_len": 16, "global_batch": 4, "micro_batch": 2, "steps": 5},
    }
    spec = spec_from_dict(doc)
    prof = profile_spec(spec, steps=3, warmup=1, device="cpu", threads=1, measure=False)
    assert calls == [0, 1, 2, 3]  # warm-up and timed steps, the sampler's steps in order
    assert prof["runner"] == "trainer" and len(prof["step_times_s"]) == 3
    assert prof["params"] == build_model(spec).description["params"]
    assert prof["plan"] == {"micro_batch": 2, "grad_accum": 2, "activation_checkpointing": "none"}
