"""The batch prediction path (``predict_grouped``, ``engine.chosen_plans``) equals the scalar predictor."""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.catalog.accelerators import get_accelerator, load_accelerators
from trainyard.predict import Prediction, predict, predict_grouped
from trainyard.predict.engine import chosen_plans
from trainyard.predict.model import _LazyPrediction
from trainyard.spec.models import JobSpec

ACCS = sorted(a for a in load_accelerators() if a != "cpu")


def _spec(
    layers: int, d_mult: int, heads: int, seq: int, batch: int, prec: str, method: str, custom_b: float | None
) -> JobSpec:
    model: dict[str, Any]
    if custom_b is not None:
        model = {"architecture": "custom", "params_b": custom_b}
    else:
        model = {
            "n_layers": layers,
            "d_model": 128 * d_mult,
            "n_heads": heads,
            "ffn": "gated",
            "vocab_size": 32000,
        }
    wl = {"seq_len": seq, "global_batch": batch, "precision": prec, "method": method, "steps": 100}
    return JobSpec.model_validate({"name": "t", "model": model, "workload": wl})


spec_st = st.builds(
    _spec,
    st.integers(2, 96),
    st.sampled_from([4, 8, 16, 32, 64]),
    st.sampled_from([8, 16, 32]),
    st.sampled_from([512, 2048, 8192]),
    st.sampled_from([1, 8, 64, 512]),
    st.sampled_from(["bf16-mixed", "fp32", "fp8-mixed"]),
    st.sampled_from(["full", "lora"]),
    st.one_of(st.none(), st.sampled_from([0.3, 2.0, 13.0, 70.0, 400.0])),  # 400B: fits almost nowhere
)


@st.composite
def _measured(draw: Any, spec: JobSpec) -> JobSpec:
    """The spec with profile-measured step times on some accelerators, scaled from ``min_devices``."""
    names = draw(st.lists(st.sampled_from(ACCS), max_size=3, unique=True))
    if not names:
        return spec
    steps = {n: draw(st.floats(0.01, 50.0)) for n in names}
    return spec.model_copy(
        update={
            "measured": spec.measured.model_copy(update={"step_time_s": steps}),
            "resources": spec.resources.model_copy(
                update={"min_devices": draw(st.sampled_from([1, 2, 4, 8]))}
            ),
        }
    )


def _close(a: Any, b: Any, path: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(a, bool):
        assert isinstance(b, float), path
        if math.isnan(a) or math.isinf(a):
            assert a == b or (math.isnan(a) and math.isnan(b)), (path, a, b)
        else:
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0), (path, a, b)
    else:
        assert a == b, (path, a, b)


def grouped_cases(test: Any) -> Any:
    """Specs with and without measured step times on an accelerator, over device counts and topologies."""
    cases = given(
        specs=st.lists(spec_st.flatmap(_measured), min_size=1, max_size=5),
        acc=st.sampled_from(ACCS),
        counts=st.lists(
            st.sampled_from([1, 2, 3, 4, 8, 12, 16, 64, 256]), min_size=1, max_size=5, unique=True
        ),
        per_node=st.sampled_from([None, 4, 8]),
        gbps=st.sampled_from([None, 25.0, 400.0]),
    )
    return settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])(cases(test))


@grouped_cases
def test_grouped_predictions_equal_predict_field_for_field(
    specs: list[JobSpec], acc: str, counts: list[int], per_node: int | None, gbps: float | None
) -> None:
    a = get_accelerator(acc)
    topology: dict[str, Any] = {"devices_per_node": per_node, "inter_node_gbps": gbps}
    try:
        grouped = predict_grouped([(s, counts) for s in specs], a, **topology)
    except ValueError:
        for s in specs:  # the scalar predictor refuses the same combination
            try:
                predict(s, a, counts[0], **topology)
            except ValueError:
                continue
        return
    for s, got in zip(specs, grouped, strict=True):
        want = [predict(s, a, n, **topology) for n in counts]
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _close(g.to_dict(), w.to_dict(), f"{s.model.architecture}/{acc}/{g.devices}")


def _one_by_one(
    step: np.ndarray, mem: np.ndarray, cap: float, starts: list[int]
) -> tuple[list[int], list[bool]]:
    """``model._chosen_plan``'s selection, one segment at a time."""
    idx, fits = [], []
    for k, a in enumerate(starts):
        b = starts[k + 1] if k + 1 < len(starts) else len(step)
        fit_mask = mem[a:b] <= cap
        if fit_mask.any():
            i = int(np.argmin(np.where(fit_mask, step[a:b], np.inf)))
        else:
            i = int(np.argmin(mem[a:b]))
        idx.append(a + i)
        fits.append(bool(fit_mask.any()))
    return idx, fits


