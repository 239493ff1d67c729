"""Property-based fuzzing of every route from the OpenAPI document: no input makes the API answer 5xx.

Bounded (a few examples per operation) so the whole run stays well under a minute. Requests carry a
valid non-admin key, so generated bodies reach the validation and business layers behind auth."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from trainyard.api.app import create_app
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.settings import Settings

STATE: dict[str, Any] = {}


class LazyApp:
    """An ASGI app that forwards to the app the module fixture builds (the schema is loaded at import)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await STATE["app"](scope, receive, send)


def _openapi() -> dict[str, Any]:
    # Generating the document touches no database: an unstarted platform is enough.
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        unstarted = Platform(Settings(home=Path(tmp)), PlatformOptions(with_catalog=False))
        doc = create_app(unstarted, access_log=False).openapi()
        unstarted.db.dispose()
    return doc


@schemathesis.serializer("application/gzip")
def _gzip_bytes(ctx: Any, value: Any) -> bytes:
    """Code archives (POST /v1/code) are raw bytes: generated values are sent as they are, so the server
    sees malformed archives as well as empty ones."""
    return value if isinstance(value, bytes) else str(value).encode()


schema = schemathesis.openapi.from_dict(_openapi())
schema.app = LazyApp()


@pytest.fixture(scope="module", autouse=True)
def live_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    home: Path = tmp_path_factory.mktemp("fuzz")
    platform = Platform.open(
        Settings(home=home, database_url=f"sqlite:///{home / 'fuzz.db'}"),
        PlatformOptions(cpu_count=2, with_catalog=False),
    )
    STATE["app"] = create_app(platform, access_log=False)
    _tenant, key = platform.tenants.create("fuzzer")
    STATE["headers"] = {"Authorization": f"Bearer {key}"}
    yield
    platform.close()


@schema.parametrize()
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors(case: Any) -> None:
    headers = dict(case.headers or {})
    headers.setdefault("Authorization", STATE["headers"]["Authorization"])
    response = case.call(headers=headers)
    case.validate_response(response, checks=[not_a_server_error])
    if 400 <= response.status_code < 500 and response.status_code != 405:
        body = response.json()
        keys = {"code", "message", "hint", "details"}
        if case.path.startswith("/openai/"):  # OpenAI's error keys (type, param) come on top
            assert keys | {"type", "param"} == set(body["error"]), body
        else:
            assert set(body["error"]) == keys, body
