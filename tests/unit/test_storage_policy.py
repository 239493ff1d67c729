"""The storage policy (DESIGN §3.6), case by case: what is canonical storage, what is refused and with
which message, which roots a tenant may use, what an admin may grant, and the outbound-URL policy
(webhooks) with a resolver given in the test, so no name server is needed."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from trainyard.errors import InvalidInputError, StorageNotAllowedError, UrlNotAllowedError
from trainyard.tenancy.storage import (
    REFUSED_HINT,
    StoragePolicy,
    _internal,
    _is_ip,
    _resolve,
    check_outbound_url,
    check_under,
    is_model_reference,
    is_registered_dataset,
    is_under,
    normalize,
    parse_networks,
)


def refusal(url: Any, purpose: str = "storage") -> StorageNotAllowedError:
    with pytest.raises(StorageNotAllowedError) as exc:
        normalize(url, purpose=purpose)
    return exc.value


# ---- normalize ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("s3://bucket/a/b", "s3://bucket/a/b"),
        ("S3://bucket/a", "s3://bucket/a"),  # the scheme is case-insensitive
        ("GS://b/x", "gs://b/x"),
        ("s3://bucket", "s3://bucket"),
        ("s3://bucket/", "s3://bucket"),
        ("s3://bucket//a//b/", "s3://bucket/a/b"),  # empty segments dropped
        ("s3://bucket/BOX", "s3://bucket/BOX"),
        ("s3://bucket/a.../...", "s3://bucket/a.../..."),  # only '.' and '..' are special
        ("az://container/.hidden", "az://container/.hidden"),
        ("memory://", "memory://"),
        ("memory:///x", "memory:///x"),
        ("memory://m/x", "memory://m/x"),
        ("/srv/data/a b", "file:///srv/data/a b"),  # a space is not a control character
        ("/srv/data/a:b", "file:///srv/data/a:b"),
        ("/srv/a:b/c", "file:///srv/a:b/c"),  # a colon after the first '/' is part of a name
        ("s3://bucket/name ", "s3://bucket/name "),  # a trailing space is part of the key
        ("/srv/data/\u00e9t\u00e9", "file:///srv/data/\u00e9t\u00e9"),
        ("/srv//data/", "file:///srv/data"),
        ("file:///srv/data", "file:///srv/data"),
        ("file://localhost/srv/data", "file:///srv/data"),
        ("FILE:///srv/x", "file:///srv/x"),
        ("/", "file:///"),
    ],
)
def test_canonical_form(url: str, canonical: str) -> None:
    assert normalize(url) == canonical


def test_local_paths_are_resolved_through_symbolic_links(tmp_path: Path) -> None:
    real = tmp_path.resolve() / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert normalize(str(tmp_path.resolve() / "link" / "ckpt")) == f"file://{real}/ckpt"
    assert normalize(f"file://{tmp_path.resolve()}/link") == f"file://{real}"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("", "an empty location is not storage"),
        ("   ", "an empty location is not storage"),
        (None, "an empty location is not storage"),
        (3, "an empty location is not storage"),
        ("/srv/a\x1fb", "control characters are not allowed in a storage URL"),
        ("/srv/a\x00b", "control characters are not allowed in a storage URL"),
        ("/srv/a\x7fb", "control characters are not allowed in a storage URL"),
        ("/srv/a\tb", "control characters are not allowed in a storage URL"),
        ("file:///srv/a::file:///etc", "chained URLs (with '::') are not allowed"),
        ("/srv/a::b", "chained URLs (with '::') are not allowed"),
        ("c:/windows", "not a storage URL"),
        ("c:\\windows", "not a storage URL"),
        ("1s3://bucket/x", "not a storage URL"),
        (
            "/srv/data/s3://bucket/x",
            "not a storage URL",
        ),  # a URL inside a path  # a scheme starts with a letter
        ("data/x", "relative paths are not allowed; use an absolute URL"),
        ("x", "relative paths are not allowed; use an absolute URL"),
        ("http://example.com/x", "http:// is not a storage scheme"),
        ("HTTPS://example.com/x", "https:// is not a storage scheme"),
        ("ssh://host/x", "ssh:// is not a storage scheme"),
        ("s3://bucket/x?versionId=1", "query strings and fragments are not allowed in a storage URL"),
        ("s3://bucket/x#frag", "query strings and fragments are not allowed in a storage URL"),
        ("/srv/x?y", "query strings and fragments are not allowed in a storage URL"),
        ("s3://bucket/./x", "'.' and '..' path segments are not allowed"),
        ("s3://bucket/a/../b", "'.' and '..' path segments are not allowed"),
        ("s3://bucket/a/..", "'.' and '..' path segments are not allowed"),
        ("s3://bucket/%2e%2e/b", "'.' and '..' path segments are not allowed"),
        ("s3://bucket/%2E/b", "'.' and '..' path segments are not allowed"),
        ("s3://bucket/a%2fb", "'.' and '..' path segments are not allowed"),  # an encoded slash
        ("s3://bucket/a\\b", "'.' and '..' path segments are not allowed"),
        ("/srv/../etc", "'.' and '..' path segments are not allowed"),
        ("file://relative/path", "file:// URLs name no host"),
        ("file://example.com/srv", "file:// URLs name no host"),
        ("s3://", "s3:// needs a bucket or container"),
        ("s3:///key", "s3:// needs a bucket or container"),
        ("gs://", "gs:// needs a bucket or container"),
    ],
)
def test_what_is_never_storage_is_refused_and_the_message_says_why(url: Any, why: str) -> None:
    err = refusal(url, purpose="checkpoint.storage")
    assert err.code == "storage_not_allowed" and err.http_status == 422
    assert err.message == f"checkpoint.storage: {why}"
    assert err.hint == REFUSED_HINT
    assert err.details == {"errors": [{"field": "checkpoint.storage", "message": why}]}


def test_the_default_purpose_is_storage() -> None:
    with pytest.raises(StorageNotAllowedError) as exc:
        normalize("x")
    assert exc.value.message == "storage: relative paths are not allowed; use an absolute URL"


# ---- is_under / check_under -------------------------------------------------------------------------


def test_is_under_means_the_root_itself_or_a_path_below_it() -> None:
    assert is_under("s3://b/x", "s3://b/x")
    assert is_under("s3://b/BOX", "s3://b/BOX")
    assert is_under("s3://b/BOX/1", "s3://b/BOX/")
    assert is_under("s3://b/x/y", "s3://b/x")
    assert is_under("s3://b/x/y", "s3://b/x/")  # a trailing slash on the root changes nothing
    assert is_under("s3://b/x", "s3://b/x/")
    assert not is_under("s3://b/xy", "s3://b/x")  # a sibling that shares a prefix
    assert not is_under("s3://b", "s3://b/x")
    assert not is_under("s3://c/x", "s3://b/x")


def test_check_under_accepts_any_of_the_roots_and_returns_the_canonical_url() -> None:
    roots = ["", "s3://one/a", "s3://two/b"]
    assert check_under("S3://two/b//c/", roots, purpose="p") == "s3://two/b/c"
    assert check_under("s3://one/a", roots, purpose="p") == "s3://one/a"
    with pytest.raises(StorageNotAllowedError) as exc:
        check_under("s3://three/c", roots, purpose="model.output")
    assert exc.value.message == "model.output: outside the storage this tenant may use"
    assert exc.value.details == {
        "errors": [{"field": "model.output", "message": "outside the storage this tenant may use"}]
    }
    with pytest.raises(StorageNotAllowedError, match=r"^p: relative paths"):
        check_under("a/b", roots, purpose="p")
    with pytest.raises(StorageNotAllowedError):
        check_under("s3://one/a", [], purpose="p")


def test_check_under_refuses_protected_areas_unless_the_root_lies_inside_them() -> None:
    protected = ["s3://srv/elsewhere", "s3://srv/state/db"]
    roots = ["s3://srv"]
    assert check_under("s3://srv/state/ok", roots, purpose="p", protected=protected) == "s3://srv/state/ok"
    for url in ("s3://srv/state/db", "s3://srv/state/db/x", "s3://srv/elsewhere/y"):
        with pytest.raises(StorageNotAllowedError, match="outside the storage this tenant may use"):
            check_under(url, roots, purpose="p", protected=protected)
    # a root granted inside the protected area itself is usable
    inner = ["s3://srv", "s3://srv/state/db/granted"]
    got = check_under("s3://srv/state/db/granted/x", inner, purpose="p", protected=protected)
    assert got == "s3://srv/state/db/granted/x"


# ---- StoragePolicy ----------------------------------------------------------------------------------


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    root = tmp_path.resolve() / "storage"
    root.mkdir()
    return root


@pytest.fixture
def policy(storage: Path) -> StoragePolicy:
    return StoragePolicy(f"file://{storage}/", protected_paths=[str(storage.parent / "state")])


def test_the_layout_is_tenants_name_area(policy: StoragePolicy, storage: Path) -> None:
    assert policy.storage_url == f"file://{storage}"
    assert policy.protected == [f"file://{storage.parent}/state"]
    assert policy.tenant_root("acme") == f"file://{storage}/tenants/acme"
    assert policy.tenant_root("a") == f"file://{storage}/tenants/a"
    assert policy.tenant_root("0-team") == f"file://{storage}/tenants/0-team"
    assert policy.area("acme", "checkpoints") == f"file://{storage}/tenants/acme/checkpoints"
    assert policy.area("acme", "logs") == f"file://{storage}/tenants/acme/logs"


@pytest.mark.parametrize("name", ["", "Acme", "-acme", "acme/x", "a" * 64, "acme_x", "../x"])
def test_a_malformed_tenant_name_has_no_root(policy: StoragePolicy, name: str) -> None:
    with pytest.raises(InvalidInputError) as exc:
        policy.tenant_root(name)
    assert exc.value.message == f"{name!r} is not a tenant name"


def test_an_unknown_area_is_refused(policy: StoragePolicy) -> None:
    with pytest.raises(ValueError) as exc:
        policy.area("acme", "secrets")
    assert str(exc.value) == (
        "unknown storage area 'secrets'; areas: datasets, code, checkpoints, models, evaluations, logs"
    )


def test_a_bad_storage_url_or_protected_path_is_refused_at_start_up() -> None:
    with pytest.raises(StorageNotAllowedError) as exc:
        StoragePolicy("relative/storage")
    assert exc.value.message == "TRAINYARD_STORAGE_URL: relative paths are not allowed; use an absolute URL"
    with pytest.raises(StorageNotAllowedError) as prot:
        StoragePolicy("s3://bucket", protected_paths=["s3://bucket/x", "state.db"])
    assert prot.value.message == "protected path: relative paths are not allowed; use an absolute URL"
    assert StoragePolicy("s3://bucket").protected == []


def test_roots_are_the_namespace_then_the_still_valid_grants(policy: StoragePolicy, storage: Path) -> None:
    own = f"file://{storage}/tenants/acme"
    assert policy.roots("acme") == [own]
    granted = policy.roots("acme", ["http://no/longer/valid", "S3://shared//data/", "relative", "/srv/x/"])
    assert granted == [own, "s3://shared/data", "file:///srv/x"]


def test_a_tenant_may_use_its_namespace_and_its_grants_only(policy: StoragePolicy, storage: Path) -> None:
    own = f"{storage}/tenants/acme"
    assert policy.check("acme", f"{own}/checkpoints/job-1", purpose="p") == f"file://{own}/checkpoints/job-1"
    assert policy.check("acme", f"file://{own}", purpose="p") == f"file://{own}"
    grants = ["s3://shared/data"]
    assert policy.check("acme", "s3://shared/data/x", extra_roots=grants, purpose="p") == "s3://shared/data/x"
    refused = [
        ("s3://shared/data/x", ()),  # not granted to this call
        (f"{storage}/tenants/other/checkpoints", ()),
        (f"{storage}/tenants/acme-2/x", ()),  # a namespace that shares the prefix
        (f"{storage}/shared", ()),
        (f"{storage}/tenants", ()),
        # a grant over the whole storage tree still does not open another tenant's namespace
        (f"{storage}/tenants/other/x", (f"file://{storage}",)),
        (f"{storage}/tenants/other", (f"file://{storage}/tenants",)),
        (f"{storage.parent}/state/trainyard.db", (f"file://{storage.parent}",)),  # the server's files
    ]
    for url, extra in refused:
        with pytest.raises(StorageNotAllowedError) as exc:
            policy.check("acme", url, extra_roots=extra, purpose="dataset.path")
        assert exc.value.message == "dataset.path: outside the storage this tenant may use", url
    # with the whole tree granted, the shared part outside every namespace is usable, its own namespace too
    whole = (f"file://{storage}",)
    assert (
        policy.check("acme", f"{storage}/shared/x", extra_roots=whole, purpose="p")
        == f"file://{storage}/shared/x"
    )
    assert policy.check("acme", f"{own}/x", extra_roots=whole, purpose="p") == f"file://{own}/x"


def test_grants_must_not_overlap_the_storage_tree_or_the_servers_files(
    policy: StoragePolicy, storage: Path
) -> None:
    assert policy.check_grant("S3://team//data/") == "s3://team/data"
    assert policy.check_grant("memory:///scratch") == "memory:///scratch"
    assert policy.check_grant(f"{storage.parent}/other") == f"file://{storage.parent}/other"
    cases = [
        ("memory://", "a whole filesystem cannot be granted"),
        ("/", "overlaps the shared storage tree"),
        (str(storage), "overlaps the shared storage tree"),
        (str(storage.parent), "overlaps the shared storage tree"),  # a parent of the storage tree
        (f"{storage}/tenants/acme", "overlaps the shared storage tree"),  # inside it
        (f"{storage.parent}/state", "overlaps the server's own files"),
        (f"{storage.parent}/state/runs", "overlaps the server's own files"),
    ]
    for root, why in cases:
        with pytest.raises(StorageNotAllowedError) as exc:
            policy.check_grant(root)
        assert exc.value.message == f"storage_roots: {why}", root
        assert exc.value.details["errors"][0]["field"] == "storage_roots"
    with pytest.raises(StorageNotAllowedError, match=r"^storage_roots: relative paths"):
        policy.check_grant("relative")


def test_with_object_storage_the_local_root_and_parents_of_protected_paths_are_refused() -> None:
    policy = StoragePolicy("s3://bucket/trainyard", protected_paths=["/var/lib/trainyard/state"])
    assert policy.check_grant("/data/shared") == "file:///data/shared"
    assert policy.check_grant("s3://bucket/other") == "s3://bucket/other"
    for root, why in [
        ("/", "overlaps the shared storage tree"),
        ("file:///", "overlaps the shared storage tree"),
        ("s3://bucket", "overlaps the shared storage tree"),
        ("/var/lib", "overlaps the server's own files"),
        ("/var/lib/trainyard/state/x", "overlaps the server's own files"),
    ]:
        with pytest.raises(StorageNotAllowedError) as exc:
            policy.check_grant(root)
        assert exc.value.message == f"storage_roots: {why}", root


def test_names_by_id_are_told_apart_from_paths() -> None:
    assert is_registered_dataset("ds://reviews@3")
    assert not is_registered_dataset("s3://ds/reviews")
    assert not is_registered_dataset("xds://reviews@3")
    for ref in ("llama-7b@v2", "llama-7b@prod", "llama-7b"):
        assert is_model_reference(ref), ref
    for path in ("models/llama", "models\\llama", "s3:llama", ".llama", "..", "/abs"):
        assert not is_model_reference(path), path


# ---- outbound URLs ----------------------------------------------------------------------------------


class Resolver:
    """Answers with fixed addresses and records what it was asked."""

    def __init__(self, *addresses: str, error: bool = False) -> None:
        self.addresses = list(addresses)
        self.error = error
        self.asked: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if self.error:
            raise OSError("no such host")
        return self.addresses


PUBLIC = "93.184.215.14"


def outbound_refusal(url: Any, resolve: Resolver | None = None, **kw: Any) -> str:
    with pytest.raises(UrlNotAllowedError) as exc:
        check_outbound_url(url, resolve=resolve or Resolver(PUBLIC), purpose="alert.webhook", **kw)
    err = exc.value
    assert err.code == "url_not_allowed" and err.http_status == 422
    why = err.message.removeprefix("alert.webhook: ")
    assert err.details == {"errors": [{"field": "alert.webhook", "message": why}]}
    return why


def test_the_port_asked_for_is_the_urls_or_the_schemes_default() -> None:
    for url, port in [
        ("https://hooks.example/x", 443),
        ("http://hooks.example/x", 80),
        ("http://hooks.example:8443/", 8443),
        ("https://hooks.example:80/", 80),
    ]:
        r = Resolver(PUBLIC)
        assert check_outbound_url(url, resolve=r) == [PUBLIC]
        assert r.asked == [("hooks.example", port)]


def test_every_address_a_name_resolves_to_must_be_public() -> None:
    assert check_outbound_url("https://h.example/", resolve=Resolver(PUBLIC, "2606:4700::1111")) == [
        PUBLIC,
        "2606:4700::1111",
    ]
    why = outbound_refusal("https://h.example/", Resolver(PUBLIC, "10.0.0.7"))
    assert why == "the URL resolves to a loopback, private or internal address"
    assert outbound_refusal("https://h.example/", Resolver("10.0.0.7", PUBLIC)) == why


def test_an_ip_host_is_checked_without_asking_the_resolver() -> None:
    r = Resolver(error=True)
    assert check_outbound_url(f"https://{PUBLIC}/x", resolve=r) == [PUBLIC]
    assert check_outbound_url("https://[2606:4700::1111]/x", resolve=r) == ["2606:4700::1111"]
    assert r.asked == []


def test_a_host_that_does_not_resolve_is_refused() -> None:
    assert (
        outbound_refusal("https://gone.example/", Resolver(error=True))
        == "the host 'gone.example' does not resolve"
    )
    assert (
        outbound_refusal("https://empty.example/", Resolver()) == "the host 'empty.example' does not resolve"
    )


def test_a_scoped_link_local_address_is_internal_unless_its_network_is_allowed() -> None:
    r = Resolver("fe80::1%eth0")
    assert (
        outbound_refusal("https://h.example/", r)
        == "the URL resolves to a loopback, private or internal address"
    )
    allowed = parse_networks("fe80::/10")
    assert check_outbound_url("https://h.example/", resolve=r, allowed_networks=allowed) == ["fe80::1%eth0"]


@pytest.mark.parametrize(
    ("url", "why"),
    [
        (None, "not a valid URL"),
        ("https://h.example/" + "a" * 1983, "not a valid URL"),  # 2001 characters
        ("https://h.example/a b", "not a valid URL"),
        ("https://h.example/a\x7f", "not a valid URL"),
        ("https://h.example/a\x1f", "not a valid URL"),
        ("http://h.example:99999/", "not a valid URL"),
        ("http://[::1/", "not a valid URL"),
        ("ftp://h.example/", "only http:// and https:// URLs can be called"),
        ("hxxp://h.example/", "only http:// and https:// URLs can be called"),
        ("//h.example/", "only http:// and https:// URLs can be called"),
        ("http://user@h.example/", "credentials in the URL are not allowed"),
        ("http://:secret@h.example/", "credentials in the URL are not allowed"),
        ("http://user:secret@h.example/", "credentials in the URL are not allowed"),
        ("http:///path", "the URL names no host"),
        ("http://:80/path", "the URL names no host"),
    ],
)
def test_odd_urls_are_refused_with_the_reason(url: Any, why: str) -> None:
    assert outbound_refusal(url) == why


def test_a_url_of_2000_characters_with_punctuation_is_still_valid() -> None:
    url = "https://h.example/!" + "a" * 1981
    assert len(url) == 2000
    assert check_outbound_url(url, resolve=Resolver(PUBLIC)) == [PUBLIC]


def test_the_default_purpose_is_url() -> None:
    with pytest.raises(UrlNotAllowedError) as exc:
        check_outbound_url("ftp://h.example/")
    assert exc.value.message == "url: only http:// and https:// URLs can be called"


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "169.254.169.254",
        "224.0.0.1",
        "240.0.0.1",
        "0.0.0.0",
        "100.64.0.1",
        "::1",
        "fd00::1",
        "fe80::1",
        "ff02::1",
        "::",
        "::ffff:10.0.0.1",
        "::ffff:127.0.0.1",
        "192.0.2.1",
        "4000::1",  # reserved, though Python counts it as global
    ],
)
def test_internal_addresses(address: str) -> None:
    assert _internal(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", [PUBLIC, "8.8.8.8", "2606:4700::1111", "::ffff:93.184.215.14"])
def test_public_addresses(address: str) -> None:
    assert not _internal(ipaddress.ip_address(address))


def test_networks_are_parsed_from_a_comma_list_or_an_iterable() -> None:
    assert parse_networks(None) == []
    assert parse_networks("") == []
    assert parse_networks(" 10.1.2.3/8 ,, ::1/128, ") == [
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
    ]
    assert parse_networks([" 192.168.0.0/16", "", "127.0.0.1"]) == [
        ipaddress.ip_network("192.168.0.0/16"),
        ipaddress.ip_network("127.0.0.1/32"),
    ]
    with pytest.raises(ValueError):
        parse_networks("10.0.0.0/8, nonsense")


def test_is_ip_and_the_real_resolver() -> None:
    assert _is_ip("10.0.0.1") and _is_ip("::1")
    assert not _is_ip("localhost") and not _is_ip("10.0.0.256")
    assert _resolve("10.1.2.3", 80) == ["10.1.2.3"]  # an address literal needs no name server
    got = _resolve("localhost", 80)
    assert "127.0.0.1" in got and set(got) <= {"127.0.0.1", "::1"} and got == sorted(set(got))
