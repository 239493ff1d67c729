"""Shared CLI plumbing: error rendering (one line + hint, never a traceback; a JSON error document with
``--json``), JSON output, tables that fit the terminal without cutting ids, and the display formats of
money, durations and markets (from trainyard.cost.money, the one formatter).

Only light modules are imported here: every command imports this one at start-up.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rich.console import Console

from trainyard.cost.money import format_duration_s, format_usd
from trainyard.errors import TrainyardError

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

F = TypeVar("F", bound=Callable[..., Any])


# ---- JSON ------------------------------------------------------------------------------------------
def _jsonable(value: Any) -> Any:
    """Client documents (pydantic models) as the JSON the server sent; anything else as text."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else str(value)


def print_json(doc: Any) -> None:
    """Print exactly one JSON document on stdout (the --json contract)."""
    sys.stdout.write(json.dumps(doc, indent=None, separators=(",", ":"), default=_jsonable) + "\n")
    sys.stdout.flush()


def as_doc(value: Any) -> Any:
    """A client answer as plain JSON data: typed documents become the dicts the server sent."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, list):
        return [as_doc(v) for v in value]
    return value


def json_requested(kwargs: dict[str, Any] | None = None) -> bool:
    """Whether the running command was given ``--json`` (its ``as_json`` parameter)."""
    if kwargs and kwargs.get("as_json"):
        return True
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    while ctx is not None:
        if ctx.params.get("as_json"):
            return True
        ctx = ctx.parent
    return False


# ---- errors ----------------------------------------------------------------------------------------
def error_document(exc: TrainyardError) -> dict[str, Any]:
    """The same ``{error: {code, message, hint, details}}`` document the API answers with."""
    return {"error": exc.to_dict()}


def print_error(exc: TrainyardError) -> None:
    """One line, the hint, and every validation error when there are several (never "(and N more)")."""
    message = exc.message
    errors = exc.details.get("errors") if isinstance(exc.details, dict) else None
    listed = isinstance(errors, list) and len(errors) > 1
    if listed:
        message = message.split(" (and ", 1)[0] if " more)" in message else message
        message = f"{len(errors)} problems; the first: {message}"  # type: ignore[arg-type]
    err_console.print(f"[bold red]error:[/] {_escape(message)}", markup=True, soft_wrap=True)
    if listed:
        for e in errors:  # type: ignore[union-attr]
            if isinstance(e, dict):
                where = e.get("field") or (f"line {e['line']}" if e.get("line") is not None else "")
                text = f"{where}: {e.get('message')}" if where else str(e.get("message"))
            else:
                text = str(e)
            err_console.print(f"  - {_escape(text)}", markup=True, soft_wrap=True)
    if exc.hint:
        err_console.print(f"[dim]hint:[/] {_escape(exc.hint)}", markup=True, soft_wrap=True)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def fail(exc: TrainyardError, *, as_json: bool = False) -> None:
    """Report ``exc`` and exit with its code: with ``--json`` the error document goes to stdout too."""
    if as_json:
        print_json(error_document(exc))
    print_error(exc)
    raise SystemExit(exc.exit_code)


def handle_errors(func: F) -> F:
    """Turn trainyard errors into a one-line message (and, with --json, an error document on stdout)
    and the error's exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TrainyardError as exc:
            fail(exc, as_json=json_requested(kwargs))
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise SystemExit(130) from None

    return wrapper  # type: ignore[return-value]


# ---- display formats -------------------------------------------------------------------------------
def usd(value: Any, significant: int = 2) -> str:
    """Dollars for people (``-`` for none): trainyard.cost.money.format_usd."""
    if value is None:
        return "-"
    try:
        return format_usd(float(value), significant)
    except (TypeError, ValueError):
        return "-"


def duration(seconds: Any) -> str:
    if seconds is None:
        return "-"
    try:
        return format_duration_s(float(seconds))
    except (TypeError, ValueError):
        return "-"


def hours(value: Any) -> str:
    """A duration given in hours (quotes carry ``expected_hours``)."""
    return "-" if value is None else duration(float(value) * 3600.0)


def market(value: Any) -> str:
    """The market as people read it everywhere: ``on-demand``, ``spot``, ``reserved``."""
    return "-" if not value else str(value).replace("_", "-")


def number(value: Any, fmt: str = ",") -> str:
    if value is None:
        return "-"
    try:
        return format(value, fmt)
    except (TypeError, ValueError):
        return str(value)


# ---- tables ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Col:
    """One table column. ``key`` keeps the cell whole (ids, names: never wrapped or cut); ``priority``
    orders what goes first when the terminal is too narrow (0 = always shown, higher = dropped sooner)."""

    header: str
    key: bool = False
    priority: int = 0
    justify: str = "left"


def _build(
    cols: Sequence[Col], cells: Sequence[Sequence[str]], keep: Sequence[int], title: str | None
) -> Any:
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, header_style="bold", title=title, title_justify="left", pad_edge=False)
    for i in keep:
        c = cols[i]
        t.add_column(c.header, justify=c.justify, no_wrap=c.key, overflow="fold")  # type: ignore[arg-type]
    for r in cells:
        t.add_row(*(r[i] for i in keep))
    return t


def _measure(table: Any) -> Any:
    import io

    from rich.measure import Measurement

    wide = Console(width=100_000, file=io.StringIO())
    return Measurement.get(wide, wide.options, table)


def natural_width(table: Any) -> int:
    """The width a table takes when nothing in it wraps."""
    return int(_measure(table).maximum)


def fit_columns(cols: Sequence[Col], cells: Sequence[Sequence[str]], width: int) -> list[int]:
    """Indexes of the columns to show in ``width`` cells: all of them when they fit; else the
    lowest-value columns go first (highest priority number, rightmost first) until the table fits
    without wrapping, or nothing droppable is left (the rest then wraps its non-key cells)."""
    keep = list(range(len(cols)))
    droppable = sorted((i for i in keep if cols[i].priority > 0), key=lambda i: (-cols[i].priority, -i))
    for i in droppable:
        if natural_width(_build(cols, cells, keep, None)) <= width:
            break
        keep.remove(i)
    return keep


def print_table(
    cols: Sequence[Col],
    rows: Iterable[Sequence[Any]],
    *,
    wide: bool = False,
    title: str | None = None,
    out: Console | None = None,
) -> list[str]:
    """Print rows as a table that keeps key cells (ids, names) whole. On a terminal it fits the
    terminal's width by dropping low-value columns (``wide`` keeps them all); piped or redirected, every
    column is printed at its natural width (nothing is cut to 80 columns). Returns the headers shown."""
    out = out or console
    cells = [["-" if v is None else str(v) for v in r] for r in rows]
    terminal = out.is_terminal
    keep = list(range(len(cols))) if wide or not terminal else fit_columns(cols, cells, out.width)
    table = _build(cols, cells, keep, title)
    if terminal and not wide and _measure(table).minimum <= out.width:
        out.print(table)
    else:
        # --wide, not a terminal, or key cells wider than the terminal: every cell at its natural width
        # (long lines are the terminal's to wrap), never cut to the console's width
        width = max(natural_width(table), 20)
        Console(
            file=out.file, width=width, force_terminal=terminal, no_color=not terminal, highlight=False
        ).print(table)
    dropped = len(cols) - len(keep)
    if dropped:
        out.print(f"[dim]{dropped} column(s) hidden to fit the terminal: --wide shows all[/]")
    return [cols[i].header for i in keep]


WIDE_OPTION_HELP = "Show every column (by default low-value columns are hidden to fit the terminal)."
