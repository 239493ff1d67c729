"""Structured logs with structlog: one JSON object per line when the stream is not a terminal (files,
pipes, log collectors), a readable coloured line when it is; the level from ``TRAINYARD_LOG_LEVEL``;
``trace_id`` and ``span_id`` (W3C hex) in every record emitted inside a span, so a log line leads to its
trace. Records of the standard library's loggers (uvicorn, alembic, ...) go through the same pipeline.
Request logs carry method, route, status and tenant, never headers."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal, TextIO

import structlog
from opentelemetry import trace

from trainyard.errors import InvalidInputError

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
Renderer = Literal["auto", "json", "console"]


def parse_level(level: str | int) -> int:
    """A level name (``debug``, ``info``, ``warning``, ``error``, ``critical``) or number."""
    if isinstance(level, int):
        return level
    value = LEVELS.get(str(level).strip().lower())
    if value is None:
        raise InvalidInputError(
            f"TRAINYARD_LOG_LEVEL: unknown log level {level!r}",
            hint="Use one of: debug, info, warning, error, critical.",
            details={"errors": [{"field": "TRAINYARD_LOG_LEVEL", "message": f"unknown level {level!r}"}]},
        )
    return value


def add_trace_context(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """``trace_id`` and ``span_id`` of the span current where the record is emitted (none outside)."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event_dict.setdefault("trace_id", f"{ctx.trace_id:032x}")
        event_dict.setdefault("span_id", f"{ctx.span_id:016x}")
    return event_dict


def is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def configure_logging(
    level: str | int = "info", stream: TextIO | None = None, renderer: Renderer = "auto"
) -> None:
    """Send structlog's and the standard library's records to ``stream`` (default stderr)."""
    out = stream if stream is not None else sys.stderr
    lvl = parse_level(level)
    console = renderer == "console" or (renderer == "auto" and is_terminal(out))
    render: Any = (
        structlog.dev.ConsoleRenderer(colors=is_terminal(out))
        if console
        else structlog.processors.JSONRenderer()
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        add_trace_context,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                *([] if console else [structlog.processors.format_exc_info]),
                render,
            ],
            foreign_pre_chain=shared,
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)
    for noisy in ("alembic", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(lvl, logging.WARNING))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            add_trace_context,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *([] if console else [structlog.processors.format_exc_info]),
            render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=True,
    )
