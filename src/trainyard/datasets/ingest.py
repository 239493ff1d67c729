"""Streaming ingestion: validate, normalise, de-duplicate, content-address and split one JSONL upload.

Three passes, none of which holds the data in memory:

1. read the upload line by line (a size limit is enforced as it streams), validate and normalise each
   row (:mod:`trainyard.datasets.formats`), and append its canonical line to a local spool file; per row
   only fixed-size facts are kept in arrays: its sha256 (32 bytes), spool offset, token count, hash side
   and 16 MinHash band keys (about 110 bytes a row). Every bad line is reported (up to ``max_errors``
   listed, all counted by kind); once one is found nothing more is spooled. A row already in canonical
   shape (NFC strings, no extra keys) skips building a normalised copy (``formats.FAST``); any other
   row takes the validating path, so results and errors are the same either way. Valid rows are
   handled in batches of ``BAND_BATCH``: one spool write, their sha256s and split hashes, and one
   vectorised MinHash call.
2. sort the row hashes: exact duplicates drop out (the first occurrence stays), and the dataset's
   content address is ``sha256("trainyard-dataset/v<SCHEMA_VERSION>\\n" ‖ sorted unique row hashes)``,
   the same whatever the row order or JSON formatting. The held-out side of a row is
   ``sha256(seed ‖ split key) mod 10000 < eval_fraction · 10000`` (split key: text, prompt, or the chat
   turns before the last answer), so a row lands on the same side in every version; near-duplicate
   clusters (:mod:`trainyard.datasets.minhash`) go to eval only when every member hashes to eval, so
   no eval row has a near-duplicate in train.
3. write each split as canonical JSONL sorted by row hash (equal content → equal bytes) through fsspec,
   hashing the bytes as they are written: each split's ``sha256`` is ``sha256sum`` of its file.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import secrets
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from trainyard.datasets import minhash
from trainyard.datasets.formats import (
    FAST,
    FORMATS,
    SCHEMA_VERSION,
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
from trainyard.errors import InvalidDatasetError, InvalidInputError, PayloadTooLargeError

DEFAULT_MAX_BYTES = 2 * 2**30
DEFAULT_MAX_ERRORS = 100
SPLIT_BUCKETS = 10_000
BAND_BATCH = 2048  # rows per batch: its arrays stay small enough for malloc to reuse them
WRITE_CHUNK_BYTES = 1 << 20
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
HEAP_TRIM_BYTES = 32 << 20
HEAP_MMAP_BYTES = 8 << 20
ROW_BLOCK = 8192  # rows whose offsets are turned into Python ints at a time


@dataclass(frozen=True)
class IngestOptions:
    format: str = "auto"
    eval_fraction: float = 0.1
    seed: int = 0
    max_bytes: int = DEFAULT_MAX_BYTES
    max_errors: int = DEFAULT_MAX_ERRORS
    max_tokens: int | None = None  # the base model's context; longer rows are errors
    count_tokens: Callable[[str], int] = byte_count
    tokenizer: str = "bytes"

    def check(self) -> None:
        errors = []
        if self.format not in ("auto", *FORMATS):
            errors.append({"field": "format", "message": f"use auto, {', '.join(FORMATS)}"})
        if not 0 <= self.eval_fraction < 1:
            errors.append({"field": "eval_fraction", "message": "must be at least 0 and below 1"})
        if self.seed < 0:
            errors.append({"field": "seed", "message": "must be >= 0"})
        if errors:
            raise InvalidInputError(
                "; ".join(f"{e['field']}: {e['message']}" for e in errors), details={"errors": errors}
            )


@dataclass
class SplitInfo:
    rows: int
    tokens: int
    sha256: str | None = None
    bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "sha256": self.sha256, "bytes": self.bytes, "tokens": self.tokens}


@dataclass
class Ingested:
    """The outcome of passes 1 and 2; :meth:`write` is pass 3."""

    format: str
    sha256: str
    rows: int
    bytes: int
    lines: int
    duplicates_removed: int
    near_duplicates_kept_in_train: int
    eval_fraction: float
    seed: int
    tokenizer: str
    train: SplitInfo
    eval: SplitInfo
    spool: Path
    _offsets: np.ndarray = field(repr=False)
    _train_idx: np.ndarray = field(repr=False)
    _eval_idx: np.ndarray = field(repr=False)

    @property
    def split_key(self) -> str:
        """Identifies content + split settings: the storage directory of this split of this content."""
        doc = f"{self.sha256}|{self.eval_fraction!r}|{self.seed}|{self.tokenizer}"
        return hashlib.sha256(doc.encode()).hexdigest()

    def write(self, dest_url: str) -> dict[str, Any]:
        """Write ``train.jsonl``, ``eval.jsonl`` and ``manifest.json`` under ``dest_url`` (fsspec)."""
        import fsspec

        fs, root = fsspec.core.url_to_fs(dest_url)
        fs.makedirs(root, exist_ok=True)
        with open(self.spool, "rb") as src:
            fd = src.fileno()
            for name, idx, info in (
                ("train", self._train_idx, self.train),
                ("eval", self._eval_idx, self.eval),
            ):
                info.sha256, info.bytes = _write_rows(fs, f"{root}/{name}.jsonl", fd, self._offsets, idx)
        manifest = self.manifest()
        with fs.open(f"{root}/manifest.json", "wb") as fh:
            fh.write(json.dumps(manifest, indent=1, sort_keys=True).encode())
        return manifest

    def manifest(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "sha256": self.sha256,
            "format": self.format,
            "rows": self.rows,
            "bytes": self.bytes,
            "duplicates_removed": self.duplicates_removed,
            "near_duplicates_kept_in_train": self.near_duplicates_kept_in_train,
            "split": {"eval_fraction": self.eval_fraction, "seed": self.seed, "method": "hash+minhash"},
            "tokenizer": self.tokenizer,
            "splits": {"train": self.train.to_dict(), "eval": self.eval.to_dict()},
        }

    def close(self) -> None:
        self.spool.unlink(missing_ok=True)


def _write_rows(fs: Any, path: str, fd: int, offsets: np.ndarray, idx: np.ndarray) -> tuple[str, int]:
    """Write the spooled rows ``idx`` (in that order) to ``path`` in chunks of about
    ``WRITE_CHUNK_BYTES``, hashing each chunk as it goes; returns (sha256, bytes)."""
    h = hashlib.sha256()
    pread = os.pread
    total = 0
    chunk: list[bytes] = []
    size = 0

    def flush() -> None:
        nonlocal total, chunk, size
        data = b"".join(chunk)
        h.update(data)
        out.write(data)
        total += size
        chunk, size = [], 0

    with fs.open(path, "wb") as out:
        for lo in range(0, len(idx), ROW_BLOCK):
            block = idx[lo : lo + ROW_BLOCK]
            for start, end in zip(offsets[block].tolist(), offsets[block + 1].tolist(), strict=True):
                line = pread(fd, end - start, start)
                chunk.append(line)
                size += len(line)
                if size >= WRITE_CHUNK_BYTES:
                    flush()
        if chunk:
            flush()
    return h.hexdigest(), total


class _Errors:
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


def _auto_format(raw: bytes) -> str:
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


@functools.cache
def _keep_freed_heap() -> None:
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


def ingest(lines: Iterable[bytes], options: IngestOptions, spool_dir: Path) -> Ingested:
    """Passes 1 and 2 over an iterable of raw lines (a binary file object is one)."""
    options.check()
    _keep_freed_heap()
    spool_dir.mkdir(parents=True, exist_ok=True)
    spool = spool_dir / f"spool-{secrets.token_hex(8)}.jsonl"
    fmt: str | None = None if options.format == "auto" else options.format
    errors = _Errors(options.max_errors)
    digests = bytearray()  # each row's sha256
    lengths = array("q")  # each row's canonical line length in the spool
    tokens = array("q")
    sides = bytearray()  # the first 8 bytes of each row's split hash
    bands: list[np.ndarray] = []
    # the current batch of valid rows: canonical lines, split keys, token counts
    canons: list[bytes] = []
    keys: list[str] = []
    toks: list[int] = []
    threshold = round(options.eval_fraction * SPLIT_BUCKETS)
    salt = f"trainyard-split/{options.seed}\n".encode()
    count = options.count_tokens
    max_tokens = options.max_tokens
    max_bytes = options.max_bytes
    nbytes = 0
    lineno = 0
    sha256 = hashlib.sha256
    loads = orjson.loads
    bad_json = orjson.JSONDecodeError
    fast: Callable[[Any, Callable[[str], int]], FastRow | None] | None = None

    def flush(out: Any) -> None:
        nonlocal canons, keys, toks
        out.write(b"".join(canons))
        digests.extend(b"".join([sha256(c).digest() for c in canons]))
        lengths.extend([len(c) for c in canons])
        tokens.extend(toks)
        sides.extend(b"".join([sha256(salt + k.encode("utf-8")).digest()[:8] for k in keys]))
        bands.append(minhash.band_keys(keys))
        canons, keys, toks = [], [], []

    try:
        with open(spool, "wb") as out:
            for lineno, raw in enumerate(lines, 1):
                nbytes += len(raw)
                if nbytes > max_bytes:
                    raise PayloadTooLargeError(
                        f"the dataset exceeds the upload limit of {max_bytes} bytes",
                        hint="Split the file, or ask an admin to raise TRAINYARD_DATASET_MAX_BYTES.",
                        details={"max_bytes": max_bytes},
                    )
                if raw.isspace() or not raw:
                    continue
                try:
                    if fast is None:
                        if fmt is None:
                            fmt = _auto_format(raw)
                        fast = FAST[fmt]
                    assert fmt is not None
                    # a row already in canonical shape skips building a normalised copy; any other row
                    # (or a line orjson refuses before it is stripped) takes the validating path
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
                        row, key = normalize(obj, fmt)
                        n_tok = token_count(row, count)
                        canon = canonical_bytes(row) + b"\n"
                    else:
                        canon, key, n_tok = got
                    if max_tokens is not None and n_tok > max_tokens:
                        raise RowError(
                            ErrorKind.TOO_LONG,
                            f"{n_tok} tokens, more than the base model's context of {max_tokens}",
                        )
                except RowError as exc:
                    errors.add(lineno, exc.kind, exc.message)
                    continue
                if errors.total:
                    continue  # invalid upload: keep validating, store nothing
                canons.append(canon)
                keys.append(key)
                toks.append(n_tok)
                if len(canons) >= BAND_BATCH:
                    flush(out)
            errors.raise_if_any(lineno)
            if canons:
                flush(out)
        if not lengths:
            raise InvalidDatasetError(
                "the dataset holds no rows",
                details={"errors": [{"line": 0, "kind": "empty_content", "message": "no rows"}]},
            )
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(lengths, dtype=np.int64), out=offsets[1:])
        assert fmt is not None
        return _split(
            fmt,
            spool,
            options,
            digests,
            offsets,
            np.frombuffer(tokens, dtype=np.int64),
            np.frombuffer(sides, dtype="<u8") % SPLIT_BUCKETS < threshold,
            np.concatenate(bands),
            nbytes,
            lineno,
        )
    except BaseException:
        spool.unlink(missing_ok=True)
        raise


def content_address(sorted_unique_digests: bytes) -> str:
    h = hashlib.sha256(f"trainyard-dataset/v{SCHEMA_VERSION}\n".encode())
    h.update(sorted_unique_digests)
    return h.hexdigest()


def _split(
    fmt: str,
    spool: Path,
    options: IngestOptions,
    digests: bytearray,
    offsets: np.ndarray,
    tokens: np.ndarray,
    eval_hash: np.ndarray,
    bands: np.ndarray,
    nbytes: int,
    lines: int,
) -> Ingested:
    d = np.frombuffer(digests, dtype="S32")
    order = np.argsort(d, kind="stable")
    sd = d[order]
    dup = np.zeros(len(d), dtype=bool)
    dup[1:] = sd[1:] == sd[:-1]
    unique = order[~dup]  # row indices in row-hash order, first occurrence of each
    sha = content_address(sd[~dup].tobytes())
    labels = minhash.clusters(bands[unique])
    on_eval = eval_hash[unique]
    in_train_cluster = np.isin(labels, labels[~on_eval])
    final_eval = on_eval & ~in_train_cluster
    train_idx, eval_idx = unique[~final_eval], unique[final_eval]
    return Ingested(
        format=fmt,
        sha256=sha,
        rows=len(unique),
        bytes=nbytes,
        lines=lines,
        duplicates_removed=int(dup.sum()),
        near_duplicates_kept_in_train=int((on_eval & in_train_cluster).sum()),
        eval_fraction=options.eval_fraction,
        seed=options.seed,
        tokenizer=options.tokenizer,
        train=SplitInfo(rows=len(train_idx), tokens=int(tokens[train_idx].sum())),
        eval=SplitInfo(rows=len(eval_idx), tokens=int(tokens[eval_idx].sum())),
        spool=spool,
        _offsets=offsets,
        _train_idx=train_idx,
        _eval_idx=eval_idx,
    )
