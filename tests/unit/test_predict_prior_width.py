"""The per-accelerator prior width is chosen by cross-validation over models inside the rows being
fitted: the folds keep every row of a model together, the choice is the width with the lowest held-out
error, and in leave-one-model-out the held-out model takes no part in choosing the width of its refit."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from trainyard.predict.calib_data import CalibrationRow, packaged_rows
from trainyard.predict.fit import (
    choose_accelerator_prior_scale,
    fit_calibration,
    leave_one_model_out,
    model_folds,
    predict_row,
    prepare_row,
)


@pytest.fixture(scope="module")
def tpu_rows() -> list[CalibrationRow]:
    """The TPU rows: three accelerators with enough rows of their own, several models, fast to fit."""
    rows, _ = packaged_rows()
    return [r for r in rows if r.family == "google-tpu"]


@pytest.fixture(scope="module")
def v5_rows(tpu_rows: list[CalibrationRow]) -> list[CalibrationRow]:
    """TPU v5e and v5p: five MaxText models, each accelerator with rows enough for its own fit."""
    return [r for r in tpu_rows if r.accelerator in ("tpu-v5e", "tpu-v5p")]


def test_model_folds_deal_whole_models_in_sorted_order(tpu_rows: list[CalibrationRow]) -> None:
    models = sorted({r.model_key for r in tpu_rows})
    assert len(models) >= 4
    folds = model_folds(tpu_rows, 3)
    assert folds == [set(models[0::3]), set(models[1::3]), set(models[2::3])]
    shuffled = list(tpu_rows)
    random.Random(0).shuffle(shuffled)
    assert model_folds(shuffled, 3) == folds  # the rows' order does not matter
    assert model_folds(tpu_rows, 100) == [{m} for m in models]  # never more folds than models
    assert model_folds(tpu_rows[:1], 4) == [{tpu_rows[0].model_key}]


def test_the_width_chosen_is_the_one_with_the_lowest_held_out_error(tpu_rows: list[CalibrationRow]) -> None:
    prep = {r.index: prepare_row(r) for r in tpu_rows}
    best, score = choose_accelerator_prior_scale(tpu_rows, prepared=prep, scales=(1.0, 4.0), folds=2)
    assert set(score) == {1.0, 4.0} and best == min(score, key=lambda s: (score[s], s))
    # the score of a width is the median held-out error of its fits, fold by fold
    errors = []
    for held in model_folds(tpu_rows, 2):
        cal = fit_calibration(
            [r for r in tpu_rows if r.model_key not in held], prepared=prep, accelerator_prior_scale=4.0
        )
        errors += [
            abs(predict_row(cal, r, prep)[0] / r.measured_step_time_s - 1)
            for r in tpu_rows
            if r.model_key in held
        ]
    errors.sort()
    mid = len(errors) // 2
    median = errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2
    assert score[4.0] == pytest.approx(median)
    # a tie goes to the narrower width; one model leaves nothing to hold out
    same, tied = choose_accelerator_prior_scale(tpu_rows, prepared=prep, scales=(4.0, 4.0 + 1e-12), folds=2)
    assert same == 4.0 and len(tied) == 2
    one = [r for r in tpu_rows if r.model_key == tpu_rows[0].model_key]
    assert choose_accelerator_prior_scale(one, scales=(2.0, 1.0)) == (2.0, {})


def test_a_calibration_left_to_choose_its_width_is_the_one_fitted_at_that_width(
    v5_rows: list[CalibrationRow],
) -> None:
    prep = {r.index: prepare_row(r) for r in v5_rows}
    best, _ = choose_accelerator_prior_scale(v5_rows, prepared=prep)
    chosen = fit_calibration(v5_rows, prepared=prep, accelerator_prior_scale=None)
    fixed = fit_calibration(v5_rows, prepared=prep, accelerator_prior_scale=best)
    assert chosen.params == fixed.params


def test_the_width_makes_a_difference_to_the_per_accelerator_fits(tpu_rows: list[CalibrationRow]) -> None:
    prep = {r.index: prepare_row(r) for r in tpu_rows}
    narrow = fit_calibration(tpu_rows, prepared=prep, accelerator_prior_scale=0.25)
    wide = fit_calibration(tpu_rows, prepared=prep, accelerator_prior_scale=4.0)
    group = narrow.params["google-tpu/xla/bf16"]
    assert wide.params["google-tpu/xla/bf16"] == group  # the group fit does not use the width
    acc_keys = [k for k in narrow.params if k.startswith("google-tpu/xla/bf16/")]
    assert acc_keys
    for k in acc_keys:  # a wider prior lets each accelerator move further from its group
        dist = lambda p: abs(p.mm_max / group.mm_max - 1) + abs(p.attn_ratio / group.attn_ratio - 1)  # noqa: E731
        assert dist(wide.params[k]) > dist(narrow.params[k])


def test_the_held_out_model_takes_no_part_in_choosing_its_refits_width(
    v5_rows: list[CalibrationRow],
) -> None:
    """Tripling the held-out model's measured step times changes neither the width its refit chose
    nor the step times predicted for it."""
    models = sorted({r.model_key for r in v5_rows})
    target = models[0]
    held = {h.row.index: h for h in leave_one_model_out(v5_rows, scales=(1.0, 4.0), folds=2)}
    moved = [
        replace(r, measured_step_time_s=3 * r.measured_step_time_s) if r.model_key == target else r
        for r in v5_rows
    ]
    again = [h for h in leave_one_model_out(moved, scales=(1.0, 4.0), folds=2) if h.row.model_key == target]
    assert again
    for h in again:
        before = held[h.row.index]
        assert h.accelerator_prior_scale == before.accelerator_prior_scale
        assert h.predicted_s == pytest.approx(before.predicted_s, rel=1e-12)
    # and a fixed width is used as given
    fixed = leave_one_model_out(v5_rows[:6], accelerator_prior_scale=2.5)
    assert {h.accelerator_prior_scale for h in fixed} == {2.5}
