"""The Python client of the REST API (used by the CLI, the tests and users' scripts).

Every method returns a typed document, the same pydantic model the API declares in its OpenAPI
document (:mod:`trainyard.api_models`); documents also read like the JSON (``job["state"]``).
Connection errors (server not up yet, refused, reset before a response) are retried with exponential
backoff; an HTTP answer is never retried, and error envelopes become the matching TrainyardError.
Submissions always carry an Idempotency-Key, so a retried submission cannot create a second job.
:class:`~trainyard.client.AsyncTrainyardClient` is the same API over ``httpx.AsyncClient``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from trainyard import errors as E
from trainyard.client import _calls as C
from trainyard.client._core import (
    Call,
    default_headers,
    may_retry,
    next_delay,
    read_response,
    resolve_api_key,
    resolve_url,
    transport_errors,
    unreachable,
)
from trainyard.client.progress import JobProgress, Watcher
from trainyard.enums import TERMINAL_JOB_STATES

if TYPE_CHECKING:
    import httpx

    from trainyard import api_models as M
    from trainyard.client._calls import SpecLike

T = TypeVar("T")

#: States a job never leaves (strings compare equal to :class:`~trainyard.enums.JobState` members).
TERMINAL_STATES = frozenset(s.value for s in TERMINAL_JOB_STATES)

__all__ = ["TERMINAL_STATES", "TrainyardClient", "resolve_api_key"]


class TrainyardClient:
    """A client of one trainyard server; use it as a context manager or call :meth:`close`.

    ``url`` defaults to ``TRAINYARD_URL``, else the live ``trainyard up`` of ``$TRAINYARD_HOME``
    (``server.json``), else ``http://127.0.0.1:8080``; ``api_key`` to
    ``TRAINYARD_API_KEY`` (else ``$TRAINYARD_HOME/api_key``, written by ``trainyard up``).
    """

    UPLOAD_CHUNK_BYTES = C.UPLOAD_CHUNK_BYTES

    #: False: every method returns the decoded JSON the server sent (dicts and lists) instead of a
    #: document, and a call whose answer is only passed on never imports the documents (pydantic). The
    #: CLI's client, which prints JSON, is such a subclass; the methods below read answers through
    #: ``doc["field"]``, which documents and dicts both answer.
    _typed: bool = True

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
        self.url = resolve_url(url)
        self.api_key = resolve_api_key(api_key)
        self.retries = retries
        self.backoff_s = backoff_s
        import httpx

        self._http = httpx.Client(
            base_url=self.url, headers=default_headers(self.api_key), timeout=timeout_s, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TrainyardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing ------------------------------------------------------------------------------
    def _do(self, call: Call[T], *, typed: bool | None = None) -> T:
        delay = self.backoff_s
        attempt = 0
        while True:
            kwargs = call.request_kwargs()
            if call.upload is not None:
                kwargs["content"] = _chunks(call.upload.path, call.upload.chunk_bytes, call.upload.progress)
            try:
                resp = self._http.request(call.method, call.path, **kwargs)
            except transport_errors() as exc:
                if not may_retry(exc, call, attempt, self.retries):
                    raise unreachable(self.url, exc) from None
                time.sleep(delay)
                delay = next_delay(delay)
                attempt += 1
                continue
            return read_response(resp, call, self._typed if typed is None else typed)

    def _pages(self, call: Call[T] | None, next_call: Callable[[T], Call[T] | None]) -> Iterator[T]:
        while call is not None:
            page = self._do(call)
            yield page
            call = next_call(page)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Any API call by method and path; returns the decoded JSON (None for an empty answer)."""
        headers = kwargs.pop("headers", None) or {}
        call: Call[Any] = Call(method, path, lambda body: body, headers=headers)
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.request(method, path, headers=headers, **kwargs)
                break
            except transport_errors() as exc:
                if not may_retry(exc, call, attempt, self.retries):
                    raise unreachable(self.url, exc) from None
                time.sleep(delay)
                delay = next_delay(delay)
        return read_response(resp, call)

    # ---- jobs ----------------------------------------------------------------------------------
    def submit(
        self, spec: SpecLike, *, idempotency_key: str | None = None, upload_dataset: bool = True
    ) -> M.JobDocument:
        """Submit a job: a :class:`~trainyard.spec.JobSpec`, its document, or a spec file path.

        For a spec file, a ``workload.dataset`` naming a local file (relative paths are taken from the
        spec file's directory) is uploaded as a dataset version first and the job names that version,
        as ``trainyard jobs submit`` does; a JobSpec or a dict is sent as it is (a path in it must lie
        under one of the tenant's storage roots on the server)."""
        doc, spec_dir = C.spec_document(spec)
        local = C.local_dataset(doc, spec_dir) if upload_dataset and spec_dir is not None else None
        if local is not None:
            uploaded = self.upload_dataset(local, name=C.dataset_name_for(local))
            doc["workload"] = {**doc["workload"], "dataset": uploaded["id"]}
        return self._do(C.submit(doc, idempotency_key))

    def get_job(self, job_id: str) -> M.JobDocument:
        return self._do(C.get_job(job_id))

    def list_jobs(
        self,
        *,
        states: Iterable[str] | None = None,
        name: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> M.JobList:
        """One page of jobs, newest first; ``next_cursor`` names the next page."""
        return self._do(C.list_jobs(states, name, cursor, limit))

    def iter_jobs(
        self, *, states: Iterable[str] | None = None, name: str | None = None, page_size: int = 200
    ) -> Iterator[M.JobDocument]:
        """Every job (newest first), fetching pages as the iteration goes."""
        states = list(states) if states else None
        first = C.list_jobs(states, name, None, page_size)
        for page in self._pages(first, lambda p: C.next_jobs_page(p, states, name, page_size)):
            yield from page["jobs"]

    def cancel_job(self, job_id: str) -> M.JobDocument:
        return self._do(C.cancel_job(job_id))

    def preempt_job(self, job_id: str, *, notice_s: float | None = None) -> M.JobDocument:
        """Inject a preemption: the job checkpoints, goes preempted -> queued and resumes elsewhere."""
        return self._do(C.preempt_job(job_id, notice_s))

    def job_events(self, job_id: str, *, after: int = 0, limit: int = 1000) -> M.EventList:
        return self._do(C.job_events(job_id, after, limit))

    def iter_events(self, job_id: str, *, after: int = 0, page_size: int = 1000) -> Iterator[M.EventDoc]:
        """Every event of the job logged after ``after`` so far, oldest first."""
        first = C.job_events(job_id, after, page_size)
        for page in self._pages(first, lambda p: C.next_events_page(p, job_id, page_size)):
            yield from page["events"]

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
    ) -> M.LogChunk:
        """A chunk of one rank's log (of one ``attempt``, or every attempt's); ``tail``: the last N lines;
        ``wait_s``: wait that long on the server for bytes past ``offset`` (following a running job)."""
        return self._do(C.job_logs(job_id, rank, offset, limit_bytes, attempt, tail, wait_s))

    def job_metrics(
        self,
        job_id: str,
        *,
        since_step: int = 0,
        max_points: int = 2000,
        attempt: int | None = None,
        downsample: bool = True,
    ) -> M.MetricsDocument:
        """Step metrics (loss, eval_loss, step_time_s, tokens_per_s, learning_rate) after ``since_step``."""
        return self._do(C.job_metrics(job_id, since_step, max_points, attempt, downsample))

    def watch(
        self, job_id: str, *, timeout_s: float | None = None, poll_s: float = 0.5, events: bool = True
    ) -> Iterator[JobProgress]:
        """Follow a job: a :class:`JobProgress` each time its state, step, loss, cost or attempt
        changes or new events are logged; the last one is the terminal state."""
        w = Watcher(job_id, timeout_s=timeout_s, events=events)
        while True:
            # always documents here: the progress reports are typed whatever the client returns
            job = self._do(C.get_job(job_id), typed=True)
            page = self._do(C.job_events(job_id, w.after, 1000), typed=True) if events else None
            report = w.report(job, page)
            if report is not None:
                yield report
            if job.done:
                return
            w.check_deadline(job)
            time.sleep(poll_s)

    def wait(
        self,
        job_id: str,
        *,
        timeout_s: float | None = None,
        poll_s: float = 0.5,
        on_progress: Callable[[JobProgress], Any] | None = None,
    ) -> M.JobDocument:
        """Poll until the job reaches a terminal state; returns the final job document.
        ``on_progress`` receives every :class:`JobProgress` on the way (see :meth:`watch`)."""
        last: JobProgress | None = None
        for last in self.watch(job_id, timeout_s=timeout_s, poll_s=poll_s, events=on_progress is not None):
            if on_progress is not None:
                on_progress(last)
        assert last is not None  # watch yields at least the terminal report
        return last.job if self._typed else last.job.to_dict()  # type: ignore[return-value]

    def job_record(self, job_id: str, *, attempt: int | None = None) -> M.Document:
        return self._do(C.job_record(job_id, attempt))

    def reproduce_job(self, job_id: str, *, idempotency_key: str | None = None) -> M.JobDocument:
        return self._do(C.reproduce_job(job_id, idempotency_key))

    # ---- quotes, pools, catalog, code ----------------------------------------------------------
    def quote(
        self,
        spec: SpecLike,
        *,
        pools: Sequence[Mapping[str, Any]] | None = None,
        include_catalog: bool = True,
    ) -> M.QuoteResponse:
        doc, _ = C.spec_document(spec)
        return self._do(C.quote(doc, pools, include_catalog))

    def list_pools(self) -> M.PoolList:
        return self._do(C.list_pools())

    def get_pool(self, name: str) -> M.PoolDoc:
        return self._do(C.get_pool(name))

    def put_pool(self, pool: Mapping[str, Any]) -> M.PoolDoc:
        return self._do(C.put_pool(pool))

    def patch_pool(self, name: str, changes: Mapping[str, Any]) -> M.PoolDoc:
        return self._do(C.patch_pool(name, changes))

    def delete_pool(self, name: str) -> None:
        self._do(C.delete_pool(name))

    def catalog(self) -> M.AcceleratorList:
        return self._do(C.catalog())

    def upload_code(self, archive: bytes) -> M.CodeUploaded:
        """Upload a code archive (tar.gz); ``{url, sha256, bytes}`` of its content-addressed copy."""
        return self._do(C.upload_code(archive))

    def whoami(self) -> M.WhoAmI:
        return self._do(C.whoami())

    def healthz(self) -> M.Document:
        return self._do(C.healthz())

    def readyz(self) -> M.Document:
        return self._do(C.readyz())

    # ---- tenants and keys ----------------------------------------------------------------------
    def create_tenant(
        self,
        name: str,
        *,
        admin: bool = False,
        max_queued_jobs: int | None = None,
        max_active_devices: int | None = None,
    ) -> M.TenantCreated:
        return self._do(C.create_tenant(name, admin, max_queued_jobs, max_active_devices))

    def list_tenants(self) -> M.TenantList:
        return self._do(C.list_tenants())

    def get_tenant(self, name: str) -> M.TenantDoc:
        return self._do(C.get_tenant(name))

    def update_tenant(self, name: str, changes: Mapping[str, Any]) -> M.TenantDoc:
        """Change quotas/limits (admin); a key with value None removes that limit."""
        return self._do(C.update_tenant(name, changes))

    def list_api_keys(self, tenant: str) -> M.ApiKeyList:
        """The tenant's keys ``{id, prefix, admin, created_at, revoked}`` (admin, or its own key)."""
        return self._do(C.list_api_keys(tenant))

    def create_api_key(self, tenant: str, *, role: str = "member") -> M.ApiKeyCreated:
        """A new key of the tenant with a role; ``api_key`` is shown once."""
        return self._do(C.create_api_key(tenant, role))

    def revoke_api_key(self, tenant: str, key_id: str) -> M.ApiKeyDoc:
        """Revoke one of the tenant's keys; returns its document with ``revoked: true``."""
        return self._do(C.revoke_api_key(tenant, key_id))

    def rotate_api_key(self, tenant: str, key_id: str, *, overlap_s: float = 3600.0) -> M.ApiKeyRotated:
        """``{new: {…, api_key}, old: {…}}``: the old key works ``overlap_s`` more seconds."""
        return self._do(C.rotate_api_key(tenant, key_id, overlap_s))

    # ---- usage and budgets ---------------------------------------------------------------------
    def usage(
        self,
        *,
        by: str = "tenant",
        from_: str | None = None,
        to: str | None = None,
        tenant: str | None = None,
    ) -> M.Document:
        return self._do(C.usage(by, from_, to, tenant))

    def invoice(self, *, tenant: str | None = None, month: str | None = None) -> M.Document:
        return self._do(C.invoice(tenant, month))

    def reconcile_usage(self) -> M.Document:
        return self._do(C.reconcile_usage())

    def set_budget(
        self, tenant: str, *, usd: float, period: str = "month", hard: bool = False, tag: str | None = None
    ) -> M.Document:
        return self._do(C.set_budget(tenant, usd, period, hard, tag))

    def list_budgets(self, *, tenant: str | None = None) -> M.Document:
        return self._do(C.list_budgets(tenant))

    def get_budget(self, tenant: str, *, tag: str | None = None, period: str = "month") -> M.Document:
        return self._do(C.get_budget(tenant, tag, period))

    def budget_events(self, tenant: str) -> M.Document:
        return self._do(C.budget_events(tenant))

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
        progress: Callable[[int], Any] | None = None,
        chunk_bytes: int = 1 << 20,
    ) -> M.DatasetDoc:
        """Stream a local JSONL file to the server; ``progress(n_bytes)`` is called per chunk sent."""
        return self._do(
            C.upload_dataset(
                Path(path),
                name=name,
                format=format,
                eval_fraction=eval_fraction,
                seed=seed,
                base=base,
                max_tokens=max_tokens,
                derived_from=derived_from,
                progress=progress,
                chunk_bytes=chunk_bytes,
            )
        )

    def get_dataset(self, ref: str) -> M.DatasetDoc:
        return self._do(C.get_dataset(ref))

    def dataset_epoch_cost(
        self, ref: str, *, model: str | None = None, seq_len: int = 2048, global_batch: int = 16
    ) -> M.DatasetEpochCost:
        """What one epoch over the version's train split costs on the cheapest feasible placement."""
        return self._do(C.dataset_epoch_cost(ref, model, seq_len, global_batch))

    def list_datasets(self, *, name: str | None = None) -> M.DatasetList:
        return self._do(C.list_datasets(name))

    def dataset_rows(
        self, ref: str, *, split: str = "train", offset: int = 0, limit: int = 100
    ) -> M.DatasetRows:
        return self._do(C.dataset_rows(ref, split, offset, limit))

    def iter_dataset_rows(
        self, ref: str, *, split: str = "train", page_size: int = 1000
    ) -> Iterator[dict[str, Any]]:
        """Every row of one split, in order, fetching pages as the iteration goes."""
        first = C.dataset_rows(ref, split, 0, page_size)
        for page in self._pages(first, lambda p: C.next_rows_page(p, ref, split, page_size)):
            yield from page["rows"]

    # ---- models and evaluations (DESIGN §3.8) --------------------------------------------------
    def import_model(self, directory: str | Path, name: str, *, public: bool = False) -> M.ModelVersionDoc:
        """Upload a local Hugging Face directory (its plain files) and import it as a base model."""
        files = C.model_files(Path(directory))
        upload = str(self._do(C.start_model_upload())["upload_id"])
        for path in files:
            offset = 0
            with path.open("rb") as f:
                while True:
                    chunk = f.read(self.UPLOAD_CHUNK_BYTES)
                    if not chunk and offset > 0:
                        break
                    self._do(C.model_upload_chunk(upload, path.name, offset, chunk))
                    offset += len(chunk)
                    if not chunk:
                        break
        return self._do(C.import_model(upload, name, public))

    def list_models(self, *, name: str | None = None, dataset: str | None = None) -> M.ModelList:
        return self._do(C.list_models(name, dataset))

    def get_model(self, ref: str) -> M.ModelVersionDoc:
        return self._do(C.get_model(ref))

    def model_lineage(self, ref: str) -> M.Document:
        return self._do(C.model_lineage(ref))

    def promote_model(
        self,
        ref: str,
        alias: str,
        *,
        force: bool = False,
        reason: str = "",
        evaluation: str | None = None,
    ) -> M.Document:
        return self._do(C.promote_model(ref, alias, force, reason, evaluation))

    def model_aliases(self, name: str) -> M.Document:
        return self._do(C.model_aliases(name))

    def run_evaluation(
        self,
        *,
        model: str,
        dataset: str,
        baseline: str | None = None,
        split: str = "eval",
        max_examples: int | None = None,
        guardrails: Mapping[str, float] | None = None,
        primary_metric: str | None = None,
        non_inferiority: Mapping[str, float] | None = None,
        alpha: float | None = None,
        correction: str | None = None,
        guardrail_datasets: Sequence[Mapping[str, Any]] | None = None,
    ) -> M.EvaluationDoc:
        return self._do(
            C.run_evaluation(
                model,
                dataset,
                baseline,
                split,
                max_examples,
                guardrails,
                primary_metric=primary_metric,
                non_inferiority=non_inferiority,
                alpha=alpha,
                correction=correction,
                guardrail_datasets=guardrail_datasets,
            )
        )

    def get_evaluation(self, eval_id: str) -> M.EvaluationDoc:
        return self._do(C.get_evaluation(eval_id))

    def list_evaluations(self, *, model: str | None = None) -> M.EvaluationList:
        return self._do(C.list_evaluations(model))

    def wait_evaluation(
        self, eval_id: str, *, timeout_s: float | None = None, poll_s: float = 0.5
    ) -> M.EvaluationDoc:
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

    # ---- sweeps ------------------------------------------------------------------------------------
    def create_sweep(self, sweep: Any) -> M.SweepDoc:
        """Create a sweep from a ``kind: Sweep`` document, a SweepSpec or a sweep file path: the answer
        carries its group quote; its trials start as jobs on the server's next ticks."""
        return self._do(C.create_sweep(sweep))

    def get_sweep(self, sweep_id: str) -> M.SweepDoc:
        return self._do(C.get_sweep(sweep_id))

    def list_sweeps(self, *, limit: int = 100) -> M.SweepList:
        return self._do(C.list_sweeps(limit))

    def cancel_sweep(self, sweep_id: str) -> M.SweepDoc:
        return self._do(C.cancel_sweep(sweep_id))

    def wait_sweep(self, sweep_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0) -> M.SweepDoc:
        """Poll a sweep until it ends (succeeded, failed or cancelled)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            doc = self.get_sweep(sweep_id)
            if doc["state"] in C.SWEEP_DONE:
                return doc
            if deadline is not None and time.monotonic() > deadline:
                raise E.ServiceUnavailableError(f"sweep {sweep_id} still {doc['state']} after {timeout_s} s")
            time.sleep(poll_s)

    # ---- webhooks (alert delivery) --------------------------------------------------------------
    def create_webhook(self, url: str, *, rules: Sequence[str] | None = None) -> M.WebhookDoc:
        """Register ``url`` for the tenant's alerts (only ``rules``, when given); the answer carries the
        tenant's signing secret."""
        return self._do(C.create_webhook(url, rules))

    def list_webhooks(self) -> M.WebhookList:
        return self._do(C.list_webhooks())

    def delete_webhook(self, webhook_id: str) -> None:
        self._do(C.delete_webhook(webhook_id))

    def test_webhook(self, webhook_id: str) -> M.Document:
        """Send a ``webhook_test`` alert to one webhook now; the answer is the alert."""
        return self._do(C.test_webhook(webhook_id))

    def list_webhook_deliveries(
        self, webhook_id: str | None = None, *, limit: int = 50
    ) -> M.WebhookDeliveryList:
        """The latest deliveries, newest first: the tenant's, or one webhook's."""
        return self._do(C.list_webhook_deliveries(webhook_id, limit))

    # ---- deployments (DESIGN §3.9) -------------------------------------------------------------
    def create_deployment(
        self,
        name: str,
        model: str,
        *,
        min_replicas: int = 1,
        max_replicas: int | None = None,
        **options: Any,
    ) -> M.DeploymentDoc:
        """Deploy a model version or alias; options: target_in_flight, scale_up_delay_s,
        scale_down_delay_s, cold_start_timeout_s, tags."""
        return self._do(C.create_deployment(name, model, min_replicas, max_replicas, options))

    def get_deployment(self, name: str) -> M.DeploymentDoc:
        return self._do(C.get_deployment(name))

    def list_deployments(self) -> M.DeploymentList:
        return self._do(C.list_deployments())

    def set_traffic(
        self, name: str, routes: Sequence[Mapping[str, Any]], *, canary: Mapping[str, Any] | None = None
    ) -> M.DeploymentDoc:
        """Routes ``[{model, weight, shadow?, canary?}]``; ``canary`` holds the rollback thresholds."""
        return self._do(C.set_traffic(name, routes, canary))

    def shadow_report(self, name: str) -> M.Document:
        return self._do(C.shadow_report(name))

    def delete_deployment(self, name: str) -> None:
        self._do(C.delete_deployment(name))

    def wait_deployment(self, name: str, *, timeout_s: float = 120.0, poll_s: float = 0.2) -> M.DeploymentDoc:
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


def _chunks(path: Path, chunk_bytes: int, progress: Callable[[int], Any] | None) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while True:
            data = fh.read(chunk_bytes)
            if not data:
                return
            if progress is not None:
                progress(len(data))
            yield data
