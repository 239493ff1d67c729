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
   vectorised MinHash call and, with a base model's tokenizer, one batched ``encode`` call
   (:mod:`trainyard.datasets.scan`). A large upload read from a regular file goes through this pass in
   worker processes, a byte range of the file each, merged in file order into the same columns,
   errors and spool bytes (:mod:`trainyard.datasets.parallel`).
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

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainyard.datasets import minhash, parallel
from trainyard.datasets.formats import FORMATS, SCHEMA_VERSION, byte_count
from trainyard.datasets.scan import (
    BAND_BATCH,
    EVAL_HASH,
    ROW,
    SPLIT_BUCKETS,
    Errors,
    Rules,
    facts,
    keep_freed_heap,
    scan,
)
from trainyard.errors import InvalidDatasetError, InvalidInputError

__all__ = [
    "BAND_BATCH",
    "SPLIT_BUCKETS",
    "IngestOptions",
    "Ingested",
    "SplitInfo",
    "content_address",
    "ingest",
]

DEFAULT_MAX_BYTES = 2 * 2**30
DEFAULT_MAX_ERRORS = 100
DEFAULT_MEMORY_BUDGET = 64 << 20  # bytes for the per-row columns and pass 2's working sets
MIN_MEMORY_BUDGET = 64 << 10
WRITE_CHUNK_BYTES = 1 << 20
ROW_BLOCK = 8192  # rows whose offsets are turned into Python ints at a time
SPILL_BUFFER = 128 << 10  # write buffer of a spilled column

