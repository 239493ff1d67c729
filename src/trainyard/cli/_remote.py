"""Helpers shared by the commands that talk to a running server."""

from __future__ import annotations

from typing import Any

from trainyard.cli.common import as_doc
from trainyard.serverfile import resolve_url


def root_url() -> str | None:
    """The root ``--url`` option of this invocation, if given."""
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    value = root.params.get("url") if root is not None else None
    return str(value) if value else None


class _Documents:
    """The client, with every answer as plain JSON data (dicts and lists), whatever type it returns."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return as_doc(attr(*args, **kwargs))

        return call

    def __enter__(self) -> _Documents:
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.close()


def client() -> Any:
    """A client for the server named by --url, TRAINYARD_URL, $TRAINYARD_HOME/server.json or the default
    address, authenticated by TRAINYARD_API_KEY or $TRAINYARD_HOME/api_key."""
    import httpx

    from trainyard.client import TrainyardClient

    url, _ = resolve_url(root_url())
    transport = None
    if url.startswith("http://"):
        # plain HTTP never uses TLS: skip building a certificate store (~0.15 s of every command)
        transport = httpx.HTTPTransport(verify=False)
    return _Documents(TrainyardClient(url=url, retries=3, backoff_s=0.2, transport=transport))
