"""API keys (``ty_<prefix>_<secret>``, only the SHA-256 stored) and the queue and device quotas."""

from __future__ import annotations

import pytest

from trainyard.errors import QuotaExceededError
from trainyard.tenancy.keys import generate_key, hash_key, key_prefix, redact, verify
from trainyard.tenancy.quotas import check_queue_quota, devices_allowed

ALNUM = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
URLSAFE = ALNUM | {"-", "_"}
# SHA-256 reference vectors: FIPS 180-2 "abc", and "é" as its UTF-8 bytes c3 a9 (as Latin-1, the single
# byte e9, it would hash to de2e331d...)
SHA256_ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
SHA256_E_ACUTE_UTF8 = "4a99557e4033c3539de2eb65472017cad5f9557f7a0625a09f1c3f6e2ba69c4c"
WELL_FORMED = "ty_AbCd1234_" + "s3cr3t-_" * 3  # 8-character prefix, 24-character secret


def test_a_new_key_is_ty_prefix_secret_with_8_alphanumerics_and_32_random_bytes() -> None:
    key = generate_key()
    head, prefix, secret = key.plaintext[:3], key.plaintext[3:11], key.plaintext[12:]
    assert head == "ty_" and key.plaintext[11] == "_"
    assert key.prefix == prefix and len(prefix) == 8 and set(prefix) <= ALNUM
    # token_urlsafe(32): 32 bytes in unpadded base64url are 43 characters
    assert len(secret) == 43 and set(secret) <= URLSAFE
    assert len(key.plaintext) == 3 + 8 + 1 + 43
    assert key.sha256 == hash_key(key.plaintext) and len(key.sha256) == 64
    assert key_prefix(key.plaintext) == key.prefix
    assert verify(key.plaintext, key.sha256)
    other = generate_key()
    assert other.plaintext != key.plaintext and not verify(other.plaintext, key.sha256)


def test_prefixes_draw_on_upper_case_lower_case_and_digits() -> None:
    # 100 prefixes are 800 draws from 62 characters: each class is missing with probability below 1e-60
    drawn = set("".join(generate_key().prefix for _ in range(100)))
    assert drawn & set("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert drawn & set("abcdefghijklmnopqrstuvwxyz")
    assert drawn & set("0123456789")


def test_the_stored_hash_is_the_hex_sha256_of_the_utf8_key() -> None:
    assert hash_key("abc") == SHA256_ABC
    assert hash_key("\u00e9") == SHA256_E_ACUTE_UTF8


def test_verify_accepts_only_the_key_whose_hash_is_stored() -> None:
    assert verify("abc", SHA256_ABC)
    assert not verify("abd", SHA256_ABC)
    assert not verify("abc", SHA256_ABC.upper())
    assert not verify("abc", "")


def test_the_prefix_is_read_only_from_a_well_formed_key() -> None:
    assert key_prefix(WELL_FORMED) == "AbCd1234"
    for bad in ("", "ty_AbCd1234", "ty_AbCd123_" + "s" * 20, "xx_AbCd1234_" + "s" * 20, "ty_AbCd1234_short"):
        assert key_prefix(bad) is None, bad


def test_redact_shows_only_the_prefix() -> None:
    assert redact(WELL_FORMED) == "ty_AbCd1234_…"
    assert redact("Bearer not-a-key") == "(malformed key)"


def test_the_queue_quota_refuses_the_submission_that_would_pass_the_cap() -> None:
    check_queue_quota("acme", 0, 1)
    check_queue_quota("acme", 2, 3)
    check_queue_quota("acme", 10_000, None)  # no quota
    with pytest.raises(QuotaExceededError) as exc:
        check_queue_quota("acme", 3, 3)
    err = exc.value
    assert err.code == "quota_exceeded" and err.http_status == 429
    assert err.message == "tenant 'acme' already has 3 unfinished jobs (quota 3)"
    assert err.hint == (
        "Wait for some to finish, or ask an admin to raise the quota with "
        "`trainyard tenants update acme --max-queued-jobs N`."
    )
    assert err.details == {"open_jobs": 3, "max_queued_jobs": 3}
    with pytest.raises(QuotaExceededError) as over:
        check_queue_quota("acme", 5, 0)
    assert over.value.details == {"open_jobs": 5, "max_queued_jobs": 0}


@pytest.mark.parametrize(
    ("active", "requested", "cap", "allowed"),
    [
        (2, 2, 4, True),  # exactly at the cap
        (2, 3, 4, False),  # one past it
        (0, 5, 4, False),
        (3, 0, 2, False),  # already over the cap: nothing more
        (0, 0, 0, True),
        (7, 9, None, True),  # no quota
    ],
)
def test_devices_are_allowed_up_to_and_including_the_cap(
    active: int, requested: int, cap: int | None, allowed: bool
) -> None:
    assert devices_allowed(active, requested, cap) is allowed
