"""Documents of quotes, pools, tenants, API keys, the catalog and code archives."""

from __future__ import annotations

import warnings
from typing import Any

from pydantic import ConfigDict, Field

from trainyard.api_models.base import Document
from trainyard.enums import Market, PoolBackend


class QuoteOptionDoc(Document):
    accelerator: str
    devices: int
    cloud: str | None = None
    region: str
    instance_type: str | None = None
    market: Market
    step_time_s: float | None = None
    price_usd_per_hour: float | None = None
    usd_per_step: float | None = None
    expected_hours: float | None = None
    expected_cost_usd: float | None = None
    preemption_overhead_usd: float | None = None
    checkpoint_interval_s: float | None = None
    feasible: bool
    reason: str = ""
    pool: str | None = None


class QuoteResponse(Document):
    options: list[QuoteOptionDoc]

    def feasible(self) -> list[QuoteOptionDoc]:
        """The options a job could run on, cheapest expected cost first."""
        return [o for o in self.options if o.feasible]


class PoolDoc(Document):
    name: str
    accelerator: str
    devices_per_node: int
    nodes: int
    market: Market
    region: str
    source: str
    devices_in_use: int
    updated_at: str | None
    backend: PoolBackend = Field(description="local | ray | none (planning only: quoted, never started)")
    executable: bool = Field(description="True when an executor of this server can start work here")


class PoolList(Document):
    pools: list[PoolDoc]


class TenantCreated(Document):
    id: str
    name: str
    api_key: str = Field(description="Shown once; only its hash is stored.")


class TenantDoc(Document):
    id: str
    name: str
    created_at: str | None
    max_queued_jobs: int | None
    max_active_devices: int | None
    storage_roots: list[str] = Field(default_factory=list)
    allow_user_code: bool = False
    storage_url: str | None = Field(None, description="The tenant's namespace under the storage root.")


class TenantList(Document):
    tenants: list[TenantDoc]


class ApiKeyDoc(Document):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "key-3f2a9c1b7d4e5a6b",
                    "prefix": "Ab12Cd34",
                    "admin": False,
                    "created_at": "2026-11-29T12:00:00Z",
                    "revoked": False,
                }
            ]
        }
    )
    id: str
    prefix: str = Field(
        description="The public part of the key: `ty_<prefix>_...`. The key itself is never stored."
    )
    admin: bool
    created_at: str | None
    revoked: bool


class ApiKeyCreated(ApiKeyDoc):
    api_key: str = Field(description="Shown once; only its hash is stored.")


class ApiKeyRotated(Document):
    new: ApiKeyCreated
    old: ApiKeyDoc


with warnings.catch_warnings():
    # the API's `{keys: [...]}`: on this document `.keys` is that list, not the mapping method, so read
    # it as `doc.keys` / `doc["keys"]` and use to_dict() rather than dict(doc). Field() keeps it required
    # (without it pydantic would take the inherited method as the field's default).
    warnings.filterwarnings("ignore", message='Field name "keys" in "ApiKeyList"', category=UserWarning)

    class ApiKeyList(Document):
        keys: list[ApiKeyDoc] = Field()  # type: ignore[assignment]


class CodeUploaded(Document):
    url: str = Field(description="Where the archive is stored; name it as entrypoint.code.")
    sha256: str
    bytes: int


class WhoAmI(Document):
    tenant: str
    admin: bool
    storage_url: str | None = None
    storage_roots: list[str] = Field(default_factory=list)
    allow_user_code: bool = False


class AcceleratorList(Document):
    accelerators: list[dict[str, Any]]


class WebhookDoc(Document):
    id: str
    url: str
    rules: list[str] | None = None
    created_at: str | None = None
    signing_secret: str | None = Field(None, description="Only in the answer to its creation.")


class WebhookList(Document):
    webhooks: list[WebhookDoc]


class WebhookDeliveryDoc(Document):
    id: str = Field(description="The delivery id, sent as Trainyard-Delivery-Id on every attempt.")
    webhook_id: str
    alert_id: str
    rule: str
    job_id: str | None = None
    url: str
    state: str = Field(description="pending | delivered | failed | dead")
    attempts: int
    max_attempts: int
    last_status_code: int | None = None
    last_error: str | None = None
    next_attempt_at: str | None = None
    created_at: str | None = None
    delivered_at: str | None = None


class WebhookDeliveryList(Document):
    deliveries: list[WebhookDeliveryDoc]
