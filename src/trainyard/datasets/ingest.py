"""Streaming ingestion: validate, normalise, de-duplicate, content-address and split one JSONL upload.

Three passes, none of which holds the data in memory, and whose working memory is bounded by
``IngestOptions.memory_budget`` whatever the size of the upload:

1. read the upload line by line (a size limit is enforced as it streams), validate and normalise each
   row (:mod:`trainyard.datasets.formats`), and append its canonical line to a local spool file; per row
   only fixed-size facts are kept, in columns: its sha256 (32 bytes), spool offset and length, token
   count, and 16 MinHash band keys (about 120 bytes a row), plus one byte of flags (its hash side).
   The columns stay in memory while they fit in a quarter of the budget and are spilled to files in
   a work directory beside the spool once they do not. Every bad line is reported (up to ``max_errors``
   listed, all counted by kind); once one is found nothing more is spooled. A row already in canonical
   shape (NFC strings, no extra keys) skips building a normalised copy (``formats.FAST``); any other
   row takes the validating path, so results and errors are the same either way. Valid rows are
   handled in batches of ``BAND_BATCH``: one spool write, their sha256s and split hashes, one
   vectorised MinHash call and, with a base model's tokenizer, one batched ``encode`` call.
2. de-duplicate, content-address and split, in passes sized to the budget:

   - the row hashes are taken a range of hash prefixes at a time (ranges in ascending order, so the
     concatenation of the sorted ranges is the sorted whole): exact duplicates drop out (the first
     occurrence stays), and the dataset's content address is
     ``sha256("trainyard-dataset/v<SCHEMA_VERSION>\\n" ‖ sorted unique row hashes)``, the same whatever
     the row order or JSON formatting; the unique rows, in row-hash order, go to an ``order`` column;
   - the held-out side of a row is ``sha256(seed ‖ split key) mod 10000 < eval_fraction · 10000``
     (split key: text, prompt, or the chat turns before the last answer), so a row lands on the same
     side in every version; near-duplicate clusters (rows sharing a MinHash band key, transitively)
     go to eval only when every member hashes to eval, so no eval row has a near-duplicate in train.
     Each band is taken a range of keys at a time; equal keys link rows, and the links are joined
     into clusters by a union-find over one label per row (4 bytes a row: the one per-row array that
     stays in memory besides the flags).
3. write each split as canonical JSONL sorted by row hash (equal content → equal bytes) through fsspec,
   hashing the bytes as they are written: each split's ``sha256`` is ``sha256sum`` of its file.

Whether the columns stayed in memory or were spilled, and in how many passes pass 2 went, changes
nothing in the outcome: the same content address, split, files and counts (tests check this).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
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
DEFAULT_MEMORY_BUDGET = 64 << 20  # bytes for the per-row columns and pass 2's working sets
MIN_MEMORY_BUDGET = 64 << 10
SPLIT_BUCKETS = 10_000
BAND_BATCH = 2048  # rows per batch: its arrays stay small enough for malloc to reuse them
WRITE_CHUNK_BYTES = 1 << 20
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
HEAP_TRIM_BYTES = 32 << 20
HEAP_MMAP_BYTES = 8 << 20
ROW_BLOCK = 8192  # rows whose offsets are turned into Python ints at a time
SPILL_BUFFER = 128 << 10  # write buffer of a spilled column

# one row's facts from pass 1; ``prefix`` is the first 8 bytes of ``digest`` read as a big-endian
# integer (the two fields overlap), which orders rows as their digests do
ROW = np.dtype(
    {
        "names": ["digest", "prefix", "start", "length", "tokens"],
        "formats": ["S32", ">u8", "<i8", "<i8", "<i8"],
        "offsets": [0, 0, 32, 40, 48],
        "itemsize": 56,
    }
)
ORDER = np.dtype([("row", "<i8"), ("start", "<i8"), ("length", "<i8"), ("tokens", "<i8")])
EVAL_HASH, DUPLICATE, EVAL = 1, 2, 4  # per-row flag bits
# bytes of working memory per row held at once in pass 2 (the selected records and their sorts)
DEDUPE_BYTES_PER_ROW = ROW.itemsize + 2 * ORDER.itemsize + 96
BAND_BYTES_PER_ROW = 96


@dataclass(frozen=True)
class IngestOptions:
    format: str = "auto"
    eval_fraction: float = 0.1
    seed: int = 0
    max_bytes: int = DEFAULT_MAX_BYTES
    max_errors: int = DEFAULT_MAX_ERRORS
    max_tokens: int | None = None  # the base model's context; longer rows are errors
    count_tokens: Callable[[str], int] = byte_count
    # counts a list of strings in one call (a fast tokenizer's encode_batch); when given, it is used
    # instead of ``count_tokens`` and must count each string as ``count_tokens`` would
    count_tokens_batch: Callable[[list[str]], list[int]] | None = None
    tokenizer: str = "bytes"
    memory_budget: int = DEFAULT_MEMORY_BUDGET

    def check(self) -> None:
        errors = []
        if self.format not in ("auto", *FORMATS):
            errors.append({"field": "format", "message": f"use auto, {', '.join(FORMATS)}"})
        if not 0 <= self.eval_fraction < 1:
            errors.append({"field": "eval_fraction", "message": "must be at least 0 and below 1"})
        if self.seed < 0:
            errors.append({"field": "seed", "message": "must be >= 0"})
        if self.memory_budget < MIN_MEMORY_BUDGET:
            errors.append({"field": "memory_budget", "message": f"must be at least {MIN_MEMORY_BUDGET}"})
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


class _Column:
    """Fixed-width records appended in order: in memory until :meth:`spill`, then in a file."""

    def __init__(self, path: Path, dtype: np.dtype[Any]):
        self.path = path
        self.dtype = dtype
        self.buf = bytearray()
        self.file: Any = None
        self.nbytes = 0

    def extend(self, records: np.ndarray) -> None:
        data = np.ascontiguousarray(records).view(np.uint8)
        if self.file is None:
            self.buf += data.data
        else:
            self.file.write(data)
        self.nbytes += data.nbytes

    def spill(self) -> None:
        if self.file is None:
            self.file = open(self.path, "w+b", buffering=SPILL_BUFFER)  # noqa: SIM115 (closed in close)
            self.file.write(self.buf)
            self.buf = bytearray()

    def __len__(self) -> int:
        return self.nbytes // self.dtype.itemsize

    def chunks(self, rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """(index of the first record, records) ``rows`` at a time, in order. A spilled column is read
        into one reused buffer: each chunk is valid until the next one is asked for."""
        n = len(self)
        rows = max(1, rows)
        if self.file is None:
            whole = np.frombuffer(self.buf, dtype=self.dtype, count=n)
            for lo in range(0, n, rows):
                yield lo, whole[lo : lo + rows]
            return
        self.file.flush()
        fd = self.file.fileno()
        size = self.dtype.itemsize
        buf = bytearray(min(rows, n) * size)
        for lo in range(0, n, rows):
            count = min(rows, n - lo)
            view = memoryview(buf)[: count * size]
            got = os.preadv(fd, [view], lo * size)
            if got != count * size:
                raise OSError(f"short read from {self.path}: {got} of {count * size} bytes")
            yield lo, np.frombuffer(buf, dtype=self.dtype, count=count)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        self.buf = bytearray()


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
    # how pass 2 went: whether the columns were spilled to files, and its passes over them
    work: dict[str, Any] = field(default_factory=dict)
    _order: _Column | None = field(default=None, repr=False)
    _flags: np.ndarray | None = field(default=None, repr=False)
    _workdir: Path | None = field(default=None, repr=False)
    _chunk_rows: int = field(default=ROW_BLOCK, repr=False)

    @property
    def split_key(self) -> str:
        """Identifies content + split settings: the storage directory of this split of this content."""
        doc = f"{self.sha256}|{self.eval_fraction!r}|{self.seed}|{self.tokenizer}"
        return hashlib.sha256(doc.encode()).hexdigest()

    def write(self, dest_url: str) -> dict[str, Any]:
        """Write ``train.jsonl``, ``eval.jsonl`` and ``manifest.json`` under ``dest_url`` (fsspec)."""
        import fsspec

        assert self._order is not None and self._flags is not None
        fs, root = fsspec.core.url_to_fs(dest_url)
        fs.makedirs(root, exist_ok=True)
        with open(self.spool, "rb") as src:
            fd = src.fileno()
            for name, want, info in (("train", False, self.train), ("eval", True, self.eval)):
                info.sha256, info.bytes = _write_rows(
                    fs, f"{root}/{name}.jsonl", fd, self._order, self._flags, want, self._chunk_rows
                )
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
        if self._order is not None:
            self._order.close()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self.spool.unlink(missing_ok=True)


def _write_rows(
    fs: Any, path: str, fd: int, order: _Column, flags: np.ndarray, want_eval: bool, chunk_rows: int
) -> tuple[str, int]:
    """Write the spooled rows of one split (in row-hash order) to ``path`` in chunks of about
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
        for _, recs in order.chunks(chunk_rows):
            for lo in range(0, len(recs), ROW_BLOCK):
                block = recs[lo : lo + ROW_BLOCK]
                sel = block[((flags[block["row"]] & EVAL) != 0) == want_eval]
                for start, length in zip(sel["start"].tolist(), sel["length"].tolist(), strict=True):
                    line = pread(fd, length, start)
                    chunk.append(line)
                    size += length
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


