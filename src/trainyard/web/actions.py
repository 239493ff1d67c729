"""What the dashboard's buttons do: the same service calls, with the same permission rules, as the API
routes they mirror (``/v1/jobs/{id}/cancel``, ``/v1/jobs/{id}/preempt``, ``/v1/models/{ref}/promote``,
``PUT /v1/deployments/{name}/traffic``). A viewer cannot act; another tenant's resource is not found."""

from __future__ import annotations

from typing import Any

from trainyard.errors import ConflictError
from trainyard.services.domain import Principal
from trainyard.web.rendering import require_actor


def cancel_job(platform: Any, principal: Principal, job_id: str) -> Any:
    require_actor(principal)
    return platform.jobs.cancel(principal, job_id)


def preempt_job(platform: Any, principal: Principal, job_id: str, notice_s: float | None = None) -> Any:
    require_actor(principal)
    if not principal.admin:
        platform.jobs.get(principal, job_id)  # 404 for another tenant's job
    supervisor = platform.supervisor
    if supervisor is None:
        raise ConflictError(
            "this server runs no executor, so no job is running to preempt",
            hint="Start the platform with `trainyard up --executor local` (or ray).",
        )
    return supervisor.preempt(job_id, notice_s, by=principal.tenant_name)


def promote(
    platform: Any, principal: Principal, ref: str, alias: str, *, evaluation: str | None = None
) -> dict[str, Any]:
    require_actor(principal)
    doc: dict[str, Any] = platform.registry.promote(principal, ref, alias, evaluation_id=evaluation or None)
    return doc


def set_traffic(platform: Any, principal: Principal, name: str, routes: list[dict[str, Any]]) -> Any:
    require_actor(principal)
    svc = platform.serving
    svc.get(principal.tenant_id, name)  # 404 first, as the API does for an unknown name
    return svc.set_traffic(principal.tenant_id, principal.tenant_name, name, routes)
