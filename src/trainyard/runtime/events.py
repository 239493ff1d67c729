"""Append-only JSON-lines event files, one per rank and attempt, inside the job's ``run_dir``.

Workers never talk to the server; the executor tails these files (``executors.base`` names them). A
line is written with a single ``write`` call on a file opened in append mode and flushed immediately,
so a reader sees whole lines, and a line cut short by a crash is ignored by the reader.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from trainyard.executors.base import EVENT_KINDS, event_file_name


def _num(value: Any, fmt: str) -> str:
    return "?" if not isinstance(value, int | float) or isinstance(value, bool) else format(value, fmt)


def describe(kind: str, data: dict[str, Any]) -> str | None:
    """The human-readable log line of an event (what the built-in trainer prints), or None for kinds
    that are not logged as lines (step metrics, run records)."""
    if kind == "heartbeat":
        total = data.get("total_steps")
        of = f"/{total}" if total else ""
        return (
            f"step {data.get('step')}{of} loss {_num(data.get('loss'), '.4f')} "
            f"{_num(data.get('step_time_s'), '.3f')} s/step "
            f"{_num(data.get('tokens_per_s'), ',.0f')} tokens/s "
            f"memory {_num(data.get('memory_gib'), '.2f')} GiB"
        )
    if kind == "started":
        resumed = data.get("resumed_from_step")
        where = f"resumed from the checkpoint of step {resumed}" if resumed is not None else "from step 0"
        device = (data.get("device") or {}).get("accelerator") or (data.get("device") or {}).get("type")
        return (
            f"rank {data.get('rank')} started (pid {data.get('pid')} on {data.get('host')}, device {device}, "
            f"world size {data.get('world_size')}): {where}"
        )
    if kind == "checkpoint":
        extra = f" in {_num(data.get('save_s'), '.2f')} s" if data.get("save_s") is not None else ""
        emergency = "emergency " if data.get("emergency") else ""
        return f"{emergency}checkpoint of step {data.get('step')} committed{extra}: {data.get('path')}"
    if kind == "evaluation":
        return (
            f"eval loss {_num(data.get('loss'), '.4f')} at step {data.get('step')} "
            f"({data.get('samples')} samples of the {data.get('split')} split)"
        )
    if kind == "log":
        return str(data.get("message", ""))
    if kind == "succeeded":
        sha = data.get("model_sha256")
        return f"training finished at step {data.get('final_step')}" + (
            f", model sha256 {sha}" if sha else ""
        )
    if kind == "preempted":
        ckpt = data.get("checkpoint_step")
        return f"preempted at step {data.get('step')}; last committed checkpoint: step {ckpt}"
    if kind == "failed":
        return f"failed ({data.get('classification')}): {data.get('reason')}"
    return None


class EventWriter:
    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        job_id: str,
        attempt: int,
        rank: int,
        *,
        echo: TextIO | None = None,
    ):
        self.path = Path(run_dir) / event_file_name(attempt, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.job_id = job_id
        self.attempt = attempt
        self.rank = rank
        self.host = socket.gethostname()
        self._lock = threading.Lock()
        self.echo = echo  # where a readable line of each event goes (the rank's log), if anywhere
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process lifetime

    def emit(self, kind: str, **data: Any) -> dict[str, Any]:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        now = time.time()
        doc = {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "kind": kind,
            "data": data,
            "time_s": now,
        }
        line = json.dumps(doc, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()
            text = describe(kind, data) if self.echo is not None else None
            if text and self.echo is not None:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
                with contextlib.suppress(OSError, ValueError):  # a closed stdout loses the line only
                    self.echo.write(f"{stamp}Z [rank {self.rank}] {text}\n")
                    self.echo.flush()
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
