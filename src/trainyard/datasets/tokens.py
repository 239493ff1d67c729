"""Token counters for ingestion: the default byte tokenizer, or a Hugging Face tokenizer directory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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


def token_counter(spec: TokenizerSpec) -> Callable[[str], int]:
    if spec.path is None:
        return byte_count
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

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    return count