class _Pass1:
    """The columns pass 1 fills, in memory or spilled to files under ``workdir``."""

    def __init__(self, workdir: Path, budget: int):
        self.workdir = workdir
        self.rows = _Column(workdir / "rows.bin", ROW)
        self.bands = [_Column(workdir / f"band-{b}.u32", np.dtype("<u4")) for b in range(minhash.N_BANDS)]
        self.flags = bytearray()
        self.limit = budget // 4
        self.spilled = False
        self.offset = 0  # spool bytes so far

    def columns(self) -> list[_Column]:
        return [self.rows, *self.bands]

    def add(
        self, canons: list[bytes], tokens: np.ndarray, sides: bytes, threshold: int, keys: list[str]
    ) -> None:
        n = len(canons)
        recs = np.empty(n, dtype=ROW)
        recs["digest"] = np.frombuffer(b"".join([hashlib.sha256(c).digest() for c in canons]), dtype="S32")
        lengths = np.fromiter((len(c) for c in canons), dtype=np.int64, count=n)
        ends = np.cumsum(lengths)
        recs["start"] = ends - lengths + self.offset
        recs["length"] = lengths
        recs["tokens"] = tokens
        self.offset += int(ends[-1])
        self.rows.extend(recs)
        on_eval = np.frombuffer(sides, dtype="<u8") % SPLIT_BUCKETS < threshold
        self.flags += on_eval.astype(np.uint8).tobytes()  # EVAL_HASH is bit 0
        bk = minhash.band_keys(keys)
        for b, col in enumerate(self.bands):
            col.extend(bk[:, b])
        if not self.spilled and sum(c.nbytes for c in self.columns()) > self.limit:
            for c in self.columns():
                c.spill()
            self.spilled = True

    def close(self) -> None:
        for c in self.columns():
            c.close()


