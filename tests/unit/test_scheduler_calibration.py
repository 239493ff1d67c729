"""The scheduler's calibration hook (CandidateCache.calibrated) and the control plane's feedback hook."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from scheduler_paths import both_pricing_paths  # noqa: F401
from test_scheduler_round import CFG, job, pool, spec

from trainyard.cost.quote import option_for, pool_accelerator, predict_kwargs
from trainyard.predict import default_calibration, predict
from trainyard.predict.fit import ingest_measurement
from trainyard.schedule import CandidateCache, schedule_round
from trainyard.schedule.candidates import price_option
from trainyard.services.scheduler_adapter import calibrated_predictions

# every round runs on the vectorised pricing and on the scalar reference, which must decide alike
pytestmark = pytest.mark.usefixtures("both_pricing_paths")

A100 = pool("a", "a100-80gb", 2.0)
H100 = pool("h", "h100-80gb", 3.5, memory_per_device_gib=94.0)
H100_ACC = pool_accelerator(H100)  # the catalog's H100 with the pool's 94 GiB


def test_hook_answers_for_the_accelerators_it_knows_and_is_memoised() -> None:
    calls: list[tuple[str, float, int, dict[str, Any]]] = []

    def slow_h100(s: Any, accelerator: Any, devices: int, topology: Any) -> Any:
        calls.append((accelerator.name, accelerator.memory_gib, devices, dict(topology)))
        if accelerator.name != H100_ACC.name:
            return None  # the packaged predictor answers
        p = predict(s, accelerator, devices, **topology)
        return replace(p, step_time_s=3 * p.step_time_s, step_time_p90_s=3 * p.step_time_p90_s)

    s = spec("hooked")
    plain, hooked = CandidateCache(), CandidateCache(calibrated=slow_h100)
    for _ in range(2):  # the second pass is served from the memo
        assert price_option(s, H100, 1, 0.0, hooked).step_time_s == pytest.approx(
            3 * price_option(s, H100, 1, 0.0, plain).step_time_s
        )
        assert price_option(s, A100, 1, 0.0, hooked) == price_option(s, A100, 1, 0.0, plain)
    assert sorted(c[0] for c in calls) == sorted([pool_accelerator(A100).name, H100_ACC.name])
    # the hook sees the pool's device memory and the topology the cost model passes to the predictor
    assert (H100_ACC.name, 94.0, 1, predict_kwargs(H100, H100_ACC)) in calls
    # a round prices with it: the slowed H100 loses to the A100 it beat without the hook
    assert schedule_round([job(s)], [A100, H100], config=CFG, cache=plain).placements[0].pool == "h"
    assert schedule_round([job(s)], [A100, H100], config=CFG, cache=hooked).placements[0].pool == "a"


def test_feedback_hook_predicts_measured_accelerators_on_the_calibration() -> None:
    assert calibrated_predictions(None) is None
    assert calibrated_predictions(default_calibration()) is None  # nothing measured: no hook
    s = spec("measured")
    acc = H100_ACC
    topology = predict_kwargs(H100, acc)
    predicted = predict(s, acc, 1, **topology).step_time_s
    cal = ingest_measurement(default_calibration(), s, acc, 1, 4 * predicted, **topology)
    hook = calibrated_predictions(cal)
    assert hook is not None
    assert hook(s, pool_accelerator(A100), 1, predict_kwargs(A100, pool_accelerator(A100))) is None
    cache = CandidateCache(calibrated=hook)
    ours = price_option(s, H100, 1, 0.0, cache)
    # the same step time as a quote priced on the calibration (services.feedback.calibrated_quote)
    want = option_for(s, H100, 1, predict_fn=lambda sp, a, d: predict(sp, a, d, calibration=cal, **topology))
    assert ours.step_time_s == pytest.approx(want.step_time_s)
    assert ours.step_time_s > 1.5 * predicted  # the correction moved it (so the comparison can fail)
    assert price_option(s, A100, 1, 0.0, cache) == price_option(s, A100, 1, 0.0, CandidateCache())
