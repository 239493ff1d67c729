"""API keys: ``ty_<prefix>_<secret>``. Only the SHA-256 of the whole key is stored; the key is shown once.

Keys carry 256 bits of randomness, so a fast hash is enough (no password stretching needed); the
stored and presented hashes are compared with :func:`hmac.compare_digest` (constant time).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

KEY_PREFIX = "ty"
_KEY_RE = re.compile(r"^ty_([A-Za-z0-9]{8})_([A-Za-z0-9_\-]{20,128})$")


@dataclass(frozen=True)
class NewKey:
    plaintext: str  # shown to the user exactly once
    prefix: str  # public lookup handle, safe to log
    sha256: str


def generate_key() -> NewKey:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    prefix = "".join(secrets.choice(alphabet) for _ in range(8))
    plaintext = f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    return NewKey(plaintext=plaintext, prefix=prefix, sha256=hash_key(plaintext))


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def key_prefix(plaintext: str) -> str | None:
    """The lookup prefix of a well-formed key, or None for anything else."""
    m = _KEY_RE.match(plaintext)
    return m.group(1) if m else None


def verify(plaintext: str, stored_sha256: str) -> bool:
    return hmac.compare_digest(hash_key(plaintext).encode("ascii"), stored_sha256.encode("ascii"))


def redact(plaintext: str) -> str:
    """What may appear in logs: the prefix only."""
    p = key_prefix(plaintext)
    return f"ty_{p}_…" if p else "(malformed key)"
