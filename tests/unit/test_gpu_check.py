"""benchmarks/gpu_check.py imports and its CPU-runnable parts work (the CUDA run needs a lent GPU):
the check spec, the device section, the plain-loop timer, the predictor comparison, the table."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cpu_parts_of_the_gpu_check(gpu_check: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    doc = gpu_check.check_spec("cpu", 4)
    assert doc["workload"]["steps"] == 4 and doc["model"]["ffn"] == "gated"
    cuda_doc = gpu_check.check_spec("cuda", 40)
    assert cuda_doc["workload"]["precision"] == "bf16-mixed"
    dev = gpu_check.device_section("cpu")
    assert dev["torch_devices"][0]["accelerator"] == "cpu" and isinstance(dev["nvidia_smi"], list)
    step = gpu_check.plain_loop_step_s(doc, "cpu", steps=2, warmup=1)
    assert 0 < step < 60
    for acc in ("h200", "h100", "a100-80gb"):
        predicted = gpu_check.predicted_step_s(cuda_doc, acc)
        assert predicted is not None and math.isfinite(predicted) and predicted > 0
    assert gpu_check.predicted_step_s(cuda_doc, None) is None
    gpu_check.print_table(
        {
            "devices": dev,
            "step_time": {"plain_loop_s": step, "trainer_s": step, "overhead_pct": 0.0, "predicted_s": None},
            "kill_resume": {"bit_identical": True},
            "fsdp": {"skipped": "one GPU"},
            "passed": True,
        }
    )
    assert "plain loop step" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpu_check.run_checks("cuda", 4, 10.0)