values = st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0, math.inf, math.nan])


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    data=st.data(),
    cap=st.sampled_from([0.0, 1.0, 2.0, math.inf]),
)
def test_chosen_plans_equal_argmin_per_segment(lengths: list[int], data: Any, cap: float) -> None:
    n = sum(lengths)
    step = np.array(data.draw(st.lists(values, min_size=n, max_size=n)))
    mem = np.array(data.draw(st.lists(values, min_size=n, max_size=n)))
    starts = [int(x) for x in np.cumsum([0, *lengths[:-1]])]
    idx, fits = chosen_plans(step, mem, cap, starts)
    want_idx, want_fits = _one_by_one(step, mem, cap, starts)
    assert idx.tolist() == want_idx and fits.tolist() == want_fits


@grouped_cases
def test_lazy_grouped_predictions_equal_eager_ones(
    specs: list[JobSpec], acc: str, counts: list[int], per_node: int | None, gbps: float | None
) -> None:
    """``predict_grouped(lazy=True)``: what pricing reads is there before anything else is built and is the
    eager prediction's, bit for bit; the rest, built on first read, is the eager prediction's too."""
    a = get_accelerator(acc)
    topology: dict[str, Any] = {"devices_per_node": per_node, "inter_node_gbps": gbps}
    try:
        eager = predict_grouped([(s, counts) for s in specs], a, **topology)
    except ValueError:
        return
    lazy = predict_grouped([(s, counts) for s in specs], a, lazy=True, **topology)
    for es, ls in zip(eager, lazy, strict=True):
        assert len(es) == len(ls)
        for e, g in zip(es, ls, strict=True):
            assert isinstance(g, Prediction)
            if isinstance(g, _LazyPrediction):
                assert e.fits and "_make" in g.__dict__
                for f in _LazyPrediction._EAGER:  # read without building the rest
                    assert g.__dict__[f] == getattr(e, f), f
                assert "_make" in g.__dict__
                copy = pickle.loads(pickle.dumps(g))
                assert type(copy) is Prediction and copy == e
            assert g.to_dict() == e.to_dict()
            assert g == e and e == g
            assert "_make" not in g.__dict__


def test_lazy_predictions_in_a_round_are_built_only_when_read() -> None:
    """A scheduling round's predictions come from the lazy batch path: most are never built in full."""
    from trainyard.catalog.pools import Pool
    from trainyard.schedule import CandidateCache, QueuedJob, SchedulerConfig, schedule_round

    spec = _spec(12, 8, 8, 2048, 64, "bf16-mixed", "full", None)
    pools = [
        Pool.model_validate(
            {
                "name": f"p{i}",
                "cloud": "aws",
                "region": "us-east-1",
                "accelerator": acc,
                "market": "on_demand",
                "devices_per_node": 8,
                "nodes": 2,
                "price_usd_per_device_hour": 1.0 + i,
            }
        )
        for i, acc in enumerate(["a100-80gb", "h100-80gb"])
    ]
    cache = CandidateCache()
    jobs = [QueuedJob(job_id="j", tenant="t", spec=spec, submit_s=0.0)]
    res = schedule_round(jobs, pools, now_s=0.0, config=SchedulerConfig(), cache=cache)
    assert res.placements
    preds = list(cache.predictions.values())
    assert preds and all(isinstance(p, _LazyPrediction) and "_make" in p.__dict__ for p in preds)
    want = predict(spec, get_accelerator("a100-80gb"), 8, devices_per_node=8, inter_node_gbps=None)
    got = next(p for p in preds if p.accelerator == "a100-80gb" and p.devices == 8)
    _close(got.to_dict(), want.to_dict(), "a100-80gb/8")


def test_the_batched_fit_search_finds_the_scalar_smallest_fitting_count() -> None:
    """``predict_grouped`` searches the smallest fitting device count of all its predictions that do not
    fit at once (``model.prefill_min_devices``); every answer and reason is the scalar predictor's."""
    specs = [
        _spec(4, 8, 8, seq, batch, prec, method, size)
        for size in (30.0, 120.0, 400.0, 1500.0, 6000.0)
        for batch in (1, 16, 512)
        for seq, prec, method in (
            (2048, "bf16-mixed", "full"), (8192, "fp32", "full"), (512, "bf16-mixed", "lora")
        )
    ]  # fmt: skip
    specs.append(_spec(48, 64, 32, 8192, 64, "bf16-mixed", "full", None))  # a dense model of its own shape
    counts = [1, 2, 3, 8, 12]
    found = unbounded = 0
    for acc in ("t4", "l4", "a100-80gb", "tpu-v5e"):
        a = get_accelerator(acc)
        grouped = predict_grouped([(s, counts) for s in specs], a, devices_per_node=8, lazy=True)
        for s, got in zip(specs, grouped, strict=True):
            for g, n in zip(got, counts, strict=True):
                want = predict(s, a, n, devices_per_node=8)
                assert (g.fits, g.min_devices_to_fit, g.reason) == (
                    want.fits,
                    want.min_devices_to_fit,
                    want.reason,
                ), (acc, s.model, s.workload.global_batch, n)
                if not want.fits:
                    found += want.min_devices_to_fit is not None
                    unbounded += want.min_devices_to_fit is None
    assert found > 100 and unbounded > 10
