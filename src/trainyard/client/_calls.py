"""Every REST call of the client, once: path, parameters, body and the document type of the answer.

:class:`~trainyard.client.TrainyardClient` and :class:`~trainyard.client.AsyncTrainyardClient` send
these; keeping them here is what makes the two clients the same API.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote as _quote

from trainyard import errors as E
from trainyard.client._core import Call, Upload

if TYPE_CHECKING:
    from trainyard import api_models as M
    from trainyard.spec.models import JobSpec

    #: What ``submit`` and ``quote`` accept: a JobSpec, its document, or a YAML/JSON spec file.
    SpecLike = JobSpec | Mapping[str, Any] | str | PathLike[str]

T = TypeVar("T")

UPLOAD_CHUNK_BYTES = 768 * 1024  # model files: below the API's body limit
_STREAMING = (30.0, None, None, 30.0)  # httpx (connect, read, write, pool): a stream may take long


def _seg(value: str, safe: str = "") -> str:
    return _quote(str(value), safe=safe)


def _none(_: Any) -> None:
    return None


def _doc(name: str) -> Callable[[Any], Any]:
    """The parser of the :mod:`trainyard.api_models` document ``name``. The models (and pydantic) are
    imported when a first answer is parsed, not with the client: a caller that takes the JSON as it is
    (the CLI) never pays for them."""

    def parse(body: Any) -> Any:
        from trainyard import api_models

        return getattr(api_models, name).model_validate(body)

    parse.__qualname__ = f"parse_{name}"
    return parse


def dataset_path(ref: str) -> str:
    """``ds://name@3`` → ``name@3`` (the path segment of /v1/datasets/{ref})."""
    return ref[len("ds://") :] if ref.startswith("ds://") else ref


# ---- specs ---------------------------------------------------------------------------------------
def spec_document(spec: SpecLike) -> tuple[dict[str, Any], Path | None]:
    """The JSON document of a spec and the directory relative paths in it are taken from.

    A :class:`~trainyard.spec.JobSpec` (or anything with ``to_document()``), a mapping (sent as it is;
    the server validates it), or the path of a YAML/JSON spec file (validated here first, so every
    error is reported before anything is sent)."""
    if hasattr(spec, "to_document"):
        return dict(spec.to_document()), None
    if isinstance(spec, Mapping):
        return dict(spec), None
    if isinstance(spec, str | PathLike):
        from trainyard.spec import load_spec

        path = Path(spec).expanduser()
        return load_spec(path).to_document(), path.parent
    raise E.InvalidInputError(
        f"a job spec must be a JobSpec, a dict or a spec file path, not {type(spec).__name__}",
        hint="Pass trainyard.spec.load_spec('job.yaml'), its .to_document(), or the path itself.",
    )


def local_dataset(spec_doc: Mapping[str, Any], spec_dir: Path | None) -> Path | None:
    """The local file ``workload.dataset`` names, when it names one (DESIGN §3.6: the client uploads
    what a user names locally; the server never reads a path a client typed). ``ds://`` references and
    other URLs are left to the server."""
    ref = (spec_doc.get("workload") or {}).get("dataset")
    if not isinstance(ref, str) or ref.startswith("ds://"):
        return None
    if ref.startswith("file://"):
        local = Path(ref[len("file://") :])
    elif "://" in ref:
        return None
    else:
        local = Path(ref).expanduser()
        if not local.is_absolute() and not local.exists() and spec_dir is not None:
            local = spec_dir / local
    if not local.is_file():
        raise E.SpecError(
            f"workload.dataset: {ref} is not a file on this machine",
            hint="Name an existing JSONL file, or a registered version such as ds://NAME@3.",
            details={"errors": [{"field": "workload.dataset", "message": "no such file"}]},
        )
    return local


def dataset_name_for(path: Path) -> str:
    """The dataset name a local file is uploaded under: its stem, lower-case, safe characters only."""
    return re.sub(r"[^a-z0-9._-]+", "-", path.stem.lower()).strip("-._")[:100] or "dataset"


