"""Training data: deterministic, resumable sampling; corpora and tokenisation."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.runtime.data import (
    EOS_ID,
    N_SPECIAL,
    ByteTokenizer,
    CorpusDataset,
    DataError,
    Sampler,
    SyntheticDataset,
    build_dataset,
    mlm_mask,
    read_documents,
)


@given(
    global_batch=st.integers(1, 16),
    world_size=st.integers(1, 4),
    step=st.integers(0, 10_000),
)
@settings(max_examples=60, deadline=None)
def test_ranks_partition_each_global_batch(global_batch: int, world_size: int, step: int) -> None:
    if global_batch < world_size:
        return
    ds = SyntheticDataset(vocab_size=50, seq_len=4, seed=0)
    seen = []
    for r in range(world_size):
        seen.extend(Sampler(ds, global_batch, r, world_size).indices(step))
    assert sorted(seen) == list(range(step * global_batch, (step + 1) * global_batch))


def test_synthetic_corpus_is_a_pure_function_of_seed_and_index() -> None:
    a = SyntheticDataset(vocab_size=64, seq_len=32, seed=3)
    b = SyntheticDataset(vocab_size=64, seq_len=32, seed=3)
    c = SyntheticDataset(vocab_size=64, seq_len=32, seed=4)
    assert np.array_equal(a.sample(17), b.sample(17))
    assert not np.array_equal(a.sample(17), c.sample(17))
    assert not np.array_equal(a.sample(17), a.sample(18))
    s = a.sample(5)
    assert s.min() >= N_SPECIAL and s.max() < 64
    # Markov structure: every transition is one of the table's successors
    for x, y in itertools.pairwise(s):
        assert y in a.table[x]


def test_sampler_batches_replay_identically_after_resume() -> None:
    ds = SyntheticDataset(vocab_size=40, seq_len=8, seed=1)
    full = [Sampler(ds, 6, 1, 2).batch(Sampler(ds, 6, 1, 2).indices(s)) for s in range(10)]
    resumed = Sampler(SyntheticDataset(vocab_size=40, seq_len=8, seed=1), 6, 1, 2)
    for s in range(5, 10):
        assert np.array_equal(resumed.batch(resumed.indices(s)), full[s])
    assert resumed.state(5) == {"step": 5, "samples_seen": 30, "global_batch": 6, "epoch": 0, "position": 30}


def test_corpus_windows_reshuffle_per_epoch_and_cover_everything(tmp_path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"document number {i} " * 3}) for i in range(20)))
    ds = build_dataset(str(path), vocab_size=300, seq_len=16, seed=0)
    assert isinstance(ds, CorpusDataset)
    n = ds.n_windows
    epoch0 = {tuple(ds.sample(i)) for i in range(n)}
    epoch1 = [tuple(ds.sample(n + i)) for i in range(n)]
    assert epoch0 == set(epoch1)  # every window once per epoch
    assert [tuple(ds.sample(i)) for i in range(n)] != epoch1  # but in a new order
    assert ds.position(n + 3) == {"epoch": 1, "position": 3}


def test_text_file_url_and_byte_tokens(tmp_path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("hello\n\nworld")
    assert read_documents(path) == ["hello", "world"]
    ds = build_dataset(f"file://{path}", vocab_size=300, seq_len=4, seed=0)
    assert isinstance(ds, CorpusDataset)
    toks = ByteTokenizer(300).encode("hi")
    assert toks == [N_SPECIAL + ord("h"), N_SPECIAL + ord("i")]
    assert EOS_ID in ds.windows.reshape(-1)
    # small vocabularies fold bytes into range
    assert max(ByteTokenizer(10).encode("xyz~")) < 10


def test_bad_datasets_are_user_errors(tmp_path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        build_dataset(str(tmp_path / "missing.jsonl"), vocab_size=300, seq_len=4, seed=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2"):
        build_dataset(str(bad), vocab_size=300, seq_len=4, seed=0)
    with pytest.raises(DataError, match="not a local file"):
        build_dataset("s3://bucket/x.jsonl", vocab_size=300, seq_len=4, seed=0)


def test_mlm_mask_depends_on_sample_index_only() -> None:
    tokens = np.arange(40, dtype=np.int64).reshape(2, 20) + N_SPECIAL
    a_in, a_lab = mlm_mask(tokens, [7, 8], seed=0, vocab_size=100)
    b_in, b_lab = mlm_mask(tokens[1:], [8], seed=0, vocab_size=100)
    assert np.array_equal(a_in[1], b_in[0]) and np.array_equal(a_lab[1], b_lab[0])
    assert ((a_lab != -100).sum(axis=1) >= 1).all()
