"""Quota basics: per-tenant caps on queued jobs and on devices held by running jobs. Pure checks."""

from __future__ import annotations

from trainyard.errors import QuotaExceededError


def check_queue_quota(tenant_name: str, open_jobs: int, max_queued_jobs: int | None) -> None:
    """Raise when one more submission would exceed the tenant's cap on unfinished jobs."""
    if max_queued_jobs is not None and open_jobs >= max_queued_jobs:
        raise QuotaExceededError(
            f"tenant {tenant_name!r} already has {open_jobs} unfinished jobs (quota {max_queued_jobs})",
            hint=(
                "Wait for some to finish, or ask an admin to raise the quota with "
                f"`trainyard tenants update {tenant_name} --max-queued-jobs N`."
            ),
            details={"open_jobs": open_jobs, "max_queued_jobs": max_queued_jobs},
        )


def devices_allowed(active_devices: int, requested: int, max_active_devices: int | None) -> bool:
    """Whether placing ``requested`` more devices keeps the tenant within its device quota."""
    return max_active_devices is None or active_devices + requested <= max_active_devices
