"""Mirror jobs into an MLflow tracking server as they happen (optional extra ``trainyard[mlflow]``).

The mirror follows the job event log (``job_events``, one global id order) from a cursor and pushes
what each event means to MLflow (the mapping is in docs/interop.md): a job becomes a run named after it
in the experiment ``trainyard/<tenant>`` with the spec's fields as params, heartbeats become step
metrics (``loss``, ``step_time_s``, ``tokens_per_s``), placements tags, preemptions, restarts and cost
cumulative metrics, and the end of the job the run's status; a finished job's weights become a version
of the registered model ``<tenant>.<job name>``.

The cursor is kept in ``<TRAINYARD_HOME>/mlflow-mirror.json`` (mode 0600) after every event, and the
run of a job is found again by its ``trainyard.job_id`` tag, so a restarted mirror picks up where it
stopped. MLflow is reached only through its client; an unreachable tracking server delays the mirror
(the cursor does not move), it never affects jobs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from trainyard.store.db import Database
from trainyard.store.models import JobEventRow, JobRow, TenantRow

log = logging.getLogger("trainyard.mlflow")

TERMINAL_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
PARAM_SECTIONS = ("model", "workload", "objective", "checkpoint", "resources")
MAX_PARAM_CHARS = 500  # MLflow caps param values (6,000 characters on recent servers); keep them short
BATCH = 500


def flatten(doc: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"workload": {"seq_len": 64}}`` → ``{"workload.seq_len": "64"}`` (lists as JSON)."""
    out: dict[str, str] = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{key}."))
        elif v is not None:
            text = json.dumps(v) if isinstance(v, list | bool) else str(v)
            out[key] = text[:MAX_PARAM_CHARS]
    return out


@dataclass(frozen=True)
class _Job:
    id: str
    name: str
    spec: dict[str, Any]
    created_at_s: float
    result: dict[str, Any] | None


@dataclass(frozen=True)
class _Event:
    id: int
    job_id: str
    kind: str
    data: dict[str, Any]
    time_s: float


