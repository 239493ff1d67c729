"""Helpers shared by the commands that talk to a running server."""

from __future__ import annotations

from typing import Any

from trainyard.client import TrainyardClient


def client() -> TrainyardClient:
    """A client for TRAINYARD_URL, authenticated by TRAINYARD_API_KEY or $TRAINYARD_HOME/api_key."""
    return TrainyardClient(retries=3, backoff_s=0.2)


def money(v: Any) -> str:
    return "-" if v is None else f"${float(v):,.4f}"
