"""Guardrail datasets of the promotion gate: a metric measured on another dataset's examples must be
non-inferior within its margin; one Holm family with the own-split guardrails; the reasons name the
dataset; the gate's settings are checked (422 naming each field); the CLI's syntax."""

from __future__ import annotations

import numpy as np
import pytest

from trainyard.errors import InvalidInputError
from trainyard.evaluation import stats as S
from trainyard.evaluation.service import dataset_guardrails, gate_options
from trainyard.evaluation.stats import DatasetNonInferiority, MetricInput, NonInferiority, compare


def _own(rng: np.random.Generator, n: int = 300) -> dict[str, MetricInput]:
    """The evaluation's own split: loss clearly better, exact match unchanged."""
    base_loss = rng.gamma(2.0, 1.0, size=n)
    base_em = (rng.random(n) < 0.5).astype(float)
    return {
        "loss": MetricInput(base_loss - 0.3 + rng.normal(0, 0.3, size=n), base_loss, higher_is_better=False),
        "exact_match": MetricInput(base_em.copy(), base_em, binary=True),
    }


def _other(rng: np.random.Generator, n: int, shift: float) -> MetricInput:
    """Another dataset's per-example losses: the model's are ``shift`` higher on average."""
    base = rng.gamma(2.0, 1.0, size=n)
    return MetricInput(base + shift + rng.normal(0, 0.2, size=n), base, higher_is_better=False)


def test_a_worse_guardrail_dataset_blocks_an_otherwise_passing_gate_and_a_loose_margin_passes() -> None:
    rng = np.random.default_rng(5)
    own = _own(rng)
    worse = _other(rng, 80, 0.5)  # loss up by 0.5 on the other dataset (its own n: 80, not 300)
    assert compare(own, primary="loss").passed
    tight = compare(
        own, primary="loss", dataset_guardrails=[DatasetNonInferiority("ds://safety@2", "loss", 0.1, worse)]
    )
    assert tight.verdict == "better" and not tight.passed  # the primary verdict is the own split's
    (g,) = tight.non_inferiority
    assert g.dataset == "ds://safety@2" and g.n == 80 and g.delta == pytest.approx(0.5, abs=0.1)
    assert tight.reasons[0].startswith("loss on ds://safety@2: not shown non-inferior within margin 0.1")
    assert g.to_dict()["dataset"] == "ds://safety@2" and g.to_dict()["kind"] == "non_inferiority"
    loose = compare(
        own, primary="loss", dataset_guardrails=[DatasetNonInferiority("ds://safety@2", "loss", 2.0, worse)]
    )
    assert loose.passed and loose.non_inferiority[0].passed
    assert any(r.startswith("loss on ds://safety@2: non-inferior within margin 2") for r in loose.reasons)
    # an own-split guardrail entry carries no dataset
    both = compare(
        own,
        primary="loss",
        non_inferiority=[NonInferiority("exact_match", 0.05)],
        dataset_guardrails=[DatasetNonInferiority("ds://safety@2", "loss", 2.0, worse)],
    )
    assert both.passed and "dataset" not in both.non_inferiority[0].to_dict()


def test_holm_runs_over_own_split_and_dataset_guardrails_together() -> None:
    rng = np.random.default_rng(1)
    own = _own(rng)
    a, b = _other(rng, 60, 0.05), _other(rng, 120, -0.02)
    specs = [NonInferiority("exact_match", 0.05)]
    datasets = [
        DatasetNonInferiority("ds://a@1", "loss", 0.1, a),
        DatasetNonInferiority("ds://b@3", "loss", 0.1, b),
    ]
    holm = compare(own, primary="loss", non_inferiority=specs, dataset_guardrails=datasets)
    none = compare(own, primary="loss", non_inferiority=specs, dataset_guardrails=datasets, correction="none")
    raw = [g.p_value for g in none.non_inferiority]
    assert len(raw) == 3 and [g.dataset for g in holm.non_inferiority] == [None, "ds://a@1", "ds://b@3"]
    assert [g.p_value for g in holm.non_inferiority] == pytest.approx(raw)
    assert [g.p_adjusted for g in holm.non_inferiority] == pytest.approx(S.holm(raw))
    # a dataset guardrail's p-value is the one-sided paired t test on its own examples
    p, _bound = S.paired_t_noninferiority(-(np.asarray(a.model) - np.asarray(a.baseline)), 0.1, 0.05)
    assert none.non_inferiority[1].p_value == pytest.approx(p, rel=1e-12)
    # adding a guardrail dataset can only raise the other guardrails' adjusted p-values
    alone = compare(own, primary="loss", non_inferiority=specs)
    assert holm.non_inferiority[0].p_adjusted >= alone.non_inferiority[0].p_adjusted


