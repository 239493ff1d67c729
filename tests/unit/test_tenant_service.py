"""TenantService on a real SQLite file, called directly (no server): tenant names, keys and their roles,
rotation with its overlap, revocation, quotas and limits, walls, the authentication cache (its TTL, what
forgets it, a revocation racing a lookup), the default tenant and its key file."""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from service_support import Clock, Logged, sqlite_template
from sqlalchemy import Table, insert, text, update

from trainyard.errors import (
    AuthenticationError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    StorageNotAllowedError,
)
from trainyard.services import tenants as tenants_module
from trainyard.services.domain import Principal, TenantLimits
from trainyard.services.tenants import AUTH_CACHE_TTL_S, TenantService, write_key_file
from trainyard.store.db import Database
from trainyard.store.governance_models import BudgetRow
from trainyard.store.governance_repo import GovernanceRepo
from trainyard.store.models import TenantRow
from trainyard.store.repositories import TenantRepo
from trainyard.tenancy.storage import StoragePolicy

T0 = 1_800_000_000.0
DAY = 86400.0
TENANTS = cast(Table, TenantRow.__table__)
BUDGETS = cast(Table, BudgetRow.__table__)
STORE = "s3://bucket/store"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sqlite_template(tmp_path_factory.mktemp("tenants") / "template.sqlite")


class Env:
    def __init__(self, path: Path, policy: StoragePolicy | None = None) -> None:
        self.db = Database(f"sqlite:///{path}")
        self.clock = Clock(T0)
        self.svc = TenantService(self.db, self.clock, storage_policy=policy)

    def version(self) -> int:
        with self.db.engine.connect() as c:
            return int(c.execute(text("SELECT version FROM settings_version WHERE id = 1")).scalar_one())

    def set_row(self, name: str, **values: Any) -> None:
        """Change a tenant's row behind the service's back (another server process, say)."""
        with self.db.engine.begin() as c:
            c.execute(update(TENANTS).where(TENANTS.c.name == name).values(**values))


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Logged:
    out = Logged()
    monkeypatch.setattr(tenants_module, "log", out)
    return out


@pytest.fixture
def env(template: Path, tmp_path: Path) -> Iterator[Env]:
    shutil.copy(template, tmp_path / "db.sqlite")
    e = Env(tmp_path / "db.sqlite")
    yield e
    e.db.dispose()


@pytest.fixture
def walled(template: Path, tmp_path: Path) -> Iterator[Env]:
    shutil.copy(template, tmp_path / "db.sqlite")
    e = Env(tmp_path / "db.sqlite", StoragePolicy(STORE))
    yield e
    e.db.dispose()


# ---- tenants -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["a", "0", "a-b", "team-7", "a" * 63, "a-"])
def test_tenant_names_of_1_to_63_lowercase_letters_digits_and_dashes_are_accepted(
    env: Env, name: str
) -> None:
    tenant, _ = env.svc.create(name)
    assert tenant.name == name


