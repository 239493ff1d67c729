"""Worker logs, per rank and attempt: read live from the job's run directory while it runs, kept in the
tenant's storage area once an attempt ends.

Executors append each rank's stdout and stderr to ``run_dir/rank-<r>.log``, one section per attempt
that starts with a header line ``--- attempt A rank R ... ---``. When an attempt ends, the supervisor
copies each rank's section to ``tenants/<tenant>/logs/<job>/attempt-<A>/rank-<R>.log`` under the
storage root (``file://``: directories 0700, files 0600, like everything under ``TRAINYARD_HOME``); a
read prefers the live file and falls back to that copy, so logs outlive the run directory.

Offsets are byte offsets into what is read: the whole rank log without ``attempt`` (every section, with
its header, as before), or one attempt's section (the bytes after its header).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from trainyard.executors.base import rank_log_name
from trainyard.services.domain import Job
from trainyard.tenancy.storage import StoragePolicy

log = structlog.get_logger("trainyard.worker_logs")

_HEADER = re.compile(rb"^--- attempt (\d+) rank (\d+)[^\n]*---$", re.MULTILINE)
SCAN_CHUNK_BYTES = 1 << 20
MAX_TAIL_LINES = 10_000
MAX_INDEXED_LOGS = 4096  # rank logs whose sections are remembered (least recently read dropped first)


@dataclass
class _Index:
    """The sections of one rank log found so far: ``(attempt, header_start, body_start)``."""

    scanned_to: int = 0
    sections: list[tuple[int, int, int]] = field(default_factory=list)


def _read_range(path: Path, start: int, end: int) -> bytes:
    if end <= start:
        return b""
    with open(path, "rb") as fh:
        fh.seek(start)
        return fh.read(end - start)


def tail_start(data: bytes, lines: int) -> int:
    """The offset in ``data`` where its last ``lines`` lines begin (a final line without a newline
    counts as one)."""
    if lines <= 0:
        return len(data)
    end = len(data)
    if data.endswith(b"\n"):
        end -= 1
    pos = end
    for _ in range(lines):
        pos = data.rfind(b"\n", 0, pos)
        if pos < 0:
            return 0
    return pos + 1


class WorkerLogs:
    def __init__(self, storage_policy: StoragePolicy, tenant_name: Any) -> None:
        self.storage_policy = storage_policy
        self.tenant_name = tenant_name  # tenant id -> name
        self._indexes: dict[str, _Index] = {}
        self._lock = threading.Lock()

    # ---- where -----------------------------------------------------------------------------------
    def archive_url(self, tenant: str, job_id: str, attempt: int, rank: int) -> str:
        return f"{self.storage_policy.area(tenant, 'logs')}/{job_id}/attempt-{attempt}/{rank_log_name(rank)}"

    @staticmethod
    def live_path(job: Job, rank: int) -> Path | None:
        return Path(job.run_dir) / rank_log_name(rank) if job.run_dir else None

    # ---- sections of a live log ----------------------------------------------------------------
    def sections(self, path: Path) -> tuple[int, list[tuple[int, int, int]]]:
        """(size, sections) of a rank log, scanning only what was appended since the last call."""
        try:
            size = path.stat().st_size
        except OSError:
            return 0, []
        key = str(path)
        with self._lock:
            idx = self._indexes.pop(key, None)  # re-inserted below: the dict is kept in use order
            if idx is None or idx.scanned_to > size:  # new or truncated
                idx = _Index()
            self._indexes[key] = idx
            while len(self._indexes) > MAX_INDEXED_LOGS:
                self._indexes.pop(next(iter(self._indexes)))
            while idx.scanned_to < size:
                chunk = _read_range(path, idx.scanned_to, min(size, idx.scanned_to + SCAN_CHUNK_BYTES))
                last_nl = chunk.rfind(b"\n")
                if last_nl < 0:
                    if len(chunk) < SCAN_CHUNK_BYTES:
                        break  # a line still being written
                    idx.scanned_to += len(chunk)  # a very long line: no header in it
                    continue
                body = chunk[: last_nl + 1]
                for m in _HEADER.finditer(body):
                    at = idx.scanned_to + m.start()
                    if m.start() == 0 and idx.scanned_to > 0 and not self._after_newline(path, at):
                        continue
                    idx.sections.append((int(m.group(1)), at, idx.scanned_to + m.end() + 1))
                idx.scanned_to += last_nl + 1
            return size, list(idx.sections)

    @staticmethod
    def _after_newline(path: Path, at: int) -> bool:
        return _read_range(path, at - 1, at) == b"\n"

    def _section_range(self, path: Path, attempt: int) -> tuple[int, int] | None:
        size, sections = self.sections(path)
        for i, (a, _header, body) in enumerate(sections):
            if a == attempt:
                end = sections[i + 1][1] if i + 1 < len(sections) else size
                return body, end
        return None

    # ---- reading ---------------------------------------------------------------------------------
    def attempts(self, job: Job, rank: int) -> list[int]:
        path = self.live_path(job, rank)
        found: set[int] = set()
        if path is not None and path.is_file():
            found.update(a for a, _h, _b in self.sections(path)[1])
        found.update(self._archived_attempts(job, rank))
        return sorted(found)

    def _archived_attempts(self, job: Job, rank: int) -> list[int]:
        tenant = self.tenant_name(job.tenant_id)
        if not tenant:
            return []
        out = []
        for a in range(1, job.attempt + 1):
            if self._archive_exists(self.archive_url(tenant, job.id, a, rank)):
                out.append(a)
        return out

    def _archive_exists(self, url: str) -> bool:
        try:
            import fsspec

            fs, p = fsspec.core.url_to_fs(url)
            return bool(fs.exists(p))
        except Exception:
            return False

    def _archive_bytes(self, url: str) -> bytes | None:
        try:
            import fsspec

            with fsspec.open(url, "rb") as fh:
                return bytes(fh.read())
        except FileNotFoundError:
            return None
        except Exception as exc:
            log.warning("log_archive_read_failed", url=url, error=str(exc)[:300])
            return None

    def content(self, job: Job, rank: int, attempt: int | None) -> tuple[bytes | Path | None, int, int]:
        """What a read sees: ``(source, start, end)``, where ``source`` is the live file (bytes
        ``start..end`` of it), bytes (an archived attempt, or every archived attempt with its header),
        or None when the rank has no log."""
        path = self.live_path(job, rank)
        live = path is not None and path.is_file()
        if live and path is not None:
            if attempt is None:
                size = path.stat().st_size
                return path, 0, size
            rng = self._section_range(path, attempt)
            if rng is not None:
                return path, rng[0], rng[1]
        tenant = self.tenant_name(job.tenant_id)
        if not tenant:
            return None, 0, 0
        if attempt is not None:
            data = self._archive_bytes(self.archive_url(tenant, job.id, attempt, rank))
            return (data, 0, len(data)) if data is not None else (None, 0, 0)
        parts = []
        for a in range(1, job.attempt + 1):
            data = self._archive_bytes(self.archive_url(tenant, job.id, a, rank))
            if data is not None:
                parts.append(f"--- attempt {a} rank {rank} ---\n".encode() + data)
        if not parts:
            return None, 0, 0
        whole = b"".join(parts)
        return whole, 0, len(whole)

    def read(
        self,
        job: Job,
        *,
        rank: int,
        attempt: int | None,
        offset: int,
        limit_bytes: int,
        tail_lines: int | None = None,
    ) -> dict[str, Any]:
        source, start, end = self.content(job, rank, attempt)
        length = end - start
        if tail_lines is not None and source is not None:
            window = min(length, limit_bytes)
            data = self._bytes(source, end - window, end)
            cut = tail_start(data, min(tail_lines, MAX_TAIL_LINES))
            offset = length - window + cut
            chunk = data[cut:]
        else:
            chunk = b""
            if source is not None and offset < length:
                chunk = self._bytes(source, start + offset, start + min(length, offset + limit_bytes))
        return {
            "job_id": job.id,
            "rank": rank,
            "attempt": attempt,
            "offset": offset,
            "next_offset": offset + len(chunk),
            "size": length,
            "text": chunk.decode("utf-8", errors="replace"),
        }

    @staticmethod
    def _bytes(source: bytes | Path, start: int, end: int) -> bytes:
        if isinstance(source, bytes):
            return source[start:end]
        return _read_range(source, start, end)

    # ---- keeping ---------------------------------------------------------------------------------
    def archive(self, job: Job, attempt: int) -> list[str]:
        """Copy each rank's section of ``attempt`` to the tenant's logs area; the URLs written."""
        tenant = self.tenant_name(job.tenant_id)
        if not tenant or not job.run_dir:
            return []
        written = []
        ranks = max(1, job.placement.devices if job.placement else 1)
        for rank in range(ranks):
            path = self.live_path(job, rank)
            if path is None or not path.is_file():
                continue
            rng = self._section_range(path, attempt)
            if rng is None:
                continue
            url = self.archive_url(tenant, job.id, attempt, rank)
            try:
                _write(url, _read_range(path, rng[0], rng[1]))
                written.append(url)
            except Exception as exc:  # the live log stays; a later read falls back to it
                log.warning(
                    "log_archive_failed", job_id=job.id, attempt=attempt, rank=rank, error=str(exc)[:300]
                )
        return written


def _write(url: str, data: bytes) -> None:
    """Write ``data`` at ``url``: locally with 0700 directories and a 0600 file (written to a temporary
    name, then renamed), elsewhere through fsspec."""
    if url.startswith("file://"):
        path = Path(url[len("file://") :])
        missing = []
        d = path.parent
        while not d.exists():
            missing.append(d)
            d = d.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                d.mkdir(mode=0o700)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        return
    import fsspec

    with fsspec.open(url, "wb") as fh:
        fh.write(data)
