"""The evaluator scores rows in batches: per-example losses, outputs, exact match and token counts equal
those of one row at a time (batch size 1), whatever the batch size, on rows of very different lengths
(so padding, attention masks and positions matter), and in the rows' own order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hf_models import WORDS, build_tiny_llama, completion_rows
from trainyard.evaluation.evaluator import (
    BatchTiming,
    _batches,
    evaluate_pair,
    latency_s_per_token,
    score_model,
    side_by_side,
    time_to_first_token_s,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("hf") / "tiny", seed=3)


def _mixed_rows() -> list[dict[str, Any]]:
    rows = completion_rows(9, seed=4)
    # prompts from one word to twenty, references from one word to six: padding on both sides matters
    for i in range(1, 12):
        prompt = " ".join(WORDS[(i * j) % len(WORDS)] for j in range(1 + (i * 7) % 20))
        completion = " " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(1 + i % 6))
        rows.append({"prompt": prompt, "completion": completion})
    return rows


@pytest.mark.parametrize(("batch_size", "max_tokens"), [(3, 2048), (8, 2048), (64, 2048), (64, 60)])
def test_batched_scores_equal_one_row_at_a_time(tiny: Path, batch_size: int, max_tokens: int) -> None:
    rows = _mixed_rows()
    one = score_model(tiny, rows, "completion", max_new_tokens=6, batch_size=1)
    many = score_model(
        tiny, rows, "completion", max_new_tokens=6, batch_size=batch_size, max_batch_tokens=max_tokens
    )
    assert many["batch_size"] == batch_size and one["batch_size"] == 1
    assert many["tokens"] == one["tokens"]
    assert many["loss"] == pytest.approx(one["loss"], abs=1e-5, rel=1e-5)
    assert many["mean_loss"] == pytest.approx(one["mean_loss"], abs=1e-5)
    assert many["outputs"] == one["outputs"]
    assert many["exact_match"] == one["exact_match"]
    assert many["generated_tokens"] == one["generated_tokens"]
    # the losses are per row, in the rows' order: they differ from row to row
    assert len(set(round(x, 4) for x in one["loss"])) > len(rows) // 2


def test_batched_loss_is_the_models_own_loss(tiny: Path) -> None:
    """The batched pass computes what the model's forward pass with -100 labels computes, row by row."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = _mixed_rows()[:6]
    got = score_model(tiny, rows, "completion", max_new_tokens=2, batch_size=6, generate=False)
    tok = AutoTokenizer.from_pretrained(str(tiny))
    model = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).eval()
    for row, loss, k in zip(rows, got["loss"], got["tokens"], strict=True):
        p = tok(row["prompt"] + "\n", add_special_tokens=False).input_ids
        r = tok(row["completion"], add_special_tokens=False).input_ids
        x = torch.tensor([p + r])
        labels = x.clone()
        labels[:, : len(p)] = -100
        with torch.inference_mode():
            ref = float(model(input_ids=x, labels=labels).loss)
        assert k == len(r) and loss == pytest.approx(ref, abs=1e-5)


def test_text_rows_are_batched_too(tiny: Path) -> None:
    rows = [{"text": " ".join(WORDS[: 2 + i])} for i in range(10)]
    one = score_model(tiny, rows, "text", batch_size=1)
    many = score_model(tiny, rows, "text", batch_size=4)
    assert "outputs" not in many and many["latency_s_per_token"] is None
    assert many["loss"] == pytest.approx(one["loss"], abs=1e-5)


def test_batches_hold_at_most_so_many_rows_and_padded_tokens() -> None:
    lengths = [3, 5, 5, 9, 40, 41, 300, 700]
    order = list(range(len(lengths)))
    chunks = list(_batches(order, lengths, 3, 100))
    assert [i for c in chunks for i in c] == order  # every row once, in order
    for c in chunks:
        assert len(c) <= 3
        assert len(c) == 1 or len(c) * max(lengths[i] for i in c) <= 100
    assert chunks == [[0, 1, 2], [3, 4], [5], [6], [7]]


def test_the_pair_runs_its_batches_in_alternating_turns() -> None:
    assert list(side_by_side(3, 2)) == [
        (0, ("model", "baseline")),
        (1, ("baseline", "model")),
        (2, ("model",)),
    ]
    assert list(side_by_side(1, 2)) == [(0, ("model", "baseline")), (1, ("baseline",))]
    assert list(side_by_side(0, 0)) == []


