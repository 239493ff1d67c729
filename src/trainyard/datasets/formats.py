"""Row formats of fine-tuning data (JSON Lines), their validation and their canonical form.

Formats (DESIGN §3.7):

- ``text``: a plain line, or ``{"text": "..."}``;
- ``completion``: ``{"prompt": "...", "completion": "..."}``;
- ``chat``: ``{"messages": [{"role": "system|user|assistant|tool", "content": "..."}, ...]}`` as in the
  OpenAI fine-tuning format (``name`` and an assistant ``weight`` of 0 or 1 are kept; other keys are
  dropped).

A row is normalised to the fields above only, every string in Unicode NFC, and serialised as canonical
JSON (sorted keys, no insignificant whitespace, UTF-8), so the same data written with other key order,
spacing or escaping has the same bytes and the same hash. Pure functions; no I/O.

Error kinds follow the OpenAI cookbook's fine-tuning data check (``bad_json``, ``data_type``,
``missing_field``, ``wrong_type``, ``unknown_role``, ``empty_content``, ``no_assistant_turn``) plus
``bad_encoding``, ``wrong_format`` (a row of another format than the dataset's) and ``too_long`` (more
tokens than the base model's context).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import orjson

SCHEMA_VERSION = 1
FORMATS = ("text", "completion", "chat")
ROLES = frozenset({"system", "user", "assistant", "tool"})
CHAT_TOKENS_PER_MESSAGE = 4  # role and separators, as the cookbook counts them


class ErrorKind(StrEnum):
    BAD_ENCODING = "bad_encoding"
    BAD_JSON = "bad_json"
    DATA_TYPE = "data_type"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    WRONG_FORMAT = "wrong_format"
    UNKNOWN_ROLE = "unknown_role"
    EMPTY_CONTENT = "empty_content"
    NO_ASSISTANT_TURN = "no_assistant_turn"
    TOO_LONG = "too_long"


class RowError(ValueError):
    def __init__(self, kind: ErrorKind, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def nfc(s: str) -> str:
    return s if unicodedata.is_normalized("NFC", s) else unicodedata.normalize("NFC", s)


def canonical_bytes(doc: Any) -> bytes:
    """Canonical JSON: sorted keys, no insignificant whitespace, UTF-8 (non-ASCII unescaped). For rows
    (strings and small integers only) these are the bytes of ``json.dumps(doc, ensure_ascii=False,
    sort_keys=True, separators=(",", ":"))``; orjson writes them several times faster."""
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def canonical_json(doc: Any) -> str:
    return canonical_bytes(doc).decode("utf-8")


def detect_format(obj: Any) -> str | None:
    """The format a parsed row looks like (None when it looks like none)."""
    if isinstance(obj, str):
        return "text"
    if not isinstance(obj, dict):
        return None
    if "messages" in obj:
        return "chat"
    if "prompt" in obj or "completion" in obj:
        return "completion"
    if "text" in obj:
        return "text"
    return None


def parse_line(raw: bytes, fmt: str) -> Any:
    """Parse one non-blank line; a ``text`` line that is not JSON is its own text."""
    line = raw.strip()
    if fmt == "text" and line[:1] not in (b"{", b'"', b"["):
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RowError(ErrorKind.BAD_ENCODING, f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as uexc:
            msg = f"not UTF-8 ({uexc.reason} at byte {uexc.start})"
            raise RowError(ErrorKind.BAD_ENCODING, msg) from None
        raise RowError(ErrorKind.BAD_JSON, f"not valid JSON ({exc})") from None


def _string(obj: dict[str, Any], key: str, where: str = "") -> str:
    if key not in obj:
        raise RowError(ErrorKind.MISSING_FIELD, f"missing field {where}{key!r}")
    v = obj[key]
    if not isinstance(v, str):
        raise RowError(ErrorKind.WRONG_TYPE, f"{where}{key!r} must be a string, not {type(v).__name__}")
    return nfc(v)


def normalize(obj: Any, fmt: str) -> tuple[dict[str, Any], str]:
    """(canonical row, split key) of a parsed row in format ``fmt``; raises RowError.

    The split key is the text that decides the held-out side: the text, the prompt, or every chat turn
    before the last assistant turn except system turns, so one prompt never lands on both sides."""
    if fmt == "text":
        if isinstance(obj, str):
            text = nfc(obj)
        elif isinstance(obj, dict) and "text" in obj:
            text = _string(obj, "text")
        else:
            raise _mismatch(obj, fmt)
        if not text.strip():
            raise RowError(ErrorKind.EMPTY_CONTENT, "the text is empty")
        return {"text": text}, text
    if not isinstance(obj, dict):
        raise RowError(ErrorKind.DATA_TYPE, f"a row must be a JSON object, not {type(obj).__name__}")
    if fmt == "completion":
        if "messages" in obj or ("text" in obj and "prompt" not in obj):
            raise _mismatch(obj, fmt)
        prompt = _string(obj, "prompt")
        completion = _string(obj, "completion")
        if not completion.strip():
            raise RowError(ErrorKind.EMPTY_CONTENT, "the completion is empty")
        return {"prompt": prompt, "completion": completion}, prompt
    if fmt == "chat":
        return _chat(obj)
    raise ValueError(f"unknown format {fmt!r}")


def _mismatch(obj: Any, fmt: str) -> RowError:
    seen = detect_format(obj)
    if seen is not None and seen != fmt:
        return RowError(ErrorKind.WRONG_FORMAT, f"a {seen} row in a {fmt} dataset")
    if not isinstance(obj, dict):
        return RowError(ErrorKind.DATA_TYPE, f"a row must be a JSON object, not {type(obj).__name__}")
    need = {"text": "'text'", "completion": "'prompt' and 'completion'", "chat": "'messages'"}[fmt]
    return RowError(ErrorKind.MISSING_FIELD, f"missing field {need}")


def _chat(obj: dict[str, Any]) -> tuple[dict[str, Any], str]:
    if "messages" not in obj:
        raise _mismatch(obj, "chat")
    msgs = obj["messages"]
    if not isinstance(msgs, list):
        raise RowError(ErrorKind.WRONG_TYPE, f"'messages' must be a list, not {type(msgs).__name__}")
    if not msgs:
        raise RowError(ErrorKind.EMPTY_CONTENT, "'messages' is empty")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]."
        if not isinstance(m, dict):
            raise RowError(ErrorKind.DATA_TYPE, f"messages[{i}] must be an object, not {type(m).__name__}")
        role = _string(m, "role", where)
        if role not in ROLES:
            raise RowError(
                ErrorKind.UNKNOWN_ROLE,
                f"messages[{i}] has unknown role {role!r} (use {', '.join(sorted(ROLES))})",
            )
        content = _string(m, "content", where)
        if not content.strip():
            raise RowError(ErrorKind.EMPTY_CONTENT, f"messages[{i}] ({role}) has empty content")
        msg: dict[str, Any] = {"role": role, "content": content}
        if isinstance(m.get("name"), str):
            msg["name"] = nfc(m["name"])
        if role == "assistant" and "weight" in m:
            if m["weight"] not in (0, 1) or isinstance(m["weight"], bool):
                raise RowError(ErrorKind.WRONG_TYPE, f"messages[{i}].weight must be 0 or 1")
            msg["weight"] = int(m["weight"])
        out.append(msg)
    last_assistant = max((i for i, m in enumerate(out) if m["role"] == "assistant"), default=-1)
    if last_assistant < 0:
        raise RowError(ErrorKind.NO_ASSISTANT_TURN, "no assistant message to learn from")
    # system turns are left out of the key: one system prompt shared by every row must not make all rows
    # one near-duplicate cluster
    key = "\n".join(f"{m['role']}: {m['content']}" for m in out[:last_assistant] if m["role"] != "system")
    return {"messages": out}, key


FastRow = tuple[bytes, str, int]  # (canonical line with its newline, split key, tokens)
_CANONICAL_LINE = orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE


def _kept(s: str) -> bool:
    """Not blank and already NFC: what :func:`normalize` keeps unchanged."""
    if not s or s.isspace():
        return False
    return s.isascii() or unicodedata.is_normalized("NFC", s)


def fast_chat(obj: Any, count: Callable[[str], int]) -> FastRow | None:
    """The canonical line, split key and tokens of a chat row that is already in canonical shape
    (only ``messages``; each message only a known ``role`` and NFC, non-blank ``content``; an assistant
    turn), which :func:`normalize` would return unchanged; None for any other row, which then takes
    the validating path (so its result, or its error, is exactly :func:`normalize`'s)."""
    if type(obj) is not dict or len(obj) != 1:
        return None
    msgs = obj.get("messages")
    if type(msgs) is not list or not msgs:
        return None
    by_bytes = count is byte_count
    tokens = 1
    parts: list[str] = []  # the key's turns: every non-system turn
    cut = -1  # how many of them come before the last assistant turn
    for m in msgs:
        if type(m) is not dict or len(m) != 2:
            return None
        role = m.get("role")
        content = m.get("content")
        if type(role) is not str or role not in ROLES or type(content) is not str:
            return None
        if not content or content.isspace():
            return None
        if content.isascii():
            tokens += (len(content) if by_bytes else count(content)) + CHAT_TOKENS_PER_MESSAGE
        elif unicodedata.is_normalized("NFC", content):
            tokens += count(content) + CHAT_TOKENS_PER_MESSAGE
        else:
            return None
        if role == "assistant":
            cut = len(parts)
        if role != "system":
            parts.append(f"{role}: {content}")
    if cut < 0:
        return None
    return orjson.dumps(obj, option=_CANONICAL_LINE), "\n".join(parts[:cut]), tokens


def fast_completion(obj: Any, count: Callable[[str], int]) -> FastRow | None:
    """As :func:`fast_chat`, for a ``{"prompt", "completion"}`` row of NFC strings."""
    if type(obj) is not dict or len(obj) != 2:
        return None
    prompt = obj.get("prompt")
    completion = obj.get("completion")
    if type(prompt) is not str or type(completion) is not str or not _kept(completion):
        return None
    if not (prompt.isascii() or unicodedata.is_normalized("NFC", prompt)):
        return None
    tokens = count(prompt) + count(completion) + 1
    return orjson.dumps(obj, option=_CANONICAL_LINE), prompt, tokens


def fast_text(obj: Any, count: Callable[[str], int]) -> FastRow | None:
    """As :func:`fast_chat`, for a text row (a string, or ``{"text"}``) that is NFC and not blank."""
    if type(obj) is str:
        text = obj
    elif type(obj) is dict and len(obj) == 1 and type(obj.get("text")) is str:
        text = obj["text"]
    else:
        return None
    if not _kept(text):
        return None
    return orjson.dumps({"text": text}, option=_CANONICAL_LINE), text, count(text) + 1


FAST = {"chat": fast_chat, "completion": fast_completion, "text": fast_text}


def token_count(row: dict[str, Any], count: Callable[[str], int]) -> int:
    """Tokens of one canonical row (plus one end-of-sequence token)."""
    if "text" in row:
        return count(row["text"]) + 1
    if "prompt" in row:
        return count(row["prompt"]) + count(row["completion"]) + 1
    return sum(count(m["content"]) + CHAT_TOKENS_PER_MESSAGE for m in row["messages"]) + 1


def byte_count(text: str) -> int:
    """The default byte tokenizer's count (one token per UTF-8 byte, as the runtime encodes)."""
    return len(text.encode("utf-8")) if not text.isascii() else len(text)
