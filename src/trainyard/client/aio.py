"""The asyncio twin of :class:`~trainyard.client.TrainyardClient`: the same methods, arguments and
documents over ``httpx.AsyncClient``; requests, retries and errors come from the same code.

"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
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

if TYPE_CHECKING:
    import httpx

    from trainyard import api_models as M
    from trainyard.client._calls import SpecLike

T = TypeVar("T")

__all__ = ["AsyncTrainyardClient"]


class AsyncTrainyardClient:
    """An asyncio client of one trainyard server; ``async with`` it or ``await close()``.

    ``url`` defaults to ``TRAINYARD_URL``, else the live ``trainyard up`` of ``$TRAINYARD_HOME``
    (``server.json``), else ``http://127.0.0.1:8080``; ``api_key`` to
    ``TRAINYARD_API_KEY`` (else ``$TRAINYARD_HOME/api_key``, written by ``trainyard up``).
    """

    UPLOAD_CHUNK_BYTES = C.UPLOAD_CHUNK_BYTES

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.2,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = resolve_url(url)
        self.api_key = resolve_api_key(api_key)
        self.retries = retries
        self.backoff_s = backoff_s
        import httpx

        self._http = httpx.AsyncClient(
            base_url=self.url, headers=default_headers(self.api_key), timeout=timeout_s, transport=transport
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncTrainyardClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- plumbing ------------------------------------------------------------------------------
    async def _do(self, call: Call[T]) -> T:
        delay = self.backoff_s
        attempt = 0
        while True:
            kwargs = call.request_kwargs()
            if call.upload is not None:
                kwargs["content"] = _achunks(call.upload.path, call.upload.chunk_bytes, call.upload.progress)
            try:
                resp = await self._http.request(call.method, call.path, **kwargs)
            except transport_errors() as exc:
                if not may_retry(exc, call, attempt, self.retries):
                    raise unreachable(self.url, exc) from None
                await asyncio.sleep(delay)
                delay = next_delay(delay)
                attempt += 1
                continue
            return read_response(resp, call)

    async def _pages(
        self, call: Call[T] | None, next_call: Callable[[T], Call[T] | None]
    ) -> AsyncIterator[T]:
        while call is not None:
            page = await self._do(call)
            yield page
            call = next_call(page)

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Any API call by method and path; returns the decoded JSON (None for an empty answer)."""
        headers = kwargs.pop("headers", None) or {}
        call: Call[Any] = Call(method, path, lambda body: body, headers=headers)
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                resp = await self._http.request(method, path, headers=headers, **kwargs)
                break
            except transport_errors() as exc:
                if not may_retry(exc, call, attempt, self.retries):
                    raise unreachable(self.url, exc) from None
                await asyncio.sleep(delay)
                delay = next_delay(delay)
        return read_response(resp, call)

    # ---- jobs ----------------------------------------------------------------------------------
    async def submit(
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
            uploaded = await self.upload_dataset(local, name=C.dataset_name_for(local))
            doc["workload"] = {**doc["workload"], "dataset": uploaded.id}
        return await self._do(C.submit(doc, idempotency_key))

    async def get_job(self, job_id: str) -> M.JobDocument:
        return await self._do(C.get_job(job_id))

    async def list_jobs(
        self,
        *,
        states: Iterable[str] | None = None,
        name: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> M.JobList:
        """One page of jobs, newest first; ``next_cursor`` names the next page."""
        return await self._do(C.list_jobs(states, name, cursor, limit))

    async def iter_jobs(
        self, *, states: Iterable[str] | None = None, name: str | None = None, page_size: int = 200
    ) -> AsyncIterator[M.JobDocument]:
        """Every job (newest first), fetching pages as the iteration goes."""
        states = list(states) if states else None
        first = C.list_jobs(states, name, None, page_size)
        async for page in self._pages(first, lambda p: C.next_jobs_page(p, states, name, page_size)):
            for job in page.jobs:
                yield job

    async def cancel_job(self, job_id: str) -> M.JobDocument:
        return await self._do(C.cancel_job(job_id))

    async def preempt_job(self, job_id: str, *, notice_s: float | None = None) -> M.JobDocument:
        """Inject a preemption: the job checkpoints, goes preempted -> queued and resumes elsewhere."""
        return await self._do(C.preempt_job(job_id, notice_s))

    async def job_events(self, job_id: str, *, after: int = 0, limit: int = 1000) -> M.EventList:
        return await self._do(C.job_events(job_id, after, limit))

    async def iter_events(
        self, job_id: str, *, after: int = 0, page_size: int = 1000
    ) -> AsyncIterator[M.EventDoc]:
        """Every event of the job logged after ``after`` so far, oldest first."""
        first = C.job_events(job_id, after, page_size)
        async for page in self._pages(first, lambda p: C.next_events_page(p, job_id, page_size)):
            for event in page.events:
                yield event

    async def job_logs(
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
        return await self._do(C.job_logs(job_id, rank, offset, limit_bytes, attempt, tail, wait_s))

    async def job_metrics(
        self,
        job_id: str,
        *,
        since_step: int = 0,
        max_points: int = 2000,
        attempt: int | None = None,
        downsample: bool = True,
    ) -> M.MetricsDocument:
        """Step metrics (loss, eval_loss, step_time_s, tokens_per_s, learning_rate) after ``since_step``."""
        return await self._do(C.job_metrics(job_id, since_step, max_points, attempt, downsample))

    async def watch(
        self, job_id: str, *, timeout_s: float | None = None, poll_s: float = 0.5, events: bool = True
    ) -> AsyncIterator[JobProgress]:
        """Follow a job: a :class:`JobProgress` each time its state, step, loss, cost or attempt
        changes or new events are logged; the last one is the terminal state."""
        w = Watcher(job_id, timeout_s=timeout_s, events=events)
        while True:
            job = await self.get_job(job_id)
            page = await self.job_events(job_id, after=w.after) if events else None
            report = w.report(job, page)
            if report is not None:
                yield report
            if job.done:
                return
            w.check_deadline(job)
            await asyncio.sleep(poll_s)

    async def wait(
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
        async for last in self.watch(
            job_id, timeout_s=timeout_s, poll_s=poll_s, events=on_progress is not None
        ):
            if on_progress is not None:
                outcome = on_progress(last)
                if asyncio.iscoroutine(outcome):
                    await outcome
        assert last is not None  # watch yields at least the terminal report
        return last.job

    async def job_record(self, job_id: str, *, attempt: int | None = None) -> M.Document:
        return await self._do(C.job_record(job_id, attempt))

    async def reproduce_job(self, job_id: str, *, idempotency_key: str | None = None) -> M.JobDocument:
        return await self._do(C.reproduce_job(job_id, idempotency_key))

    # ---- quotes, pools, catalog, code ----------------------------------------------------------
    async def quote(
        self,
        spec: SpecLike,
        *,
        pools: Sequence[Mapping[str, Any]] | None = None,
        include_catalog: bool = True,
    ) -> M.QuoteResponse:
        doc, _ = C.spec_document(spec)
        return await self._do(C.quote(doc, pools, include_catalog))

    async def list_pools(self) -> M.PoolList:
        return await self._do(C.list_pools())

    async def get_pool(self, name: str) -> M.PoolDoc:
        return await self._do(C.get_pool(name))

    async def put_pool(self, pool: Mapping[str, Any]) -> M.PoolDoc:
        return await self._do(C.put_pool(pool))

    async def patch_pool(self, name: str, changes: Mapping[str, Any]) -> M.PoolDoc:
        return await self._do(C.patch_pool(name, changes))

    async def delete_pool(self, name: str) -> None:
        await self._do(C.delete_pool(name))

    async def catalog(self) -> M.AcceleratorList:
        return await self._do(C.catalog())

    async def upload_code(self, archive: bytes) -> M.CodeUploaded:
        """Upload a code archive (tar.gz); ``{url, sha256, bytes}`` of its content-addressed copy."""
        return await self._do(C.upload_code(archive))

    async def whoami(self) -> M.WhoAmI:
        return await self._do(C.whoami())

    async def healthz(self) -> M.Document:
        return await self._do(C.healthz())

    async def readyz(self) -> M.Document:
        return await self._do(C.readyz())

    # ---- tenants and keys ----------------------------------------------------------------------
    async def create_tenant(
        self,
        name: str,
        *,
        admin: bool = False,
        max_queued_jobs: int | None = None,
        max_active_devices: int | None = None,
    ) -> M.TenantCreated:
        return await self._do(C.create_tenant(name, admin, max_queued_jobs, max_active_devices))

    async def list_tenants(self) -> M.TenantList:
        return await self._do(C.list_tenants())

    async def get_tenant(self, name: str) -> M.TenantDoc:
        return await self._do(C.get_tenant(name))

    async def update_tenant(self, name: str, changes: Mapping[str, Any]) -> M.TenantDoc:
        """Change quotas/limits (admin); a key with value None removes that limit."""
        return await self._do(C.update_tenant(name, changes))

    async def list_api_keys(self, tenant: str) -> M.ApiKeyList:
        """The tenant's keys ``{id, prefix, admin, created_at, revoked}`` (admin, or its own key)."""
        return await self._do(C.list_api_keys(tenant))

    async def create_api_key(self, tenant: str, *, role: str = "member") -> M.ApiKeyCreated:
        """A new key of the tenant with a role; ``api_key`` is shown once."""
        return await self._do(C.create_api_key(tenant, role))

    async def revoke_api_key(self, tenant: str, key_id: str) -> M.ApiKeyDoc:
        """Revoke one of the tenant's keys; returns its document with ``revoked: true``."""
        return await self._do(C.revoke_api_key(tenant, key_id))

    async def rotate_api_key(self, tenant: str, key_id: str, *, overlap_s: float = 3600.0) -> M.ApiKeyRotated:
        """``{new: {…, api_key}, old: {…}}``: the old key works ``overlap_s`` more seconds."""
        return await self._do(C.rotate_api_key(tenant, key_id, overlap_s))

    # ---- usage and budgets ---------------------------------------------------------------------
    async def usage(
        self,
        *,
        by: str = "tenant",
        from_: str | None = None,
        to: str | None = None,
        tenant: str | None = None,
    ) -> M.Document:
        return await self._do(C.usage(by, from_, to, tenant))

    async def invoice(self, *, tenant: str | None = None, month: str | None = None) -> M.Document:
        return await self._do(C.invoice(tenant, month))

    async def reconcile_usage(self) -> M.Document:
        return await self._do(C.reconcile_usage())

    async def set_budget(
        self, tenant: str, *, usd: float, period: str = "month", hard: bool = False, tag: str | None = None
    ) -> M.Document:
        return await self._do(C.set_budget(tenant, usd, period, hard, tag))

    async def list_budgets(self, *, tenant: str | None = None) -> M.Document:
        return await self._do(C.list_budgets(tenant))

    async def get_budget(self, tenant: str, *, tag: str | None = None, period: str = "month") -> M.Document:
        return await self._do(C.get_budget(tenant, tag, period))

    async def budget_events(self, tenant: str) -> M.Document:
        return await self._do(C.budget_events(tenant))

    # ---- datasets (DESIGN §3.7) ----------------------------------------------------------------
    async def upload_dataset(
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
        return await self._do(
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

    async def get_dataset(self, ref: str) -> M.DatasetDoc:
        return await self._do(C.get_dataset(ref))

    async def dataset_epoch_cost(
        self, ref: str, *, model: str | None = None, seq_len: int = 2048, global_batch: int = 16
    ) -> M.DatasetEpochCost:
        """What one epoch over the version's train split costs on the cheapest feasible placement."""
        return await self._do(C.dataset_epoch_cost(ref, model, seq_len, global_batch))

    async def list_datasets(self, *, name: str | None = None) -> M.DatasetList:
        return await self._do(C.list_datasets(name))

    async def dataset_rows(
        self, ref: str, *, split: str = "train", offset: int = 0, limit: int = 100
    ) -> M.DatasetRows:
        return await self._do(C.dataset_rows(ref, split, offset, limit))

    async def iter_dataset_rows(
        self, ref: str, *, split: str = "train", page_size: int = 1000
    ) -> AsyncIterator[dict[str, Any]]:
        """Every row of one split, in order, fetching pages as the iteration goes."""
        first = C.dataset_rows(ref, split, 0, page_size)
        async for page in self._pages(first, lambda p: C.next_rows_page(p, ref, split, page_size)):
            for row in page.rows:
                yield row

    # ---- models and evaluations (DESIGN §3.8) --------------------------------------------------
    async def import_model(
        self, directory: str | Path, name: str, *, public: bool = False
    ) -> M.ModelVersionDoc:
        """Upload a local Hugging Face directory (its plain files) and import it as a base model."""
        files = C.model_files(Path(directory))
        upload = str((await self._do(C.start_model_upload()))["upload_id"])
        for path in files:
            offset = 0
            with path.open("rb") as f:
                while True:
                    chunk = f.read(self.UPLOAD_CHUNK_BYTES)
                    if not chunk and offset > 0:
                        break
                    await self._do(C.model_upload_chunk(upload, path.name, offset, chunk))
                    offset += len(chunk)
                    if not chunk:
                        break
        return await self._do(C.import_model(upload, name, public))

    async def list_models(self, *, name: str | None = None, dataset: str | None = None) -> M.ModelList:
        return await self._do(C.list_models(name, dataset))

    async def get_model(self, ref: str) -> M.ModelVersionDoc:
        return await self._do(C.get_model(ref))

    async def model_lineage(self, ref: str) -> M.Document:
        return await self._do(C.model_lineage(ref))

    async def promote_model(
        self,
        ref: str,
        alias: str,
        *,
        force: bool = False,
        reason: str = "",
        evaluation: str | None = None,
    ) -> M.Document:
        return await self._do(C.promote_model(ref, alias, force, reason, evaluation))

    async def model_aliases(self, name: str) -> M.Document:
        return await self._do(C.model_aliases(name))

    async def run_evaluation(
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
        return await self._do(
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

    async def get_evaluation(self, eval_id: str) -> M.EvaluationDoc:
        return await self._do(C.get_evaluation(eval_id))

    async def list_evaluations(self, *, model: str | None = None) -> M.EvaluationList:
        return await self._do(C.list_evaluations(model))

    async def wait_evaluation(
        self, eval_id: str, *, timeout_s: float | None = None, poll_s: float = 0.5
    ) -> M.EvaluationDoc:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            doc = await self.get_evaluation(eval_id)
            if doc.state in ("succeeded", "failed"):
                return doc
            if deadline is not None and time.monotonic() > deadline:
                raise E.ServiceUnavailableError(f"evaluation {eval_id} still {doc.state} after {timeout_s} s")
            await asyncio.sleep(poll_s)

    # ---- sweeps ------------------------------------------------------------------------------------
    async def create_sweep(self, sweep: Any) -> M.SweepDoc:
        """Create a sweep from a ``kind: Sweep`` document, a SweepSpec or a sweep file path: the answer
        carries its group quote; its trials start as jobs on the server's next ticks."""
        return await self._do(C.create_sweep(sweep))

    async def get_sweep(self, sweep_id: str) -> M.SweepDoc:
        return await self._do(C.get_sweep(sweep_id))

    async def list_sweeps(self, *, limit: int = 100) -> M.SweepList:
        return await self._do(C.list_sweeps(limit))

    async def cancel_sweep(self, sweep_id: str) -> M.SweepDoc:
        return await self._do(C.cancel_sweep(sweep_id))

    async def wait_sweep(
        self, sweep_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0
    ) -> M.SweepDoc:
        """Poll a sweep until it ends (succeeded, failed or cancelled)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            doc = await self.get_sweep(sweep_id)
            if doc.state in C.SWEEP_DONE:
                return doc
            if deadline is not None and time.monotonic() > deadline:
                raise E.ServiceUnavailableError(f"sweep {sweep_id} still {doc.state} after {timeout_s} s")
            await asyncio.sleep(poll_s)

    # ---- webhooks (alert delivery) --------------------------------------------------------------
    async def create_webhook(self, url: str, *, rules: Sequence[str] | None = None) -> M.WebhookDoc:
        """Register ``url`` for the tenant's alerts (only ``rules``, when given); the answer carries the
        tenant's signing secret."""
        return await self._do(C.create_webhook(url, rules))

    async def list_webhooks(self) -> M.WebhookList:
        return await self._do(C.list_webhooks())

    async def delete_webhook(self, webhook_id: str) -> None:
        await self._do(C.delete_webhook(webhook_id))

    async def test_webhook(self, webhook_id: str) -> M.Document:
        """Send a ``webhook_test`` alert to one webhook now; the answer is the alert."""
        return await self._do(C.test_webhook(webhook_id))

    async def list_webhook_deliveries(
        self, webhook_id: str | None = None, *, limit: int = 50
    ) -> M.WebhookDeliveryList:
        """The latest deliveries, newest first: the tenant's, or one webhook's."""
        return await self._do(C.list_webhook_deliveries(webhook_id, limit))

    # ---- deployments (DESIGN §3.9) -------------------------------------------------------------
    async def create_deployment(
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
        return await self._do(C.create_deployment(name, model, min_replicas, max_replicas, options))

    async def get_deployment(self, name: str) -> M.DeploymentDoc:
        return await self._do(C.get_deployment(name))

    async def list_deployments(self) -> M.DeploymentList:
        return await self._do(C.list_deployments())

    async def set_traffic(
        self, name: str, routes: Sequence[Mapping[str, Any]], *, canary: Mapping[str, Any] | None = None
    ) -> M.DeploymentDoc:
        """Routes ``[{model, weight, shadow?, canary?}]``; ``canary`` holds the rollback thresholds."""
        return await self._do(C.set_traffic(name, routes, canary))

    async def shadow_report(self, name: str) -> M.Document:
        return await self._do(C.shadow_report(name))

    async def delete_deployment(self, name: str) -> None:
        await self._do(C.delete_deployment(name))

    async def wait_deployment(
        self, name: str, *, timeout_s: float = 120.0, poll_s: float = 0.2
    ) -> M.DeploymentDoc:
        """Poll until the deployment is ``ready``; returns its document."""
        deadline = time.monotonic() + timeout_s
        while True:
            doc = await self.get_deployment(name)
            if doc.state == "ready":
                return doc
            if doc.state == "failed" or time.monotonic() > deadline:
                raise E.ServiceUnavailableError(
                    f"deployment {name} is {doc.state} after {timeout_s:.0f} s",
                    hint="See its events with `trainyard deployments get NAME --json`.",
                )
            await asyncio.sleep(poll_s)


async def _achunks(
    path: Path, chunk_bytes: int, progress: Callable[[int], Any] | None
) -> AsyncIterator[bytes]:
    with path.open("rb") as fh:
        while True:
            data = fh.read(chunk_bytes)
            if not data:
                return
            if progress is not None:
                progress(len(data))
            yield data