@pytest.mark.parametrize("name", ["", "-a", "A", "a_b", "a b", "a" * 64, "é", "a\n"])
def test_other_tenant_names_are_refused(env: Env, name: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        env.svc.create(name)
    assert err.value.message == f"tenant name {name!r} is not allowed"
    assert err.value.hint == "Use 1-63 lowercase letters, digits and dashes, starting with a letter or digit."
    assert err.value.details == {
        "errors": [{"field": "name", "message": "must match ^[a-z0-9][a-z0-9-]{0,62}$"}]
    }
    assert env.svc.list() == []


def test_a_new_tenant_has_its_quotas_and_a_first_key_that_authenticates(env: Env) -> None:
    tenant, key = env.svc.create("acme", max_queued_jobs=5, max_active_devices=2, allow_user_code=True)
    assert re.fullmatch(r"tn-[0-9a-f]{16}", tenant.id), tenant.id
    assert (tenant.name, tenant.created_at_s, tenant.max_queued_jobs, tenant.max_active_devices) == (
        "acme",
        T0,
        5,
        2,
    )
    assert tenant.allow_user_code is True and tenant.storage_roots == ()
    assert env.svc.get("acme") == tenant
    p = env.svc.authenticate(key)
    assert (p.tenant_id, p.tenant_name, p.admin, p.role, p.max_queued_jobs, p.max_active_devices) == (
        tenant.id, "acme", False, "member", 5, 2,
    )  # fmt: skip
    assert p.allow_user_code is True
    (rec,) = env.svc.list_keys("acme")
    assert re.fullmatch(r"key-[0-9a-f]{16}", rec.id) and rec.id == p.key_id
    assert (rec.tenant_id, rec.admin, rec.created_at_s, rec.revoked, rec.role) == (
        tenant.id,
        False,
        T0,
        False,
        "member",
    )
    assert key.startswith(f"ty_{rec.prefix}_")
    _, admin_key = env.svc.create("root", admin=True)
    ap = env.svc.authenticate(admin_key)
    assert (ap.admin, ap.role, ap.allow_user_code, ap.max_queued_jobs) == (True, "admin", False, None)
    assert [t.name for t in env.svc.list()] == ["acme", "root"]


def test_a_tenant_name_is_taken_once(env: Env) -> None:
    env.svc.create("acme")
    with pytest.raises(ConflictError) as err:
        env.svc.create("acme", admin=True)
    assert (err.value.message, err.value.hint) == ("tenant 'acme' already exists", "Pick another name.")
    assert len(env.svc.list()) == 1


def test_a_tenant_created_meanwhile_by_another_process_is_a_conflict(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.svc.create("acme")
    monkeypatch.setattr(TenantRepo, "by_name", lambda self, name: None)  # read before the other commit
    with pytest.raises(ConflictError) as err:
        env.svc.create("acme")
    assert (err.value.message, err.value.hint) == ("tenant 'acme' already exists", "Pick another name.")
    assert err.value.__suppress_context__


def test_an_unknown_tenant_is_not_found_everywhere(env: Env) -> None:
    for call in (
        lambda: env.svc.get("ghost"),
        lambda: env.svc.create_key("ghost"),
        lambda: env.svc.limits("ghost"),
        lambda: env.svc.list_keys("ghost"),
        lambda: env.svc.revoke_key("ghost", "key-x"),
        lambda: env.svc.rotate_key("ghost", "key-x", overlap_s=0),
        lambda: env.svc.update_walls("ghost", allow_user_code=True),
        lambda: env.svc.update_walls("ghost"),
    ):
        with pytest.raises(NotFoundError) as err:
            call()
        assert err.value.message == "no tenant named 'ghost'"
    with pytest.raises(NotFoundError) as upd:
        env.svc.update("ghost", {"max_queued_jobs": 1})
    assert upd.value.message == "no tenant named 'ghost'"
    assert upd.value.hint == "List tenants with `trainyard tenants list`."


# ---- keys ----------------------------------------------------------------------------------------------
def test_a_keys_role_is_admin_member_or_viewer(env: Env) -> None:
    env.svc.create("acme")
    made = {
        "default": env.svc.create_key_record("acme"),
        "admin": env.svc.create_key_record("acme", admin=True),
        "viewer": env.svc.create_key_record("acme", role="viewer"),
        "member": env.svc.create_key_record("acme", admin=True, role="member"),
        "named-admin": env.svc.create_key_record("acme", role="admin"),
    }
    expected = {
        "default": ("member", False),
        "admin": ("admin", True),
        "viewer": ("viewer", False),
        "member": ("member", False),
        "named-admin": ("admin", True),
    }
    for label, (rec, key) in made.items():
        role, admin = expected[label]
        p = env.svc.authenticate(key)
        assert (rec.role, rec.admin, p.role, p.admin, p.key_id) == (role, admin, role, admin, rec.id), label
        assert key.startswith(f"ty_{rec.prefix}_")
    listed = {k.id: (k.role, k.admin, k.expires_at_s) for k in env.svc.list_keys("acme")}
    assert listed[made["viewer"][0].id] == ("viewer", False, None)
    assert listed[made["admin"][0].id] == ("admin", True, None)
    assert env.svc.authenticate(env.svc.create_key("acme", role="viewer")).role == "viewer"
    assert env.svc.authenticate(env.svc.create_key("acme")).role == "member"
    assert env.svc.authenticate(env.svc.create_key("acme", admin=True)).admin
    with env.db.session() as s:  # a key whose role is its default needs no policy row
        assert GovernanceRepo(s).key_policy(made["admin"][0].id) is None
        assert GovernanceRepo(s).key_policy(made["default"][0].id) is None
        assert GovernanceRepo(s).key_policy(made["viewer"][0].id) == ("viewer", None)


def test_an_unknown_role_is_refused(env: Env) -> None:
    env.svc.create("acme")
    with pytest.raises(InvalidInputError) as err:
        env.svc.create_key("acme", role="owner")
    assert err.value.message == "role 'owner' does not exist"
    assert err.value.hint == "Use admin, member or viewer."
    assert err.value.details == {"errors": [{"field": "role", "message": "admin, member or viewer"}]}
    assert len(env.svc.list_keys("acme")) == 1


def test_keys_are_listed_oldest_first_revoked_ones_included(env: Env) -> None:
    env.svc.create("acme")
    env.clock.now += 1
    second, _ = env.svc.create_key_record("acme", role="viewer")
    env.svc.revoke_key("acme", second.id)
    keys = env.svc.list_keys("acme")
    assert [k.created_at_s for k in keys] == [T0, T0 + 1]
    assert [(k.revoked, k.role) for k in keys] == [(False, "member"), (True, "viewer")]


def test_a_revoked_key_fails_from_the_next_request_even_when_cached(env: Env, logged: Logged) -> None:
    env.svc.create("acme")
    other_tenant, other_key = env.svc.create("beta")
    rec, key = env.svc.create_key_record("acme")
    keep, keep_key = env.svc.create_key_record("acme")
    env.svc.authenticate(key)
    env.svc.authenticate(keep_key)
    before = env.version()
    logged.take()
    out = env.svc.revoke_key("acme", rec.id, by="alice")
    logs = logged.take()
    assert out == replace(rec, revoked=True, role="")
    assert env.version() == before + 1
    assert logs == [
        {"event": "api_key_revoked", "tenant": "acme", "key_id": rec.id, "prefix": rec.prefix, "by": "alice",
         "log_level": "info"},
    ]  # fmt: skip
    assert env.svc.cached_principal(key) is None
    with pytest.raises(AuthenticationError) as err:
        env.svc.authenticate(key)
    assert err.value.message == "invalid API key"
    assert not env.svc.key_active(rec.id)
    assert env.svc.cached_principal(keep_key) is not None  # the tenant's other keys stay cached
    assert env.svc.key_active(keep.id)
    # revoking it again changes nothing and says nothing
    logged.take()
    assert env.svc.revoke_key("acme", rec.id).revoked
    again = logged.take()
    assert again == [] and env.version() == before + 1
    # another tenant's key id is unknown here
    (theirs,) = env.svc.list_keys("beta")
    with pytest.raises(NotFoundError) as nf:
        env.svc.revoke_key("acme", theirs.id)
    assert nf.value.message == f"tenant 'acme' has no API key {theirs.id!r}"
    assert nf.value.hint == "List its keys with `trainyard tenants keys list acme`."
    assert env.svc.authenticate(other_key).tenant_id == other_tenant.id
    assert not env.svc.key_active("key-unknown")
    logged.take()
    env.svc.revoke_key("acme", keep.id)
    assert [(e["key_id"], e["by"]) for e in logged.take()] == [(keep.id, "")]


def test_a_rotated_key_works_for_its_overlap_only_and_its_successor_keeps_its_role(
    env: Env, logged: Logged
) -> None:
    env.svc.create("acme")
    old, old_key = env.svc.create_key_record("acme", role="viewer")
    env.svc.authenticate(old_key)  # cached until T0 + 30
    before = env.version()
    env.clock.now = T0 + 100
    logged.take()
    new, new_key, old_after = env.svc.rotate_key("acme", old.id, overlap_s=10)
    logs = logged.take()
    assert env.version() == before + 1
    assert logs == [
        {"event": "api_key_rotated", "tenant": "acme", "old_key_id": old.id, "new_key_id": new.id,
         "overlap_s": 10, "log_level": "info"},
    ]  # fmt: skip
    assert (new.role, new.admin, new.created_at_s, new.revoked) == ("viewer", False, T0 + 100, False)
    assert new.id != old.id and new_key.startswith(f"ty_{new.prefix}_")
    assert (old_after.id, old_after.role, old_after.expires_at_s) == (old.id, "viewer", T0 + 110)
    assert env.svc.authenticate(new_key).role == "viewer"
    env.clock.now = T0 + 105
    p = env.svc.authenticate(old_key)
    assert p.role == "viewer" and p.key_id == old.id
    env.clock.now = T0 + 109.9
    assert env.svc.cached_principal(old_key) is not None
    env.clock.now = T0 + 110  # cached only until the overlap ends, not for the whole TTL
    assert env.svc.cached_principal(old_key) is None
    with pytest.raises(AuthenticationError) as err:
        env.svc.authenticate(old_key)
    assert err.value.message == "this API key was rotated and its overlap period is over"
    assert err.value.hint == "Use the key that replaced it (`trainyard tenants keys list`)."
    listed = {k.id: (k.role, k.expires_at_s) for k in env.svc.list_keys("acme")}
    assert listed[old.id] == ("viewer", T0 + 110) and listed[new.id] == ("viewer", None)
    # a key whose overlap is over cannot be rotated again
    with pytest.raises(NotFoundError) as nf:
        env.svc.rotate_key("acme", old.id, overlap_s=10)
    assert nf.value.message == f"tenant 'acme' has no active API key {old.id!r}"


def test_rotation_forgets_the_cached_principal_of_the_old_key(env: Env) -> None:
    env.svc.create("acme")
    old, old_key = env.svc.create_key_record("acme", admin=True)
    env.svc.authenticate(old_key)
    env.svc.rotate_key("acme", old.id, overlap_s=0)
    assert env.svc.cached_principal(old_key) is None
    with pytest.raises(AuthenticationError):
        env.svc.authenticate(old_key)  # an overlap of 0: over at once
    others = sorted((k.role, k.admin) for k in env.svc.list_keys("acme") if k.id != old.id)
    assert others == [("admin", True), ("member", False)]  # its successor, and the tenant's first key


def test_a_rotated_member_key_is_succeeded_by_a_member_key(env: Env) -> None:
    env.svc.create("acme")
    (old,) = env.svc.list_keys("acme")  # the tenant's first key: a member, by its admin flag alone
    new, new_key, old_after = env.svc.rotate_key("acme", old.id, overlap_s=60)
    assert (new.role, new.admin, old_after.role) == ("member", False, "member")
    p = env.svc.authenticate(new_key)
    assert (p.role, p.admin, p.effective_role) == ("member", False, "member")


def test_a_key_is_rotated_only_within_its_tenant_and_while_active(env: Env) -> None:
    env.svc.create("acme")
    env.svc.create("beta")
    (theirs,) = env.svc.list_keys("beta")
    for key_id in (theirs.id, "key-unknown"):
        with pytest.raises(NotFoundError) as err:
            env.svc.rotate_key("acme", key_id, overlap_s=5)
        assert err.value.message == f"tenant 'acme' has no active API key {key_id!r}"
        assert err.value.hint == "List its keys with `trainyard tenants keys list acme`."
    revoked, _ = env.svc.create_key_record("acme")
    env.svc.revoke_key("acme", revoked.id)
    with pytest.raises(NotFoundError):
        env.svc.rotate_key("acme", revoked.id, overlap_s=5)
    assert len(env.svc.list_keys("beta")) == 1 and len(env.svc.list_keys("acme")) == 2


@pytest.mark.parametrize("overlap", [-1.0, -0.001, 30 * DAY + 0.001, float("nan")])
def test_an_overlap_outside_0_to_30_days_is_refused(env: Env, overlap: float) -> None:
    env.svc.create("acme")
    (rec,) = env.svc.list_keys("acme")
    with pytest.raises(InvalidInputError) as err:
        env.svc.rotate_key("acme", rec.id, overlap_s=overlap)
    assert err.value.message == "overlap_s must be between 0 and 2.592e+06 seconds"
    assert err.value.details == {"errors": [{"field": "overlap_s", "message": "out of range"}]}


@pytest.mark.parametrize("overlap", [0.0, 30 * DAY])
def test_an_overlap_of_0_or_30_days_is_accepted(env: Env, overlap: float) -> None:
    env.svc.create("acme")
    (rec,) = env.svc.list_keys("acme")
    _, _, old = env.svc.rotate_key("acme", rec.id, overlap_s=overlap)
    assert old.expires_at_s == T0 + overlap


# ---- administration -------------------------------------------------------------------------------------
def test_an_update_changes_quotas_and_limits_and_forgets_the_tenants_cached_principals(
    env: Env, logged: Logged
) -> None:
    tenant, key = env.svc.create("acme", max_queued_jobs=1)
    _, other_key = env.svc.create("beta")
    assert env.svc.authenticate(key).max_queued_jobs == 1
    env.svc.authenticate(other_key)
    before = env.version()
    logged.take()
    out = env.svc.update(
        "acme",
        {"rate_limit_rps": 2.5, "max_queued_jobs": 9, "tokens_per_minute": 1000, "max_active_devices": 3},
    )
    logs = logged.take()
    assert logs == [
        {"event": "tenant_updated", "tenant": "acme",
         "fields": ["max_active_devices", "max_queued_jobs", "rate_limit_rps", "tokens_per_minute"],
         "log_level": "info"},
    ]  # fmt: skip
    assert (out.id, out.max_queued_jobs, out.max_active_devices) == (tenant.id, 9, 3)
    assert env.version() == before + 1
    assert env.svc.cached_principal(key) is None
    assert env.svc.cached_principal(other_key) is not None
    p = env.svc.authenticate(key)
    assert (p.max_queued_jobs, p.max_active_devices, p.rate_limit_rps, p.tokens_per_minute) == (
        9,
        3,
        2.5,
        1000,
    )
    assert env.svc.limits("acme") == TenantLimits(rate_limit_rps=2.5, tokens_per_minute=1000)
    assert env.svc.limits("beta") == TenantLimits()
    env.svc.update("acme", {"rate_limit_rps": None, "max_queued_jobs": None, "rate_limit_burst": 4.0})
    assert env.svc.limits("acme") == TenantLimits(rate_limit_burst=4.0, tokens_per_minute=1000)
    assert env.svc.get("acme").max_queued_jobs is None
    assert env.svc.all_limits() == {tenant.id: TenantLimits(rate_limit_burst=4.0, tokens_per_minute=1000)}


def test_an_update_of_unknown_fields_is_refused_naming_each(env: Env) -> None:
    env.svc.create("acme")
    with pytest.raises(InvalidInputError) as err:
        env.svc.update("acme", {"zeta": 1, "max_queued_jobs": 2, "alpha": 3})
    assert err.value.message == "cannot update alpha, zeta"
    assert err.value.details == {
        "errors": [
            {"field": "alpha", "message": "unknown field"},
            {"field": "zeta", "message": "unknown field"},
        ]
    }
    assert env.svc.get("acme").max_queued_jobs is None


def test_walls_are_granted_canonical_and_once_each_and_forget_the_cached_principals(
    walled: Env, logged: Logged
) -> None:
    env = walled
    _, key = env.svc.create("acme")
    _, other_key = env.svc.create("beta")
    env.svc.authenticate(key)
    env.svc.authenticate(other_key)
    before = env.version()
    logged.take()
    out = env.svc.update_walls(
        "acme",
        storage_roots=["s3://data//team/", "s3://data/team", "s3://other"],
        allow_user_code=1,
        by="root",
    )
    logs = logged.take()
    assert logs == [
        {"event": "tenant_updated", "tenant": "acme", "by": "root",
         "fields": ["allow_user_code", "storage_roots"], "log_level": "info"},
    ]  # fmt: skip
    assert out.storage_roots == ("s3://data/team", "s3://other")
    assert out.allow_user_code is True
    assert env.version() == before + 1
    assert env.svc.cached_principal(key) is None and env.svc.cached_principal(other_key) is not None
    p = env.svc.authenticate(key)
    assert (p.storage_roots, p.allow_user_code) == (("s3://data/team", "s3://other"), True)
    # options left out stay as they are
    kept = env.svc.update_walls("acme", allow_user_code=False)
    assert logged.take()[0]["by"] == ""  # who changed it, when not named
    assert (kept.storage_roots, kept.allow_user_code) == (("s3://data/team", "s3://other"), False)
    cleared = env.svc.update_walls("acme", storage_roots=[])
    assert (cleared.storage_roots, cleared.allow_user_code) == ((), False)
    # nothing to change: the tenant as it is, no settings change, nothing logged
    env.svc.authenticate(key)
    version = env.version()
    logged.take()
    same = env.svc.update_walls("acme")
    quiet = logged.take()
    assert same == cleared and quiet == [] and env.version() == version
    assert env.svc.cached_principal(key) is None  # its principals are forgotten all the same
    with pytest.raises(StorageNotAllowedError):
        env.svc.update_walls("acme", storage_roots=[f"{STORE}/tenants/beta"])
    assert env.svc.get("acme").storage_roots == ()


def test_without_a_storage_policy_the_roots_are_kept_as_given(env: Env) -> None:
    env.svc.create("acme")
    out = env.svc.update_walls("acme", storage_roots=["s3://x//y/", "s3://x//y/", "s3://z"])
    assert out.storage_roots == ("s3://x//y/", "s3://z")


def test_forgetting_drops_cached_principals_of_one_tenant_or_all(env: Env) -> None:
    acme, key = env.svc.create("acme")
    _, other = env.svc.create("beta")
    env.svc.authenticate(key)
    env.svc.authenticate(other)
    env.set_row("acme", max_queued_jobs=3)
    env.set_row("beta", max_queued_jobs=4)
    # within the TTL a cached principal is answered without reading the database
    assert env.svc.authenticate(key).max_queued_jobs is None
    env.svc.forget_tenant(acme.id)
    assert env.svc.authenticate(key).max_queued_jobs == 3
    assert env.svc.authenticate(other).max_queued_jobs is None
    env.svc.invalidate_tenant("tn-unrelated")
    assert env.svc.authenticate(other).max_queued_jobs is None
    env.svc.forget_all()
    assert env.svc.cached_principal(key) is None and env.svc.cached_principal(other) is None
    assert env.svc.authenticate(other).max_queued_jobs == 4


# ---- authentication --------------------------------------------------------------------------------------
def test_a_missing_or_malformed_key_is_refused(env: Env) -> None:
    env.svc.create("acme")
    for presented, message in (
        (None, "missing API key (send Authorization: Bearer <key>)"),
        ("", "missing API key (send Authorization: Bearer <key>)"),
        ("Bearer nonsense", "invalid API key"),
        ("ty_AbCd1234_" + "s" * 43, "invalid API key"),  # well formed, not issued
    ):
        with pytest.raises(AuthenticationError) as err:
            env.svc.authenticate(presented)
        assert err.value.message == message
        assert env.svc.cached_principal(presented) is None


def test_the_principal_carries_the_tenants_quotas_limits_budget_and_walls(env: Env) -> None:
    tenant, key = env.svc.create("acme", max_queued_jobs=4, max_active_devices=8)
    env.svc.update(
        "acme",
        {
            "rate_limit_rps": 5.0,
            "rate_limit_burst": 10.0,
            "key_rate_limit_rps": 1.0,
            "tokens_per_minute": 600,
        },
    )
    env.svc.update_walls("acme", storage_roots=["s3://granted"], allow_user_code=True)
    assert env.svc.authenticate(key).governed is False
    with env.db.engine.begin() as c:
        c.execute(
            insert(BUDGETS),
            {"id": "b1", "tenant_id": tenant.id, "tag_key": "", "tag_value": "", "period": "month",
             "limit_usd": 1.0, "hard": False, "created_at_s": T0, "updated_at_s": T0},
        )  # fmt: skip
    env.svc.forget_all()
    p = env.svc.authenticate(key)
    (rec,) = env.svc.list_keys("acme")
    assert p == Principal(
        tenant_id=tenant.id,
        tenant_name="acme",
        key_id=rec.id,
        admin=False,
        max_queued_jobs=4,
        role="member",
        max_active_devices=8,
        governed=True,
        rate_limit_rps=5.0,
        rate_limit_burst=10.0,
        key_rate_limit_rps=1.0,
        tokens_per_minute=600,
        storage_roots=("s3://granted",),
        allow_user_code=True,
    )


def test_a_principal_is_cached_for_30_seconds(env: Env) -> None:
    _, key = env.svc.create("acme")
    assert AUTH_CACHE_TTL_S == 30.0
    first = env.svc.authenticate(key)
    assert env.svc.cached_principal(key) == first
    env.set_row("acme", max_queued_jobs=7)
    env.clock.now = T0 + 29.9
    assert env.svc.authenticate(key).max_queued_jobs is None
    env.clock.now = T0 + 30
    assert env.svc.cached_principal(key) is None
    assert env.svc.authenticate(key).max_queued_jobs == 7
    assert env.svc.cached_principal(key) is not None


def test_cached_principals_are_used_only_while_the_settings_watcher_vouches_for_them(env: Env) -> None:
    _, key = env.svc.create("acme")
    env.svc.authenticate(key)
    fresh = [True]
    env.svc.cache_trusted = lambda: fresh[0]
    assert env.svc.cached_principal(key) is not None
    env.set_row("acme", max_queued_jobs=2)
    fresh[0] = False
    assert env.svc.cached_principal(key) is None
    assert env.svc.authenticate(key).max_queued_jobs == 2


@pytest.mark.parametrize("revocation", ["forget_all", "forget_tenant", "invalidate_tenant"])
def test_a_lookup_that_a_revocation_overtook_is_not_cached(
    env: Env, monkeypatch: pytest.MonkeyPatch, revocation: str
) -> None:
    tenant, key = env.svc.create("acme")

    def revoke() -> None:
        if revocation == "forget_all":
            env.svc.forget_all()
        else:
            getattr(env.svc, revocation)(tenant.id)

    revoke()  # an earlier revocation: the lookup below starts after it
    real = GovernanceRepo.limits

    def limits_then_revocation(self: GovernanceRepo, tenant_id: str) -> TenantLimits:
        revoke()  # a revocation made while this lookup was reading
        return real(self, tenant_id)

    monkeypatch.setattr(GovernanceRepo, "limits", limits_then_revocation)
    env.svc.authenticate(key)
    assert env.svc.cached_principal(key) is None
    monkeypatch.setattr(GovernanceRepo, "limits", real)
    env.svc.authenticate(key)
    assert env.svc.cached_principal(key) is not None


def test_the_cache_is_emptied_once_it_holds_more_than_10000_principals(env: Env) -> None:
    _, key = env.svc.create("acme")
    _, other = env.svc.create("beta")
    stale = (Principal(tenant_id="x", tenant_name="x", key_id="x", admin=False), T0 + 1e9)
    cache = env.svc._auth_cache
    cache.update({f"d{i}": stale for i in range(10_000)})
    env.svc.authenticate(key)
    assert len(cache) == 10_001  # 10,000 is not more than 10,000
    env.svc.authenticate(other)
    assert len(cache) == 1 and env.svc.cached_principal(other) is not None


# ---- the default tenant ------------------------------------------------------------------------------------
def test_the_default_tenant_is_created_once_with_an_admin_key_file(env: Env, tmp_path: Path) -> None:
    path = tmp_path / "home" / "keys" / "admin.key"
    tenant, wrote = env.svc.ensure_default(path)
    assert wrote and tenant.name == "default" and tenant.allow_user_code is True
    key = path.read_text()
    assert key.endswith("\n") and key.count("\n") == 1
    p = env.svc.authenticate(key.strip())
    assert (p.tenant_id, p.admin, p.role) == (tenant.id, True, "admin")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["admin.key"]
    assert env.svc.ensure_default(path) == (tenant, False)
    assert path.read_text() == key
    path.unlink()  # the key file is gone: a fresh admin key, the old one keeps working
    again, wrote_again = env.svc.ensure_default(path)
    assert (again, wrote_again) == (tenant, True)
    new_key = path.read_text().strip()
    assert new_key != key.strip() and env.svc.authenticate(new_key).admin
    assert env.svc.authenticate(key.strip()).admin
    assert len(env.svc.list_keys("default")) == 2 and len(env.svc.list()) == 1


def test_a_default_tenant_created_meanwhile_by_another_process_gets_a_key_of_its_own(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = TenantService(env.db, env.clock)
    real_create = TenantService.create

    def raced(self: TenantService, name: str, **kw: Any) -> Any:
        real_create(other, name, **kw)  # the other process commits first
        return real_create(self, name, **kw)

    monkeypatch.setattr(TenantService, "create", raced)
    path = tmp_path / "admin.key"
    tenant, wrote = env.svc.ensure_default(path)
    assert wrote and tenant == env.svc.get("default")
    p = env.svc.authenticate(path.read_text().strip())
    assert (p.tenant_id, p.admin) == (tenant.id, True)
    assert len(env.svc.list_keys("default")) == 2


def test_a_key_file_is_written_for_its_owner_only_replacing_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a" / "b" / "key"
    path.parent.mkdir(parents=True)
    path.write_text("old\n")
    path.chmod(0o644)
    left = path.with_name("key.tmp")  # a file at a temporary name, readable by all (left, or planted)
    left.write_text("x" * 100)
    left.chmod(0o644)
    modes: list[int] = []

    class Os:  # records the mode of the file the key is written to, when it is written
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        def write(self, fd: int, data: bytes) -> int:
            modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
            return os.write(fd, data)

    monkeypatch.setattr(tenants_module, "os", Os())
    write_key_file(path, "ty_new")
    assert path.read_bytes() == b"ty_new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["key", "key.tmp"]  # no file of its own left
    assert left.read_text() == "x" * 100  # the key never went into a file that was there
    fresh = tmp_path / "x" / "y" / "key"
    write_key_file(fresh, "k")
    assert fresh.read_text() == "k\n" and stat.S_IMODE(fresh.stat().st_mode) == 0o600
    assert modes == [0o600, 0o600]  # never readable by others, not even before it is in place
