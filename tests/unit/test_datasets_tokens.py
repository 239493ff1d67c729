"""Token counts with a base model's tokenizer: counted in batches, equal to counting each string."""

from __future__ import annotations

import io
import json
import random
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from trainyard.datasets.ingest import BAND_BATCH, IngestOptions, ingest
from trainyard.datasets.tokens import TokenizerSpec, token_counters
from trainyard.errors import InvalidDatasetError

WORDS = ["red", "blue", "green", "café", "naïve", "über", "cat", "dog", "数据", "模型", "🙂", "x" * 30]


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> TokenizerSpec:
    """A byte-level BPE tokenizer trained here (nothing downloaded), saved as a model's tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    rng = random.Random(0)
    tok.train_from_iterator([" ".join(rng.choices(WORDS, k=12)) for _ in range(300)], trainer=trainer)
    d = tmp_path_factory.mktemp("tok")
    tok.save(str(d / "tokenizer.json"))
    return TokenizerSpec(name="tok@1", path=str(d), context_tokens=None)


def phrase(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(1, 40)))


def test_a_batch_counts_each_string_as_encode_does(spec: TokenizerSpec) -> None:
    one, batch = token_counters(spec)
    assert batch is not None
    rng = random.Random(1)
    texts = [phrase(rng) for _ in range(500)] + [
        "",
        " ",
        "\n\n",
        "e\u0301",
        unicodedata.normalize("NFD", "café"),
    ]
    assert batch(texts) == [one(t) for t in texts]
    assert sum(batch(texts)) > len(texts)  # a real tokenizer: more than one token a string
    assert token_counters(TokenizerSpec("bytes")) == (token_counters(TokenizerSpec("bytes"))[0], None)


def rows_of(fmt: str, n: int, rng: random.Random) -> list[Any]:
    rows: list[Any] = []
    for i in range(n):
        if fmt == "text":
            row: Any = f"{i} {phrase(rng)}" if i % 2 else {"text": f"{i} {phrase(rng)}"}
        elif fmt == "completion":
            row = {"prompt": f"{i} {phrase(rng)}", "completion": phrase(rng)}
        else:
            row = {
                "messages": [
                    {"role": "system", "content": "Réponds brièvement."},
                    {"role": "user", "content": f"{i} {phrase(rng)}"},
                    {"role": "assistant", "content": phrase(rng)},
                ]
            }
        if i % 7 == 3:  # not in canonical shape: NFD text or an extra key takes the validating path
            row = json.loads(unicodedata.normalize("NFD", json.dumps(row, ensure_ascii=False)))
            if isinstance(row, dict):
                row["meta"] = i
        rows.append(row)
    return rows


def upload(rows: list[Any], tmp: Path, **opts: Any) -> Any:
    raw = b"".join((r if isinstance(r, str) else json.dumps(r)).encode() + b"\n" for r in rows)
    return ingest(io.BytesIO(raw), IngestOptions(eval_fraction=0.2, **opts), tmp / "spool")


def refuse(text: str) -> int:
    raise AssertionError("counted one string at a time although a batch counter was given")


@pytest.mark.parametrize("fmt", ["text", "completion", "chat"])
def test_ingestion_counts_tokens_in_batches_with_the_same_counts(
    fmt: str, spec: TokenizerSpec, tmp_path: Path
) -> None:
    """Rows of every format, on the fast and the validating path, across several batches: the tokens of
    each split are those of counting every string with ``encode``, and ``encode`` is not called."""
    one, batch = token_counters(spec)
    assert batch is not None
    calls: list[int] = []

    def counted_batch(texts: list[str]) -> list[int]:
        calls.append(len(texts))
        return batch(texts)

    rows = rows_of(fmt, 2 * BAND_BATCH + 100, random.Random(2))
    per_string = upload(rows, tmp_path, count_tokens=one)
    batched = upload(rows, tmp_path, count_tokens=refuse, count_tokens_batch=counted_batch)
    assert batched.format == fmt
    assert per_string.train.tokens > 0 and per_string.eval.tokens > 0
    assert (batched.train.tokens, batched.eval.tokens) == (per_string.train.tokens, per_string.eval.tokens)
    assert batched.sha256 == per_string.sha256
    assert len(calls) == 3 and sum(calls) >= len(rows)  # one call per batch of rows
    per_string.close()
    batched.close()


def test_rows_too_long_for_the_context_are_found_by_the_batched_count(
    spec: TokenizerSpec, tmp_path: Path
) -> None:
    """The context check uses the batched counts: the same lines are too long, listed in line order
    among the other errors, whichever way tokens are counted."""
    one, batch = token_counters(spec)
    rng = random.Random(3)
    rows: list[Any] = rows_of("completion", BAND_BATCH + 50, rng)
    long_prompt = " ".join(["green blue 数据"] * 60)
    for at in (5, BAND_BATCH - 1, BAND_BATCH + 10):
        rows[at] = {"prompt": long_prompt, "completion": "yes"}
    rows[7] = {"prompt": "no completion"}
    limit = max(one(long_prompt) - 5, 1)
    assert all(
        one(r["prompt"]) + one(r["completion"]) + 1 <= limit
        for r in rows
        if r.get("prompt") != long_prompt and "completion" in r
    )
    found = []
    for opts in ({"count_tokens": one}, {"count_tokens": refuse, "count_tokens_batch": batch}):
        with pytest.raises(InvalidDatasetError) as info:
            upload(rows, tmp_path, max_tokens=limit, **opts)
        found.append(info.value.details)
        assert list((tmp_path / "spool").iterdir()) == []
    assert found[0] == found[1]
    assert [(e["line"], e["kind"]) for e in found[1]["errors"]] == [
        (6, "too_long"),
        (8, "missing_field"),
        (BAND_BATCH, "too_long"),
        (BAND_BATCH + 11, "too_long"),
    ]