# ---- jobs ----------------------------------------------------------------------------------------
def submit(spec_doc: dict[str, Any], idempotency_key: str | None) -> Call[M.JobDocument]:
    key = idempotency_key or str(uuid.uuid4())
    return Call(
        "POST", "/v1/jobs", _doc("JobDocument"), json={"spec": spec_doc}, headers={"Idempotency-Key": key}
    )


def get_job(job_id: str) -> Call[M.JobDocument]:
    return Call("GET", f"/v1/jobs/{_seg(job_id)}", _doc("JobDocument"))


def list_jobs(
    states: Iterable[str] | None, name: str | None, cursor: str | None, limit: int
) -> Call[M.JobList]:
    params: dict[str, Any] = {"limit": limit, "name": name or None, "cursor": cursor or None}
    if states:
        params["state"] = [str(s) for s in states]
    return Call("GET", "/v1/jobs", _doc("JobList"), params=params)


def cancel_job(job_id: str) -> Call[M.JobDocument]:
    return Call("POST", f"/v1/jobs/{_seg(job_id)}/cancel", _doc("JobDocument"))


def preempt_job(job_id: str, notice_s: float | None) -> Call[M.JobDocument]:
    body = {} if notice_s is None else {"notice_s": notice_s}
    return Call("POST", f"/v1/jobs/{_seg(job_id)}/preempt", _doc("JobDocument"), json=body)


def job_events(job_id: str, after: int, limit: int) -> Call[M.EventList]:
    return Call(
        "GET", f"/v1/jobs/{_seg(job_id)}/events", _doc("EventList"), params={"after": after, "limit": limit}
    )


def job_logs(
    job_id: str,
    rank: int,
    offset: int,
    limit_bytes: int,
    attempt: int | None = None,
    tail: int | None = None,
    wait_s: float = 0.0,
) -> Call[M.LogChunk]:
    params = {
        "rank": rank,
        "offset": offset,
        "limit_bytes": limit_bytes,
        "attempt": attempt,
        "tail": tail,
        "wait_s": wait_s or None,
    }
    return Call(
        "GET",
        f"/v1/jobs/{_seg(job_id)}/logs",
        _doc("LogChunk"),
        params=params,
        timeout=30.0 + wait_s,
    )


def job_metrics(
    job_id: str, since_step: int, max_points: int, attempt: int | None, downsample: bool
) -> Call[M.MetricsDocument]:
    params = {
        "since_step": since_step,
        "max_points": max_points,
        "downsample": "true" if downsample else "false",
        "attempt": attempt,
    }
    return Call("GET", f"/v1/jobs/{_seg(job_id)}/metrics", _doc("MetricsDocument"), params=params)


def job_record(job_id: str, attempt: int | None) -> Call[M.Document]:
    return Call("GET", f"/v1/jobs/{_seg(job_id)}/record", _doc("Document"), params={"attempt": attempt})


def reproduce_job(job_id: str, idempotency_key: str | None) -> Call[M.JobDocument]:
    key = idempotency_key or str(uuid.uuid4())
    return Call(
        "POST", f"/v1/jobs/{_seg(job_id)}/reproduce", _doc("JobDocument"), headers={"Idempotency-Key": key}
    )


# ---- quotes, pools, catalog, code ----------------------------------------------------------------
def quote(
    spec_doc: dict[str, Any], pools: Sequence[Mapping[str, Any]] | None, include_catalog: bool
) -> Call[M.QuoteResponse]:
    body: dict[str, Any] = {"spec": spec_doc, "include_catalog": include_catalog}
    if pools is not None:
        body["pools"] = [dict(p) for p in pools]
    return Call("POST", "/v1/quotes", _doc("QuoteResponse"), json=body)


def list_pools() -> Call[M.PoolList]:
    return Call("GET", "/v1/pools", _doc("PoolList"))


def get_pool(name: str) -> Call[M.PoolDoc]:
    return Call("GET", f"/v1/pools/{_seg(name)}", _doc("PoolDoc"))


