"""Typed Python client of the trainyard REST API."""

from trainyard.client.client import TrainyardClient, resolve_api_key

__all__ = ["TrainyardClient", "resolve_api_key"]
