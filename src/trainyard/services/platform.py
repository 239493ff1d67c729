"""The composition root: one database, the services over it, and the control loop.

``Platform.open(settings)`` upgrades the schema, creates the embedded defaults (tenant ``default`` with
an admin key file, the ``local-cpu`` pool and, when the local executor finds CUDA GPUs, ``local-gpu``)
and, when an executor is given, reconciles jobs left by a previous run. ``start_loop()`` runs admission,
scheduling and executor polling in a background thread.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy.orm import Session

from trainyard.errors import TrainyardError
from trainyard.executors.base import Executor
from trainyard.services.domain import Job, Principal
from trainyard.services.execution import Supervisor
from trainyard.services.feedback import Feedback
from trainyard.services.governance import GovernanceService
from trainyard.services.jobs import JobService
from trainyard.services.pools import PoolService, local_cpu_pool, local_gpu_pools
from trainyard.services.quoting import QuoteFn
from trainyard.services.scheduler_adapter import OptimizerRound, ReplanningSupervisor
from trainyard.services.scheduling import ScheduleRound
from trainyard.services.tenants import TenantService
from trainyard.serving.models import ModelSource
from trainyard.settings import Settings
from trainyard.store.db import Database
from trainyard.tenancy.ratelimit import RateLimiter, TokenBuckets, make_store, token_store
from trainyard.tenancy.storage import StoragePolicy

log = structlog.get_logger("trainyard.platform")


@dataclass
class PlatformOptions:
    executor: Executor | None = None
    schedule_round: ScheduleRound | None = None
    quoter: QuoteFn | None = None
    with_catalog: bool = True  # quotes also price the packaged cloud catalog
    register_local_pool: bool = True
    cpu_count: int | None = None
    loop_interval_s: float = 0.5
    clock: Callable[[], float] = time.time
    model_source: ModelSource | None = None  # where deployments find model versions
    stop_replicas_on_close: bool = True  # a crash leaves replicas running; a restart adopts them


def protected_paths(settings: Settings) -> list[str]:
    """The server's own files, never storage for a tenant: TRAINYARD_HOME (its database, keys, logs and
    run directories; the storage root may lie inside it) and a SQLite database elsewhere."""
    out = [Path(settings.home).resolve().as_uri()]
    url = settings.resolved_database_url
    if url.startswith("sqlite:///"):
        out.append(Path(url[len("sqlite:///") :]).resolve().as_uri())
    return out


def secure_home(home: Path, settings: Settings) -> None:
    """TRAINYARD_HOME is the server's alone (DESIGN §3.6): the directory and the directories in it 0700,
    the database, key and log files 0600. Run directories handed to the sandbox keep their own modes."""
    home.chmod(0o700)
    for name in ("runs", "storage", "checkpoints", "logs"):
        d = home / name
        d.mkdir(exist_ok=True)
        d.chmod(0o700)
    url = settings.resolved_database_url
    db_files = [home / "api_key"]
    if url.startswith("sqlite:///"):
        db = Path(url[len("sqlite:///") :])
        db_files += [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
    db_files += [p for p in home.glob("*.log") if p.is_file()]
    for f in db_files:
        if f.is_file():
            f.chmod(0o600)


class Platform:
    def __init__(self, settings: Settings, options: PlatformOptions | None = None) -> None:
        self.settings = settings
        self.options = options or PlatformOptions()
        # the write transaction a callback of this thread runs in (see _on_job_succeeded): reads it makes
        # go through that session, as a second SQLite connection would wait for the first one's lock
        self._open_session: ContextVar[Session | None] = ContextVar("trainyard_open_session", default=None)
        self.home = Path(settings.home)
        self.db = Database(settings.resolved_database_url)
        clock = self.options.clock
        self.storage_policy = StoragePolicy(
            settings.resolved_storage_url, protected_paths=protected_paths(settings)
        )
        self.tenants = TenantService(self.db, clock, storage_policy=self.storage_policy)
        self.pools = PoolService(self.db, clock)
        self.feedback = Feedback(self.db, self.pools.pools, clock, home=self.home)
        if self.options.quoter is None:
            self.options.quoter = self.feedback.quote  # quotes use step times measured here
        from trainyard.datasets.service import DatasetService

        self.datasets = DatasetService(
            self.db,
            storage_url=settings.resolved_storage_url,
            spool_dir=self.home / "tmp" / "uploads",
            max_bytes=settings.dataset_max_bytes,
            clock=clock,
        )
        self.jobs = JobService(
            self.db,
            quoter=self.options.quoter,
            live_pools=self.pools.pools,
            clock=clock,
            with_catalog=self.options.with_catalog,
            storage_policy=self.storage_policy,
            resolve_data=self.datasets.resolve_spec_document,
        )
        from trainyard.services.training_metrics import TrainingMetricsService

        self.training_metrics = TrainingMetricsService(self.db, self.jobs)
        from trainyard.services.worker_logs import WorkerLogs

        self.worker_logs = WorkerLogs(self.storage_policy, self._tenant_name_of)
        from trainyard.services.alerting import AlertConfig, AlertService

        self.alerts = AlertService(
            self.db, AlertConfig.from_settings(settings), tenant_name=self._tenant_name_of, clock=clock
        )

        def health(now_s: float) -> list[Any]:
            from trainyard.observability.snapshot import take

            return list(take(self, now_s).open_jobs)

        self.alerts.health = health
        self.governance = GovernanceService(self.db, clock)
        self.governance.jobs = self.jobs
        self.governance.on_budgets_changed = self._budgets_changed
        self.jobs.on_governed = self.tenants.invalidate_tenant  # a budget set by another server process
        from trainyard.tenancy.settings_sync import SettingsWatcher

        # admin changes made through other server processes on this database (started with the loop)
        self.settings_watcher = SettingsWatcher(self.db, self._settings_changed)
        self.rate_limiter = RateLimiter(make_store(self.db, settings.rate_limit_backend))
        from trainyard.tenancy.storage_meter import StorageMeter

        self.storage_meter = StorageMeter(
            self.db,
            clock=clock,
            interval_s=settings.storage_accrual_interval_s,
            price_usd_per_gb_month=settings.storage_price_usd_per_gb_month,
        )
        self.supervisor: Supervisor | None = None
        if self.options.executor is not None:
            self.supervisor = ReplanningSupervisor(
                self.db,
                self.jobs,
                self.pools,
                self.options.executor,
                runs_dir=self.home / "runs",
                checkpoint_url=(self.home / "checkpoints").resolve().as_uri(),
                schedule_round=self.options.schedule_round,
                clock=clock,
                feedback=self.feedback,
                storage_policy=self.storage_policy,
            )
            self.supervisor.governance = self.governance
            self.supervisor.worker_logs = self.worker_logs
            self.supervisor.alerts = self.alerts
            self.supervisor.metrics_every_steps = settings.metrics_every_steps
            self.supervisor.metrics_max_rows_per_s = settings.metrics_max_rows_per_s
            self.supervisor.tenant_limits = self.tenants.all_limits
        self._wire_registry(clock)
        from trainyard.services.sweeps import SweepService

        supervisor = self.supervisor
        self.sweeps = SweepService(
            self.db,
            self.jobs,
            registry=self.registry,
            live_pools=self.pools.pools,
            executable=supervisor.executable if supervisor is not None else None,
            clock=clock,
        )
        rnd = supervisor.schedule_round if supervisor is not None else None
        if isinstance(rnd, OptimizerRound):  # trials are scheduled as their sweep's group
            rnd.groups = self.sweeps.scheduling_groups
        from trainyard.serving.gateway import Gateway
        from trainyard.serving.models import ChainedModelSource, RegistryModelSource, StorageModelSource
        from trainyard.serving.service import ServingService

        self.serving = ServingService(
            self.db,
            self.options.model_source
            or ChainedModelSource(
                RegistryModelSource(self.registry, self._tenant_id_of),
                StorageModelSource(self.home / "storage"),
            ),
            home=self.home,
            clock=clock,
            launcher=self._serving_launcher(),
            placement=self._serving_placement,
            sandbox=self._replica_sandbox(),
        )
        self.serving_gateway = Gateway(self.serving)
        # tokens per minute drawn from the request-rate limiter's store (shared by every server process
        # on the database when that one is)
        self.serving_gateway.token_buckets = TokenBuckets(token_store(self.rate_limiter.store), clock)
        from trainyard.services.governance import InferenceBudgetGate

        self.serving_gateway.budget_gate = InferenceBudgetGate(self.governance)
        from trainyard.datasets.records import RunRecords

        self.records = RunRecords(self.db, clock)
        if self.supervisor is not None:
            model_env = self.supervisor.launch_env
            datasets = self.datasets

            def launch_env(job: Job) -> dict[str, str]:  # the base model's weights and the data's manifest
                return {**(model_env(job) if model_env is not None else {}), **datasets.launch_env(job)}

            self.supervisor.launch_env = launch_env
            self.supervisor.records = self.records
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ready = False

    # ---- model registry and evaluations ----------------------------------------------------------
    def _dataset_tokenizer(self, principal: Principal, base: str) -> Any:
        """The tokenizer of the model version ``base`` (the caller's own, or a public base model) that
        counts a dataset upload's tokens (``datasets upload --base NAME@V``)."""
        from trainyard.datasets.tokens import model_tokenizer

        return model_tokenizer(self.registry.resolve(principal.tenant_id, base))

    def _wire_registry(self, clock: Callable[[], float]) -> None:
        from trainyard.evaluation.service import EvaluationService
        from trainyard.registry.service import RegistryService, storage_root

        self.registry = RegistryService(self.db, root=lambda: storage_root(self.home), clock=clock)
        self.datasets.tokenizers = self._dataset_tokenizer
        self.evaluations = EvaluationService(
            self.db,
            self.registry,
            self._submit_internal,
            clock=clock,
            split_resolver=self._split_resolver(),
        )
        self.jobs.spec_resolver = lambda principal, spec: self.registry.resolve_spec(
            principal.tenant_id, spec
        )
        if self.supervisor is not None:
            registry_env, evaluation_env = self.registry.launch_env, self.evaluations.launch_env

            def launch_env(job: Job) -> dict[str, str]:  # a registered base model; an evaluation's request
                return {**registry_env(job), **evaluation_env(job)}

            self.supervisor.launch_env = launch_env
            self.supervisor.on_job_succeeded = self._on_job_succeeded

    def _split_resolver(self) -> Any:
        """Evaluation splits: ``ds://NAME@V`` through the dataset service (a local copy of a remote
        split is cached by its sha256), anything else as the evaluation service's file resolver does."""
        from trainyard.evaluation.service import file_split_resolver

        files = file_split_resolver(lambda: self.registry.root)

        def resolve(tenant_id: str, tenant_name: str, dataset: str, split: str) -> tuple[Path, str | None]:
            if not dataset.startswith("ds://"):
                return files(tenant_id, tenant_name, dataset, split)
            v = self.datasets.resolve(tenant_id, dataset, session=self._open_session.get())
            side = v.split(split)
            if side.url.startswith("file://"):
                return Path(side.url[len("file://") :]), v.format
            import fsspec

            local = self.home / "cache" / "datasets" / f"{side.sha256}.jsonl"
            if not local.is_file():
                local.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                tmp = local.with_suffix(".part")
                with fsspec.open(side.url, "rb") as src, tmp.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                tmp.rename(local)
            return local, v.format

        return resolve

    def _submit_internal(self, principal: Principal, spec_doc: dict[str, Any]) -> Job:
        from trainyard.spec.loader import spec_from_dict

        job, _ = self.jobs.submit(principal, spec_from_dict(spec_doc, source="evaluation"))
        return job

    def _on_job_succeeded(self, s: Session, job: Job, result: dict[str, Any]) -> dict[str, Any]:
        """A finished evaluation job gets its comparison; a finished training job registers its model
        version and, when its dataset has an eval split, an evaluation against its base."""
        token = self._open_session.set(s)
        try:
            return self._finish_job(s, job, result)
        finally:
            self._open_session.reset(token)

    def _finish_job(self, s: Session, job: Job, result: dict[str, Any]) -> dict[str, Any]:
        if self.evaluations.is_evaluation_job(job):
            return self.evaluations.finish(s, job)
        version = self.registry.register_job_output(s, job, result)
        out: dict[str, Any] = {"model_version": version.id}
        dataset = (job.spec.get("workload") or {}).get("dataset")
        if version.base is not None and isinstance(dataset, str) and dataset.startswith("ds://"):
            tenant = version.tenant_name
            try:
                self.evaluations.split_resolver(job.tenant_id, tenant, dataset, "eval")
            except TrainyardError:
                return out  # no eval split: nothing to evaluate on automatically
            row = self.evaluations.create_in(
                s,
                job.tenant_id,
                tenant,
                model=version.id,
                baseline=version.base,
                dataset=dataset,
                split="eval",
                auto=True,
            )
            out["evaluation"] = {"id": row.id, "baseline": version.base, "verdict": None, "passed": False}
        return out

    def _tenant_name_of(self, tenant_id: str) -> str | None:
        from trainyard.store.repositories import TenantRepo

        with self.db.session() as s:
            tenant = TenantRepo(s).by_id(tenant_id)
        return tenant.name if tenant is not None else None

    def _tenant_id_of(self, name: str) -> str | None:
        try:
            return self.tenants.get(name).id
        except Exception:
            return None

    def _serving_launcher(self) -> Any:
        """Replicas on the Ray cluster when the server runs with the Ray executor, else local processes."""
        executor = self.options.executor
        if executor is not None and getattr(executor, "name", None) == "ray":
            from trainyard.serving.ray_replicas import RayLauncher

            return RayLauncher(executor)
        return None

    def _replica_sandbox(self) -> Any:
        """The sandbox local deployment replicas run in: the local executor's (its workers' sandbox,
        ``TRAINYARD_SANDBOX``); without an executor that has one (``--executor none``), the setting's;
        None under ``TRAINYARD_SANDBOX=none`` (replicas run as the server's user, like workers)."""
        executor = self.options.executor
        if executor is not None and hasattr(executor, "sandbox"):
            sandbox = executor.sandbox
            if sandbox is None:
                return None
            from trainyard.executors.sandbox import Sandbox

            return sandbox.spec() if isinstance(sandbox, Sandbox) else sandbox
        from trainyard.server import sandbox_spec

        return sandbox_spec(self.settings)

    def _serving_placement(self) -> dict[str, Any]:
        """Where a new replica runs and what it costs, priced like a job: this machine's local pool, or
        with the Ray executor a pool the cluster serves (GPU pools first, then the cheapest)."""
        executor = self.options.executor
        if executor is not None and getattr(executor, "name", None) == "ray":
            from trainyard.services.pools import pool_backend

            served = [p for p in self.pools.pools() if pool_backend(p, executor) == "ray"]
            served.sort(key=lambda p: (p.accelerator == "cpu", p.price_usd_per_device_hour or 0.0, p.name))
            if not served:
                return {"pool": None, "accelerator": None, "devices": 1, "price_usd_per_hour": 0.0}
            best = served[0]
            return {
                "pool": best.name,
                "accelerator": best.accelerator,
                "devices": 1,
                "price_usd_per_hour": float(best.price_usd_per_device_hour or 0.0),
            }
        try:
            rec = self.pools.get("local-cpu")
        except Exception:
            return {"pool": "local-cpu", "accelerator": "cpu", "devices": 1, "price_usd_per_hour": 0.0}
        price = float(rec.doc.get("price_usd_per_device_hour") or 0.0)
        return {
            "pool": rec.name,
            "accelerator": rec.doc.get("accelerator", "cpu"),
            "devices": 1,
            "price_usd_per_hour": price,
        }

    @classmethod
    def open(cls, settings: Settings, options: PlatformOptions | None = None) -> Platform:
        p = cls(settings, options)
        p.start()
        return p

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.db.upgrade()
        secure_home(self.home, self.settings)
        _, wrote = self.tenants.ensure_default(self.settings.api_key_path)
        if wrote:
            log.info("default_tenant_key_written", path=str(self.settings.api_key_path))
        if self.options.register_local_pool:
            self.pools.ensure_local(local_cpu_pool(self.options.cpu_count))
            # this machine's CUDA GPUs, as the local executor found them (named by catalog accelerator)
            for gpu_pool in local_gpu_pools(list(getattr(self.options.executor, "gpus", None) or [])):
                self.pools.ensure_local(gpu_pool)
                log.info("local_gpu_pool", name=gpu_pool.name, accelerator=gpu_pool.accelerator)
        self.feedback.rebuild()
        if self.supervisor is not None:
            self.supervisor.reconcile()
        self._check_ledger()
        self.serving.start()  # adopt replicas a previous run left, restart the rest
        self.ready = True

    def _check_ledger(self) -> None:
        """Log loudly when the usage ledger and the recorded job costs disagree (never silently)."""
        from trainyard.errors import LedgerMismatchError
        from trainyard.tenancy import ledger

        try:
            with self.db.session() as s:
                ledger.check_reconciled(s.connection())
        except LedgerMismatchError as exc:
            log.error("ledger_mismatch", mismatches=exc.details.get("mismatches", [])[:20])

    # ---- control loop ----------------------------------------------------------------------------
    def _settings_changed(self) -> None:
        """Another server process changed some tenant's settings: forget every cached copy."""
        self.tenants.forget_all()
        self.jobs.budget_cache.clear()
        gate = getattr(getattr(self, "serving_gateway", None), "budget_gate", None)
        if gate is not None:
            gate.forget()

    def _budgets_changed(self, tenant_id: str) -> None:
        self.tenants.invalidate_tenant(tenant_id)
        self.jobs.budget_cache.invalidate(tenant_id)
        gate = getattr(getattr(self, "serving_gateway", None), "budget_gate", None)
        if gate is not None:
            gate.forget(tenant_id)

    def tick(self) -> None:
        if self.supervisor is not None:
            self.supervisor.tick()
        else:
            self.jobs.admit_pending()
            try:
                self.alerts.scan()  # budgets and deployments alert without an executor too
            except Exception:
                log.exception("alert_scan_failed")
        try:
            self.evaluations.launch_pending()
        except Exception:
            log.exception("evaluation_launch_phase_failed")
        try:  # after the supervisor: trials' new metrics, ends and cancels are in
            self.sweeps.tick()
        except Exception:
            log.exception("sweep_phase_failed")
        try:
            self.storage_meter.tick()
        except Exception:
            log.exception("storage_metering_failed")

    def start_loop(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        # from here on cached principals are used only while the watcher keeps up (settings_sync)
        self.tenants.cache_trusted = self.settings_watcher.fresh
        self.settings_watcher.start()
        self._thread = threading.Thread(target=self._run_loop, name="trainyard-control-loop", daemon=True)
        self._thread.start()
        self.serving.start_loop()
        self.alerts.start()  # webhook deliveries left pending by a previous run resume

    def _run_loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:
                log.exception("control_loop_tick_failed")
            elapsed = time.monotonic() - started
            self._stop.wait(max(0.0, self.options.loop_interval_s - elapsed))

    def stop_loop(self, timeout_s: float = 10.0) -> None:
        self.serving.stop_loop()
        self.settings_watcher.stop()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def close(self) -> None:
        self.stop_loop()
        try:  # before the executor: replicas on a Ray cluster are stopped through its connection
            self.serving.close(stop_replicas=self.options.stop_replicas_on_close)
        except Exception:
            log.exception("serving_shutdown_failed")
        if self.options.executor is not None:
            try:
                self.options.executor.shutdown()
            except Exception:
                log.exception("executor_shutdown_failed")
        self.alerts.close()
        self.db.dispose()
        self.ready = False