def put_pool(pool: Mapping[str, Any]) -> Call[M.PoolDoc]:
    return Call("PUT", f"/v1/pools/{_seg(pool['name'])}", _doc("PoolDoc"), json=dict(pool))


def patch_pool(name: str, changes: Mapping[str, Any]) -> Call[M.PoolDoc]:
    return Call("PATCH", f"/v1/pools/{_seg(name)}", _doc("PoolDoc"), json=dict(changes))


def delete_pool(name: str) -> Call[None]:
    return Call("DELETE", f"/v1/pools/{_seg(name)}", _none)


def catalog() -> Call[M.AcceleratorList]:
    return Call("GET", "/v1/catalog", _doc("AcceleratorList"))


def upload_code(archive: bytes) -> Call[M.CodeUploaded]:
    return Call(
        "POST",
        "/v1/code",
        _doc("CodeUploaded"),
        content=archive,
        headers={"Content-Type": "application/gzip"},
    )


def whoami() -> Call[M.WhoAmI]:
    return Call("GET", "/v1/whoami", _doc("WhoAmI"))


def healthz() -> Call[M.Document]:
    return Call("GET", "/healthz", _doc("Document"))


def readyz() -> Call[M.Document]:
    return Call("GET", "/readyz", _doc("Document"))


# ---- tenants and keys ----------------------------------------------------------------------------
def create_tenant(
    name: str, admin: bool, max_queued_jobs: int | None, max_active_devices: int | None
) -> Call[M.TenantCreated]:
    body: dict[str, Any] = {"name": name, "admin": admin}
    if max_queued_jobs is not None:
        body["max_queued_jobs"] = max_queued_jobs
    if max_active_devices is not None:
        body["max_active_devices"] = max_active_devices
    return Call("POST", "/v1/tenants", _doc("TenantCreated"), json=body)


def list_tenants() -> Call[M.TenantList]:
    return Call("GET", "/v1/tenants", _doc("TenantList"))


def get_tenant(name: str) -> Call[M.TenantDoc]:
    return Call("GET", f"/v1/tenants/{_seg(name)}", _doc("TenantDoc"))


def update_tenant(name: str, changes: Mapping[str, Any]) -> Call[M.TenantDoc]:
    return Call("PATCH", f"/v1/tenants/{_seg(name)}", _doc("TenantDoc"), json=dict(changes))


def list_api_keys(tenant: str) -> Call[M.ApiKeyList]:
    return Call("GET", f"/v1/tenants/{_seg(tenant)}/keys", _doc("ApiKeyList"))


def create_api_key(tenant: str, role: str) -> Call[M.ApiKeyCreated]:
    return Call("POST", f"/v1/tenants/{_seg(tenant)}/keys", _doc("ApiKeyCreated"), json={"role": role})


def revoke_api_key(tenant: str, key_id: str) -> Call[M.ApiKeyDoc]:
    return Call("POST", f"/v1/tenants/{_seg(tenant)}/keys/{_seg(key_id)}/revoke", _doc("ApiKeyDoc"))


def rotate_api_key(tenant: str, key_id: str, overlap_s: float) -> Call[M.ApiKeyRotated]:
    return Call(
        "POST",
        f"/v1/tenants/{_seg(tenant)}/keys/{_seg(key_id)}/rotate",
        _doc("ApiKeyRotated"),
        json={"overlap_s": overlap_s},
    )


# ---- usage and budgets ---------------------------------------------------------------------------
def usage(by: str, from_: str | None, to: str | None, tenant: str | None) -> Call[M.Document]:
    params = {"by": by, "from": from_, "to": to, "tenant": tenant}
    return Call("GET", "/v1/usage", _doc("Document"), params=params)


def invoice(tenant: str | None, month: str | None) -> Call[M.Document]:
    return Call("GET", "/v1/usage/invoice", _doc("Document"), params={"tenant": tenant, "month": month})


def reconcile_usage() -> Call[M.Document]:
    return Call("GET", "/v1/usage/reconcile", _doc("Document"))


