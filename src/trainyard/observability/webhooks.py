"""Alert webhooks on the wire: the signature, one attempt, and the backoff between attempts.

Every delivery is a ``POST`` of the alert as JSON with these headers::

    Trainyard-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>
    Trainyard-Alert-Id: <alert id>          Trainyard-Webhook-Id: <webhook id>
    Trainyard-Delivery-Id: <delivery id>    Trainyard-Delivery-Attempt: <1, 2, ...>

``Trainyard-Delivery-Id`` is the same on every attempt of a delivery, before and after a restart of the
server: a receiver that has seen it already has the alert (an attempt whose answer was lost is sent
again).

like Stripe's and GitHub's: a receiver recomputes the HMAC over the timestamp and the raw body with
the tenant's secret, compares in constant time, and refuses timestamps older than a few minutes (a
replayed request). :func:`verify_signature` does exactly that.

Retries: connection errors, timeouts, ``429`` and ``5xx`` are retried up to ``max_attempts`` with
exponential backoff and jitter (tenacity's, :func:`retry_delay_s`); any other answer ends the delivery.
The attempts are scheduled by the delivery outbox (``services.alerting``), which keeps each delivery's
state in the database. The URL is checked against the outbound-URL policy before every attempt (DNS
can change between registration and delivery) and redirects are never followed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, wait_exponential_jitter

from trainyard.errors import UrlNotAllowedError

SIGNATURE_HEADER = "Trainyard-Signature"
SIGNATURE_TOLERANCE_S = 300.0


def sign(secret: str, body: bytes, timestamp_s: int) -> str:
    """The ``Trainyard-Signature`` header value of ``body`` sent at ``timestamp_s``."""
    mac = hmac.new(secret.encode(), f"{timestamp_s}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp_s},v1={mac}"


def verify_signature(
    secret: str,
    header: str,
    body: bytes,
    *,
    now_s: float | None = None,
    tolerance_s: float = SIGNATURE_TOLERANCE_S,
) -> bool:
    """True when ``header`` signs ``body`` with ``secret`` and its timestamp is within ``tolerance_s``."""
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        k, sep, v = item.strip().partition("=")
        if sep:
            parts.setdefault(k, []).append(v)
    try:
        ts = int(parts["t"][0])
    except (KeyError, ValueError, IndexError):
        return False
    now = time.time() if now_s is None else now_s
    if abs(now - ts) > tolerance_s:
        return False
    expected = sign(secret, body, ts).split("v1=", 1)[1]
    return any(hmac.compare_digest(expected, v) for v in parts.get("v1", []))


@dataclass(frozen=True)
class DeliveryPolicy:
    max_attempts: int = 5
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    timeout_s: float = 10.0


@dataclass
class AttemptResult:
    attempt: int
    ok: bool
    status_code: int | None = None
    error: str | None = None
    duration_s: float = 0.0
    retryable: bool = False


@dataclass
class DeliveryResult:
    ok: bool
    attempts: list[AttemptResult] = field(default_factory=list)


DELIVERY_ID_HEADER = "Trainyard-Delivery-Id"


def retry_delay_s(policy: DeliveryPolicy, attempt: int) -> float:
    """How long to wait after failed attempt number ``attempt`` (1, 2, ...): tenacity's exponential
    backoff with jitter (``backoff_initial_s`` doubling up to ``backoff_max_s``)."""
    wait = wait_exponential_jitter(
        initial=policy.backoff_initial_s, max=policy.backoff_max_s, jitter=policy.backoff_initial_s / 4
    )
    state = RetryCallState(retry_object=Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = max(1, attempt)
    return float(wait(state))


def send_once(
    url: str,
    body: bytes,
    *,
    attempt: int,
    secret: str,
    headers: dict[str, str],
    timeout_s: float,
    check_url: Callable[[str], object],
    transport: httpx.BaseTransport | None = None,
    client_hook: Callable[[httpx.Client], None] | None = None,
) -> AttemptResult:
    """One signed POST of ``body`` (signed afresh, with this attempt's number); never raises for what
    the receiver or the network did: the result says whether it is worth retrying. ``client_hook`` gets
    the client before it sends (tracing instruments it there)."""
    t0 = time.monotonic()
    res = AttemptResult(attempt=attempt, ok=False)
    try:
        check_url(url)
        with httpx.Client(timeout=timeout_s, follow_redirects=False, transport=transport) as client:
            if client_hook is not None:
                client_hook(client)
            resp = client.post(
                url,
                content=body,
                headers={
                    **headers,
                    "Content-Type": "application/json",
                    "User-Agent": "trainyard-webhooks",
                    SIGNATURE_HEADER: sign(secret, body, int(time.time())),
                    "Trainyard-Delivery-Attempt": str(attempt),
                },
            )
        res.status_code = resp.status_code
        res.ok = 200 <= resp.status_code < 300
        res.retryable = resp.status_code == 429 or resp.status_code >= 500
        if not res.ok:
            res.error = f"HTTP {resp.status_code}"
    except UrlNotAllowedError as exc:
        res.error = exc.message
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:300]
        res.retryable = True
    res.duration_s = round(time.monotonic() - t0, 4)
    return res


def encode(payload: dict[str, Any]) -> bytes:
    """The body of a delivery: compact JSON with sorted keys (what the signature covers)."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, default=str).encode()
