"""Per-request metering records of the gateway, for the usage ledger to aggregate.

Every gateway request (and every mirrored shadow request, with ``route: shadow``) writes one record:
tenant, deployment, model version, base version, adapter, route, endpoint, status, prompt and completion
tokens, latency, time to first token (streams), replica and tags (the deployment's tags merged with the
request's ``metadata``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from trainyard.store.db import Database
from trainyard.store.serving_models import ServingRequestRow

FIELDS = (
    "id",
    "request_id",
    "tenant_id",
    "tenant",
    "deployment",
    "model_version",
    "base_version",
    "adapter",
    "route",
    "endpoint",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "latency_s",
    "ttft_s",
    "stream",
    "replica_id",
    "tags",
    "created_at_s",
)


def usage_records(
    db: Database,
    *,
    tenant_id: str | None = None,
    since_s: float | None = None,
    until_s: float | None = None,
    after_id: int = 0,
    limit: int = 10_000,
) -> list[dict[str, Any]]:
    """Metering records in id order (``after_id`` pages through them), optionally one tenant's, in
    ``[since_s, until_s)``. Records are append-only; ids only grow."""
    q = select(ServingRequestRow).where(ServingRequestRow.id > after_id)
    if tenant_id is not None:
        q = q.where(ServingRequestRow.tenant_id == tenant_id)
    if since_s is not None:
        q = q.where(ServingRequestRow.created_at_s >= since_s)
    if until_s is not None:
        q = q.where(ServingRequestRow.created_at_s < until_s)
    with db.session() as s:
        rows = list(s.scalars(q.order_by(ServingRequestRow.id).limit(limit)))
    return [{f: getattr(r, f) for f in FIELDS} for r in rows]