def set_budget(tenant: str, usd: float, period: str, hard: bool, tag: str | None) -> Call[M.Document]:
    body: dict[str, Any] = {"usd": usd, "period": period, "hard": hard}
    if tag is not None:
        body["tag"] = tag
    return Call("PUT", f"/v1/budgets/{_seg(tenant)}", _doc("Document"), json=body)


def list_budgets(tenant: str | None) -> Call[M.Document]:
    return Call("GET", "/v1/budgets", _doc("Document"), params={"tenant": tenant})


def get_budget(tenant: str, tag: str | None, period: str) -> Call[M.Document]:
    return Call("GET", f"/v1/budgets/{_seg(tenant)}", _doc("Document"), params={"period": period, "tag": tag})


def budget_events(tenant: str) -> Call[M.Document]:
    return Call("GET", f"/v1/budgets/{_seg(tenant)}/events", _doc("Document"))


# ---- datasets (DESIGN §3.7) ----------------------------------------------------------------------
def upload_dataset(
    path: Path,
    *,
    name: str,
    format: str,
    eval_fraction: float,
    seed: int,
    base: str | None,
    max_tokens: int | None,
    derived_from: str | None,
    progress: Callable[[int], Any] | None,
    chunk_bytes: int,
) -> Call[M.DatasetDoc]:
    if not path.is_file():
        raise E.InvalidInputError(f"{path} is not a file", hint="Name a JSON Lines file on this machine.")
    params: dict[str, Any] = {
        "name": name,
        "format": str(format),
        "eval_fraction": eval_fraction,
        "seed": seed,
        "base": base,
        "max_tokens": max_tokens,
        "derived_from": derived_from,
    }
    return Call(
        "POST",
        "/v1/datasets",
        _doc("DatasetDoc"),
        params=params,
        upload=Upload(path, chunk_bytes=chunk_bytes, progress=progress),
        headers={"Content-Type": "application/x-ndjson"},
        timeout=_STREAMING,
    )


def get_dataset(ref: str) -> Call[M.DatasetDoc]:
    return Call("GET", f"/v1/datasets/{_seg(dataset_path(ref), '@')}", _doc("DatasetDoc"))


def dataset_epoch_cost(
    ref: str, model: str | None, seq_len: int, global_batch: int
) -> Call[M.DatasetEpochCost]:
    return Call(
        "GET",
        f"/v1/datasets/{_seg(dataset_path(ref), '@')}/cost",
        _doc("DatasetEpochCost"),
        params={"model": model, "seq_len": seq_len, "global_batch": global_batch},
    )


def list_datasets(name: str | None) -> Call[M.DatasetList]:
    return Call("GET", "/v1/datasets", _doc("DatasetList"), params={"name": name})


def dataset_rows(ref: str, split: str, offset: int, limit: int) -> Call[M.DatasetRows]:
    return Call(
        "GET",
        f"/v1/datasets/{_seg(dataset_path(ref), '@')}/rows",
        _doc("DatasetRows"),
        params={"split": split, "offset": offset, "limit": limit},
    )


# ---- models and evaluations (DESIGN §3.8) --------------------------------------------------------
def model_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise E.InvalidInputError(
            f"{directory} is not a directory", hint="Pass a Hugging Face model directory."
        )
    return sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))


def start_model_upload() -> Call[M.Document]:
    return Call("POST", "/v1/models/uploads", _doc("Document"))


def model_upload_chunk(upload_id: str, filename: str, offset: int, chunk: bytes) -> Call[M.Document]:
    return Call(
        "PUT",
        f"/v1/models/uploads/{_seg(upload_id)}/files/{_seg(filename)}",
        _doc("Document"),
        params={"offset": offset},
        content=chunk,
        headers={"Content-Type": "application/octet-stream"},
    )


def import_model(upload_id: str, name: str, public: bool) -> Call[M.ModelVersionDoc]:
    return Call(
        "POST",
        "/v1/models/import",
        _doc("ModelVersionDoc"),
        json={"upload_id": upload_id, "name": name, "public": public},
    )


def list_models(name: str | None, dataset: str | None) -> Call[M.ModelList]:
    return Call(
        "GET", "/v1/models", _doc("ModelList"), params={"name": name or None, "dataset": dataset or None}
    )