ORDER = np.dtype([("row", "<i8"), ("start", "<i8"), ("length", "<i8"), ("tokens", "<i8")])
DUPLICATE, EVAL = 2, 4  # per-row flag bits besides EVAL_HASH (1)
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
    # pass 1's worker processes for an upload read from a regular file with the byte tokenizer: 0 is
    # one per CPU from parallel.PARALLEL_MIN_BYTES on, 1 is sequential; each takes ``chunk_bytes`` at
    # a time. The outcome is the same whichever way pass 1 goes.
    workers: int = 0
    chunk_bytes: int = parallel.CHUNK_BYTES

    def check(self) -> None:
        errors = []
        if self.format not in ("auto", *FORMATS):
            errors.append({"field": "format", "message": f"use auto, {', '.join(FORMATS)}"})
        if not 0 <= self.eval_fraction < 1:
            errors.append({"field": "eval_fraction", "message": "must be at least 0 and below 1"})
        if self.seed < 0:
            errors.append({"field": "seed", "message": "must be >= 0"})
        if not 0 <= self.workers <= parallel.MAX_WORKERS:
            most = parallel.MAX_WORKERS
            errors.append({"field": "workers", "message": f"must be 0 (one per CPU) to {most}"})
        if self.chunk_bytes < 1:
            errors.append({"field": "chunk_bytes", "message": "must be at least 1"})
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
class Spool:
    """Pass 1's canonical lines in row order: one file, or (pass 1 in parallel) one file per range of
    the upload. A row's ``start`` counts over their concatenation."""

    paths: list[Path] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # where each file begins in the concatenation

    def add(self, path: Path, start: int) -> None:
        self.paths.append(path)
        self.starts.append(start)

    def locate(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(file index, offset in that file) of each concatenated offset."""
        part = np.searchsorted(np.asarray(self.starts, dtype=np.int64), starts, side="right") - 1
        return part, starts - np.asarray(self.starts, dtype=np.int64)[part]

    @contextlib.contextmanager
    def opened(self) -> Iterator[np.ndarray]:
        """The files' descriptors (read-only), open for the block."""
        fds: list[int] = []
        try:
            for p in self.paths:
                fds.append(os.open(p, os.O_RDONLY))
            yield np.asarray(fds, dtype=np.int64)
        finally:
            for fd in fds:
                os.close(fd)

    def unlink(self) -> None:
        for p in self.paths:
            p.unlink(missing_ok=True)


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
    spool: Spool
    # how passes 1 and 2 went: whether the columns were spilled to files, and its passes over them
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
        with self.spool.opened() as fds:
            for name, want, info in (("train", False, self.train), ("eval", True, self.eval)):
                dest = f"{root}/{name}.jsonl"
                info.sha256, info.bytes = _write_rows(
                    fs, dest, fds, self.spool, self._order, self._flags, want, self._chunk_rows
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
        self.spool.unlink()


def _write_rows(
    fs: Any,
    path: str,
    fds: np.ndarray,
    spool: Spool,
    order: _Column,
    flags: np.ndarray,
    want_eval: bool,
    chunk_rows: int,
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
                part, at = spool.locate(sel["start"])
                for fd, start, length in zip(
                    fds[part].tolist(), at.tolist(), sel["length"].tolist(), strict=True
                ):
                    line = pread(fd, length, start)
                    chunk.append(line)
                    size += length
                    if size >= WRITE_CHUNK_BYTES:
                        flush()
        if chunk:
            flush()
    return h.hexdigest(), total


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

    def append(self, recs: np.ndarray, flags: bytes, bands: np.ndarray) -> None:
        """Append rows' facts (``recs["start"]`` counted from the first of them; shifted here to
        follow the rows so far in the spool)."""
        if recs.dtype != ROW:
            raise TypeError(f"row records must be of dtype ROW, not {recs.dtype}")
        recs["start"] += self.offset
        self.offset += int(recs["length"].sum())
        self.rows.extend(recs)
        self.flags += flags
        for b, col in enumerate(self.bands):
            col.extend(bands[:, b])
        if not self.spilled and sum(c.nbytes for c in self.columns()) > self.limit:
            for c in self.columns():
                c.spill()
            self.spilled = True

    def close(self) -> None:
        for c in self.columns():
            c.close()


def ingest(lines: Iterable[bytes], options: IngestOptions, spool_dir: Path) -> Ingested:
    """Passes 1 and 2 over an iterable of raw lines (a binary file object is one). A large regular file
    opened by its path goes through pass 1 in worker processes (:mod:`trainyard.datasets.parallel`;
    ``IngestOptions.workers``) with the same outcome."""
    options.check()
    keep_freed_heap()
    spool_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(8)
    workdir = spool_dir / f"work-{token}"
    workdir.mkdir()
    fmt: str | None = None if options.format == "auto" else options.format
    rules = Rules(
        eval_fraction=options.eval_fraction,
        seed=options.seed,
        max_tokens=options.max_tokens,
        max_errors=options.max_errors,
        count_tokens=options.count_tokens,
        count_tokens_batch=options.count_tokens_batch,
    )
    errors = Errors(options.max_errors)
    cols = _Pass1(workdir, options.memory_budget)
    spool = Spool()
    started = time.perf_counter()
    try:
        src = parallel.source_of(lines, rules)
        workers = 1 if src is None else parallel.worker_count(options.workers, src.end - src.start)
        if src is not None and workers > 1:

            def take(part: Path, recs: np.ndarray, flags: bytes, bands: np.ndarray) -> None:
                spool.add(part, cols.offset)
                cols.append(recs, flags, bands)

            fmt, lineno, nbytes, how = parallel.scan_file(
                src, fmt, rules, errors, take, workdir, workers, options.chunk_bytes, options.max_bytes
            )
        else:
            path = spool_dir / f"spool-{token}.jsonl"
            spool.add(path, 0)
            with open(path, "wb") as out:

                def emit(canons: list[bytes], tokens: np.ndarray, keys: list[str]) -> None:
                    out.write(b"".join(canons))
                    cols.append(*facts(canons, tokens, keys, rules))

                fmt, lineno, nbytes = scan(lines, fmt, rules, errors, emit, options.max_bytes)
            how = {"workers": 1}
        errors.raise_if_any(lineno)
        if not len(cols.rows):
            raise InvalidDatasetError(
                "the dataset holds no rows",
                details={"errors": [{"line": 0, "kind": "empty_content", "message": "no rows"}]},
            )
        assert fmt is not None
        how["seconds"] = round(time.perf_counter() - started, 3)
        ing = _split(fmt, spool, workdir, options, cols, nbytes, lineno)
        ing.work["pass1"] = how
        return ing
    except BaseException:
        cols.close()
        shutil.rmtree(workdir, ignore_errors=True)
        spool.unlink()
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
    spool: Spool,
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
    t0 = time.perf_counter()
    try:
        sha, dedupe_passes = _dedupe(cols.rows, flags, order, budget, chunk_rows)
        cols.rows.close()
        t1 = time.perf_counter()
        labels, band_passes = _cluster(cols.bands, flags, n, budget, chunk_rows * 8)
        t2 = time.perf_counter()
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
        work={
            "spilled": cols.spilled,
            "dedupe_passes": dedupe_passes,
            "band_passes": band_passes,
            "seconds": {"dedupe": round(t1 - t0, 3), "clusters": round(t2 - t1, 3)},
        },
        _order=order,
        _flags=flags,
        _workdir=workdir,
        _chunk_rows=chunk_rows,
    )
