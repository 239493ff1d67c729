"""A typed httpx client for the REST API (used by the CLI, the tests and users' scripts).

Connection errors (server not up yet, refused, reset before a response) are retried with exponential
backoff; an HTTP answer is never retried, and error envelopes become the matching TrainyardError.
Submissions always carry an Idempotency-Key, so a retried submission cannot create a second job.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from trainyard import errors as E

_BY_CODE: dict[str, type[E.TrainyardError]] = {}
for _cls in (
    E.InvalidInputError,
    E.SpecError,
    E.UnknownAcceleratorError,
    E.PoolsFileError,
    E.NotFoundError,
    E.ConflictError,
    E.IllegalTransitionError,
    E.PromotionBlockedError,
    E.AuthenticationError,
    E.PermissionDeniedError,
    E.PayloadTooLargeError,
    E.QuotaExceededError,
    E.InfeasibleError,
    E.ServiceUnavailableError,
    E.StorageError,
    E.CheckpointError,
    E.BudgetExceededError,
    E.RateLimitedError,
    E.LedgerMismatchError,
    E.InvalidDatasetError,
    E.UnknownDatasetError,
):
    _BY_CODE[_cls.code] = _cls

_BY_STATUS: dict[int, type[E.TrainyardError]] = {
    400: E.InvalidInputError,
    401: E.AuthenticationError,
    403: E.PermissionDeniedError,
    404: E.NotFoundError,
    409: E.ConflictError,
    413: E.PayloadTooLargeError,
    422: E.InvalidInputError,
    429: E.QuotaExceededError,
    503: E.ServiceUnavailableError,
}

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


def resolve_api_key(explicit: str | None = None, home: str | Path | None = None) -> str | None:
    """TRAINYARD_API_KEY, else $TRAINYARD_HOME/api_key (written by `trainyard up`)."""
    if explicit:
        return explicit
    env = os.environ.get("TRAINYARD_API_KEY")
    if env:
        return env.strip()
    base = (
        Path(home)
        if home is not None
        else Path(os.environ.get("TRAINYARD_HOME") or Path.home() / ".trainyard")
    )
    try:
        text = (base / "api_key").read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def _dataset_path(ref: str) -> str:
    """``ds://name@3`` → ``name@3`` (the path segment of /v1/datasets/{ref})."""
    return ref[len("ds://") :] if ref.startswith("ds://") else ref


def _error_from(resp: httpx.Response) -> E.TrainyardError:
    try:
        body = resp.json()
        err = body["error"]
        code, message = str(err.get("code", "")), str(err.get("message", resp.reason_phrase))
        hint, details = err.get("hint"), err.get("details") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        code, message, hint, details = "", f"HTTP {resp.status_code} from the server", None, {}
    cls = _BY_CODE.get(code) or _BY_STATUS.get(resp.status_code) or E.TrainyardError
    exc = cls(message, hint=hint, details=details)
    return exc


