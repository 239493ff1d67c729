"""Helpers shared by the commands that talk to a running server."""

from __future__ import annotations

import sys
from typing import Any

from trainyard.serverfile import resolve_url


def root_url() -> str | None:
    """The root ``--url`` option of this invocation, if given."""
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    value = root.params.get("url") if root is not None else None
    return str(value) if value else None


def _import_httpx() -> Any:
    """httpx, without its own command-line tool: when click, pygments and rich are installed (they are,
    beside typer), ``import httpx`` also imports ``httpx._main`` and with it click, pygments and
    rich's progress, syntax and table modules, which the CLI does not use for most commands. An entry
    of None in sys.modules makes that one import fail, which httpx handles (its ``httpx.main`` then
    only explains that the tool cannot run); the entry is removed again afterwards."""
    if "httpx" in sys.modules:
        return sys.modules["httpx"]
    blocked = "httpx._main" not in sys.modules
    if blocked:
        sys.modules["httpx._main"] = None  # type: ignore[assignment]
    try:
        import httpx
    finally:
        if blocked and sys.modules.get("httpx._main", 0) is None:
            del sys.modules["httpx._main"]
    return httpx


def client() -> Any:
    """A client for the server named by --url, TRAINYARD_URL, $TRAINYARD_HOME/server.json or the default
    address, authenticated by TRAINYARD_API_KEY or $TRAINYARD_HOME/api_key. It returns every answer as
    the JSON the server sent (dicts and lists): the commands print JSON or tables of it, so the typed
    documents (pydantic) are not imported for them."""
    httpx = _import_httpx()

    from trainyard.client import TrainyardClient

    class JsonClient(TrainyardClient):
        _typed = False

    url, _ = resolve_url(root_url())
    transport = None
    if url.startswith("http://"):
        # plain HTTP never uses TLS: skip building a certificate store (~0.15 s of every command)
        transport = httpx.HTTPTransport(verify=False)
    return JsonClient(url=url, retries=3, backoff_s=0.2, transport=transport)
