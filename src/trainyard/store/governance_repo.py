"""Repository of tenant administration: limits beyond the tenants table, key roles and expiry."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table, select, update
from sqlalchemy.orm import Session

from trainyard.services.domain import TenantLimits
from trainyard.store.governance_models import ApiKeyPolicyRow, BudgetRow, TenantLimitsRow
from trainyard.store.models import TenantRow

_LIMITS = cast(Table, TenantLimitsRow.__table__)
_POLICIES = cast(Table, ApiKeyPolicyRow.__table__)
_BUDGETS = cast(Table, BudgetRow.__table__)
LIMIT_FIELDS = (
    "max_concurrent_jobs",
    "rate_limit_rps",
    "rate_limit_burst",
    "key_rate_limit_rps",
    "tokens_per_minute",
)
TENANT_FIELDS = ("max_queued_jobs", "max_active_devices")
ROLES = ("admin", "member", "viewer")


class GovernanceRepo:
    def __init__(self, s: Session) -> None:
        self.s = s

    def limits(self, tenant_id: str) -> TenantLimits:
        row = self.s.connection().execute(select(_LIMITS).where(_LIMITS.c.tenant_id == tenant_id)).first()
        if row is None:
            return TenantLimits()
        return TenantLimits(**{f: getattr(row, f) for f in LIMIT_FIELDS})

    def all_limits(self) -> dict[str, TenantLimits]:
        return {
            r.tenant_id: TenantLimits(**{f: getattr(r, f) for f in LIMIT_FIELDS})
            for r in self.s.connection().execute(select(_LIMITS))
        }

    def set_limits(self, tenant_id: str, changes: dict[str, Any]) -> None:
        """Apply ``changes`` (field -> value, None = no limit) to the tenant's limits and quotas."""
        tenant_changes = {k: v for k, v in changes.items() if k in TENANT_FIELDS}
        limit_changes = {k: v for k, v in changes.items() if k in LIMIT_FIELDS}
        conn = self.s.connection()
        if tenant_changes:
            conn.execute(update(TenantRow).where(TenantRow.id == tenant_id).values(**tenant_changes))
        if limit_changes:
            exists = conn.execute(select(_LIMITS.c.tenant_id).where(_LIMITS.c.tenant_id == tenant_id)).first()
            if exists is None:
                conn.execute(_LIMITS.insert(), {"tenant_id": tenant_id, **limit_changes})
            else:
                conn.execute(update(_LIMITS).where(_LIMITS.c.tenant_id == tenant_id).values(**limit_changes))

    def key_policy(self, key_id: str) -> tuple[str, float | None] | None:
        row = (
            self.s.connection()
            .execute(select(_POLICIES.c.role, _POLICIES.c.expires_at_s).where(_POLICIES.c.key_id == key_id))
            .first()
        )
        return None if row is None else (str(row[0]), row[1])

    def key_policies(self, key_ids: list[str]) -> dict[str, tuple[str, float | None]]:
        if not key_ids:
            return {}
        rows = self.s.connection().execute(
            select(_POLICIES.c.key_id, _POLICIES.c.role, _POLICIES.c.expires_at_s).where(
                _POLICIES.c.key_id.in_(key_ids)
            )
        )
        return {str(k): (str(r), e) for k, r, e in rows}

    def set_key_policy(self, key_id: str, *, role: str, expires_at_s: float | None) -> None:
        conn = self.s.connection()
        if conn.execute(select(_POLICIES.c.key_id).where(_POLICIES.c.key_id == key_id)).first() is None:
            conn.execute(_POLICIES.insert(), {"key_id": key_id, "role": role, "expires_at_s": expires_at_s})
        else:
            conn.execute(
                update(_POLICIES)
                .where(_POLICIES.c.key_id == key_id)
                .values(role=role, expires_at_s=expires_at_s)
            )

    def has_budget(self, tenant_id: str) -> bool:
        return (
            self.s.connection()
            .execute(select(_BUDGETS.c.id).where(_BUDGETS.c.tenant_id == tenant_id).limit(1))
            .first()
            is not None
        )