class MlflowMirror:
    def __init__(
        self,
        db: Database,
        tracking_uri: str,
        *,
        cursor_path: Path,
    ) -> None:
        from mlflow.tracking import MlflowClient  # the optional extra: imported only when mirroring

        self.db = db
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.cursor_path = cursor_path
        self.cursor = self._load_cursor()
        self._runs: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- cursor ---------------------------------------------------------------------------------------
    def _load_cursor(self) -> int:
        try:
            return int(json.loads(self.cursor_path.read_text())["after_event_id"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return 0

    def _save_cursor(self) -> None:
        tmp = self.cursor_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"after_event_id": self.cursor}, f)
        os.replace(tmp, self.cursor_path)

    # ---- runs -----------------------------------------------------------------------------------------
    def _experiment_id(self, tenant: str) -> str:
        name = f"trainyard/{tenant}"
        exp = self.client.get_experiment_by_name(name)
        return exp.experiment_id if exp is not None else self.client.create_experiment(name)

    def _run_for(self, job: _Job, tenant: str) -> str:
        if job.id in self._runs:
            return self._runs[job.id]
        exp = self._experiment_id(tenant)
        found = self.client.search_runs(
            [exp], filter_string=f"tags.`trainyard.job_id` = '{job.id}'", max_results=1
        )
        if found:
            run_id = found[0].info.run_id
        else:
            spec = job.spec or {}
            tags = {f"spec.{k}": str(v) for k, v in (spec.get("tags") or {}).items()}
            tags.update({"trainyard.job_id": job.id, "trainyard.tenant": tenant, "mlflow.runName": job.name})
            run = self.client.create_run(
                exp, start_time=int(job.created_at_s * 1000), tags=tags, run_name=job.name
            )
            run_id = run.info.run_id
            params = {}
            for section in PARAM_SECTIONS:
                if isinstance(spec.get(section), dict):
                    params.update(flatten(spec[section], f"{section}."))
            from mlflow.entities import Param

            items = [Param(k, v) for k, v in sorted(params.items())]
            for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(run_id, params=items[i : i + 100])
        self._runs[job.id] = run_id
        return run_id

    # ---- events ---------------------------------------------------------------------------------------
    def sync_once(self) -> int:
        """Push every event after the cursor; returns how many were mirrored."""
        with self.db.session() as s:
            rows = s.execute(
                select(
                    JobEventRow.id,
                    JobEventRow.job_id,
                    JobEventRow.kind,
                    JobEventRow.data,
                    JobEventRow.time_s,
                    JobRow.name,
                    JobRow.spec,
                    JobRow.created_at_s,
                    JobRow.result,
                    TenantRow.name,
                )
                .join(JobRow, JobRow.id == JobEventRow.job_id)
                .join(TenantRow, TenantRow.id == JobRow.tenant_id)
                .where(JobEventRow.id > self.cursor)
                .order_by(JobEventRow.id)
                .limit(BATCH)
            ).all()  # fmt: skip
        for ev_id, job_id, kind, data, time_s, name, spec, created_at_s, result, tenant in rows:
            job = _Job(job_id, name, spec or {}, created_at_s, result)
            self._apply(_Event(ev_id, job_id, kind, data or {}, time_s), job, tenant)
            self.cursor = ev_id
            self._save_cursor()  # after every event: a crash re-sends at most the event in flight
        return len(rows)

    def _so_far(self, ev: _Event) -> list[dict[str, Any]]:
        """The data of this job's events of ``ev``'s kind up to and including ``ev`` (counts and sums are
        recomputed from the log, so a restarted mirror reports the same values)."""
        with self.db.session() as s:
            q = (
                select(JobEventRow.data)
                .where(JobEventRow.job_id == ev.job_id, JobEventRow.kind == ev.kind, JobEventRow.id <= ev.id)
                .order_by(JobEventRow.id)
            )
            return [d or {} for d in s.scalars(q)]

    def _apply(self, ev: _Event, job: _Job, tenant: str) -> None:
        run_id = self._run_for(job, tenant)
        d = ev.data or {}
        ts = int(ev.time_s * 1000)
        if ev.kind == "heartbeat":
            step = int(d.get("step", 0))
            for key in ("loss", "step_time_s", "tokens_per_s", "eval_loss"):
                if isinstance(d.get(key), int | float):
                    self.client.log_metric(run_id, key, float(d[key]), timestamp=ts, step=step)
        elif ev.kind == "checkpoint" and isinstance(d.get("step"), int):
            self.client.log_metric(run_id, "checkpoint_step", d["step"], timestamp=ts, step=d["step"])
        elif ev.kind == "placement":
            for key in ("pool", "accelerator", "market"):
                if d.get(key) is not None:
                    self.client.set_tag(run_id, f"trainyard.{key}", str(d[key]))
        elif ev.kind in ("preempted", "restart"):
            name = "preemptions" if ev.kind == "preempted" else "restarts"
            self.client.log_metric(run_id, name, len(self._so_far(ev)), timestamp=ts)
        elif ev.kind == "cost" and isinstance(d.get("usd"), int | float):
            total = sum(float(c.get("usd", 0.0)) for c in self._so_far(ev))
            self.client.log_metric(run_id, "cost_usd", total, timestamp=ts, step=int(d.get("attempt", 0)))
        elif ev.kind == "state" and d.get("to") in TERMINAL_STATUS:
            result = job.result or {}
            if result.get("model_version"):
                self.client.set_tag(run_id, "trainyard.model_version", str(result["model_version"]))
                self._register(job, tenant, run_id, result)
            self.client.set_terminated(run_id, status=TERMINAL_STATUS[d["to"]], end_time=ts)

    def _register(self, job: _Job, tenant: str, run_id: str, result: dict[str, Any]) -> None:
        """A version of ``<tenant>.<job name>`` whose source is the run's ``model`` artifact: a card naming
        trainyard's model version, its weights and their sha256 (MLflow accepts a local path as a source
        only inside the run's artifacts, and the weights stay in trainyard's storage)."""
        if not result.get("model_path"):
            return
        card = {key: result.get(key) for key in ("model_version", "model_path", "model_sha256")}
        self.client.log_dict(run_id, {"trainyard_job": job.id, **card}, "model/trainyard-model.json")
        name = f"{tenant}.{job.name}"
        from mlflow.exceptions import MlflowException

        with contextlib.suppress(MlflowException):  # already registered
            self.client.create_registered_model(name)
        self.client.create_model_version(
            name,
            f"runs:/{run_id}/model",
            run_id=run_id,
            tags={"trainyard.model_version": str(result["model_version"])},
        )

    # ---- background thread ----------------------------------------------------------------------------
    def start(self, interval_s: float = 2.0) -> None:
        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    while self.sync_once() == BATCH:
                        pass
                except Exception:  # the tracking server is down or refused: retry from the same cursor
                    log.warning("mlflow_mirror_failed", exc_info=True)
                    self._runs.clear()

        self._thread = threading.Thread(target=loop, name="trainyard-mlflow-mirror", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
