"""Tiny real Hugging Face models for tests: a randomly initialised Llama with a word-level tokenizer
trained on the fly (with a chat template), saved as an ordinary HF directory, and LoRA adapters over it.

Everything is built locally in well under a second; nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
BROKEN_CHAT_TEMPLATE = "{{ raise_exception('this model has no usable chat template') }}"
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a model serves tokens to many users at once",
    "hello world this is a tiny language model for tests",
    "paris is the capital of france and berlin of germany",
    "one two three four five six seven eight nine ten",
    "red green blue yellow black white orange purple",
    "system user assistant say something short please",
]
SPECIAL = ["<unk>", "<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


def build_tokenizer(out_dir: Path, *, chat_template: str = CHAT_TEMPLATE) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=SPECIAL, min_frequency=1))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
    )
    fast.chat_template = chat_template
    fast.save_pretrained(out_dir)
    return fast


def build_tiny_llama(
    out_dir: Path,
    *,
    seed: int = 0,
    hidden_size: int = 32,
    n_layers: int = 2,
    chat_template: str = CHAT_TEMPLATE,
) -> Path:
    """A random Llama (safetensors) plus its tokenizer in ``out_dir``; returns ``out_dir``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out_dir, chat_template=chat_template)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        initializer_range=0.5,  # spread logits so greedy decoding is not decided by rounding
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    # never generate the special tokens: answers are words and run to max_tokens
    model.generation_config.suppress_tokens = list(range(len(SPECIAL)))
    model.save_pretrained(out_dir)
    return out_dir


def build_lora_adapter(base_dir: Path, out_dir: Path, *, seed: int = 1, rank: int = 4) -> Path:
    """A LoRA adapter over ``base_dir`` with random (non-zero) weights, so its outputs differ."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    torch.manual_seed(seed)
    cfg = LoraConfig(
        r=rank, lora_alpha=rank * 4, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.mul_(8.0)
    peft_model.save_pretrained(out_dir)
    return out_dir


def place_model_version(
    storage_root: Path, tenant: str, name: str, version: int, source: Path, *, base: str | None = None
) -> Path:
    """Copy an HF (or adapter) directory into a tenant's model area as ``name@version``."""
    import shutil

    dest = storage_root / "tenants" / tenant / "models" / name / str(version)
    shutil.copytree(source, dest)
    if base is not None:
        (dest / "trainyard-model.json").write_text(json.dumps({"base": base}))
    return dest


def set_alias(storage_root: Path, tenant: str, name: str, alias: str, version: int) -> None:
    path = storage_root / "tenants" / tenant / "models" / name / "aliases.json"
    current = json.loads(path.read_text()) if path.exists() else {}
    current[alias] = version
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(current))
    tmp.replace(path)
