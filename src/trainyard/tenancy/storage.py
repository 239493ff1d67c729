"""The storage policy: every path or URL that touches storage goes through here (DESIGN §3.6).

One storage root, ``TRAINYARD_STORAGE_URL``, holds every artifact under
``tenants/<tenant>/{datasets,code,checkpoints,models,evaluations,logs}/``. A tenant may name storage only
inside its own namespace there, or under a root an admin granted it. Everything else is refused with
:class:`~trainyard.errors.StorageNotAllowedError` (422, ``storage_not_allowed``): ``::`` chained URLs,
``..`` or ``.`` segments, relative paths, ``http(s)://`` and other non-storage schemes, other tenants'
areas and the server's own files (``protected_paths``: the database, keys, logs, run directories).

The checks are purely lexical, plus ``realpath`` for local paths so a symbolic link cannot lead out of a
root. Nothing is ever stat-ed for a refused URL, and the error message is the same whether the path
exists or not. The server checks at submission; the worker checks again what its launch request names
(``check_under`` with the roots the server put into the request).

Outbound URLs a tenant gives (alert webhooks) go through :func:`check_outbound_url`: http(s) only, no
credentials in the URL, and every address the host resolves to must be public (not loopback, private,
link-local, multicast, reserved or unspecified) unless it lies in a network the operator allowed.
This module imports only the standard library and :mod:`trainyard.errors`, so the runtime can use it too.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from urllib.parse import unquote, urlsplit

from trainyard.errors import InvalidInputError, StorageNotAllowedError, UrlNotAllowedError

AREAS = ("datasets", "code", "checkpoints", "models", "evaluations", "logs")
# schemes that name storage; anything else (http, https, ftp, ssh, data, ...) is never storage
STORAGE_SCHEMES = ("file", "s3", "gs", "gcs", "az", "abfs", "abfss", "memory")
_SCHEME_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")
_TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9\-]{0,62}$")
REFUSED_HINT = (
    "Name data by id (ds://NAME@VERSION, NAME@VERSION), or use a URL under your tenant's storage "
    "(see `trainyard whoami`); an admin can grant more roots with `trainyard tenants update NAME "
    "--storage-root URL`."
)


def _refuse(purpose: str, why: str) -> StorageNotAllowedError:
    # ``why`` is lexical only (never whether something exists there)
    return StorageNotAllowedError(
        f"{purpose}: {why}",
        hint=REFUSED_HINT,
        details={"errors": [{"field": purpose, "message": why}]},
    )


def normalize(url: str, *, purpose: str = "storage") -> str:
    """A storage URL in canonical form (``scheme://path`` without ``.``/``..``/empty segments; local
    paths resolved through symbolic links), or :class:`StorageNotAllowedError` for what is never
    storage. An absolute local path becomes a ``file://`` URL; a relative one is refused."""
    if not isinstance(url, str) or not url.strip():
        raise _refuse(purpose, "an empty location is not storage")
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise _refuse(purpose, "control characters are not allowed in a storage URL")
    if "::" in url:
        raise _refuse(purpose, "chained URLs (with '::') are not allowed")
    m = _SCHEME_RE.match(url)
    if m is None:
        if "://" in url or ":" in url.split("/", 1)[0]:
            raise _refuse(purpose, "not a storage URL")
        if not url.startswith("/"):
            raise _refuse(purpose, "relative paths are not allowed; use an absolute URL")
        scheme, rest = "file", url
    else:
        scheme, rest = m.group(1).lower(), url[m.end() :]
    if scheme not in STORAGE_SCHEMES:
        raise _refuse(purpose, f"{scheme}:// is not a storage scheme")
    if "?" in rest or "#" in rest:
        raise _refuse(purpose, "query strings and fragments are not allowed in a storage URL")
    segments = rest.split("/")
    for seg in segments:
        decoded = unquote(seg)
        if decoded in (".", "..") or "/" in decoded or "\\" in seg:
            raise _refuse(purpose, "'.' and '..' path segments are not allowed")
    if scheme == "file":
        host, _, path = rest.partition("/") if not rest.startswith("/") else ("", "", rest[1:])
        if host not in ("", "localhost"):
            raise _refuse(purpose, "file:// URLs name no host")
        path = "/" + path
        real = os.path.realpath(posixpath.normpath(path))
        return "file://" + real
    netloc, _, path = rest.partition("/")
    if not netloc and scheme != "memory":
        raise _refuse(purpose, f"{scheme}:// needs a bucket or container")
    clean = "/".join(s for s in path.split("/") if s)
    return f"{scheme}://{netloc}/{clean}".rstrip("/") if clean else f"{scheme}://{netloc}"


def is_under(url: str, root: str) -> bool:
    """Whether canonical ``url`` is ``root`` or inside it (both canonical)."""
    root = root.rstrip("/")
    return url == root or url.startswith(root + "/")


def check_under(url: str, roots: Iterable[str], *, purpose: str, protected: Iterable[str] = ()) -> str:
    """``url`` canonical when it lies under one of ``roots`` (canonical URLs) and not under a
    ``protected`` one unless that root lies inside the protected area itself; else refused."""
    norm = normalize(url, purpose=purpose)
    roots = [r for r in roots if r]
    for root in roots:
        if is_under(norm, root):
            for p in protected:
                if is_under(norm, p) and not is_under(root, p):
                    break
            else:
                return norm
    raise _refuse(purpose, "outside the storage this tenant may use")


