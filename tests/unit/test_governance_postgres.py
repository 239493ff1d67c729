"""GovernanceService's budget listings on a real PostgreSQL server (127.0.0.1:5432). SQLite answers them
through its unique indexes, in the order the listing asks for even without its ORDER BY; PostgreSQL reads
a small table in the order its rows were written, so rows written out of order show that the listings
sort them. SQLite runs the rest of the service (test_governance_service.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
from sqlalchemy import Table, insert

from controlplane_support import postgres_db
from trainyard.services.domain import Principal
from trainyard.services.governance import GovernanceService
from trainyard.store.db import Database
from trainyard.store.governance_models import BudgetRow
from trainyard.tenancy import ledger

pytestmark = pytest.mark.postgres

MID = 1797292800.0  # 2026-12-15T00:00:00Z
ADMIN = Principal(tenant_id="pa", tenant_name="pa", key_id="k0", admin=True)
# (id, tenant, tag key, tag value, period), in the listing's order: tenant, tag key, tag value, period
LISTED = [
    ("b1", "pa", "", "", "day"),
    ("b2", "pa", "", "", "month"),
    ("b3", "pa", "team", "a", "month"),
    ("b4", "pa", "team", "b", "day"),
    ("b5", "pa", "zone", "a", "day"),
    ("b6", "pb", "", "", "month"),
]


@pytest.fixture(autouse=True)
def _statements_built_by_each_test(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger, "_BUILT", {})
    monkeypatch.setattr(ledger, "_BATCH_STATEMENTS", {})


@pytest.fixture(scope="module")
def pg() -> Iterator[Database]:
    with postgres_db((("pa", "pa"), ("pb", "pb"))) as db:
        with db.engine.begin() as c:
            c.execute(  # written last first
                insert(cast(Table, BudgetRow.__table__)),
                [
                    {"id": i, "tenant_id": t, "tag_key": k, "tag_value": v, "period": p, "limit_usd": 1.0,
                     "hard": False, "created_at_s": MID, "updated_at_s": MID}
                    for i, t, k, v, p in reversed(LISTED)
                ],
            )  # fmt: skip
        yield db


def test_budgets_are_listed_by_tenant_tag_key_tag_value_and_period_whatever_order_they_were_written(
    pg: Database,
) -> None:
    gov = GovernanceService(pg, lambda: MID)
    listed = gov.list_budgets(ADMIN)
    assert [d["id"] for d in listed] == [row[0] for row in LISTED]
    assert [(d["tenant"], d["tag"], d["period"]) for d in listed][:3] == [
        ("pa", None, "day"),
        ("pa", None, "month"),
        ("pa", "team=a", "month"),
    ]
    assert [d["id"] for d in gov.list_budgets(ADMIN, "pa")] == ["b1", "b2", "b3", "b4", "b5"]


def test_every_budget_is_listed_for_the_metrics_in_id_order_whatever_order_they_were_written(
    pg: Database,
) -> None:
    gov = GovernanceService(pg, lambda: MID)
    assert [d["id"] for d in gov.all_budgets()] == ["b1", "b2", "b3", "b4", "b5", "b6"]
    assert [d["id"] for d in gov.all_budgets(limit=2)] == ["b1", "b2"]
