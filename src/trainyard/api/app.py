"""The FastAPI app factory. The app holds a :class:`~trainyard.services.platform.Platform`; it does no
work of its own beyond parsing, auth and rendering."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Gauge

from trainyard import __version__
from trainyard.api.errors import install_error_handlers
from trainyard.api.fastpath import install_fast_path
from trainyard.api.middleware import MAX_BODY_BYTES, Metrics, ServiceMiddleware
from trainyard.api.operation_ids import operation_id
from trainyard.api.routers import (
    alerts,
    catalog,
    code,
    datasets,
    deployments,
    evaluations,
    governance,
    health,
    jobs,
    models,
    openai,
    pools,
    quotes,
    records,
    sweeps,
    tenants,
)
from trainyard.services.lifecycle import JobState
from trainyard.services.platform import Platform
from trainyard.store.repositories import JobRepo

DESCRIPTION = """\
The trainyard control plane. Every `/v1` route needs `Authorization: Bearer <api key>`; every
resource belongs to one tenant and another tenant's resource answers 404. Errors are
`{"error": {"code", "message", "hint", "details"}}`.
"""


def create_app(
    platform: Platform, *, access_log: bool = True, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    app = FastAPI(
        title="trainyard",
        version=__version__,
        description=DESCRIPTION,
        docs_url=None,  # Swagger UI and ReDoc load assets from a CDN; the platform serves nothing remote
        redoc_url=None,
        generate_unique_id_function=operation_id,
        openapi_tags=[
            {"name": "jobs", "description": "Submit, follow and cancel training jobs."},
            {"name": "datasets", "description": "Upload, validate and read immutable dataset versions."},
            {"name": "quotes", "description": "Price a job on every pool before submitting it."},
            {"name": "pools", "description": "Live capacity the scheduler places jobs on."},
            {"name": "tenants", "description": "Tenants and API keys (admin)."},
            {"name": "catalog", "description": "Accelerators and cloud offers."},
            {"name": "usage", "description": "The usage ledger: reports by tag, tenant, day; invoices."},
            {"name": "budgets", "description": "Dollar budgets per tenant and tag, alerts, hard limits."},
            {"name": "models", "description": "Model registry: versions, lineage, aliases, promotion."},
            {"name": "evaluations", "description": "Paired evaluations of a model against a baseline."},
            {"name": "sweeps", "description": "Hyperparameter sweeps: group quotes, halving, one budget."},
            {"name": "code", "description": "Code archives that entrypoint jobs run in."},
            {"name": "deployments", "description": "Serve model versions: replicas, traffic, autoscaling."},
            {"name": "openai", "description": "OpenAI-compatible API over the tenant's deployments."},
            {"name": "health", "description": "Liveness, readiness, metrics."},
        ],
    )
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    jobs_gauge = Gauge("trainyard_jobs", "Jobs by state", ["state"], registry=registry)

    def refresh_gauges() -> None:
        with platform.db.session() as s:
            counts = JobRepo(s).counts_by_state()
        for st in JobState:
            jobs_gauge.labels(st.value).set(counts.get(st.value, 0))

    app.state.platform = platform
    app.state.metrics = metrics
    app.state.refresh_gauges = refresh_gauges
    install_error_handlers(app)
    for r in (
        health.router,
        jobs.router,
        quotes.router,
        pools.router,
        tenants.router,
        catalog.router,
        governance.router,
        models.router,
        evaluations.router,
        sweeps.router,
        code.router,
        deployments.router,
        openai.router,
        datasets.router,
        records.router,
        alerts.router,
    ):
        app.include_router(r)
    from trainyard.observability import install_observability  # dashboard + metrics/traces/alerts
    from trainyard.web import install_dashboard

    install_observability(app, platform)
    install_dashboard(app, platform)
    _document_common_answers(app)
    app.add_middleware(
        ServiceMiddleware,
        metrics=metrics,
        max_body_bytes=max_body_bytes,
        access_log=access_log,
        # dataset uploads stream to disk under their own (configurable) limit
        upload_paths={"/v1/datasets": platform.settings.dataset_max_bytes},
    )
    install_fast_path(app, platform)  # the completion routes, in front of the framework (api.fastpath)
    return app


def _document_common_answers(app: FastAPI) -> None:
    """Answers every route can give that the routers do not each declare, added to the OpenAPI document
    so that it lists every status the API really sends: a request body that cannot be read as its
    media type at all (400, from the framework before validation), and under /openai the key and
    rate-limit answers (401, 429) of the OpenAI-compatible API."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build()
        error = {"$ref": "#/components/schemas/ErrorEnvelope"}

        def answer(description: str) -> dict[str, Any]:
            return {"description": description, "content": {"application/json": {"schema": error}}}

        for path, item in doc.get("paths", {}).items():
            for op in item.values():
                if not isinstance(op, dict) or "responses" not in op:
                    continue
                responses = op["responses"]
                if "requestBody" in op:
                    responses.setdefault("400", answer("The request body could not be parsed"))
                if path.startswith("/openai/"):
                    responses.setdefault("401", answer("Missing or wrong API key"))
                    responses.setdefault("429", answer("Rate limited; Retry-After says when to retry"))
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def openapi_document(app: FastAPI) -> dict[str, Any]:
    return app.openapi()
