"""Near-duplicate detection for the held-out split: MinHash over word shingles, vectorised in numpy.

Each row's split key is lower-cased and split into words at whitespace; its shingles are word 3-grams
(a word is hashed on its first 8 bytes). The signature is one-permutation MinHash (Li, Owen, Zhang 2012):
one 64-bit hash per shingle, its top 32 bits choose one of 96 bins, each bin keeps its minimum, and
empty bins are filled from the next non-empty bin to the right (rotation densification, Shrivastava
2017), so two rows agree on a bin with probability equal to their Jaccard similarity J. LSH: 16 bands
of 6 bins; rows sharing any band key are candidates — the chance of that is 1-(1-J^6)^16: 0.9995 at
J = 0.85, 0.992 at 0.8, 0.87 at 0.7, 0.22 at 0.5 and 0.01 at 0.3. Candidates are joined into clusters
transitively (a vectorised union-find, :func:`join`). A false candidate only moves an eval row to train.

Why not ``datasketch``: its MinHash is one Python object and several numpy calls per row (tens of
microseconds each), and its LSH index is a dict of Python objects per band; at a million rows that is
slower than the rest of ingestion together and holds hundreds of MB. Here a batch of thousands of rows
is a handful of array operations, and only 16 uint32 band keys per row are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

N_BINS = 96
N_BANDS = 16
ROWS_PER_BAND = N_BINS // N_BANDS
WORD_BYTES = 8
SHINGLE_WORDS = 3

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_P1 = np.uint64(0x100000001B3)
_P2 = np.uint64(0x9E3779B97F4A7C15)
_EMPTY = np.uint64(2**58)
_VAL_MASK = np.uint64(2**58 - 1)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (wrapping uint64 arithmetic), in place: ``x`` must be an array of the
    caller's own (every caller passes a fresh one); one temporary instead of five."""
    t = x >> np.uint64(30)
    x ^= t
    x *= _M1
    np.right_shift(x, np.uint64(27), out=t)
    x ^= t
    x *= _M2
    np.right_shift(x, np.uint64(31), out=t)
    x ^= t
    return x


def signatures(keys: Sequence[str]) -> np.ndarray:
    """(len(keys), N_BINS) uint64 MinHash signatures."""
    n = len(keys)
    joined = "\x00".join(keys)
    if joined.count("\x00") != max(0, n - 1):  # a key holding NUL: keep the row boundaries exact
        joined = "\x00".join(k.replace("\x00", " ") for k in keys)
    raw = joined.lower().encode("utf-8", errors="replace") + b"\x00"
    buf = np.frombuffer(raw + b"\x00" * WORD_BYTES, dtype=np.uint8)
    total = len(raw)
    body = buf[:total]
    sep = body <= 32
    word_byte = ~sep
    # a word starts at a non-separator after a separator (or at 0) and ends at the next separator: the
    # buffer ends in NUL, so starts and ends pair up in order
    edge = np.empty(total + 1, dtype=bool)
    edge[0] = False
    edge[total] = False
    np.not_equal(word_byte[1:], word_byte[:-1], out=edge[1:total])
    edge[0] = word_byte[0]
    bounds = np.flatnonzero(edge[:total])
    pos = bounds[0::2]  # the first byte of each word
    wend = bounds[1::2]  # the separator after it
    # NULs before a word = its row: the words before each NUL, counted per word index, summed up (the
    # same as searching every word's position among the NULs, for a fraction of the work)
    before_nul = np.searchsorted(pos, np.flatnonzero(body == 0))
    row = np.cumsum(np.bincount(before_nul, minlength=len(pos) + 1)[: len(pos)])
    length = np.minimum(wend - pos, WORD_BYTES).astype(np.uint64)
    # the 8 bytes from each word start as one little-endian integer (an unaligned strided view), cut at
    # the word's end
    lanes = np.ndarray((total,), dtype="<u8", buffer=buf, strides=(1,))
    full = np.uint64(2**64 - 1)
    with np.errstate(over="ignore"):
        mask = np.where(length >= WORD_BYTES, full, (np.uint64(1) << (length * np.uint64(8))) - np.uint64(1))
        word: np.ndarray = _mix((lanes[pos] & mask) ^ length)
        sh: np.ndarray = word.copy()
        for k in range(1, SHINGLE_WORDS):
            later = np.zeros_like(word)
            if len(pos) > k:
                later[:-k] = np.where(row[k:] == row[:-k], word[k:], np.uint64(0))
            sh = sh * _P2 + later
        h = _mix(sh)
    sig = np.full(n * N_BINS, _EMPTY, dtype=np.uint64)
    if len(pos):
        bin_ = ((h >> np.uint64(32)) * np.uint64(N_BINS)) >> np.uint64(32)  # uniform in [0, N_BINS)
        slot = row * N_BINS + bin_.astype(np.int64)
        np.minimum.at(sig, slot, h & _VAL_MASK)
    return _densify(sig).reshape(n, N_BINS)


