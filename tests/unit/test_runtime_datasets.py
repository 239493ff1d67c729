"""The runtime side of registered datasets: reading a version's splits, loss masks, masked loss."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trainyard.datasets.ingest import IngestOptions, ingest
from trainyard.runtime.data import (
    BOS_ID,
    DATASET_MANIFEST_ENV,
    EOS_ID,
    IGNORE_INDEX,
    ByteTokenizer,
    CorpusDataset,
    DataError,
    ExampleDataset,
    build_datasets,
)

TOK = ByteTokenizer(260)


def test_completion_labels_cover_only_the_completion() -> None:
    ds = ExampleDataset([{"prompt": "2+2=", "completion": "4!"}], TOK, 16, 0, "t")
    toks, labels = ds.tokens[0], ds.label_ids[0]
    assert toks[0] == BOS_ID
    enc = TOK.encode("2+2=") + TOK.encode("4!")
    assert list(toks[1 : 1 + len(enc)]) == enc and toks[1 + len(enc)] == EOS_ID
    assert list(labels[:5]) == [IGNORE_INDEX] * 5  # BOS + the 4 prompt bytes
    assert list(labels[5:8]) == [*TOK.encode("4!"), EOS_ID]
    assert (labels[8:] == IGNORE_INDEX).all()  # padding


def test_chat_labels_cover_only_assistant_turns_with_weight() -> None:
    row = {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "no", "weight": 0},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "yes"},
        ]
    }
    ds = ExampleDataset([row], TOK, 128, 0, "t")
    labelled = [int(t) for t, lab in zip(ds.tokens[0], ds.label_ids[0], strict=True) if lab != IGNORE_INDEX]
    assert labelled == [*TOK.encode("yes"), EOS_ID]


def test_a_prompt_longer_than_the_window_keeps_the_answer() -> None:
    ds = ExampleDataset([{"prompt": "x" * 100, "completion": "ok"}], TOK, 16, 0, "t")
    assert (ds.label_ids[0] != IGNORE_INDEX).sum() == 3


def test_masked_loss_is_the_loss_of_the_answer_tokens_only() -> None:
    from trainyard.runtime.modeling import build_model, forward_loss
    from trainyard.spec.models import JobSpec

    spec = JobSpec.model_validate(
        {
            "apiVersion": "trainyard/v1",
            "kind": "TrainingJob",
            "name": "m",
            "model": {
                "architecture": "decoder",
                "n_layers": 1,
                "d_model": 32,
                "n_heads": 2,
                "vocab_size": 260,
            },
            "workload": {"seq_len": 16, "global_batch": 1, "steps": 1, "precision": "fp32"},
        }
    )
    torch.manual_seed(0)
    built = build_model(spec)
    ds = ExampleDataset([{"prompt": "abcdefgh", "completion": "xyz"}], TOK, 16, 0, "t")
    tokens = torch.from_numpy(ds.tokens[:1].copy())
    labels = torch.from_numpy(ds.label_ids[:1].copy())
    with torch.no_grad():
        masked = float(forward_loss(built, tokens, labels))
        full = float(forward_loss(built, tokens, None))
        logits = built.model(input_ids=tokens).logits[0, :-1]
        target = labels[0, 1:]
        keep = target != IGNORE_INDEX
        manual = float(torch.nn.functional.cross_entropy(logits[keep], target[keep]))
    assert masked == pytest.approx(manual, rel=1e-5)
    assert masked != pytest.approx(full, rel=1e-3)


def _version(tmp_path: Path, rows: list[dict[str, Any]], **opts: Any) -> dict[str, Any]:
    body = io.BytesIO(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    ing = ingest(body, IngestOptions(**opts), tmp_path / "spool")
    url = f"file://{tmp_path}/v"
    man = ing.write(url)
    return {
        "id": "ds://t@1",
        "sha256": ing.sha256,
        "format": ing.format,
        "splits": {k: {**man["splits"][k], "url": f"{url}/{k}.jsonl"} for k in ("train", "eval")},
    }


def test_build_datasets_reads_a_registered_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(40)]
    manifest = _version(tmp_path, rows, eval_fraction=0.25)
    monkeypatch.setenv(DATASET_MANIFEST_ENV, json.dumps(manifest))
    train, evals = build_datasets("ds://t@1", vocab_size=260, seq_len=16, seed=0)
    assert isinstance(train, ExampleDataset) and isinstance(evals, ExampleDataset)
    assert train.n_windows + evals.n_windows == 40
    assert train.n_windows == manifest["splits"]["train"]["rows"]
    with pytest.raises(DataError, match="not ds://other@2"):
        build_datasets("ds://other@2", vocab_size=260, seq_len=16, seed=0)
    text = _version(tmp_path / "text", [{"text": f"document {i}"} for i in range(10)], eval_fraction=0.0)
    monkeypatch.setenv(DATASET_MANIFEST_ENV, json.dumps(text))
    t, e = build_datasets("ds://t@1", vocab_size=260, seq_len=8, seed=0)
    assert isinstance(t, CorpusDataset) and e is None
    Path(text["splits"]["train"]["url"][len("file://") :]).write_text('{"text": "tampered"}\n')
    with pytest.raises(DataError, match="sha256"):
        build_datasets("ds://t@1", vocab_size=260, seq_len=8, seed=0)
    assert np.array_equal(train.sample(3), train.sample(3))
