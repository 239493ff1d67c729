"""Pass 1 over a file in worker processes: byte ranges split at line boundaries, merged in file order.

A large upload read from a regular file (what the API spools a request body to) is cut into ranges of
about ``chunk_bytes`` that start at line starts; each worker process (``python -m
trainyard.datasets.parallel``, one per CPU by default) runs :func:`trainyard.datasets.scan.scan` over
one range at a time, writes the range's canonical lines to a spool file of its own and sends back the
range's facts (row records, flags, band keys), its bad lines (numbered within the range) and its line
count. The parent merges the ranges strictly in file order: line numbers are shifted by the lines
before the range, a range's rows get the row numbers and spool offsets that follow the previous
range's, and the first bad line stops the spooling as it does in one sequential scan. Since what pass 1
finds for a row depends on that row alone, the merged facts, errors and spool bytes are exactly those
of the sequential scan, so passes 2 and 3 give the same content address, split, duplicate choice,
files and manifest (tests compare them byte for byte).

With ``format=auto`` the parent first reads lines itself up to the first one that tells the format (as
the sequential scan does: the lines before it are errors); the ranges start at that line.

Only the default byte tokenizer goes in parallel (a base model's tokenizer stays in the parent, and
its batched encoding already uses both cores). Results waiting to be merged are bounded: at most twice
as many ranges as workers are handed out beyond the next range to merge. Workers are separate
interpreters (not ``fork``, which is unsafe in the threaded server, and not ``multiprocessing``'s spawn,
which would import the server's main module in each): the protocol is pickled messages with an 8-byte
length over each worker's stdin and stdout.
"""

from __future__ import annotations

import io
import itertools
import os
import pickle
import stat
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

import trainyard
from trainyard.datasets.formats import RowError, byte_count
from trainyard.datasets.scan import ROW, Errors, Rules, auto_format, facts, keep_freed_heap, scan, too_large
from trainyard.errors import TrainyardError

PARALLEL_MIN_BYTES = 64 << 20  # below this, starting the workers costs more than they save
CHUNK_BYTES = 8 << 20  # bytes of the upload per range handed to a worker
MAX_WORKERS = 8
READ_BUFFER = 1 << 20
SEARCH_BLOCK = 64 << 10  # bytes read at a time looking for a line end
STOP_WAIT_S = 10.0

# what the parent takes from each range, in file order: (spool file, row records with spool offsets
# from the file's start, flag bytes, band keys)
Take = Callable[[Path, np.ndarray, bytes, np.ndarray], None]


@dataclass(frozen=True)
class Source:
    """The regular file behind an upload's lines: bytes [start, end) of ``path``."""

    path: str
    start: int
    end: int
    fh: IO[bytes]


def worker_count(workers: int, size: int) -> int:
    """Workers for an upload of ``size`` bytes: ``workers`` when set (1: sequential), else one per
    available CPU (at most MAX_WORKERS) from PARALLEL_MIN_BYTES on."""
    if workers:
        return workers
    if size < PARALLEL_MIN_BYTES:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


