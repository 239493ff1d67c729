"""Token counters for ingestion: the default byte tokenizer, or a Hugging Face tokenizer directory.

``model_tokenizer(version)`` is the tokenizer of a registered model version (``--base NAME@V``): its
``tokenizer.json`` (the files the runtime loads with ``AutoTokenizer``) and its context in tokens from
``config.json`` (``max_position_embeddings``, ``n_positions`` or ``max_sequence_length``). Strings are
counted as the runtime encodes them: without special tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.datasets.formats import byte_count
from trainyard.errors import InvalidInputError


@dataclass(frozen=True)
class TokenizerSpec:
    """How to count tokens for a base model: its name, its tokenizer directory (None: bytes) and its
    context length in tokens (None: unlimited)."""

    name: str
    path: str | None = None
    context_tokens: int | None = None


BYTES = TokenizerSpec("bytes")
BATCH_CHARS = 64 << 10  # characters encoded in one call (each token's encoding is ~100 bytes)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def model_tokenizer(version: Any) -> TokenizerSpec:
    """The TokenizerSpec of a registry ``ModelVersion`` (its id, tokenizer directory and context)."""
    config = dict(getattr(version, "config", None) or {})
    context = next(
        (int(config[k]) for k in CONTEXT_KEYS if isinstance(config.get(k), int) and config[k] > 0), None
    )
    return TokenizerSpec(name=version.id, path=str(version.artefacts["tokenizer"]), context_tokens=context)


def token_counter(spec: TokenizerSpec) -> Callable[[str], int]:
    return token_counters(spec)[0]


def token_counters(
    spec: TokenizerSpec,
) -> tuple[Callable[[str], int], Callable[[list[str]], list[int]] | None]:
    """(count one string, count a list of strings in one call — None for the byte tokenizer, whose
    count is a length). The batch counter is the fast tokenizer's ``encode_batch_fast`` (the ids of
    ``encode_batch`` without the character offsets), so each string is counted as ``encode`` counts
    it; ingestion calls it once per batch of rows instead of calling ``encode`` per string."""
    if spec.path is None:
        return byte_count, None
    path = Path(spec.path)
    file = path / "tokenizer.json" if path.is_dir() else path
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(file))
    except Exception as exc:
        raise InvalidInputError(
            f"the tokenizer of {spec.name} cannot be loaded ({type(exc).__name__})",
            hint="The base model's directory needs a tokenizer.json (a Hugging Face fast tokenizer).",
        ) from None
    encode_batch = getattr(tok, "encode_batch_fast", None) or tok.encode_batch

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    def count_batch(texts: list[str]) -> list[int]:
        counts: list[int] = []
        lo = 0
        while lo < len(texts):  # slices of about BATCH_CHARS: a slice's encodings are held at once
            hi, size = lo, 0
            while hi < len(texts) and (hi == lo or size < BATCH_CHARS):
                size += len(texts[hi])
                hi += 1
            counts.extend(len(e) for e in encode_batch(texts[lo:hi], add_special_tokens=False))
            lo = hi
        return counts

    return count, count_batch