def get_model(ref: str) -> Call[M.ModelVersionDoc]:
    return Call("GET", f"/v1/models/{_seg(ref, '@')}", _doc("ModelVersionDoc"))


def model_lineage(ref: str) -> Call[M.Document]:
    return Call("GET", f"/v1/models/{_seg(ref, '@')}/lineage", _doc("Document"))


def promote_model(ref: str, alias: str, force: bool, reason: str, evaluation: str | None) -> Call[M.Document]:
    body = {"alias": alias, "force": force, "reason": reason, "evaluation": evaluation}
    return Call("POST", f"/v1/models/{_seg(ref, '@')}/promote", _doc("Document"), json=body)


def model_aliases(name: str) -> Call[M.Document]:
    return Call("GET", f"/v1/models/{_seg(name)}/aliases", _doc("Document"))


def run_evaluation(
    model: str,
    dataset: str,
    baseline: str | None,
    split: str,
    max_examples: int | None,
    guardrails: Mapping[str, float] | None,
    primary_metric: str | None = None,
    non_inferiority: Mapping[str, float] | None = None,
    alpha: float | None = None,
    correction: str | None = None,
    guardrail_datasets: Sequence[Mapping[str, Any]] | None = None,
) -> Call[M.EvaluationDoc]:
    body: dict[str, Any] = {
        "model": model,
        "baseline": baseline,
        "dataset": dataset,
        "split": split,
        "max_examples": max_examples,
        "guardrails": dict(guardrails) if guardrails is not None else None,
    }
    # the gate's options go only when given, so the body stays what an older server accepts
    for key, value in (
        ("primary_metric", primary_metric),
        ("non_inferiority", dict(non_inferiority) if non_inferiority is not None else None),
        ("alpha", alpha),
        ("correction", correction),
        ("guardrail_datasets", [dict(g) for g in guardrail_datasets] if guardrail_datasets else None),
    ):
        if value is not None:
            body[key] = value
    return Call("POST", "/v1/evaluations", _doc("EvaluationDoc"), json=body)


# ---- sweeps ---------------------------------------------------------------------------------------
def sweep_document(sweep: Any) -> dict[str, Any]:
    """The JSON document of a sweep: a mapping (sent as it is; the server validates it), a
    :class:`~trainyard.spec.sweep.SweepSpec`, or the path of a YAML/JSON sweep file (validated here first,
    so every error is reported before anything is sent)."""
    if isinstance(sweep, Mapping):
        return dict(sweep)
    if hasattr(sweep, "template") and hasattr(sweep, "model_dump"):
        return {
            **sweep.model_dump(mode="json", by_alias=True, exclude={"template"}),
            "template": sweep.template.to_document(),
        }
    if isinstance(sweep, str | PathLike):
        from trainyard.spec.loader import parse_document
        from trainyard.spec.sweep import sweep_from_dict

        path = Path(sweep).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise E.SpecError(
                f"{path}: no such file", hint="Give the path of a sweep YAML or JSON file."
            ) from None
        doc = parse_document(text, str(path))
        sweep_from_dict(doc, str(path))
        return dict(doc)
    raise E.InvalidInputError(
        f"a sweep must be a dict, a SweepSpec or a sweep file path, not {type(sweep).__name__}",
        hint="Pass the path of a kind: Sweep file, or its parsed document.",
    )


def create_sweep(sweep: Any) -> Call[M.SweepDoc]:
    return Call("POST", "/v1/sweeps", _doc("SweepDoc"), json=sweep_document(sweep))


def get_sweep(sweep_id: str) -> Call[M.SweepDoc]:
    return Call("GET", f"/v1/sweeps/{_seg(sweep_id)}", _doc("SweepDoc"))


def list_sweeps(limit: int) -> Call[M.SweepList]:
    return Call("GET", "/v1/sweeps", _doc("SweepList"), params={"limit": limit})


