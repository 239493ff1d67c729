"""Property-based fuzzing of every route from the OpenAPI document with every check schemathesis has:
no input makes the API answer 5xx, and every answer conforms to the document (status codes, content
types, response schemas and headers, the Allow header of a 405), invalid data is rejected and valid
data accepted, unsupported methods answer 405, a missing required header or credential is refused,
and deleted resources are gone while created ones are there.

Bounded (a few examples per operation) so the whole run stays around a minute of CPU. Requests carry a
valid non-admin key, so generated bodies reach the validation and business layers behind auth."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.core.parameters import ParameterLocation

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

load_all_checks()
#: Every check the installed schemathesis offers, named here so that one it adds or drops shows up.
#: One of them checks nothing in this set-up, for a reason: object_level_authorization replays a read
#: as other identities only when schemathesis is given several (auth providers with peers); the walls
#: between tenants are tested directly instead (another tenant's resources answer 404: the walls,
#: datasets, registry, governance and webhook integration tests). max_response_time is not among them:
#: it is a threshold to configure, and a response time on a shared, loaded CI machine is not a
#: property of the API.
ALL_CHECKS = list(CHECKS.get_all())
CHECK_NAMES = {
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "positive_data_acceptance",
    "missing_required_header",
    "unsupported_method",
    "allow_header_conformance",
    "use_after_free",
    "ensure_resource_availability",
    "ignored_auth",
    "object_level_authorization",
}


def test_every_check_is_on() -> None:
    assert {check.__name__ for check in ALL_CHECKS} == CHECK_NAMES


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
    components = case.meta.components if case.meta is not None else {}
    header_mode = components.get(ParameterLocation.HEADER)
    if header_mode is None or not header_mode.mode.is_negative:
        # the tenant's key, except where the case leaves the bearer key out on purpose (it must be refused)
        headers.setdefault("Authorization", STATE["headers"]["Authorization"])
    response = case.call(headers=headers)
    case.validate_response(response, checks=ALL_CHECKS, headers=headers)
    if 400 <= response.status_code < 500 and response.status_code != 405:
        body = response.json()
        keys = {"code", "message", "hint", "details"}
        if case.path.startswith("/openai/"):  # OpenAI's error keys (type, param) come on top
            assert keys | {"type", "param"} == set(body["error"]), body
        else:
            assert set(body["error"]) == keys, body
