"""Shared CLI plumbing: error rendering (one line + hint, never a traceback) and JSON output."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from rich.console import Console

from trainyard.errors import TrainyardError

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def print_json(doc: Any) -> None:
    """Print exactly one JSON document on stdout (the --json contract)."""
    sys.stdout.write(json.dumps(doc, indent=None, separators=(",", ":"), default=str) + "\n")
    sys.stdout.flush()


def fail(exc: TrainyardError) -> None:
    err_console.print(f"[bold red]error:[/] {exc.message}", highlight=False, markup=True, soft_wrap=True)
    if exc.hint:
        err_console.print(f"[dim]hint:[/] {exc.hint}", highlight=False, soft_wrap=True)
    raise SystemExit(exc.exit_code)


def handle_errors(func: F) -> F:
    """Turn trainyard errors (and a few predictable OS errors) into a one-line message and exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TrainyardError as exc:
            fail(exc)
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise SystemExit(130) from None

    return wrapper  # type: ignore[return-value]
