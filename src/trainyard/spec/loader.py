"""Load a JobSpec from YAML or JSON text and turn pydantic errors into one clear, path-named error."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trainyard.errors import SpecError, list_errors
from trainyard.spec.models import JobSpec

_NAMED = re.compile(r"^([a-z_]+(?:\.[a-z_]+)+): (.+)$", re.DOTALL)


def _path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p in ("function-after", "function-before") or "[" in str(p):
            continue
        else:
            parts.append(("." if parts else "") + str(p))
    return "".join(parts) or "(spec)"


def describe_validation_error(exc: ValidationError, prefix: str = "") -> list[dict[str, str]]:
    """One ``{field, message}`` per failure, with field paths like ``workload.precision``."""
    out: list[dict[str, str]] = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if p not in ("literal['auto']", "ParallelismPin"))
        field = _path(loc)
        if prefix:
            field = f"{prefix}.{field}" if field != "(spec)" else prefix
        msg = err["msg"].removeprefix("Value error, ")
        kind = err["type"]
        named = _NAMED.match(msg) if kind == "value_error" else None
        if named and field.startswith("(spec)"):
            # a check across sections names its field in the message ("workload.seq_len: ...")
            field, msg = named.group(1), named.group(2)
        given = err.get("input")
        if kind == "enum":
            allowed = err.get("ctx", {}).get("expected", "")
            msg = f"{given!r} is not one of {allowed.replace(' or ', ', ').replace(chr(39), '')}"
        elif kind == "extra_forbidden":
            msg = "unknown key (not part of trainyard/v1)"
        elif kind == "missing":
            msg = "required"
        elif kind == "literal_error" or (
            given is not None and not isinstance(given, dict | list) and kind != "value_error"
        ):
            msg = f"{given!r}: {msg}"
        out.append({"field": field, "message": msg})
    return out


def spec_from_dict(data: Any, source: str = "spec") -> JobSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a job spec must be a mapping, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        errors = describe_validation_error(exc)
        raise SpecError(list_errors(errors), details={"errors": errors}) from None


# A job spec or pools file is a few kilobytes; anything past this is refused before parsing.
MAX_DOCUMENT_BYTES = 1_000_000


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases, so a small document cannot expand into a huge one
    (the "billion laughs" alias bomb). Job specs and pools files never need them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None,
                None,
                "YAML anchors and aliases (&name, *name) are not accepted",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def safe_yaml_load(text: str) -> Any:
    """The one YAML loader for untrusted input: safe types only, no anchors/aliases, bounded size."""
    return yaml.load(text, Loader=_NoAliasLoader)


def parse_document(text: str, source: str) -> Any:
    """Parse YAML (a superset of JSON) with a one-line error on malformed input.

    Refuses documents over ``MAX_DOCUMENT_BYTES`` and YAML anchors/aliases, whoever sent them."""
    size = len(text) if len(text) > MAX_DOCUMENT_BYTES else len(text.encode("utf-8", errors="replace"))
    if size > MAX_DOCUMENT_BYTES:
        raise SpecError(
            f"{source}: document too large ({size} bytes; the limit is {MAX_DOCUMENT_BYTES})",
            hint="A job spec or pools file is a few kilobytes; check that the right file was given.",
            details={"errors": [{"field": "(document)", "message": "document too large"}]},
        )
    try:
        if source.endswith(".json"):
            return json.loads(text)
        return safe_yaml_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        if isinstance(exc, json.JSONDecodeError):
            where = f" at line {exc.lineno}, column {exc.colno}"
        problem = getattr(exc, "problem", None) or getattr(exc, "msg", None) or str(exc).splitlines()[0]
        raise SpecError(
            f"{source}: malformed {'JSON' if source.endswith('.json') else 'YAML'}{where}: {problem}",
            hint="Check indentation and quoting near that position.",
        ) from None


def load_spec_text(text: str, source: str = "spec") -> JobSpec:
    return spec_from_dict(parse_document(text, source), source)


def load_spec(path: str | Path) -> JobSpec:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{p}: no such file", hint="Give the path of a job spec YAML or JSON file.") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise SpecError(f"{p}: cannot read ({exc.__class__.__name__})") from None
    return load_spec_text(text, str(p))
