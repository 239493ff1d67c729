"""Tenants and API keys: create (the key is returned once), authenticate (constant-time), bootstrap."""

from __future__ import annotations

import builtins
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy.exc import IntegrityError

from trainyard.errors import AuthenticationError, ConflictError, InvalidInputError, NotFoundError
from trainyard.services.domain import ApiKeyRecord, Principal, Tenant, TenantLimits
from trainyard.store.db import Database
from trainyard.store.governance_repo import LIMIT_FIELDS, ROLES, TENANT_FIELDS, GovernanceRepo
from trainyard.store.repositories import ApiKeyRepo, TenantRepo
from trainyard.tenancy import keys, settings_sync

if TYPE_CHECKING:
    from trainyard.tenancy.storage import StoragePolicy

TENANT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9\-]{0,62}$")
DEFAULT_TENANT = "default"
AUTH_CACHE_TTL_S = 30.0
MAX_KEY_OVERLAP_S = 30 * 86400.0

log = structlog.get_logger("trainyard.tenants")


def _new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(8)}"


class TenantService:
    def __init__(
        self,
        db: Database,
        clock: Callable[[], float] = time.time,
        storage_policy: StoragePolicy | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.storage_policy = storage_policy
        # key sha256 -> (principal, expires_at_s); saves a database round trip per request.
        self._auth_cache: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()
        # bumped by every revocation: a lookup that started before it must not cache what it read
        self._revocations = 0
        # whether the cached principals may be used: set by the platform to its settings watcher's
        # ``fresh`` (admin changes made through other server processes have been applied); None
        # (no watcher: one process) trusts them for AUTH_CACHE_TTL_S
        self.cache_trusted: Callable[[], bool] | None = None

    # ---- tenants -----------------------------------------------------------------------------
    def create(
        self,
        name: str,
        *,
        admin: bool = False,
        max_queued_jobs: int | None = None,
        max_active_devices: int | None = None,
        allow_user_code: bool = False,
    ) -> tuple[Tenant, str]:
        """Create a tenant and its first API key; the plaintext key is returned here and never again."""
        if not TENANT_NAME_RE.fullmatch(name):  # not .match: its $ also matches before a final newline
            raise InvalidInputError(
                f"tenant name {name!r} is not allowed",
                hint="Use 1-63 lowercase letters, digits and dashes, starting with a letter or digit.",
                details={"errors": [{"field": "name", "message": "must match ^[a-z0-9][a-z0-9-]{0,62}$"}]},
            )
        now = self.clock()
        tenant = Tenant(
            id=_new_id("tn"),
            name=name,
            created_at_s=now,
            max_queued_jobs=max_queued_jobs,
            max_active_devices=max_active_devices,
            allow_user_code=allow_user_code,
        )
        try:
            with self.db.session() as s:
                if TenantRepo(s).by_name(name) is not None:
                    raise ConflictError(f"tenant {name!r} already exists", hint="Pick another name.")
                TenantRepo(s).add(tenant)
                plaintext = self._add_key(s, tenant.id, admin=admin, now=now)
        except IntegrityError:
            raise ConflictError(f"tenant {name!r} already exists", hint="Pick another name.") from None
        return tenant, plaintext

    def create_key(self, tenant_name: str, *, admin: bool = False, role: str | None = None) -> str:
        return self.create_key_record(tenant_name, admin=admin, role=role)[1]

    def create_key_record(
        self, tenant_name: str, *, admin: bool = False, role: str | None = None
    ) -> tuple[ApiKeyRecord, str]:
        """A new key of the tenant (role admin, member or viewer); the plaintext is returned once."""
        role = _check_role(role) if role is not None else ("admin" if admin else "member")
        with self.db.session() as s:
            tenant = TenantRepo(s).by_name(tenant_name)
            if tenant is None:
                raise NotFoundError(f"no tenant named {tenant_name!r}")
            now = self.clock()
            plaintext = self._add_key(s, tenant.id, admin=role == "admin", now=now, role=role)
            rec = next(
                k for k in ApiKeyRepo(s).for_tenant(tenant.id) if k.prefix == keys.key_prefix(plaintext)
            )
        return replace(rec, role=role), plaintext

    def _add_key(self, s: object, tenant_id: str, *, admin: bool, now: float, role: str | None = None) -> str:
        new = keys.generate_key()
        key_id = _new_id("key")
        ApiKeyRepo(s).add(  # type: ignore[arg-type]
            ApiKeyRecord(
                id=key_id,
                tenant_id=tenant_id,
                prefix=new.prefix,
                key_sha256=new.sha256,
                admin=admin,
                created_at_s=now,
            )
        )
        if role is not None and role != ("admin" if admin else "member"):
            GovernanceRepo(s).set_key_policy(key_id, role=role, expires_at_s=None)  # type: ignore[arg-type]
        return new.plaintext

    def rotate_key(
        self, tenant_name: str, key_id: str, *, overlap_s: float
    ) -> tuple[ApiKeyRecord, str, ApiKeyRecord]:
        """Issue a successor of a key (same role) and let the old one keep working for ``overlap_s``
        seconds; returns (new key record, its plaintext, the old key record with its expiry)."""
        if not 0 <= overlap_s <= MAX_KEY_OVERLAP_S:
            raise InvalidInputError(
                f"overlap_s must be between 0 and {MAX_KEY_OVERLAP_S:g} seconds",
                details={"errors": [{"field": "overlap_s", "message": "out of range"}]},
            )
        now = self.clock()
        with self.db.session() as s:
            tenant = TenantRepo(s).by_name(tenant_name)
            if tenant is None:
                raise NotFoundError(f"no tenant named {tenant_name!r}")
            old = ApiKeyRepo(s).get(key_id, tenant_id=tenant.id)
            if old is None or old.revoked:
                raise NotFoundError(
                    f"tenant {tenant_name!r} has no active API key {key_id!r}",
                    hint=f"List its keys with `trainyard tenants keys list {tenant_name}`.",
                )
            gov = GovernanceRepo(s)
            policy = gov.key_policy(old.id)
            role = policy[0] if policy else ("admin" if old.admin else "member")
            if policy and policy[1] is not None and policy[1] <= now:
                raise NotFoundError(f"tenant {tenant_name!r} has no active API key {key_id!r}")
            plaintext = self._add_key(s, tenant.id, admin=old.admin, now=now, role=role)
            new = next(
                k for k in ApiKeyRepo(s).for_tenant(tenant.id) if k.prefix == keys.key_prefix(plaintext)
            )
            gov.set_key_policy(old.id, role=role, expires_at_s=now + overlap_s)
            settings_sync.bump(s.connection())
        self._forget(lambda p: p.key_id == key_id)
        log.info(
            "api_key_rotated", tenant=tenant_name, old_key_id=key_id, new_key_id=new.id, overlap_s=overlap_s
        )
        return replace(new, role=role), plaintext, replace(old, role=role, expires_at_s=now + overlap_s)

    # ---- administration ------------------------------------------------------------------------
    def update(self, name: str, changes: dict[str, Any]) -> Tenant:
        """Change a tenant's quotas and limits (``changes``: field -> value; None removes the limit)."""
        unknown = sorted(set(changes) - set(TENANT_FIELDS) - set(LIMIT_FIELDS))
        if unknown:
            raise InvalidInputError(
                f"cannot update {', '.join(unknown)}",
                details={"errors": [{"field": f, "message": "unknown field"} for f in unknown]},
            )
        with self.db.session() as s:
            tenant = TenantRepo(s).by_name(name)
            if tenant is None:
                raise NotFoundError(
                    f"no tenant named {name!r}", hint="List tenants with `trainyard tenants list`."
                )
            GovernanceRepo(s).set_limits(tenant.id, changes)
            settings_sync.bump(s.connection())
            updated = TenantRepo(s).by_id(tenant.id)
        assert updated is not None
        self.invalidate_tenant(tenant.id)
        log.info("tenant_updated", tenant=name, fields=sorted(changes))
        return updated

    def limits(self, name: str) -> TenantLimits:
        with self.db.session() as s:
            tenant = TenantRepo(s).by_name(name)
            if tenant is None:
                raise NotFoundError(f"no tenant named {name!r}")
            return GovernanceRepo(s).limits(tenant.id)

    def all_limits(self) -> dict[str, TenantLimits]:
        with self.db.session() as s:
            return GovernanceRepo(s).all_limits()

    def invalidate_tenant(self, tenant_id: str) -> None:
        """Forget cached principals of a tenant (its limits, quotas or budgets changed)."""
        self._forget(lambda p: p.tenant_id == tenant_id)

    def _forget(self, match: Callable[[Principal], bool]) -> None:
        with self._lock:
            self._revocations += 1
            for digest in [d for d, (p, _) in self._auth_cache.items() if match(p)]:
                del self._auth_cache[digest]

    def list(self) -> builtins.list[Tenant]:
        with self.db.session() as s:
            return TenantRepo(s).list()

    # ---- API keys ------------------------------------------------------------------------------
    def list_keys(self, tenant_name: str) -> builtins.list[ApiKeyRecord]:
        """The tenant's API keys (revoked ones included), oldest first, with role and expiry."""
        with self.db.session() as s:
            tenant = TenantRepo(s).by_name(tenant_name)
            if tenant is None:
                raise NotFoundError(f"no tenant named {tenant_name!r}")
            found = ApiKeyRepo(s).for_tenant(tenant.id)
            policies = GovernanceRepo(s).key_policies([k.id for k in found])
        out = []
        for k in found:
            role, expires = policies.get(k.id, ("admin" if k.admin else "member", None))
            out.append(replace(k, role=role, expires_at_s=expires))
        return out

    def revoke_key(self, tenant_name: str, key_id: str, *, by: str = "") -> ApiKeyRecord:
        """Revoke one of the tenant's keys; it fails authentication from the next request on (the auth
        cache forgets it before this returns). Revoking a revoked key changes nothing. A key id of another
        tenant is unknown here (NotFoundError)."""
        with self.db.session() as s:
            tenant = TenantRepo(s).by_name(tenant_name)
            if tenant is None:
                raise NotFoundError(f"no tenant named {tenant_name!r}")
            repo = ApiKeyRepo(s)
            key = repo.get(key_id, tenant_id=tenant.id)
            if key is None:
                raise NotFoundError(
                    f"tenant {tenant_name!r} has no API key {key_id!r}",
                    hint=f"List its keys with `trainyard tenants keys list {tenant_name}`.",
                )
            if not key.revoked:
                repo.revoke(key.id)
                settings_sync.bump(s.connection())
        with self._lock:
            self._revocations += 1
            for digest in [d for d, (p, _) in self._auth_cache.items() if p.key_id == key.id]:
                del self._auth_cache[digest]
        if not key.revoked:
            log.info("api_key_revoked", tenant=tenant_name, key_id=key.id, prefix=key.prefix, by=by)
        return replace(key, revoked=True)

    def update_walls(
        self,
        name: str,
        *,
        storage_roots: Sequence[str] | None = None,
        allow_user_code: bool | None = None,
        by: str = "",
    ) -> Tenant:
        """Change a tenant's walls (admin): the storage roots granted besides its namespace (replaced as a
        whole; each checked by the storage policy) and whether it may run user code. Options left None
        stay as they are. Cached principals of the tenant are forgotten at once."""
        fields: dict[str, object] = {}
        if storage_roots is not None:
            roots: list[str] = []
            for root in storage_roots:
                norm = self.storage_policy.check_grant(root) if self.storage_policy else root
                if norm not in roots:
                    roots.append(norm)
            fields["storage_roots"] = roots
        if allow_user_code is not None:
            fields["allow_user_code"] = bool(allow_user_code)
        with self.db.session() as s:
            repo = TenantRepo(s)
            tenant = repo.update(name, **fields) if fields else repo.by_name(name)
            if tenant is not None and fields:
                settings_sync.bump(s.connection())
        if tenant is None:
            raise NotFoundError(f"no tenant named {name!r}")
        self.forget_tenant(tenant.id)
        if fields:
            log.info("tenant_updated", tenant=name, by=by, fields=sorted(fields))
        return tenant

    def forget_all(self) -> None:
        """Drop every cached principal (settings changed through another server process)."""
        with self._lock:
            self._revocations += 1
            self._auth_cache.clear()

    def forget_tenant(self, tenant_id: str) -> None:
        """Drop the cached principals of one tenant (its settings changed)."""
        with self._lock:
            self._revocations += 1
            for digest in [d for d, (p, _) in self._auth_cache.items() if p.tenant_id == tenant_id]:
                del self._auth_cache[digest]

    def key_active(self, key_id: str) -> bool:
        """Whether API key ``key_id`` exists and is not revoked (dashboard sessions are bound to it)."""
        with self.db.session() as s:
            return ApiKeyRepo(s).is_active(key_id)

    def get(self, name: str) -> Tenant:
        with self.db.session() as s:
            t = TenantRepo(s).by_name(name)
        if t is None:
            raise NotFoundError(f"no tenant named {name!r}")
        return t

    # ---- authentication ------------------------------------------------------------------------
    def cached_principal(self, presented: str | None) -> Principal | None:
        """The principal of a key authenticated within the last AUTH_CACHE_TTL_S, without touching the
        database; None when it has to be looked up (unknown, expired, malformed or revoked keys, or
        while admin changes made through other server processes may not have been applied here:
        :mod:`trainyard.tenancy.settings_sync`)."""
        if not presented:
            return None
        trusted = self.cache_trusted
        if trusted is not None and not trusted():
            return None
        digest = keys.hash_key(presented)
        with self._lock:
            hit = self._auth_cache.get(digest)
        if hit is not None and hit[1] > self.clock():
            return hit[0]
        return None

    def authenticate(self, presented: str | None) -> Principal:
        if not presented:
            raise AuthenticationError("missing API key (send Authorization: Bearer <key>)")
        prefix = keys.key_prefix(presented)
        if prefix is None:
            raise AuthenticationError("invalid API key")
        hit = self.cached_principal(presented)
        if hit is not None:
            return hit
        digest = keys.hash_key(presented)
        now = self.clock()
        with self._lock:
            revocations = self._revocations
        principal: Principal | None = None
        valid_until = now + AUTH_CACHE_TTL_S
        with self.db.session() as s:
            for rec in ApiKeyRepo(s).by_prefix(prefix):
                if keys.verify(presented, rec.key_sha256):
                    tenant = TenantRepo(s).by_id(rec.tenant_id)
                    if tenant is None:
                        continue
                    gov = GovernanceRepo(s)
                    policy = gov.key_policy(rec.id)
                    role = policy[0] if policy else ("admin" if rec.admin else "member")
                    if policy and policy[1] is not None:
                        if policy[1] <= now:
                            raise AuthenticationError(
                                "this API key was rotated and its overlap period is over",
                                hint="Use the key that replaced it (`trainyard tenants keys list`).",
                            )
                        valid_until = min(valid_until, policy[1])
                    limits = gov.limits(tenant.id)
                    principal = Principal(
                        tenant_id=tenant.id,
                        tenant_name=tenant.name,
                        key_id=rec.id,
                        admin=role == "admin",
                        max_queued_jobs=tenant.max_queued_jobs,
                        role=role,
                        max_active_devices=tenant.max_active_devices,
                        governed=gov.has_budget(tenant.id),
                        rate_limit_rps=limits.rate_limit_rps,
                        rate_limit_burst=limits.rate_limit_burst,
                        key_rate_limit_rps=limits.key_rate_limit_rps,
                        tokens_per_minute=limits.tokens_per_minute,
                        storage_roots=tenant.storage_roots,
                        allow_user_code=tenant.allow_user_code,
                    )
        if principal is None:
            raise AuthenticationError("invalid API key")
        with self._lock:
            if len(self._auth_cache) > 10_000:
                self._auth_cache.clear()
            if revocations == self._revocations:  # else the key may have been revoked since it was read
                self._auth_cache[digest] = (principal, valid_until)
        return principal

    # ---- embedded defaults ---------------------------------------------------------------------
    def ensure_default(self, key_path: Path) -> tuple[Tenant, bool]:
        """Create the ``default`` tenant with an admin key written to ``key_path`` (mode 0600) on first start.

        Returns the tenant and whether a new key was written. When the tenant exists but the key file is
        gone, a fresh admin key is issued and written (the old one keeps working).
        """
        with self.db.session() as s:
            existing = TenantRepo(s).by_name(DEFAULT_TENANT)
        if existing is not None and key_path.exists():
            return existing, False
        if existing is None:
            try:
                tenant, plaintext = self.create(DEFAULT_TENANT, admin=True, allow_user_code=True)
            except ConflictError:  # another process created it first
                tenant = self.get(DEFAULT_TENANT)
                plaintext = self.create_key(DEFAULT_TENANT, admin=True)
        else:
            tenant, plaintext = existing, self.create_key(DEFAULT_TENANT, admin=True)
        write_key_file(key_path, plaintext)
        return tenant, True


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise InvalidInputError(
            f"role {role!r} does not exist",
            hint="Use admin, member or viewer.",
            details={"errors": [{"field": "role", "message": "admin, member or viewer"}]},
        )
    return role


def write_key_file(path: Path, plaintext: str) -> None:
    """Write a key readable by the owner only (0600), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # a new file of a name of its own: a file already at a fixed temporary name (left there, or a link
    # planted there) would keep its mode and owner through O_TRUNC, and the key would be written into it
    # before the chmod below; two processes writing the key at once would share it
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (plaintext + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
