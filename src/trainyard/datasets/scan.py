"""Pass 1 of ingestion over a run of lines: validate and normalise each row, and turn each batch of valid
rows into fixed-size facts (row hash, spool length, tokens, hash side, MinHash band keys).

:func:`scan` is the per-line loop; the sequential ingestion runs it over the whole upload, and each
worker of the parallel one (:mod:`trainyard.datasets.parallel`) over one byte range of the file, lines
numbered from 1 within the range. What it finds for a row depends on that row alone (and on the
format), never on the batch or range it falls in, so any split of the file into ranges, merged in file
order, gives the facts and errors of one sequential scan. Pure apart from calling ``emit``; no I/O.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from trainyard.datasets import minhash
from trainyard.datasets.formats import (
    FAST,
    ErrorKind,
    FastRow,
    RowError,
    byte_count,
    canonical_bytes,
    detect_format,
    normalize,
    parse_line,
    token_count,
)
from trainyard.errors import InvalidDatasetError, PayloadTooLargeError

SPLIT_BUCKETS = 10_000
BAND_BATCH = 2048  # rows per batch: its arrays stay small enough for malloc to reuse them
MINHASH_ROWS = 1024  # rows per MinHash call: its temporaries (~20 KB a row) bound a process's peak
EVAL_HASH = 1  # the flag bit of a row whose split key hashes to eval
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
HEAP_TRIM_BYTES = 32 << 20
HEAP_MMAP_BYTES = 8 << 20


@functools.cache
def keep_freed_heap() -> None:
    """Ask glibc's allocator to keep up to ``HEAP_TRIM_BYTES`` of freed memory at the top of the heap
    instead of returning it to the kernel, and to take blocks below ``HEAP_MMAP_BYTES`` from the heap
    (``mallopt``: ``M_TRIM_THRESHOLD``, ``M_MMAP_THRESHOLD``). Every batch's MinHash arrays (a few MB)
    are freed at its end; returned to the kernel, they are page-faulted in afresh by the next batch,
    which cost a third of the ingestion's CPU time as system time (benchmarks/bench_datasets.py). The
    process may keep that much freed memory resident. Nothing happens without ``mallopt`` (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(M_TRIM_THRESHOLD, HEAP_TRIM_BYTES)
    mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_BYTES)


# one row's facts from pass 1; ``prefix`` is the first 8 bytes of ``digest`` read as a big-endian
# integer (the two fields overlap), which orders rows as their digests do; ``start`` is the row's
# offset in the spool
ROW = np.dtype(
    {
        "names": ["digest", "prefix", "start", "length", "tokens"],
        "formats": ["S32", ">u8", "<i8", "<i8", "<i8"],
        "offsets": [0, 0, 32, 40, 48],
        "itemsize": 56,
    }
)


@dataclass(frozen=True)
class Rules:
    """What pass 1 needs of :class:`~trainyard.datasets.ingest.IngestOptions`."""

    eval_fraction: float
    seed: int
    max_tokens: int | None
    max_errors: int
    count_tokens: Callable[[str], int] = byte_count
    count_tokens_batch: Callable[[list[str]], list[int]] | None = None

    @property
    def threshold(self) -> int:
        return round(self.eval_fraction * SPLIT_BUCKETS)

    @property
    def salt(self) -> bytes:
        return f"trainyard-split/{self.seed}\n".encode()


class Errors:
    """Bad lines in line order: the first ``limit`` listed, all counted by kind."""

    def __init__(self, limit: int):
        self.limit = limit
        self.listed: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}
        self.total = 0

    def add(self, line: int, kind: ErrorKind, message: str) -> None:
        self.total += 1
        self.counts[kind.value] = self.counts.get(kind.value, 0) + 1
        if len(self.listed) < self.limit:
            self.listed.append({"line": line, "kind": kind.value, "message": message})

    def extend(self, other: Errors, line_offset: int) -> None:
        """Append the errors of the lines after these (``other``'s lines numbered from 1, which here
        are line ``line_offset + 1`` on)."""
        self.total += other.total
        for kind, n in other.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        for e in other.listed[: max(0, self.limit - len(self.listed))]:
            self.listed.append({**e, "line": e["line"] + line_offset})

    def raise_if_any(self, lines: int) -> None:
        if not self.total:
            return
        shown = ", ".join(str(e["line"]) for e in self.listed[:10])
        more = "" if self.total <= 10 else f" and {self.total - 10} more"
        raise InvalidDatasetError(
            f"{self.total} of {lines} lines are invalid (lines {shown}{more})",
            details={
                "errors": self.listed,
                "counts": dict(sorted(self.counts.items())),
                "total": self.total,
                "truncated": self.total > len(self.listed),
            },
        )


def auto_format(raw: bytes) -> str:
    """The format of the first non-blank line (raises RowError when it cannot be told)."""
    stripped = raw.strip()
    try:
        obj = orjson.loads(stripped)
    except orjson.JSONDecodeError:
        if stripped[:1] in (b"{", b"["):
            raise RowError(ErrorKind.BAD_JSON, "not valid JSON") from None
        return "text"
    fmt = detect_format(obj)
    if fmt is None:
        raise RowError(
            ErrorKind.MISSING_FIELD,
            "cannot tell the format: expected 'text', 'prompt' and 'completion', or 'messages'",
        )
    return fmt


