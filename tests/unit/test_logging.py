"""Structured logs as the server configures them, in a child process: JSON on a pipe, the console
renderer on a terminal (a real pseudo-terminal), the level from TRAINYARD_LOG_LEVEL, trace and span ids
in every record emitted inside a span, the standard library's records through the same pipeline."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.errors import InvalidInputError
from trainyard.observability.logging import parse_level

SRC = Path(__file__).resolve().parents[2] / "src"
CHILD = """
import logging, structlog
from opentelemetry.sdk.trace import TracerProvider
from trainyard.server import configure_logging
from trainyard.settings import Settings
configure_logging(Settings().log_level)
log = structlog.get_logger("t")
tracer = TracerProvider().get_tracer("t")
log.debug("hidden_debug")
with tracer.start_as_current_span("s") as sp:
    c = sp.get_span_context()
    print(f"{c.trace_id:032x} {c.span_id:016x}", flush=True)
    log.info("inside", answer=42)
    logging.getLogger("uvicorn.error").warning("stdlib %s", "record")
log.info("outside")
"""
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env["PYTHONPATH"] = str(SRC)
    env.update(extra)
    return env


def run_piped(**extra: str) -> tuple[str, list[dict[str, object]]]:
    p = subprocess.run(
        [sys.executable, "-c", CHILD], env=child_env(**extra), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.strip(), [json.loads(line) for line in p.stderr.splitlines() if line.strip()]


def test_json_on_a_pipe_with_trace_ids_inside_spans_only() -> None:
    ids, records = run_piped()
    trace_id, span_id = ids.split()
    by_event = {r["event"]: r for r in records}
    assert "hidden_debug" not in by_event  # info by default
    inside = by_event["inside"]
    assert inside["level"] == "info" and inside["answer"] == 42
    assert (inside["trace_id"], inside["span_id"]) == (trace_id, span_id)
    stdlib = by_event["stdlib record"]
    assert stdlib["level"] == "warning" and stdlib["trace_id"] == trace_id
    assert "trace_id" not in by_event["outside"] and "span_id" not in by_event["outside"]
    assert all("timestamp" in r for r in records)


def test_level_comes_from_the_settings() -> None:
    _, records = run_piped(TRAINYARD_LOG_LEVEL="debug")
    assert "hidden_debug" in {r["event"] for r in records}
    _, records = run_piped(TRAINYARD_LOG_LEVEL="error")
    assert records == []


def test_readable_lines_on_a_terminal() -> None:
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(
            [sys.executable, "-c", CHILD],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
        )
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        out, _ = p.communicate(timeout=120)
    finally:
        os.close(master)
    assert p.returncode == 0
    trace_id, span_id = out.split()
    text = b"".join(chunks).decode()
    assert ANSI.search(text), "a terminal gets colours"
    plain = ANSI.sub("", text)
    lines = [line for line in plain.splitlines() if line.strip()]
    inside = next(line for line in lines if " inside " in f" {line} ")
    with pytest.raises(ValueError):
        json.loads(inside)
    assert "answer=42" in inside and f"trace_id={trace_id}" in inside and f"span_id={span_id}" in inside
    assert any("stdlib record" in line and trace_id in line for line in lines)
    assert "hidden_debug" not in plain


def test_unknown_level_is_a_clear_error() -> None:
    assert parse_level("WARNING") == 30 and parse_level(10) == 10
    with pytest.raises(InvalidInputError, match="TRAINYARD_LOG_LEVEL"):
        parse_level("loud")
