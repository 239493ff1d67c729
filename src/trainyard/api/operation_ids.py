"""Named OpenAPI operation ids, ``<tag>_<verb>`` (``jobs_submit``, ``jobs_get``, ``datasets_rows``), so
generated clients get readable method names. The id comes from the route's handler name with the
resource's own name dropped: ``submit_job`` under ``jobs`` is ``jobs_submit``."""

from __future__ import annotations

from fastapi.routing import APIRoute

_DEFAULT_VERB = {"GET": "get", "POST": "create", "PUT": "put", "PATCH": "update", "DELETE": "delete"}


def _singular(word: str) -> str:
    return word[:-1] if word.endswith("s") else word


def operation_id(route: APIRoute) -> str:
    tag = str(route.tags[-1]) if route.tags else "root"
    drop = {tag, _singular(tag)}
    verb = "_".join(w for w in route.name.split("_") if w not in drop)
    if not verb:
        verb = _DEFAULT_VERB.get(next(iter(sorted(route.methods or {"GET"}))), "call")
    return f"{tag}_{verb}"
