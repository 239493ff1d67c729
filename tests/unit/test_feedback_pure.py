"""Pure parts of the step-time feedback: steady-state selection, thinning, and the calibrated quote."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard.catalog.accelerators import get_accelerator
from trainyard.catalog.pools import Pool
from trainyard.cost.quote import quote
from trainyard.predict.fit import ingest_measurement
from trainyard.predict.params import default_calibration
from trainyard.services.feedback import STALL_FACTOR, WARMUP_SAMPLES, calibrated_quote, steady_state, thin
from trainyard.spec.loader import spec_from_dict

SPEC = spec_from_dict(
    {
        "apiVersion": "trainyard/v1",
        "kind": "TrainingJob",
        "name": "fb",
        "model": {"architecture": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 256},
        "workload": {"seq_len": 64, "global_batch": 4, "steps": 100, "precision": "fp32"},
        "resources": {"max_devices": 1},
    }
)
CPU = Pool(
    name="cpu-box", accelerator="cpu", devices_per_node=4, nodes=1, market="on_demand",
    price_usd_per_device_hour=0.1, region="local",
)  # fmt: skip
GPU = Pool(
    name="a10g-od", accelerator="a10g", devices_per_node=1, nodes=1, market="on_demand",
    price_usd_per_device_hour=1.0, region="r1",
)  # fmt: skip


def test_steady_state_drops_warmup_stalls_and_garbage() -> None:
    values = [1.0, 0.9, 0.8] + [0.1] * 50 + [0.5] + [float("nan"), -1.0, 0.0]
    steady = steady_state(values)
    assert steady == [0.1] * 50
    assert steady_state([0.1, 0.1]) == []


@given(st.lists(st.floats(min_value=1e-4, max_value=10.0), max_size=300))
def test_steady_state_is_a_bounded_subset(values: list[float]) -> None:
    steady = steady_state(values)
    assert len(steady) <= max(0, len(values) - WARMUP_SAMPLES)
    body = values[max(WARMUP_SAMPLES, int(len(values) * 0.05)) :]
    assert set(steady) <= set(body)
    if body:
        assert all(x <= STALL_FACTOR * statistics.median(body) for x in steady)
        assert len(steady) >= len(body) // 2  # stalls are the exception: at least the median's half stays


@given(st.lists(st.floats(min_value=0.0, max_value=1.0), max_size=500), st.integers(1, 64))
def test_thin_keeps_order_and_bound(values: list[float], n: int) -> None:
    out = thin(values, n)
    assert len(out) == min(n, len(values))
    it = iter(values)
    assert all(any(v == w for w in it) for v in out)  # a subsequence


def test_calibrated_quote_moves_only_the_measured_accelerator() -> None:
    cal = default_calibration()
    acc = get_accelerator("cpu")
    base = {(o.pool, o.devices): o for o in quote(SPEC, [CPU, GPU])}
    predicted = base[("cpu-box", 1)].step_time_s
    for _ in range(100):
        cal = ingest_measurement(cal, SPEC, acc, 1, predicted * 2.0, devices_per_node=4, inter_node_gbps=None)
    after = {(o.pool, o.devices): o for o in calibrated_quote(SPEC, [CPU, GPU], cal)}
    assert after[("cpu-box", 1)].step_time_s == pytest.approx(predicted * 2.0, rel=0.03)
    assert after[("cpu-box", 1)].expected_cost_usd > base[("cpu-box", 1)].expected_cost_usd
    assert after[("a10g-od", 1)] == base[("a10g-od", 1)]
    assert calibrated_quote(SPEC, [CPU, GPU], default_calibration()) == list(quote(SPEC, [CPU, GPU]))
