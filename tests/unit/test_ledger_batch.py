"""Batched ledger charges (the inference-token meter): one INSERT for many entries, each fact once,
and budgets settled for the new entries that fall under them."""

from __future__ import annotations

import time
from pathlib import Path

from trainyard.services.governance import GovernanceService
from trainyard.store.db import Database
from trainyard.store.models import TenantRow
from trainyard.tenancy import ledger


def _charge(key: str, tenant: str, usd: float, tags: dict[str, str]) -> ledger.Charge:
    return ledger.Charge(
        source_key=key,
        tenant_id=tenant,
        kind=ledger.KIND_TOKENS,
        quantity=100.0,
        unit="tokens",
        unit_price_usd=usd / 100,
        usd=usd,
        time_s=time.time(),
        deployment="chat",
        model="tiny@1",
        tags=tags,
    )


def test_charge_batch_writes_each_fact_once_and_settles_budgets(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    db.upgrade()
    with db.session() as s:
        s.add(TenantRow(id="t1", name="a", created_at_s=0.0))
        s.add(TenantRow(id="t2", name="b", created_at_s=0.0))
    gov = GovernanceService(db)
    budget = gov.set_budget("a", usd=10.0, tag="team=x")
    batch = [
        (_charge("tokens:r1", "t1", 1.5, {"team": "x"}), "a"),
        (_charge("tokens:r2", "t1", 2.0, {"team": "y"}), "a"),  # outside the tag budget
        (_charge("tokens:r3", "t2", 4.0, {}), "b"),  # a tenant without budgets
    ]
    with db.session() as s:
        assert ledger.charge_batch(s.connection(), batch) == 3
    with db.session() as s:  # the same facts again: nothing written, nothing settled twice
        assert ledger.charge_batch(s.connection(), batch) == 0
    with db.session() as s:
        rows = ledger.entries(s.connection(), ledger.UsageQuery(by="kind", tenant_ids=None))
        key = ledger.period_key("month", time.time())
        spent, _, _ = ledger.period_state(s.connection(), budget["id"], key)
    assert sorted(r["source_key"] for r in rows) == ["tokens:r1", "tokens:r2", "tokens:r3"]
    assert abs(spent - 1.5) < 1e-9
