"""Append-only JSON-lines event files, one per rank and attempt, inside the job's ``run_dir``.

Workers never talk to the server; the executor tails these files (``executors.base`` names them). A
line is written with a single ``write`` call on a file opened in append mode and flushed immediately,
so a reader sees whole lines, and a line cut short by a crash is ignored by the reader.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from trainyard.executors.base import EVENT_KINDS, event_file_name


class EventWriter:
    def __init__(self, run_dir: str | os.PathLike[str], job_id: str, attempt: int, rank: int):
        self.path = Path(run_dir) / event_file_name(attempt, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.job_id = job_id
        self.attempt = attempt
        self.rank = rank
        self.host = socket.gethostname()
        self._lock = threading.Lock()
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process lifetime

    def emit(self, kind: str, **data: Any) -> dict[str, Any]:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        doc = {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "kind": kind,
            "data": data,
            "time_s": time.time(),
        }
        line = json.dumps(doc, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()
        return doc

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.flush()
                os.fsync(self._fh.fileno())
                self._fh.close()


class EventTail:
    """Reads new complete lines from one event file, remembering its byte offset."""

    def __init__(self, path: str | os.PathLike[str], offset: int = 0):
        self.path = Path(path)
        self.offset = offset

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        if not chunk:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []  # a line still being written
        self.offset += end + 1
        out = []
        for raw in chunk[: end + 1].splitlines():
            try:
                doc = json.loads(raw)
            except ValueError:
                continue  # a torn line from a killed process
            if isinstance(doc, dict) and "kind" in doc:
                out.append(doc)
        return out
