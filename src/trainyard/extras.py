"""Which install extra brings which import, so a command that needs a part of trainyard that is not
installed says which extra to install instead of showing a traceback (docs/dependencies.md).

The core install (the client, the CLI and the pure core) needs none of these modules."""

from __future__ import annotations

from trainyard.errors import MissingExtraError

#: top-level module → the extra that installs it
EXTRA_OF_MODULE: dict[str, str] = {
    **dict.fromkeys(
        (
            "fastapi",
            "starlette",
            "uvicorn",
            "httptools",
            "uvloop",
            "sqlalchemy",
            "alembic",
            "psycopg",
            "structlog",
            "prometheus_client",
            "opentelemetry",
            "jinja2",
            "markupsafe",
            "matplotlib",
            "orjson",
        ),
        "server",
    ),
    **dict.fromkeys(
        ("torch", "transformers", "peft", "safetensors", "tokenizers", "fsspec", "s3fs"), "train"
    ),
    "ray": "ray",
    "psutil": "serve",
    "mlflow": "mlflow",
}


def missing_extra(exc: ImportError, *, what: str = "this command") -> MissingExtraError | None:
    """The MissingExtraError for an import of a module an extra provides; None for any other import."""
    name = getattr(exc, "name", None) or ""
    extra = EXTRA_OF_MODULE.get(name.split(".")[0])
    return MissingExtraError(extra, name, what=what) if extra else None