def ingest(lines: Iterable[bytes], options: IngestOptions, spool_dir: Path) -> Ingested:
    """Passes 1 and 2 over an iterable of raw lines (a binary file object is one)."""
    options.check()
    _keep_freed_heap()
    spool_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(8)
    spool = spool_dir / f"spool-{token}.jsonl"
    workdir = spool_dir / f"work-{token}"
    workdir.mkdir()
    fmt: str | None = None if options.format == "auto" else options.format
    errors = _Errors(options.max_errors)
    cols = _Pass1(workdir, options.memory_budget)
    # the current batch: valid rows (canonical lines, split keys, token counts so far, line numbers,
    # where their strings to count end in ``texts``) and the bad lines among them, in line order
    canons: list[bytes] = []
    keys: list[str] = []
    toks: list[int] = []
    row_lines: list[int] = []
    text_ends: list[int] = []
    texts: list[str] = []
    bad: list[tuple[int, ErrorKind, str]] = []
    threshold = round(options.eval_fraction * SPLIT_BUCKETS)
    salt = f"trainyard-split/{options.seed}\n".encode()
    batch_count = options.count_tokens_batch
    count: Callable[[str], int] = options.count_tokens
    if batch_count is not None:
        collect = texts.append

        def collect_text(text: str) -> int:  # the strings are counted at the batch's end, in one call
            collect(text)
            return 0

        count = collect_text
    max_tokens = options.max_tokens
    max_bytes = options.max_bytes
    nbytes = 0
    lineno = 0
    sha256 = hashlib.sha256
    loads = orjson.loads
    bad_json = orjson.JSONDecodeError
    fast: Callable[[Any, Callable[[str], int]], FastRow | None] | None = None

    def flush(out: Any) -> None:
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
            out.write(b"".join(canons))
            sides = b"".join([sha256(salt + k.encode("utf-8")).digest()[:8] for k in keys])
            cols.add(canons, n_tok, sides, threshold, keys)
        canons, keys, toks, row_lines, text_ends, bad = [], [], [], [], [], []

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
                mark = len(texts)
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
                    flush(out)
            flush(out)
            errors.raise_if_any(lineno)
        if not len(cols.rows):
            raise InvalidDatasetError(
                "the dataset holds no rows",
                details={"errors": [{"line": 0, "kind": "empty_content", "message": "no rows"}]},
            )
        assert fmt is not None
        return _split(fmt, spool, workdir, options, cols, nbytes, lineno)
    except BaseException:
        cols.close()
        shutil.rmtree(workdir, ignore_errors=True)
        spool.unlink(missing_ok=True)
        raise