def test_unmeasured_or_small_guardrail_datasets_fail_and_bad_settings_are_refused() -> None:
    rng = np.random.default_rng(2)
    own = _own(rng)
    missing = compare(
        own, primary="loss", dataset_guardrails=[DatasetNonInferiority("ds://x@1", "loss", 5.0)]
    )
    assert not missing.passed
    assert missing.non_inferiority[0].reason.startswith("not measured on ds://x@1")
    few = compare(
        own,
        primary="loss",
        dataset_guardrails=[DatasetNonInferiority("ds://x@1", "loss", 5.0, _other(rng, 12, 0))],
    )
    assert not few.passed and "12 paired examples" in few.non_inferiority[0].reason
    for bad in (
        [DatasetNonInferiority("ds://x@1", "loss", 0.0, _other(rng, 40, 0))],
        [DatasetNonInferiority("ds://x@1", "loss", 0.1, _other(rng, 40, 0))] * 2,
        [DatasetNonInferiority("ds://x@1", "loss", 0.1, MetricInput([1.0, 2.0], [1.0]))],
    ):
        with pytest.raises(ValueError):
            compare(own, primary="loss", dataset_guardrails=bad)


def test_gate_options_check_each_guardrail_dataset() -> None:
    gate = gate_options(None, None, None, None, [{"dataset": "ds://s@2", "margin": 0.05}])
    assert gate["guardrail_datasets"] == [
        {"dataset": "ds://s@2", "split": "eval", "metric": "loss", "margin": 0.05}
    ]
    assert "guardrail_datasets" not in gate_options(None, None, None, None)  # the stored gate is unchanged
    with pytest.raises(InvalidInputError) as err:
        gate_options(
            None,
            None,
            None,
            None,
            [
                {"dataset": "ds://s@2", "metric": "bleu", "margin": 0.1},
                {"dataset": "", "margin": -1},
                {"dataset": "ds://s@2", "split": "train", "margin": True},
                {"dataset": "ds://t@1", "margin": 0.1},
                {"dataset": "ds://t@1", "margin": 0.2},
            ],
        )
    fields = {e["field"] for e in err.value.details["errors"]}
    assert fields == {
        "guardrail_datasets.0.metric",
        "guardrail_datasets.1.dataset",
        "guardrail_datasets.1.margin",
        "guardrail_datasets.2.margin",
        "guardrail_datasets.4",
    }


def test_the_job_results_feed_the_dataset_guardrails() -> None:
    gate = gate_options(
        None,
        None,
        None,
        None,
        [
            {"dataset": "ds://s@2", "split": "train", "metric": "loss", "margin": 0.1},
            {"dataset": "ds://s@2", "split": "train", "metric": "exact_match", "margin": 0.1},
            {"dataset": "ds://gone@1", "margin": 0.1},
        ],
    )
    scores = {"loss": [1.0, 2.0], "exact_match": [1.0, 0.0]}
    res = {
        "guardrail_datasets": [{"dataset": "ds://s@2", "split": "train", "model": scores, "baseline": scores}]
    }
    loss, em, gone = dataset_guardrails(gate, res)
    assert loss.dataset == "ds://s@2 (train split)" and loss.scores is not None
    assert loss.scores.higher_is_better is False and not loss.scores.binary
    assert em.scores is not None and em.scores.binary
    assert gone.scores is None  # not measured: fails its guardrail


def test_cli_guardrail_datasets_parse() -> None:
    from trainyard.cli.eval_cmd import _guardrail_datasets

    assert _guardrail_datasets(["ds://safety@2:loss=0.05", "ds://safety@2#train:exact_match=0.02"]) == [
        {"dataset": "ds://safety@2", "split": "eval", "metric": "loss", "margin": 0.05},
        {"dataset": "ds://safety@2", "split": "train", "metric": "exact_match", "margin": 0.02},
    ]
    for bad in ("ds://safety@2", "ds://safety@2:loss", "ds://safety@2:loss=-1", ":loss=0.1", "ds://s@2:=0.1"):
        with pytest.raises(InvalidInputError):
            _guardrail_datasets([bad])
