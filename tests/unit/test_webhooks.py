"""Webhook signatures (HMAC-SHA256 over timestamp and body) and the outbound-URL policy (no SSRF)."""

from __future__ import annotations

import time

import pytest

from trainyard.errors import UrlNotAllowedError
from trainyard.observability.webhooks import sign, verify_signature
from trainyard.tenancy.storage import check_outbound_url, parse_networks


def test_signature_verifies_only_the_same_secret_body_and_a_fresh_timestamp() -> None:
    body = b'{"rule":"job_stalled"}'
    now = int(time.time())
    header = sign("whsec_a", body, now)
    assert header.startswith(f"t={now},v1=") and len(header.split("v1=")[1]) == 64
    assert verify_signature("whsec_a", header, body)
    assert not verify_signature("whsec_b", header, body)
    assert not verify_signature("whsec_a", header, body + b" ")
    assert not verify_signature("whsec_a", header.replace(f"t={now}", f"t={now + 1}"), body)
    old = sign("whsec_a", body, now - 3600)
    assert not verify_signature("whsec_a", old, body)  # a replay from an hour ago
    assert verify_signature("whsec_a", old, body, now_s=now - 3590)
    assert not verify_signature("whsec_a", "garbage", body)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/x",
        "http://localhost/x",
        "http://10.1.2.3/x",
        "http://192.168.0.1/x",
        "http://172.16.0.1/x",
        "http://169.254.169.254/latest",
        "http://[::1]/x",
        "http://[fd00::1]/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://0.0.0.0/x",
        "http://100.64.0.1/x",
        "gopher://example.com/",
        "file:///etc/passwd",
        "http://u:p@example.com/",
        "http:///nohost",
        "http://exa mple.com/",
    ],
)
def test_internal_and_odd_urls_are_refused(url: str) -> None:
    with pytest.raises(UrlNotAllowedError) as exc:
        check_outbound_url(url)
    assert exc.value.code == "url_not_allowed" and exc.value.http_status == 422
    assert exc.value.details["errors"][0]["field"] == "url"


def test_public_addresses_pass_and_operators_can_allow_networks() -> None:
    assert check_outbound_url("https://93.184.215.14/hook") == ["93.184.215.14"]
    allowed = parse_networks("127.0.0.1/32, 10.0.0.0/8")
    assert check_outbound_url("http://127.0.0.1:8080/x", allowed_networks=allowed) == ["127.0.0.1"]
    assert check_outbound_url("http://10.9.9.9/x", allowed_networks=allowed) == ["10.9.9.9"]
    with pytest.raises(UrlNotAllowedError):
        check_outbound_url("http://127.0.0.2/x", allowed_networks=allowed)
    # a name is checked by every address it resolves to
    loopback = parse_networks("127.0.0.0/8, ::1/128")
    got = check_outbound_url("http://localhost:1/x", allowed_networks=loopback)
    assert got and set(got) <= {"127.0.0.1", "::1"}
    with pytest.raises(ValueError):
        parse_networks("not-a-network")