def content_address(sorted_unique_digests: bytes) -> str:
    h = hashlib.sha256(f"trainyard-dataset/v{SCHEMA_VERSION}\n".encode())
    h.update(sorted_unique_digests)
    return h.hexdigest()


def _ranges(parts: int, bits: int) -> list[tuple[int, int | None]]:
    """``parts`` consecutive [lo, hi) ranges covering 0 … 2**bits (the last one open-ended)."""
    edges = [(p << bits) // parts for p in range(parts)]
    return [(lo, edges[i + 1] if i + 1 < parts else None) for i, lo in enumerate(edges)]


def _in_range(values: np.ndarray, lo: int, hi: int | None) -> np.ndarray:
    mask = values >= np.uint64(lo)
    if hi is not None:
        mask &= values < np.uint64(hi)
    return mask


def _dedupe(
    rows: _Column, flags: np.ndarray, order: _Column, budget: int, chunk_rows: int
) -> tuple[str, int]:
    """Exact de-duplication and the content address, a range of row-hash prefixes at a time: marks
    duplicates in ``flags``, appends the unique rows to ``order`` in row-hash order; returns (content
    address, passes)."""
    n = len(rows)
    parts = max(1, -(-n * DEDUPE_BYTES_PER_ROW // budget))
    ranges = _ranges(parts, 64)
    edges = np.array([lo for lo, _ in ranges], dtype=np.uint64)
    sizes = np.zeros(parts, dtype=np.int64)  # rows per range: each range's arrays are allocated once
    whole = parts == 1
    if whole:
        sizes[0] = n
    else:
        for _, recs in rows.chunks(chunk_rows):
            sizes += np.bincount(np.searchsorted(edges, recs["prefix"], side="right") - 1, minlength=parts)
    h = hashlib.sha256(f"trainyard-dataset/v{SCHEMA_VERSION}\n".encode())
    for (lo, hi), size in zip(ranges, sizes.tolist(), strict=True):
        if not size:
            continue
        recs = np.empty(size, dtype=ROW)
        row_idx = np.empty(size, dtype=np.int64)
        at = 0
        for first, chunk in rows.chunks(chunk_rows):
            sel = np.arange(len(chunk)) if whole else np.flatnonzero(_in_range(chunk["prefix"], lo, hi))
            recs[at : at + len(sel)] = chunk[sel]
            row_idx[at : at + len(sel)] = sel + first
            at += len(sel)
        assert at == size
        # rows come in row order, so a stable sort keeps each hash's first occurrence first
        digests = np.ascontiguousarray(recs["digest"])
        srt = np.argsort(digests, kind="stable")
        sd = digests[srt]
        del digests
        dup = np.zeros(size, dtype=bool)
        dup[1:] = sd[1:] == sd[:-1]
        h.update(np.ascontiguousarray(sd[~dup]).view(np.uint8).data)
        del sd
        flags[row_idx[srt[dup]]] |= DUPLICATE
        keep = srt[~dup]
        del srt, dup
        out = np.empty(len(keep), dtype=ORDER)
        out["row"] = row_idx[keep]
        for name in ("start", "length", "tokens"):
            out[name] = recs[name][keep]
        del recs, row_idx, keep
        order.extend(out)
    return h.hexdigest(), parts


def _band_links(
    band: _Column, flags: np.ndarray, lo: int, hi: int | None, whole: bool, chunk_rows: int
) -> np.ndarray:
    """Links ``member << 32 | representative`` between the unique rows whose key in this band is in
    [lo, hi): every row of a group of equal keys to the group's smallest row."""
    parts: list[np.ndarray] = []
    for first, keys in band.chunks(chunk_rows):
        keep = (flags[first : first + len(keys)] & DUPLICATE) == 0
        if not whole:
            keep &= _in_range(keys, lo, hi)
        sel = np.flatnonzero(keep)
        packed = keys[sel].astype(np.uint64) << np.uint64(32)
        packed |= (sel + first).astype(np.uint64)
        parts.append(packed)
    x = np.concatenate(parts) if len(parts) != 1 else parts[0]
    del parts
    x.sort()  # by key, then row
    k = x >> np.uint64(32)
    same = k[1:] == k[:-1]
    del k
    if not same.any():
        return np.empty(0, dtype=np.uint64)
    rows = x & np.uint64(0xFFFFFFFF)
    del x
    starts = np.flatnonzero(np.r_[True, ~same])
    rep = np.repeat(rows[starts], np.diff(np.r_[starts, len(rows)]))
    member = rows != rep
    return (rows[member] << np.uint64(32)) | rep[member]


def _cluster(
    bands: list[_Column], flags: np.ndarray, n: int, budget: int, chunk_rows: int
) -> tuple[np.ndarray, int]:
    """Cluster label of every row (the smallest row of its cluster; a duplicate is its own), and the
    passes per band."""
    if n >= 2**32:
        raise InvalidInputError("a dataset holds at most 2**32 - 1 rows")
    labels = np.arange(n, dtype=np.int64 if n >= 2**31 else np.int32)
    unique = int(((flags & DUPLICATE) == 0).sum())
    parts = max(1, -(-unique * BAND_BYTES_PER_ROW // budget))
    for band in bands:
        for lo, hi in _ranges(parts, 32):
            links = _band_links(band, flags, lo, hi, parts == 1, chunk_rows)
            if len(links):  # at most one a row of the range: joined at once, within the budget
                _join(labels, links)
            del links
        band.close()
    minhash.flatten(labels)
    return labels, parts


def _join(labels: np.ndarray, links: np.ndarray) -> None:
    """Join the sets of each link's two rows (``member << 32 | representative``)."""
    member = (links >> np.uint64(32)).astype(labels.dtype)
    rep = (links & np.uint64(0xFFFFFFFF)).astype(labels.dtype)
    minhash.join(labels, member, rep, flat=False)


def _split(
    fmt: str,
    spool: Path,
    workdir: Path,
    options: IngestOptions,
    cols: _Pass1,
    nbytes: int,
    lines: int,
) -> Ingested:
    budget = options.memory_budget
    chunk_rows = max(256, budget // 16 // ROW.itemsize)
    n = len(cols.rows)
    flags = np.frombuffer(cols.flags, dtype=np.uint8)
    order = _Column(workdir / "order.bin", ORDER)
    if cols.spilled:
        order.spill()
    try:
        sha, dedupe_passes = _dedupe(cols.rows, flags, order, budget, chunk_rows)
        cols.rows.close()
        labels, band_passes = _cluster(cols.bands, flags, n, budget, chunk_rows * 8)
        # a cluster holding a row that hashes to train keeps all its rows in train
        has_train = np.zeros(n, dtype=bool)
        for lo in range(0, n, chunk_rows):
            f = flags[lo : lo + chunk_rows]
            has_train[labels[lo : lo + chunk_rows][(f & (DUPLICATE | EVAL_HASH)) == 0]] = True
        kept_in_train = 0
        for lo in range(0, n, chunk_rows):
            f = flags[lo : lo + chunk_rows]
            hashed_eval = (f & (DUPLICATE | EVAL_HASH)) == EVAL_HASH
            moved = has_train[labels[lo : lo + chunk_rows]]
            kept_in_train += int((hashed_eval & moved).sum())
            f[hashed_eval & ~moved] |= EVAL
        del labels, has_train
        rows = [0, 0]
        tokens = [0, 0]
        for _, recs in order.chunks(chunk_rows):
            ev = (flags[recs["row"]] & EVAL) != 0
            rows[1] += int(ev.sum())
            rows[0] += len(ev) - int(ev.sum())
            tokens[1] += int(recs["tokens"][ev].sum())
            tokens[0] += int(recs["tokens"][~ev].sum())
    except BaseException:
        order.close()
        raise
    unique = rows[0] + rows[1]
    return Ingested(
        format=fmt,
        sha256=sha,
        rows=unique,
        bytes=nbytes,
        lines=lines,
        duplicates_removed=n - unique,
        near_duplicates_kept_in_train=kept_in_train,
        eval_fraction=options.eval_fraction,
        seed=options.seed,
        tokenizer=options.tokenizer,
        train=SplitInfo(rows=rows[0], tokens=tokens[0]),
        eval=SplitInfo(rows=rows[1], tokens=tokens[1]),
        spool=spool,
        work={"spilled": cols.spilled, "dedupe_passes": dedupe_passes, "band_passes": band_passes},
        _order=order,
        _flags=flags,
        _workdir=workdir,
        _chunk_rows=chunk_rows,
    )
