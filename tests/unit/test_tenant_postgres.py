"""TenantService on a real PostgreSQL server (127.0.0.1:5432) where SQLite cannot show it: a key revoked
while a lookup of it reads. On SQLite the revocation waits for the lookup's transaction (one writer at a
time); on PostgreSQL the two overlap, and the lookup must not cache what it read. SQLite runs the rest of
the service (test_tenant_service.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controlplane_support import postgres_db
from trainyard.errors import AuthenticationError
from trainyard.services.domain import TenantLimits
from trainyard.services.tenants import TenantService
from trainyard.store.db import Database
from trainyard.store.governance_repo import GovernanceRepo

pytestmark = pytest.mark.postgres

T0 = 1_800_000_000.0


@pytest.fixture(scope="module")
def pg() -> Iterator[Database]:
    with postgres_db() as db:
        yield db


def test_a_key_revoked_while_its_lookup_reads_is_not_cached_after_an_earlier_revocation(
    pg: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = TenantService(pg, lambda: T0)
    svc.create("acme")
    first, _ = svc.create_key_record("acme")
    record, key = svc.create_key_record("acme")
    svc.revoke_key("acme", first.id)  # an earlier revocation: the lookup below starts after it
    real = GovernanceRepo.limits

    def limits_then_revocation(self: GovernanceRepo, tenant_id: str) -> TenantLimits:
        svc.revoke_key("acme", record.id)  # committed on its own connection while the lookup reads
        return real(self, tenant_id)

    monkeypatch.setattr(GovernanceRepo, "limits", limits_then_revocation)
    assert svc.authenticate(key).key_id == record.id  # what the lookup read before the revocation
    monkeypatch.setattr(GovernanceRepo, "limits", real)
    assert svc.cached_principal(key) is None
    with pytest.raises(AuthenticationError):
        svc.authenticate(key)
