"""What the sync and the async client share: connection settings, the description of each request
(:class:`Call`), retry decisions, and turning responses into documents or TrainyardErrors.

Neither client builds a request or reads a response on its own; they only move bytes (httpx.Client or
httpx.AsyncClient) and sleep (time or asyncio), so both behave the same by construction.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from trainyard import errors as E

if TYPE_CHECKING:
    import httpx

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8080"

_BY_CODE: dict[str, type[E.TrainyardError]] = {}
for _cls in (
    E.InvalidInputError,
    E.SpecError,
    E.UnknownAcceleratorError,
    E.StorageNotAllowedError,
    E.PoolsFileError,
    E.NotFoundError,
    E.ConflictError,
    E.IllegalTransitionError,
    E.PromotionBlockedError,
    E.AuthenticationError,
    E.PermissionDeniedError,
    E.UserCodeNotAllowedError,
    E.PayloadTooLargeError,
    E.QuotaExceededError,
    E.InfeasibleError,
    E.ServiceUnavailableError,
    E.SandboxUnavailableError,
    E.StorageError,
    E.CheckpointError,
    E.BudgetExceededError,
    E.RateLimitedError,
    E.LedgerMismatchError,
    E.InvalidDatasetError,
    E.UnknownDatasetError,
):
    _BY_CODE[_cls.code] = _cls

_BY_STATUS: dict[int, type[E.TrainyardError]] = {
    400: E.InvalidInputError,
    401: E.AuthenticationError,
    403: E.PermissionDeniedError,
    404: E.NotFoundError,
    409: E.ConflictError,
    413: E.PayloadTooLargeError,
    422: E.InvalidInputError,
    429: E.QuotaExceededError,
    503: E.ServiceUnavailableError,
}


@functools.cache
def transport_errors() -> tuple[type[Exception], ...]:
    """Errors of the transport (no HTTP answer); see :func:`may_retry`. httpx is imported on a client's
    first use, not when ``trainyard.client`` is (it is most of the import time)."""
    import httpx

    return (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.RemoteProtocolError,
        httpx.ReadError,
        httpx.WriteError,
    )


def resolve_api_key(explicit: str | None = None, home: str | Path | None = None) -> str | None:
    """TRAINYARD_API_KEY, else $TRAINYARD_HOME/api_key (written by `trainyard up`)."""
    if explicit:
        return explicit
    env = os.environ.get("TRAINYARD_API_KEY")
    if env:
        return env.strip()
    base = (
        Path(home)
        if home is not None
        else Path(os.environ.get("TRAINYARD_HOME") or Path.home() / ".trainyard")
    )
    try:
        text = (base / "api_key").read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def resolve_url(explicit: str | None = None) -> str:
    """``url``, else ``TRAINYARD_URL``, else the live ``trainyard up`` of ``$TRAINYARD_HOME``
    (``server.json``), else the default — the order the CLI uses."""
    from trainyard.serverfile import resolve_url as resolve

    return resolve(explicit)[0]


def default_headers(api_key: str | None) -> dict[str, str]:
    headers = {"User-Agent": "trainyard-client"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


@dataclass(frozen=True)
class Upload:
    """A local file sent as the request body in chunks; ``progress(n_bytes)`` is called per chunk."""

    path: Path
    chunk_bytes: int = 1 << 20
    progress: Callable[[int], Any] | None = None


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[Any], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    upload: Upload | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float | tuple[float | None, float | None, float | None, float | None] | None = None

    def request_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``httpx.Client.request`` (the body of an :class:`Upload` aside)."""
        kwargs: dict[str, Any] = {}
        if self.params is not None:
            kwargs["params"] = {k: v for k, v in self.params.items() if v is not None}
        if self.json is not None:
            kwargs["json"] = self.json
        if self.content is not None:
            kwargs["content"] = self.content
        if self.headers:
            kwargs["headers"] = dict(self.headers)
        if self.timeout is not None:
            kwargs["timeout"] = self.timeout
        return kwargs

    @property
    def resendable(self) -> bool:
        """Whether sending the request twice cannot act twice (reads, PUT/DELETE, Idempotency-Key)."""
        return self.method in ("GET", "HEAD", "PUT", "DELETE") or "Idempotency-Key" in self.headers


def may_retry(exc: Exception, call: Call[Any], attempt: int, retries: int) -> bool:
    """Refused/unreachable: nothing was sent, always safe to retry. A connection dropped after sending
    is retried only when resending cannot act twice; a streamed upload is never resent."""
    import httpx

    sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
    return attempt < retries and (not sent or (call.resendable and call.upload is None))


def unreachable(url: str, exc: Exception) -> E.ServiceUnavailableError:
    return E.ServiceUnavailableError(
        f"cannot reach the trainyard server at {url} ({type(exc).__name__})",
        hint="Start it with `trainyard up`, or point TRAINYARD_URL at a running server.",
    )


def next_delay(delay_s: float) -> float:
    return min(delay_s * 2, 5.0)


def error_from(resp: httpx.Response) -> E.TrainyardError:
    """The TrainyardError of an error envelope (by code, else by HTTP status)."""
    try:
        body = resp.json()
        err = body["error"]
        code, message = str(err.get("code", "")), str(err.get("message", resp.reason_phrase))
        hint, details = err.get("hint"), err.get("details") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        code, message, hint, details = "", f"HTTP {resp.status_code} from the server", None, {}
    cls = _BY_CODE.get(code) or _BY_STATUS.get(resp.status_code) or E.TrainyardError
    if cls is E.RateLimitedError:
        retry_after = resp.headers.get("Retry-After")
        try:
            retry_after_s = float(retry_after) if retry_after else 1.0
        except ValueError:
            retry_after_s = 1.0
        return E.RateLimitedError(message, retry_after_s=retry_after_s, hint=hint, details=details)
    return cls(message, hint=hint, details=details)


def read_response(resp: httpx.Response, call: Call[T], typed: bool = True) -> T:
    """The answer's document (``call.parse``), or with ``typed=False`` the decoded JSON as it is."""
    if resp.status_code >= 400:
        raise error_from(resp)
    body: Any = None if resp.status_code == 204 or not resp.content else resp.json()
    return call.parse(body) if typed else body