def source_of(lines: Iterable[bytes], rules: Rules) -> Source | None:
    """The file behind ``lines`` when pass 1 can go in parallel: a binary file object opened by a path
    that still names it (a regular file), with rows counted by the byte tokenizer."""
    if rules.count_tokens is not byte_count or rules.count_tokens_batch is not None:
        return None
    name = getattr(lines, "name", None)
    if not isinstance(name, str) or getattr(lines, "mode", None) != "rb":
        return None
    fh: Any = lines
    try:
        st = os.fstat(fh.fileno())
        named = os.stat(name)
        start = fh.tell()
    except (OSError, AttributeError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (named.st_dev, named.st_ino):
        return None
    return Source(path=os.path.abspath(name), start=start, end=st.st_size, fh=fh)


def boundaries(fd: int, begin: int, end: int, chunk_bytes: int) -> list[int]:
    """[begin, …, end]: range edges about ``chunk_bytes`` apart, each a line start (the byte after a
    newline), strictly increasing."""
    edges = [begin]
    at = begin + chunk_bytes
    while at < end:
        edge = _line_start_at_or_after(fd, at, end)
        if edge >= end:
            break
        edges.append(edge)
        at = edge + chunk_bytes
    edges.append(end)
    return edges


def _line_start_at_or_after(fd: int, pos: int, end: int) -> int:
    at = pos - 1  # pos is a line start when the byte before it ends a line
    while at < end:
        block = os.pread(fd, min(SEARCH_BLOCK, end - at), at)
        if not block:
            return end
        nl = block.find(b"\n")
        if nl >= 0:
            return at + nl + 1
        at += len(block)
    return end


def scan_file(
    src: Source,
    fmt: str | None,
    rules: Rules,
    errors: Errors,
    take: Take,
    workdir: Path,
    workers: int,
    chunk_bytes: int,
    max_bytes: int,
) -> tuple[str | None, int, int, dict[str, Any]]:
    """Pass 1 over ``src`` in ``workers`` processes; returns (format, lines, bytes, how it went)."""
    nbytes = src.end - src.start
    if nbytes > max_bytes:
        raise too_large(max_bytes)
    begin, first_line = src.start, 1
    if fmt is None:  # the lines up to the first that tells the format, read here as scan() reads them
        lineno = 0
        for lineno, raw in enumerate(src.fh, 1):
            if not (raw.isspace() or not raw):
                try:
                    fmt = auto_format(raw)
                except RowError as exc:
                    errors.add(lineno, exc.kind, exc.message)
                else:
                    first_line = lineno
                    break
            begin += len(raw)
        if fmt is None:
            return None, lineno, nbytes, {"workers": 0}
    with open(src.path, "rb") as fh:
        edges = boundaries(fh.fileno(), begin, src.end, chunk_bytes)
    ranges = [(lo, hi) for lo, hi in itertools.pairwise(edges) if lo < hi]
    pool = [_Worker(workdir, k) for k in range(min(workers, len(ranges)))]
    rule_args = (rules.eval_fraction, rules.seed, rules.max_tokens, rules.max_errors)
    lines_before = first_line - 1
    try:
        idle = list(reversed(pool))
        busy: dict[int, tuple[_Worker, int]] = {}  # worker stdout fd -> (worker, range)
        done: dict[int, dict[str, Any]] = {}
        sent = merged = 0
        window = 2 * len(pool)
        spool = True
        while merged < len(ranges):
            while idle and sent < len(ranges) and sent < merged + window:
                w = idle.pop()
                lo, hi = ranges[sent]
                w.send((src.path, lo, hi, fmt, rule_args, str(_part(workdir, sent)), spool))
                busy[w.fd] = (w, sent)
                sent += 1
            for ready in wait(list(busy)):
                w, index = busy.pop(cast(int, ready))
                done[index] = w.receive()
                idle.append(w)
            while merged in done:
                res = done.pop(merged)
                part = _part(workdir, merged)
                errors.extend(res["errors"], lines_before)
                lines_before += res["lines"]
                if res["rows"] and not errors.total:
                    take(part, res["recs"], res["flags"], res["bands"])
                else:
                    part.unlink(missing_ok=True)
                spool = not errors.total  # after a bad line nothing more is stored
                merged += 1
        peaks = [w.max_rss for w in pool]
        for w in pool:
            w.stop()
    except BaseException:
        for w in pool:
            w.kill()
        raise
    how = {
        "workers": len(pool),
        "ranges": len(ranges),
        "worker_max_rss": peaks,
        # the peak resident sets of the parent so far and of each worker: their sum bounds what this
        # pass held at once
        "parent_max_rss": _max_rss(),
    }
    return fmt, lines_before, nbytes, how


def _part(workdir: Path, index: int) -> Path:
    return workdir / f"spool-{index:06d}.jsonl"


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, workdir: Path, k: int):
        self.log = open(workdir / f"worker-{k}.log", "w+b")  # noqa: SIM115 (closed in stop/kill)
        root = str(Path(trainyard.__file__).resolve().parents[1])  # the directory holding the package
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainyard.datasets.parallel"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            bufsize=0,
            env=env,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin = self.proc.stdin
        self.stdout = self.proc.stdout
        self.fd = self.stdout.fileno()
        self.max_rss = 0

    def send(self, task: tuple[Any, ...]) -> None:
        try:
            _send(self.stdin.fileno(), task)
        except OSError:
            raise self._failed() from None

    def receive(self) -> dict[str, Any]:
        try:
            res: dict[str, Any] = _receive(self.fd)
        except EOFError:
            raise self._failed() from None
        if "error" in res:
            last = res["error"].strip().splitlines()[-1]
            raise TrainyardError(f"a dataset ingestion worker failed: {last}")
        self.max_rss = max(self.max_rss, res["max_rss"])
        errors = Errors(0)
        errors.listed, errors.counts, errors.total = res["errors"]
        res["errors"] = errors
        return res

    def _failed(self) -> TrainyardError:
        code = self.proc.wait(timeout=STOP_WAIT_S)
        self.log.seek(0)
        tail = self.log.read().decode("utf-8", "replace").strip().splitlines()[-1:]
        return TrainyardError(f"a dataset ingestion worker exited with code {code}: {' '.join(tail)}")

    def stop(self) -> None:
        self.stdin.close()  # end of tasks
        try:
            self.proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._close()

    def _close(self) -> None:
        for f in (self.stdin, self.stdout, self.log):
            if not f.closed:
                f.close()