def cancel_sweep(sweep_id: str) -> Call[M.SweepDoc]:
    return Call("POST", f"/v1/sweeps/{_seg(sweep_id)}/cancel", _doc("SweepDoc"))


SWEEP_DONE = ("succeeded", "failed", "cancelled")


def get_evaluation(eval_id: str) -> Call[M.EvaluationDoc]:
    return Call("GET", f"/v1/evaluations/{_seg(eval_id)}", _doc("EvaluationDoc"))


def list_evaluations(model: str | None) -> Call[M.EvaluationList]:
    return Call("GET", "/v1/evaluations", _doc("EvaluationList"), params={"model": model or None})


# ---- deployments (DESIGN §3.9) -------------------------------------------------------------------
def create_deployment(
    name: str, model: str, min_replicas: int, max_replicas: int | None, options: Mapping[str, Any]
) -> Call[M.DeploymentDoc]:
    body: dict[str, Any] = {"name": name, "model": model, "min_replicas": min_replicas, **options}
    if max_replicas is not None:
        body["max_replicas"] = max_replicas
    return Call("POST", "/v1/deployments", _doc("DeploymentDoc"), json=body)


def get_deployment(name: str) -> Call[M.DeploymentDoc]:
    return Call("GET", f"/v1/deployments/{_seg(name)}", _doc("DeploymentDoc"))


def list_deployments() -> Call[M.DeploymentList]:
    return Call("GET", "/v1/deployments", _doc("DeploymentList"))


def set_traffic(
    name: str, routes: Sequence[Mapping[str, Any]], canary: Mapping[str, Any] | None
) -> Call[M.DeploymentDoc]:
    body: dict[str, Any] = {"routes": [dict(r) for r in routes]}
    if canary is not None:
        body["canary"] = dict(canary)
    return Call("PUT", f"/v1/deployments/{_seg(name)}/traffic", _doc("DeploymentDoc"), json=body)


def shadow_report(name: str) -> Call[M.Document]:
    return Call("GET", f"/v1/deployments/{_seg(name)}/shadow-report", _doc("Document"))


def delete_deployment(name: str) -> Call[None]:
    return Call("DELETE", f"/v1/deployments/{_seg(name)}", _none)


# ---- pagination ----------------------------------------------------------------------------------
def next_jobs_page(
    page: M.JobList, states: Iterable[str] | None, name: str | None, limit: int
) -> Call[M.JobList] | None:
    cursor = page.get("next_cursor")
    return list_jobs(states, name, cursor, limit) if cursor else None


def next_events_page(page: M.EventList, job_id: str, limit: int) -> Call[M.EventList] | None:
    """The next page while pages come back full (a shorter page is the end of the log so far)."""
    return job_events(job_id, page["next_after"], limit) if len(page["events"]) >= limit else None


def next_rows_page(page: M.DatasetRows, ref: str, split: str, limit: int) -> Call[M.DatasetRows] | None:
    offset = page.get("next_offset")
    return dataset_rows(ref, split, offset, limit) if offset is not None else None


# ---- webhooks (alert delivery) -------------------------------------------------------------------
def create_webhook(url: str, rules: Sequence[str] | None) -> Call[M.WebhookDoc]:
    body: dict[str, Any] = {"url": url}
    if rules:
        body["rules"] = list(rules)
    return Call("POST", "/v1/webhooks", _doc("WebhookDoc"), json=body)


def list_webhooks() -> Call[M.WebhookList]:
    return Call("GET", "/v1/webhooks", _doc("WebhookList"))


def delete_webhook(webhook_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/webhooks/{_seg(webhook_id)}", _none)


def test_webhook(webhook_id: str) -> Call[M.Document]:
    return Call("POST", f"/v1/webhooks/{_seg(webhook_id)}/test", _doc("Document"))


def list_webhook_deliveries(webhook_id: str | None, limit: int) -> Call[M.WebhookDeliveryList]:
    path = "/v1/webhooks/deliveries" if webhook_id is None else f"/v1/webhooks/{_seg(webhook_id)}/deliveries"
    return Call("GET", path, _doc("WebhookDeliveryList"), params={"limit": limit})