def test_latency_is_the_median_batch_so_one_stalled_batch_does_not_move_it() -> None:
    """Four batches of 10 steps at 10 ms a step and one held up 40x by another process: the latency
    the guardrail compares stays 10 ms a step (the total over the total would be 0.1 s)."""

    def steps(n: int, per_step_s: float) -> BatchTiming:  # a 50 ms first step, then per_step_s each
        return BatchTiming(
            took_s=0.05 + (n - 1) * per_step_s, steps=n, first_token_s=0.05, decode_s=(n - 1) * per_step_s
        )

    steady = [steps(11, 0.01)] * 4
    assert latency_s_per_token(steady) == pytest.approx(0.01)
    assert latency_s_per_token([*steady, steps(11, 0.4)]) == pytest.approx(0.01)
    # per step of each batch, not per batch: a batch of 20 steps in 0.2 s is as fast as one of 10 in 0.1
    assert latency_s_per_token([steps(21, 0.01), steps(11, 0.01), steps(31, 0.03)]) == pytest.approx(0.01)
    assert latency_s_per_token([steps(11, 0.01), steps(11, 0.03)]) == pytest.approx(0.02)  # the middle of two
    # a batch that decoded nothing (every budget 0) has no time per step
    assert latency_s_per_token([BatchTiming(0.5, 0), steps(11, 0.01)]) == pytest.approx(0.01)
    assert latency_s_per_token([BatchTiming(0.5, 0)]) is None and latency_s_per_token([]) is None


def test_latency_leaves_out_the_first_token_so_a_model_that_stops_early_is_not_slower() -> None:
    """The same 10 ms a step after a first step of 0.3 s (set-up and prompt on a busy machine): a model
    that stops after 3 steps and one that runs 33 have the same time per output token, where the whole
    call over its steps would make the first 0.107 s and the second 0.019 s a token."""
    early = BatchTiming(took_s=0.32, steps=3, first_token_s=0.3, decode_s=0.02)
    long = BatchTiming(took_s=0.62, steps=33, first_token_s=0.3, decode_s=0.32)
    assert latency_s_per_token([early]) == pytest.approx(0.01)
    assert latency_s_per_token([long]) == pytest.approx(0.01)
    assert time_to_first_token_s([early, long]) == pytest.approx(0.3)
    # one step has no interval after the first: it counts only when no batch has two
    one = BatchTiming(took_s=0.3, steps=1, first_token_s=0.3, decode_s=None)
    assert latency_s_per_token([one, early]) == pytest.approx(0.01)
    assert latency_s_per_token([one, BatchTiming(0.6, 2)]) == pytest.approx(0.3)  # 0.3 and 0.3 a step
    assert time_to_first_token_s([BatchTiming(0.5, 0, first_token_s=None)]) is None


def test_the_pair_is_scored_side_by_side_with_the_scores_of_each_alone(
    tiny: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The model and the baseline take turns a batch at a time (the progress after each round counts a
    batch of both), and each one's scores are those it gets scored alone."""
    other = build_tiny_llama(tmp_path_factory.mktemp("hf") / "other", seed=5)
    rows = _mixed_rows()  # 20 rows: batches of 8, 8 and 4 for each
    seen: list[int] = []
    pair = evaluate_pair(
        tiny, other, rows, fmt="completion", max_new_tokens=6, batch_size=8, progress=seen.append
    )
    assert seen == [0, 16, 32, 40]
    assert pair["n"] == 20 and pair["format"] == "completion"
    for key, path in (("model", tiny), ("baseline", other)):
        alone = score_model(path, rows, "completion", max_new_tokens=6, batch_size=8)
        assert pair[key]["loss"] == pytest.approx(alone["loss"], abs=1e-6)
        assert pair[key]["outputs"] == alone["outputs"]
        assert pair[key]["exact_match"] == alone["exact_match"]
        assert pair[key]["latency_s_per_token"] > 0 and pair[key]["latency_s_per_token_mean"] > 0
        assert pair[key]["time_to_first_token_s"] > 0
    assert pair["model"]["loss"] != pytest.approx(pair["baseline"]["loss"], abs=1e-3)