def facts(
    canons: list[bytes], tokens: np.ndarray, keys: list[str], rules: Rules
) -> tuple[np.ndarray, bytes, np.ndarray]:
    """(ROW records with ``start`` counted from the batch's first byte, one flag byte a row, the
    (rows, N_BANDS) band keys) of one batch of valid rows."""
    n = len(canons)
    sha256 = hashlib.sha256
    recs = np.empty(n, dtype=ROW)
    recs["digest"] = np.frombuffer(b"".join([sha256(c).digest() for c in canons]), dtype="S32")
    lengths = np.fromiter((len(c) for c in canons), dtype=np.int64, count=n)
    ends = np.cumsum(lengths)
    recs["start"] = ends - lengths
    recs["length"] = lengths
    recs["tokens"] = tokens
    salt = rules.salt
    sides = b"".join([sha256(salt + k.encode("utf-8")).digest()[:8] for k in keys])
    on_eval = np.frombuffer(sides, dtype="<u8") % SPLIT_BUCKETS < rules.threshold
    flags = on_eval.astype(np.uint8).tobytes()  # EVAL_HASH is bit 0
    if n <= MINHASH_ROWS:
        return recs, flags, minhash.band_keys(keys)
    # a row's band keys do not depend on the other rows of the call: slices keep the arrays small
    bands = [minhash.band_keys(keys[lo : lo + MINHASH_ROWS]) for lo in range(0, n, MINHASH_ROWS)]
    return recs, flags, np.concatenate(bands)


# called once per batch of valid rows while no bad line has been seen: (canonical lines, tokens, keys)
Emit = Callable[[list[bytes], np.ndarray, list[str]], None]


def scan(
    lines: Iterable[bytes],
    fmt: str | None,
    rules: Rules,
    errors: Errors,
    emit: Emit,
    max_bytes: int,
) -> tuple[str | None, int, int]:
    """Validate and normalise every line of ``lines`` (numbered from 1), record the bad ones in
    ``errors`` and hand each batch of valid rows to ``emit`` (none once a bad line was seen); ``fmt``
    None takes the format of the first line that tells it. More than ``max_bytes`` is refused as it
    streams (PayloadTooLargeError). Returns (format, lines, bytes)."""
    # the current batch: valid rows (canonical lines, split keys, token counts so far, line numbers,
    # where their strings to count end in ``texts``) and the bad lines among them, in line order
    canons: list[bytes] = []
    keys: list[str] = []
    toks: list[int] = []
    row_lines: list[int] = []
    text_ends: list[int] = []
    texts: list[str] = []
    bad: list[tuple[int, ErrorKind, str]] = []
    batch_count = rules.count_tokens_batch
    count: Callable[[str], int] = rules.count_tokens
    if batch_count is not None:
        collect = texts.append

        def collect_text(text: str) -> int:  # the strings are counted at the batch's end, in one call
            collect(text)
            return 0

        count = collect_text
    max_tokens = rules.max_tokens
    lineno = 0
    nbytes = 0
    loads = orjson.loads
    bad_json = orjson.JSONDecodeError
    fast: Callable[[Any, Callable[[str], int]], FastRow | None] | None = None if fmt is None else FAST[fmt]

    def flush() -> None:
        nonlocal canons, keys, toks, row_lines, text_ends, bad
        n_tok = np.array(toks, dtype=np.int64)
        if batch_count is not None and texts:
            counted = np.zeros(len(texts) + 1, dtype=np.int64)
            np.cumsum(np.asarray(batch_count(texts), dtype=np.int64), out=counted[1:])
            ends = np.array(text_ends, dtype=np.int64)
            n_tok += counted[ends] - counted[np.r_[0, ends[:-1]]]
            texts.clear()
        if max_tokens is not None:
            for i in np.flatnonzero(n_tok > max_tokens).tolist():
                bad.append(
                    (
                        row_lines[i],
                        ErrorKind.TOO_LONG,
                        f"{int(n_tok[i])} tokens, more than the base model's context of {max_tokens}",
                    )
                )
            bad.sort(key=lambda e: e[0])
        for line, kind, message in bad:
            errors.add(line, kind, message)
        if canons and not errors.total:  # an invalid upload: keep validating, store nothing
            emit(canons, n_tok, keys)
        canons, keys, toks, row_lines, text_ends, bad = [], [], [], [], [], []

    for lineno, raw in enumerate(lines, 1):
        nbytes += len(raw)
        if nbytes > max_bytes:
            raise too_large(max_bytes)
        if raw.isspace() or not raw:
            continue
        mark = len(texts)
        try:
            if fast is None:
                if fmt is None:
                    fmt = auto_format(raw)
                fast = FAST[fmt]
            assert fmt is not None
            # a row already in canonical shape skips building a normalised copy; any other row (or a
            # line orjson refuses before it is stripped) takes the validating path
            got = None
            if fmt == "text":
                obj = parse_line(raw, fmt)
                got = fast(obj, count)
            else:
                try:
                    obj = loads(raw)
                except bad_json:
                    obj = parse_line(raw, fmt)  # raises the row's error
                else:
                    got = fast(obj, count)
            if got is None:
                del texts[mark:]  # what the fast path collected before it handed the row over
                row, key = normalize(obj, fmt)
                n_tok = token_count(row, count)
                canon = canonical_bytes(row) + b"\n"
            else:
                canon, key, n_tok = got
        except RowError as exc:
            del texts[mark:]
            bad.append((lineno, exc.kind, exc.message))
        else:
            canons.append(canon)
            keys.append(key)
            toks.append(n_tok)
            row_lines.append(lineno)
            text_ends.append(len(texts))
        if len(canons) + len(bad) >= BAND_BATCH:
            flush()
    flush()
    return fmt, lineno, nbytes


def too_large(max_bytes: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"the dataset exceeds the upload limit of {max_bytes} bytes",
        hint="Split the file, or ask an admin to raise TRAINYARD_DATASET_MAX_BYTES.",
        details={"max_bytes": max_bytes},
    )