def _densify(sig: np.ndarray) -> np.ndarray:
    """Fill each empty bin of the flat (rows × N_BINS) ``sig`` from the nearest non-empty bin to its
    right in the same row (wrapping around), plus a multiple of the distance; a row with no shingle
    stays empty."""
    empty = sig == _EMPTY
    holes = np.flatnonzero(empty)
    if len(holes) == 0:
        return sig
    filled = ~empty
    full = np.flatnonzero(filled)
    if len(full) == 0:
        return sig
    # the first non-empty bin at or after each hole (over the flat array), via how many lie before it
    before = np.cumsum(filled)[holes]
    hole_row = holes // N_BINS
    row_end = (hole_row + 1) * N_BINS
    nxt = full[np.minimum(before, len(full) - 1)]
    wrapped = nxt >= row_end
    wrapped |= before == len(full)
    # each row's first non-empty bin, and whether it has one
    starts = np.arange(0, len(sig), N_BINS)
    first_row = full[np.minimum(np.searchsorted(full, starts), len(full) - 1)]
    has_row = (first_row >= starts) & (first_row < starts + N_BINS)
    src = np.where(wrapped, first_row[hole_row], nxt)
    dist = (src - holes).astype(np.uint64)
    dist[wrapped] += np.uint64(N_BINS)
    out = sig.copy()
    with np.errstate(over="ignore"):
        vals = sig[src] + dist * np.uint64(0x9E3779B1)
    out[holes] = np.where(has_row[hole_row], vals, _EMPTY)
    return out


def band_keys(keys: Sequence[str]) -> np.ndarray:
    """(len(keys), N_BANDS) uint32 LSH band keys."""
    sig = signatures(keys).reshape(len(keys), N_BANDS, ROWS_PER_BAND)
    acc = np.zeros((len(keys), N_BANDS), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for r in range(ROWS_PER_BAND):
            acc = _mix(acc * _P1 + sig[:, :, r])
    return (acc >> np.uint64(32)).astype(np.uint32)


def estimate_jaccard(a: str, b: str) -> float:
    s = signatures([a, b])
    return float(np.mean(s[0] == s[1]))


def clusters(bands: np.ndarray) -> np.ndarray:
    """Cluster label per row: rows sharing a band key, transitively, get the same (smallest) label.

    Each band links every row of a group of equal keys to the group's smallest row; the links of all
    bands (de-duplicated, so rows equal in every band cost one link) are then joined by :func:`join`.
    Ingestion does the same a band and a range of keys at a time (``ingest._cluster``)."""
    n = bands.shape[0]
    labels = np.arange(n, dtype=np.int64)
    if n < 2:
        return labels
    pending: list[np.ndarray] = []  # member << 32 | representative
    held = 0
    for b in range(bands.shape[1]):
        order = np.argsort(bands[:, b])
        keys = bands[order, b]
        same = keys[1:] == keys[:-1]
        if not same.any():
            continue
        starts = np.flatnonzero(np.r_[True, ~same])
        rep = np.repeat(np.minimum.reduceat(order, starts), np.diff(np.r_[starts, n]))
        member = order != rep
        pending.append((order[member].astype(np.int64) << 32) | rep[member])
        held += len(pending[-1])
        if held > n:  # bound the memory when many rows share keys
            pending = [distinct(pending)]
            held = len(pending[0])
    if not held:
        return labels
    links = distinct(pending)
    join(labels, links >> 32, links & 0xFFFFFFFF)
    return labels


def join(labels: np.ndarray, a: np.ndarray, b: np.ndarray, *, flat: bool = True) -> None:
    """Union-find, vectorised: join the sets of rows ``a[i]`` and ``b[i]``, in place. A row's root is
    found by following ``labels`` up (``labels[x] <= x``; a root is its own label, and the smallest row
    of its set). Each round finds the roots of the pairs not yet joined (and points those rows at them),
    hooks the larger root of each pair under the smaller (the smallest, when a root is in several
    pairs) and goes on with the pairs of roots. With ``flat`` every label is then pointed at its root
    (:func:`flatten`), so ``labels`` maps each row to its set's smallest row; without it, call
    :func:`flatten` after the last join."""
    a = a.astype(labels.dtype, copy=False)
    b = b.astype(labels.dtype, copy=False)
    while len(a):
        ra, rb = _roots(labels, a), _roots(labels, b)
        labels[a] = ra
        labels[b] = rb
        apart = ra != rb
        if not apart.any():
            break
        a, b = ra[apart], rb[apart]  # joining the roots joins the rows' sets
        np.minimum.at(labels, np.maximum(a, b), np.minimum(a, b))
    if flat:
        flatten(labels)


def flatten(labels: np.ndarray) -> None:
    """Point every label at its root (pointer jumping)."""
    while True:
        nxt = labels[labels]
        if np.array_equal(nxt, labels):
            return
        labels[:] = nxt


def _roots(labels: np.ndarray, x: np.ndarray) -> np.ndarray:
    r = labels[x]
    while True:
        up = labels[r]
        if np.array_equal(up, r):
            return r
        r = up


def distinct(parts: list[np.ndarray]) -> np.ndarray:
    """The sorted distinct values of the concatenated ``parts``."""
    x = np.sort(np.concatenate(parts))
    return x[np.r_[True, x[1:] != x[:-1]]]