class StoragePolicy:
    """Where a tenant may read and write (one instance per server, ``platform.storage_policy``)."""

    def __init__(self, storage_url: str, protected_paths: Sequence[str] = ()) -> None:
        self.storage_url = normalize(storage_url, purpose="TRAINYARD_STORAGE_URL")
        self.protected = [normalize(p, purpose="protected path") for p in protected_paths]

    # ---- layout ------------------------------------------------------------------------------
    def tenant_root(self, tenant: str) -> str:
        if not _TENANT_RE.match(tenant):
            raise InvalidInputError(f"{tenant!r} is not a tenant name")
        return f"{self.storage_url}/tenants/{tenant}"

    def area(self, tenant: str, kind: str) -> str:
        if kind not in AREAS:
            raise ValueError(f"unknown storage area {kind!r}; areas: {', '.join(AREAS)}")
        return f"{self.tenant_root(tenant)}/{kind}"

    def roots(self, tenant: str, extra_roots: Iterable[str] = ()) -> list[str]:
        """The canonical roots a tenant may use: its namespace, then the roots an admin granted."""
        out = [self.tenant_root(tenant)]
        for r in extra_roots:
            try:
                out.append(normalize(r, purpose="storage root"))
            except StorageNotAllowedError:
                continue  # a grant that is no longer valid grants nothing
        return out

    # ---- checks ------------------------------------------------------------------------------
    def check(self, tenant: str, url: str, *, extra_roots: Iterable[str] = (), purpose: str) -> str:
        """``url`` in canonical form when ``tenant`` may use it; :class:`StorageNotAllowedError` else."""
        own = self.tenant_root(tenant)
        tenants_dir = f"{self.storage_url}/tenants"
        norm = check_under(url, self.roots(tenant, extra_roots), purpose=purpose, protected=self.protected)
        if is_under(norm, tenants_dir) and not is_under(norm, own):
            raise _refuse(purpose, "outside the storage this tenant may use")
        return norm

    def check_grant(self, root: str) -> str:
        """A root an admin grants a tenant, canonical; refused when it overlaps the shared storage tree
        (every tenant's namespace) or the server's own files."""
        norm = normalize(root, purpose="storage_roots")
        if norm.startswith("memory://") and norm == "memory://":
            raise _refuse("storage_roots", "a whole filesystem cannot be granted")
        if norm in ("file:///",) or is_under(self.storage_url, norm) or is_under(norm, self.storage_url):
            raise _refuse("storage_roots", "overlaps the shared storage tree")
        for p in self.protected:
            if is_under(norm, p) or is_under(p, norm):
                raise _refuse("storage_roots", "overlaps the server's own files")
        return norm


def is_registered_dataset(value: str) -> bool:
    """``ds://NAME@VERSION``: a dataset named by id (resolved by the datasets service, not a path)."""
    return value.startswith("ds://")


def is_model_reference(value: str) -> bool:
    """``NAME@VERSION`` / ``NAME@ALIAS`` / ``NAME``: a registered model named by id, not a path."""
    return "/" not in value and "\\" not in value and ":" not in value and not value.startswith(".")


# ---- outbound URLs (webhooks): no server-side request forgery ----------------------------------------

Resolver = Callable[[str, int], list[str]]


def _resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def parse_networks(spec: str | Iterable[str] | None) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``"127.0.0.1/32, 10.0.0.0/8"`` (or a list of CIDRs) as networks; a bad entry is an error."""
    if spec is None:
        return []
    items = [p.strip() for p in spec.split(",")] if isinstance(spec, str) else [str(p).strip() for p in spec]
    return [ipaddress.ip_network(p, strict=False) for p in items if p]


def _internal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return _internal(ip.ipv4_mapped)
    return bool(
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


def check_outbound_url(
    url: str,
    *,
    allowed_networks: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network] = (),
    resolve: Resolver = _resolve,
    purpose: str = "url",
) -> list[str]:
    """The addresses ``url`` may be called at, or :class:`UrlNotAllowedError`: http(s) only, a host and
    no user:password, and every address the host resolves to public or inside ``allowed_networks``.
    Called when a webhook is registered and again before every delivery (DNS can change)."""

    def refuse(why: str) -> UrlNotAllowedError:
        return UrlNotAllowedError(
            f"{purpose}: {why}", details={"errors": [{"field": purpose, "message": why}]}
        )

    if not isinstance(url, str) or len(url) > 2000 or any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise refuse("not a valid URL")
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise refuse("not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise refuse("only http:// and https:// URLs can be called")
    if parts.username is not None or parts.password is not None:
        raise refuse("credentials in the URL are not allowed")
    host = parts.hostname
    if not host:
        raise refuse("the URL names no host")
    try:
        addresses = [host] if _is_ip(host) else resolve(host, port)
    except OSError:
        raise refuse(f"the host {host!r} does not resolve") from None
    if not addresses:
        raise refuse(f"the host {host!r} does not resolve")
    for a in addresses:
        ip = ipaddress.ip_address(a.split("%", 1)[0])
        if _internal(ip) and not any(ip in net for net in allowed_networks):
            raise refuse("the URL resolves to a loopback, private or internal address")
    return addresses


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