class TrainyardClient:
    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = (url or os.environ.get("TRAINYARD_URL") or "http://127.0.0.1:8080").rstrip("/")
        self.api_key = resolve_api_key(api_key)
        self.retries = retries
        self.backoff_s = backoff_s
        headers = {"User-Agent": "trainyard-client"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TrainyardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing ------------------------------------------------------------------------------
    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.request(method, path, **kwargs)
                break
            except (
                httpx.ConnectError,
                httpx.ConnectTimeout,
                httpx.RemoteProtocolError,
                httpx.ReadError,
                httpx.WriteError,
            ) as exc:
                # Refused/unreachable: nothing was sent, always safe to retry. A connection dropped after
                # sending is retried only when resending cannot act twice (reads, Idempotency-Key).
                sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                resendable = method in ("GET", "HEAD", "PUT", "DELETE") or "Idempotency-Key" in (
                    kwargs.get("headers") or {}
                )
                if attempt >= self.retries or (sent and not resendable):
                    raise E.ServiceUnavailableError(
                        f"cannot reach the trainyard server at {self.url} ({type(exc).__name__})"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        if resp.status_code >= 400:
            raise _error_from(resp)
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    # ---- jobs ----------------------------------------------------------------------------------
    def submit(self, spec: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        key = idempotency_key or str(uuid.uuid4())
        return self.request("POST", "/v1/jobs", json={"spec": spec}, headers={"Idempotency-Key": key})

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{job_id}")

    def list_jobs(
        self,
        *,
        states: list[str] | None = None,
        name: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if states:
            params["state"] = states
        if name:
            params["name"] = name
        if cursor:
            params["cursor"] = cursor
        return self.request("GET", "/v1/jobs", params=params)

    def iter_jobs(self, *, states: list[str] | None = None, page_size: int = 200) -> Iterator[dict[str, Any]]:
        cursor = None
        while True:
            page = self.list_jobs(states=states, cursor=cursor, limit=page_size)
            yield from page["jobs"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/jobs/{job_id}/cancel")

    def preempt_job(self, job_id: str, *, notice_s: float | None = None) -> dict[str, Any]:
        """Inject a preemption: the job checkpoints, goes preempted -> queued and resumes elsewhere."""
        body = {} if notice_s is None else {"notice_s": notice_s}
        return self.request("POST", f"/v1/jobs/{job_id}/preempt", json=body)

    def job_events(self, job_id: str, *, after: int = 0, limit: int = 1000) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{job_id}/events", params={"after": after, "limit": limit})

    def job_logs(
        self,
        job_id: str,
        *,
        rank: int = 0,
        offset: int = 0,
        limit_bytes: int = 65536,
        attempt: int | None = None,
        tail: int | None = None,
        wait_s: float = 0.0,
    ) -> dict[str, Any]:
        """A chunk of one rank's log (of one ``attempt``, or every attempt's); ``tail``: the last N lines;
        ``wait_s``: wait that long on the server for bytes past ``offset`` (following a running job)."""
        params: dict[str, Any] = {"rank": rank, "offset": offset, "limit_bytes": limit_bytes}
        if attempt is not None:
            params["attempt"] = attempt
        if tail is not None:
            params["tail"] = tail
        if wait_s:
            params["wait_s"] = wait_s
        return self.request(
            "GET",
            f"/v1/jobs/{job_id}/logs",
            params=params,
            timeout=httpx.Timeout(30.0 + wait_s),
        )

    def job_metrics(
        self,
        job_id: str,
        *,
        since_step: int = 0,
        max_points: int = 2000,
        attempt: int | None = None,
        downsample: bool = True,
    ) -> dict[str, Any]:
        """Step metrics (loss, eval_loss, step_time_s, tokens_per_s, learning_rate) after ``since_step``."""
        params: dict[str, Any] = {
            "since_step": since_step,
            "max_points": max_points,
            "downsample": "true" if downsample else "false",
        }
        if attempt is not None:
            params["attempt"] = attempt
        return self.request("GET", f"/v1/jobs/{job_id}/metrics", params=params)

    def wait(self, job_id: str, *, timeout_s: float | None = None, poll_s: float = 0.5) -> dict[str, Any]:
        """Poll until the job reaches a terminal state; returns the final job document."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            doc = self.get_job(job_id)
            if doc["state"] in TERMINAL_STATES:
                return doc
            if deadline is not None and time.monotonic() > deadline:
                raise E.ServiceUnavailableError(
                    f"job {job_id} still {doc['state']} after {timeout_s:.0f} s",
                    hint="Keep following it with `trainyard jobs events --follow`.",
                )
            time.sleep(poll_s)

    # ---- quotes, pools, tenants, catalog -------------------------------------------------------
    def quote(
        self, spec: dict[str, Any], *, pools: list[dict[str, Any]] | None = None, include_catalog: bool = True
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"spec": spec, "include_catalog": include_catalog}
        if pools is not None:
            body["pools"] = pools
        return self.request("POST", "/v1/quotes", json=body)

    def list_pools(self) -> dict[str, Any]:
        return self.request("GET", "/v1/pools")

    def get_pool(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/pools/{name}")

    def put_pool(self, pool: dict[str, Any]) -> dict[str, Any]:
        return self.request("PUT", f"/v1/pools/{pool['name']}", json=pool)

    def patch_pool(self, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", f"/v1/pools/{name}", json=changes)

    def delete_pool(self, name: str) -> None:
        self.request("DELETE", f"/v1/pools/{name}")

    def create_tenant(
        self,
        name: str,
        *,
        admin: bool = False,
        max_queued_jobs: int | None = None,
        max_active_devices: int | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "admin": admin}
        if max_queued_jobs is not None:
            body["max_queued_jobs"] = max_queued_jobs
        if max_active_devices is not None:
            body["max_active_devices"] = max_active_devices
        return self.request("POST", "/v1/tenants", json=body)

    def list_tenants(self) -> dict[str, Any]:
        return self.request("GET", "/v1/tenants")

    def list_api_keys(self, tenant: str) -> dict[str, Any]:
        """``{keys: [{id, prefix, admin, created_at, revoked}]}`` of a tenant (admin, or its own key)."""
        return self.request("GET", f"/v1/tenants/{quote(tenant, safe='')}/keys")

    def revoke_api_key(self, tenant: str, key_id: str) -> dict[str, Any]:
        """Revoke one of the tenant's keys; returns its document with ``revoked: true``."""
        return self.request(
            "POST", f"/v1/tenants/{quote(tenant, safe='')}/keys/{quote(key_id, safe='')}/revoke"
        )

    # ---- tenant administration, usage and budgets -----------------------------------------------
    def update_tenant(self, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Change quotas/limits (admin); a key with value None removes that limit."""
        return self.request("PATCH", f"/v1/tenants/{quote(name, safe='')}", json=changes)

    def get_tenant(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/tenants/{quote(name, safe='')}")

    def create_api_key(self, tenant: str, *, role: str = "member") -> dict[str, Any]:
        """A new key of the tenant with a role; ``api_key`` is shown once."""
        return self.request("POST", f"/v1/tenants/{quote(tenant, safe='')}/keys", json={"role": role})

    def rotate_api_key(self, tenant: str, key_id: str, *, overlap_s: float = 3600.0) -> dict[str, Any]:
        """``{new: {…, api_key}, old: {…, expires_at}}``: the old key works ``overlap_s`` more seconds."""
        return self.request(
            "POST",
            f"/v1/tenants/{quote(tenant, safe='')}/keys/{quote(key_id, safe='')}/rotate",
            json={"overlap_s": overlap_s},
        )

    def usage(
        self,
        *,
        by: str = "tenant",
        from_: str | None = None,
        to: str | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        params = {"by": by, "from": from_, "to": to, "tenant": tenant}
        return self.request("GET", "/v1/usage", params={k: v for k, v in params.items() if v is not None})

    def invoice(self, *, tenant: str | None = None, month: str | None = None) -> dict[str, Any]:
        params = {"tenant": tenant, "month": month}
        return self.request(
            "GET", "/v1/usage/invoice", params={k: v for k, v in params.items() if v is not None}
        )

    def reconcile_usage(self) -> dict[str, Any]:
        return self.request("GET", "/v1/usage/reconcile")

    def set_budget(
        self, tenant: str, *, usd: float, period: str = "month", hard: bool = False, tag: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"usd": usd, "period": period, "hard": hard}
        if tag is not None:
            body["tag"] = tag
        return self.request("PUT", f"/v1/budgets/{quote(tenant, safe='')}", json=body)

    def list_budgets(self, *, tenant: str | None = None) -> dict[str, Any]:
        return self.request("GET", "/v1/budgets", params={"tenant": tenant} if tenant else None)

    def get_budget(self, tenant: str, *, tag: str | None = None, period: str = "month") -> dict[str, Any]:
        params: dict[str, Any] = {"period": period}
        if tag is not None:
            params["tag"] = tag
        return self.request("GET", f"/v1/budgets/{quote(tenant, safe='')}", params=params)

    def budget_events(self, tenant: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/budgets/{quote(tenant, safe='')}/events")

    # ---- code archives for entrypoint jobs ---------------------------------------------------------
    def upload_code(self, archive: bytes) -> dict[str, Any]:
        """Upload a code archive (tar.gz); ``{url, sha256, bytes}`` of its content-addressed copy."""
        return self.request("POST", "/v1/code", content=archive, headers={"Content-Type": "application/gzip"})

    def whoami(self) -> dict[str, Any]:
        return self.request("GET", "/v1/whoami")

    def catalog(self) -> dict[str, Any]:
        return self.request("GET", "/v1/catalog")

    # ---- datasets (DESIGN §3.7) ----------------------------------------------------------------
    def upload_dataset(
        self,
        path: str | Path,
        *,
        name: str,
        format: str = "auto",
        eval_fraction: float = 0.1,
        seed: int = 0,
        base: str | None = None,
        max_tokens: int | None = None,
        derived_from: str | None = None,
        progress: Any = None,
        chunk_bytes: int = 1 << 20,
    ) -> dict[str, Any]:
        """Stream a local JSONL file to the server; ``progress(n_bytes)`` is called per chunk sent."""
        params: dict[str, Any] = {
            "name": name,
            "format": format,
            "eval_fraction": eval_fraction,
            "seed": seed,
        }
        for k, v in (("base", base), ("max_tokens", max_tokens), ("derived_from", derived_from)):
            if v is not None:
                params[k] = v
        file = Path(path)

        def chunks() -> Iterator[bytes]:
            with file.open("rb") as fh:
                while True:
                    data = fh.read(chunk_bytes)
                    if not data:
                        return
                    if progress is not None:
                        progress(len(data))
                    yield data

        return self.request(
            "POST",
            "/v1/datasets",
            params=params,
            content=chunks(),
            headers={"Content-Type": "application/x-ndjson"},
            timeout=httpx.Timeout(30.0, read=None, write=None),
        )

    def get_dataset(self, ref: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/datasets/{quote(_dataset_path(ref), safe='@')}")

    def list_datasets(self, *, name: str | None = None) -> dict[str, Any]:
        return self.request("GET", "/v1/datasets", params={"name": name} if name else None)

    def dataset_rows(
        self, ref: str, *, split: str = "train", offset: int = 0, limit: int = 100
    ) -> dict[str, Any]:
        return self.request(
            "GET",
            f"/v1/datasets/{quote(_dataset_path(ref), safe='@')}/rows",
            params={"split": split, "offset": offset, "limit": limit},
        )

    # ---- run records ---------------------------------------------------------------------------
    def job_record(self, job_id: str, *, attempt: int | None = None) -> dict[str, Any]:
        params = {"attempt": attempt} if attempt is not None else None
        return self.request("GET", f"/v1/jobs/{job_id}/record", params=params)

    def reproduce_job(self, job_id: str, *, idempotency_key: str | None = None) -> dict[str, Any]:
        key = idempotency_key or str(uuid.uuid4())
        return self.request("POST", f"/v1/jobs/{job_id}/reproduce", headers={"Idempotency-Key": key})

    def healthz(self) -> dict[str, Any]:
        return self.request("GET", "/healthz")

    def readyz(self) -> dict[str, Any]:
        return self.request("GET", "/readyz")

    # ---- models and evaluations ------------------------------------------------------------------
    UPLOAD_CHUNK_BYTES = 768 * 1024  # below the API's body limit

    def import_model(self, directory: str | Path, name: str, *, public: bool = False) -> dict[str, Any]:
        """Upload a local Hugging Face directory (its plain files) and import it as a base model."""
        d = Path(directory)
        if not d.is_dir():
            raise E.InvalidInputError(f"{d} is not a directory", hint="Pass a Hugging Face model directory.")
        upload = self.request("POST", "/v1/models/uploads")["upload_id"]
        for path in sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")):
            offset = 0
            with path.open("rb") as f:
                while True:
                    chunk = f.read(self.UPLOAD_CHUNK_BYTES)
                    if not chunk and offset > 0:
                        break
                    self.request(
                        "PUT",
                        f"/v1/models/uploads/{upload}/files/{quote(path.name, safe='')}",
                        params={"offset": offset},
                        content=chunk,
                        headers={"Content-Type": "application/octet-stream"},
                    )
                    offset += len(chunk)
                    if not chunk:
                        break
        return self.request(
            "POST", "/v1/models/import", json={"upload_id": upload, "name": name, "public": public}
        )

    def list_models(self, *, name: str | None = None, dataset: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in (("name", name), ("dataset", dataset)) if v}
        return self.request("GET", "/v1/models", params=params)

    def get_model(self, ref: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/models/{quote(ref, safe='@')}")

    def model_lineage(self, ref: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/models/{quote(ref, safe='@')}/lineage")

    def promote_model(
        self,
        ref: str,
        alias: str,
        *,
        force: bool = False,
        reason: str = "",
        evaluation: str | None = None,
    ) -> dict[str, Any]:
        body = {"alias": alias, "force": force, "reason": reason, "evaluation": evaluation}
        return self.request("POST", f"/v1/models/{quote(ref, safe='@')}/promote", json=body)

    def model_aliases(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/models/{quote(name, safe='')}/aliases")

    def run_evaluation(
        self,
        *,
        model: str,
        dataset: str,
        baseline: str | None = None,
        split: str = "eval",
        max_examples: int | None = None,
        guardrails: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        body = {
            "model": model,
            "baseline": baseline,
            "dataset": dataset,
            "split": split,
            "max_examples": max_examples,
            "guardrails": guardrails,
        }
        return self.request("POST", "/v1/evaluations", json=body)

    def get_evaluation(self, eval_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/evaluations/{quote(eval_id, safe='')}")

    def list_evaluations(self, *, model: str | None = None) -> dict[str, Any]:
        return self.request("GET", "/v1/evaluations", params={"model": model} if model else {})

    def wait_evaluation(
        self, eval_id: str, *, timeout_s: float | None = None, poll_s: float = 0.5
    ) -> dict[str, Any]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            doc = self.get_evaluation(eval_id)
            if doc["state"] in ("succeeded", "failed"):
                return doc
            if deadline is not None and time.monotonic() > deadline:
                raise E.ServiceUnavailableError(
                    f"evaluation {eval_id} still {doc['state']} after {timeout_s} s"
                )
            time.sleep(poll_s)

    # ---- deployments (DESIGN §3.9) ---------------------------------------------------------------
    def create_deployment(
        self,
        name: str,
        model: str,
        *,
        min_replicas: int = 1,
        max_replicas: int | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """Deploy a model version or alias; options: target_in_flight, scale_up_delay_s,
        scale_down_delay_s, cold_start_timeout_s, tags."""
        body: dict[str, Any] = {"name": name, "model": model, "min_replicas": min_replicas, **options}
        if max_replicas is not None:
            body["max_replicas"] = max_replicas
        return self.request("POST", "/v1/deployments", json=body)

    def get_deployment(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/deployments/{quote(name, safe='')}")

    def list_deployments(self) -> dict[str, Any]:
        return self.request("GET", "/v1/deployments")

    def set_traffic(
        self, name: str, routes: list[dict[str, Any]], *, canary: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Routes ``[{model, weight, shadow?, canary?}]``; ``canary`` holds the rollback thresholds."""
        body: dict[str, Any] = {"routes": routes}
        if canary is not None:
            body["canary"] = canary
        return self.request("PUT", f"/v1/deployments/{quote(name, safe='')}/traffic", json=body)

    def shadow_report(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/deployments/{quote(name, safe='')}/shadow-report")

    def delete_deployment(self, name: str) -> None:
        self.request("DELETE", f"/v1/deployments/{quote(name, safe='')}")

    def wait_deployment(self, name: str, *, timeout_s: float = 120.0, poll_s: float = 0.2) -> dict[str, Any]:
        """Poll until the deployment is ``ready``; returns its document."""
        deadline = time.monotonic() + timeout_s
        while True:
            doc = self.get_deployment(name)
            if doc["state"] == "ready":
                return doc
            if doc["state"] == "failed" or time.monotonic() > deadline:
                raise E.ServiceUnavailableError(
                    f"deployment {name} is {doc['state']} after {timeout_s:.0f} s",
                    hint="See its events with `trainyard deployments get NAME --json`.",
                )
            time.sleep(poll_s)