def _send(fd: int, obj: Any) -> None:
    body = pickle.dumps(obj, protocol=5)
    data = memoryview(len(body).to_bytes(8, "little") + body)
    while data:
        data = data[os.write(fd, data) :]


def _receive(fd: int) -> Any:
    size = int.from_bytes(_read_exactly(fd, 8), "little")
    return pickle.loads(_read_exactly(fd, size))


def _read_exactly(fd: int, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise EOFError
        got += n
    return buf


def _lines_in(fh: IO[bytes], size: int) -> Iterator[bytes]:
    """The lines of the next ``size`` bytes of ``fh`` (which end at a line end), split as iterating a
    binary file splits them (at b"\\n" only), READ_BUFFER bytes at a time."""
    return itertools.chain.from_iterable(map(io.BytesIO, _blocks(fh, size)))


def _blocks(fh: IO[bytes], size: int) -> Iterator[bytes]:
    """The next ``size`` bytes of ``fh`` in blocks that end at line ends (the last at ``size``)."""
    left = size
    tail = b""
    while left > 0:
        block = fh.read(min(READ_BUFFER, left))
        if not block:
            break
        left -= len(block)
        block = tail + block if tail else block
        cut = len(block) if left <= 0 else block.rfind(b"\n") + 1
        tail = block[cut:]
        if cut:
            yield block[:cut] if cut < len(block) else block
    if tail:
        yield tail


def scan_range(
    path: str,
    start: int,
    end: int,
    fmt: str,
    rule_args: tuple[float, int, int | None, int],
    part: str,
    spool: bool,
) -> dict[str, Any]:
    """One worker task: pass 1 over bytes [start, end) of ``path`` (lines numbered from 1), the
    canonical lines written to ``part`` (when ``spool``, until the range's first bad line)."""
    rules = Rules(*rule_args)
    errors = Errors(rules.max_errors)
    recs: list[np.ndarray] = []
    flags: list[bytes] = []
    bands: list[np.ndarray] = []
    offset = 0
    with open(path, "rb", buffering=0) as fh, open(part, "wb") as out:
        fh.seek(start)

        def emit(canons: list[bytes], tokens: np.ndarray, keys: list[str]) -> None:
            nonlocal offset
            if not spool:
                return
            data = b"".join(canons)
            out.write(data)
            r, f, b = facts(canons, tokens, keys, rules)
            r["start"] += offset
            offset += len(data)
            recs.append(r)
            flags.append(f)
            bands.append(b)

        _, lines, _ = scan(_lines_in(fh, end - start), fmt, rules, errors, emit, end - start)
    rows = sum(len(r) for r in recs)
    joined = np.empty(rows, dtype=ROW)  # (np.concatenate would repack the overlapping fields)
    at = 0
    for r in recs:
        joined[at : at + len(r)] = r
        at += len(r)
    return {
        "lines": lines,
        "rows": rows,
        "recs": joined,
        "flags": b"".join(flags),
        "bands": np.concatenate(bands) if bands else None,
        "errors": (errors.listed, errors.counts, errors.total),
        "max_rss": _max_rss(),
    }


def _max_rss() -> int:
    """This process's peak resident set in bytes (VmHWM)."""
    with open("/proc/self/status", "rb") as fh:
        for line in fh:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    """A worker: run the tasks read from stdin until it closes, each result to stdout."""
    keep_freed_heap()
    tasks, results = os.dup(0), os.dup(1)
    os.dup2(2, 1)  # anything printed goes to the log, not into the results
    while True:
        try:
            task = _receive(tasks)
        except EOFError:
            return
        try:
            res = scan_range(*task)
        except Exception:
            res = {"error": traceback.format_exc()}
        _send(results, res)


if __name__ == "__main__":
    main()
