"""Evaluation runs: a model and a baseline on the same split, as a job on the platform's capacity.

``create`` resolves both models and the split, stores the evaluation (``pending``) and submits an
evaluation job — a job whose entrypoint is the built-in evaluator (:mod:`trainyard.evaluation.runner`),
so it is quoted, scheduled, started and billed like training (its quote prices the forward passes as
training steps, an over-estimate). When the job succeeds, :meth:`EvaluationService.finish` reads the
per-example scores, runs the paired statistics (:mod:`trainyard.evaluation.stats`), applies the
guardrails and stores the document of DESIGN §3.8; the result goes onto the model version and the
fine-tune job that made it.

Splits come through ``split_resolver(tenant_id, tenant_name, dataset, split) -> (jsonl path, format)``;
the default accepts a ``file://`` JSONL under the tenant's own storage area (that file *is* the split).
"""

from __future__ import annotations

import json
import math
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from trainyard.errors import InvalidInputError, NotFoundError, TrainyardError
from trainyard.evaluation.evaluator import METRICS, detect_format, read_rows, split_example
from trainyard.evaluation.stats import (
    ALPHA,
    DatasetNonInferiority,
    Guardrail,
    MetricInput,
    NonInferiority,
    compare,
    largest_differences,
)
from trainyard.registry.service import RegistryService, tenant_area
from trainyard.services.domain import Principal, iso
from trainyard.store.db import Database
from trainyard.store.governance_repo import GovernanceRepo
from trainyard.store.registry_models import EvaluationRow
from trainyard.store.repositories import JobRepo, TenantRepo

log = structlog.get_logger("trainyard.evaluation")

EVAL_TAG = "trainyard.evaluation"
EVAL_RESULTS_FILE = "eval-results.json"
MAX_EXAMPLES_SHOWN = 5
DEFAULT_MAX_EXAMPLES = 2000
DEFAULT_PRIMARY_METRIC = "loss"
# per-example metrics the built-in evaluator measures (plug-ins add theirs, higher is better)
BUILTIN_METRICS = {"loss": False, "exact_match": True}  # name -> higher_is_better
SplitResolver = Callable[[str, str, str, str], tuple[Path, str | None]]
# the evaluation job runs this script; a ``python script.py`` entrypoint runs inside the warm worker
RUNNER = str(Path(__file__).with_name("runner.py"))


def new_evaluation_id() -> str:
    return f"eval-{secrets.token_hex(6)}"


def file_split_resolver(root: Callable[[], Path]) -> SplitResolver:
    """A ``file://`` JSONL (or absolute path) inside ``<root>/tenants/<tenant>/``; anything else is 422."""

    def resolve(tenant_id: str, tenant_name: str, dataset: str, split: str) -> tuple[Path, str | None]:
        refused = InvalidInputError(
            f"dataset {dataset!r} is not a dataset this tenant may read",
            hint="Name a registered dataset version (ds://NAME@V) or a file:// URL under your storage area.",
            details={
                "code": "storage_not_allowed",
                "errors": [{"field": "dataset", "message": "not allowed"}],
            },
        )
        if dataset.startswith("ds://"):
            raise NotFoundError(
                f"dataset {dataset!r} is not known here",
                hint="Upload it with `trainyard datasets upload`.",
                details={"errors": [{"field": "dataset", "message": "unknown dataset"}]},
            )
        if ".." in dataset or "::" in dataset:
            raise refused
        raw = dataset[len("file://") :] if dataset.startswith("file://") else dataset
        if not raw.startswith("/"):
            raise refused
        area = (root() / "tenants" / tenant_name).resolve()
        path = Path(raw).resolve()
        if not path.is_relative_to(area):
            raise refused
        if not path.is_file():
            raise refused  # never reveal whether a path exists
        return path, None

    return resolve


def gate_options(
    primary_metric: str | None,
    non_inferiority: dict[str, float] | None,
    alpha: float | None,
    correction: str | None,
    guardrail_datasets: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The gate's configuration as stored on an evaluation, checked (422 naming each bad field).

    ``guardrail_datasets``: ``[{dataset, split (default eval), metric (default loss), margin}]``, other
    dataset versions on which the model must be non-inferior to the baseline within ``margin``."""
    known = set(BUILTIN_METRICS) | set(METRICS)
    primary = DEFAULT_PRIMARY_METRIC if primary_metric is None else primary_metric
    margins = dict(non_inferiority or {})
    errors: list[dict[str, str]] = []
    if primary not in known:
        errors.append({"field": "primary_metric", "message": f"unknown metric; one of {sorted(known)}"})
    for name, margin in margins.items():
        field = f"non_inferiority.{name}"
        if name not in known:
            errors.append({"field": field, "message": f"unknown metric; one of {sorted(known)}"})
        elif name == primary:
            errors.append({"field": field, "message": "the primary metric cannot also be a guardrail"})
        if not isinstance(margin, int | float) or not math.isfinite(margin) or margin <= 0:
            errors.append({"field": field, "message": "the margin must be a positive number (metric units)"})
    a = ALPHA if alpha is None else alpha
    if not isinstance(a, int | float) or not 0.0 < a < 0.5:
        errors.append({"field": "alpha", "message": "must lie in (0, 0.5)"})
    corr = correction or "holm"
    if corr not in ("holm", "none"):
        errors.append({"field": "correction", "message": "holm or none"})
    extra: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()
    for i, item in enumerate(guardrail_datasets or []):
        field = f"guardrail_datasets.{i}"
        if not isinstance(item, dict):
            errors.append({"field": field, "message": "expected {dataset, split, metric, margin}"})
            continue
        ds, sp = item.get("dataset"), item.get("split") or "eval"
        metric, g_margin = item.get("metric") or DEFAULT_PRIMARY_METRIC, item.get("margin")
        if not isinstance(ds, str) or not ds:
            errors.append({"field": f"{field}.dataset", "message": "required: ds://NAME@V"})
        if not isinstance(sp, str) or len(sp) > 32:
            errors.append({"field": f"{field}.split", "message": "a split name"})
        if metric not in known:
            errors.append({"field": f"{field}.metric", "message": f"unknown metric; one of {sorted(known)}"})
        if (
            isinstance(g_margin, bool)
            or not isinstance(g_margin, int | float)
            or not math.isfinite(g_margin)
            or g_margin <= 0
        ):
            errors.append(
                {"field": f"{field}.margin", "message": "the margin must be a positive number (metric units)"}
            )
            continue
        key = (str(ds), str(sp), str(metric))
        if key in seen:
            errors.append({"field": field, "message": "this dataset, split and metric are named twice"})
        seen.add(key)
        extra.append({"dataset": ds, "split": sp, "metric": metric, "margin": float(g_margin)})
    if errors:
        raise InvalidInputError(
            "invalid evaluation gate: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors),
            hint="Margins are in the metric's own units, e.g. non_inferiority: {exact_match: 0.02}.",
            details={"errors": errors},
        )
    gate: dict[str, Any] = {
        "primary_metric": primary,
        "non_inferiority": {k: float(v) for k, v in margins.items()},
        "alpha": float(a),
        "correction": corr,
    }
    if extra:
        gate["guardrail_datasets"] = extra
    return gate


class EvaluationService:
    def __init__(
        self,
        db: Database,
        registry: RegistryService,
        submit: Callable[[Principal, dict[str, Any]], Any],
        *,
        split_resolver: SplitResolver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.registry = registry
        self._submit = submit
        self.clock = clock
        self.split_resolver: SplitResolver = split_resolver or file_split_resolver(lambda: registry.root)

    # ---- creation ----------------------------------------------------------------------------------
    def _check_splits(
        self, tenant_id: str, tenant_name: str, dataset: str, split: str, gate: dict[str, Any] | None
    ) -> None:
        """The split and every guardrail dataset's split are the tenant's to read (else 404 / 422)."""
        self.split_resolver(tenant_id, tenant_name, dataset, split)
        for g in (gate or {}).get("guardrail_datasets") or []:  # the same tenant walls as the split's
            self.split_resolver(tenant_id, tenant_name, g["dataset"], g["split"])

    def create(
        self,
        principal: Principal,
        *,
        model: str,
        baseline: str | None,
        dataset: str,
        split: str = "eval",
        max_examples: int | None = None,
        guardrails: dict[str, float] | None = None,
        primary_metric: str | None = None,
        non_inferiority: dict[str, float] | None = None,
        alpha: float | None = None,
        correction: str | None = None,
        guardrail_datasets: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        gate = gate_options(primary_metric, non_inferiority, alpha, correction, guardrail_datasets)
        # the splits first, outside this session: a ds:// version is read through the dataset
        # service's own session, which must not wait on this one's write lock
        self._check_splits(principal.tenant_id, principal.tenant_name, dataset, split, gate)
        with self.db.session() as s:
            if baseline is None:
                base = self.registry.resolve_in(s, principal.tenant_id, model).base
                if base is None:
                    raise InvalidInputError(
                        f"{model} has no base model; name a --baseline",
                        details={"errors": [{"field": "baseline", "message": "required"}]},
                    )
                baseline = base
            row = self.create_in(
                s,
                principal.tenant_id,
                principal.tenant_name,
                model=model,
                baseline=baseline,
                dataset=dataset,
                split=split,
                max_examples=max_examples,
                guardrails=guardrails,
                gate=gate,
                splits_checked=True,
            )
            eval_id = row.id
        self.launch_pending(only=eval_id)
        return self.get(principal, eval_id)

    def create_in(
        self,
        s: Session,
        tenant_id: str,
        tenant_name: str,
        *,
        model: str,
        baseline: str,
        dataset: str,
        split: str,
        max_examples: int | None = None,
        guardrails: dict[str, float] | None = None,
        auto: bool = False,
        gate: dict[str, Any] | None = None,
        splits_checked: bool = False,
    ) -> EvaluationRow:
        model_id = self.registry.resolve_in(s, tenant_id, model).id
        baseline_id = self.registry.resolve_in(s, tenant_id, baseline).id
        if not splits_checked:
            self._check_splits(tenant_id, tenant_name, dataset, split, gate)
        row = EvaluationRow(
            id=new_evaluation_id(),
            tenant_id=tenant_id,
            state="pending",
            model=model_id,
            baseline=baseline_id,
            dataset=dataset,
            split=split,
            job_id=None,
            doc={
                "max_examples": max_examples or DEFAULT_MAX_EXAMPLES,
                "guardrail_thresholds": dict(guardrails or {}),
                "auto": auto,
                "gate": gate or gate_options(None, None, None, None),
            },
            created_at_s=self.clock(),
        )
        s.add(row)
        s.flush()
        return row

    def launch_pending(self, only: str | None = None) -> int:
        """Submit the evaluation job of every pending evaluation (a control-loop phase)."""
        with self.db.session() as s:
            q = select(EvaluationRow).where(EvaluationRow.state == "pending", EvaluationRow.job_id.is_(None))
            if only is not None:
                q = q.where(EvaluationRow.id == only)
            pending = [(r.id, r.tenant_id) for r in s.scalars(q.limit(50))]
        for eval_id, tenant_id in pending:
            if not self._claim(eval_id):
                continue  # another thread (the control loop, an API request) is launching it
            try:
                self._launch(eval_id, tenant_id)
            except TrainyardError as exc:
                self._mark_failed(eval_id, exc.message)
            except Exception as exc:
                log.exception("evaluation_launch_failed", evaluation=eval_id)
                self._mark_failed(eval_id, f"{type(exc).__name__}: {exc}")
        return len(pending)

    def _claim(self, eval_id: str) -> bool:
        """Move a pending evaluation to ``launching``, atomically: only one caller submits its job."""
        with self.db.session() as s:
            res = s.execute(
                update(EvaluationRow)
                .where(
                    EvaluationRow.id == eval_id,
                    EvaluationRow.state == "pending",
                    EvaluationRow.job_id.is_(None),
                )
                .values(state="launching")
            )
            return bool(getattr(res, "rowcount", 0) == 1)

    def _mark_failed(self, eval_id: str, reason: str) -> None:
        with self.db.session() as s:
            row = s.scalars(select(EvaluationRow).where(EvaluationRow.id == eval_id)).first()
            if row is not None and row.state in ("pending", "launching", "running"):
                row.state = "failed"
                row.doc = {**row.doc, "error": reason[:2000]}
                row.finished_at_s = self.clock()

    def _launch(self, eval_id: str, tenant_id: str) -> None:
        with self.db.session() as s:
            row = s.scalars(select(EvaluationRow).where(EvaluationRow.id == eval_id)).one()
            tenant = TenantRepo(s).by_id(tenant_id)
            assert tenant is not None
            model = self.registry.resolve_in(s, tenant_id, row.model)
            baseline = self.registry.resolve_in(s, tenant_id, row.baseline)
            dataset, split, max_examples = row.dataset, row.split, int(row.doc.get("max_examples") or 0)
            governed = GovernanceRepo(s).has_budget(tenant_id)  # budgets apply to evaluation jobs too
            gate_ds = list((row.doc.get("gate") or {}).get("guardrail_datasets") or [])
        split_path, fmt = self.split_resolver(tenant_id, tenant.name, dataset, split)
        rows = read_rows(split_path, limit=max_examples or None)
        if not rows:
            raise InvalidInputError(f"the {split} split of {dataset} is empty")
        fmt = fmt or detect_format(rows)
        extra: list[dict[str, Any]] = []
        extra_rows = 0
        seen_splits: dict[tuple[str, str], int] = {}
        for g in gate_ds:  # each (dataset, split) is scored once, whatever metrics it guards
            key = (g["dataset"], g["split"])
            if key in seen_splits:
                continue
            g_path, g_fmt = self.split_resolver(tenant_id, tenant.name, g["dataset"], g["split"])
            g_rows = read_rows(g_path, limit=max_examples or None)
            if not g_rows:
                raise InvalidInputError(
                    f"the {g['split']} split of guardrail dataset {g['dataset']} is empty"
                )
            seen_splits[key] = len(extra)
            extra_rows += len(g_rows)
            extra.append(
                {
                    "dataset": g["dataset"],
                    "split": g["split"],
                    "split_path": str(g_path),
                    "format": g_fmt or detect_format(g_rows),
                }
            )
        model_dir = self.registry.local_weights_dir(model)
        baseline_dir = self.registry.local_weights_dir(baseline)
        out_dir = tenant_area(self.registry.root, tenant.name, "evaluations") / eval_id
        out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        request: dict[str, Any] = {
            "evaluation": eval_id,
            "model_dir": str(model_dir),
            "baseline_dir": str(baseline_dir),
            "split_path": str(split_path),
            "format": fmt,
            "max_examples": max_examples or None,
            "max_new_tokens": 32,
        }
        if extra:
            request["guardrail_datasets"] = extra
        (out_dir / "request.json").write_text(json.dumps(request, indent=1))
        spec = {
            "apiVersion": "trainyard/v1",
            "kind": "TrainingJob",
            "name": f"{eval_id}",
            "tags": {EVAL_TAG: eval_id},
            "model": {"base": model.id},
            "workload": {
                "seq_len": 128,
                "global_batch": 1,
                "steps": max(1, 2 * (len(rows) + extra_rows)),
                "precision": "fp32",
            },
            "requirements": {"allow": ["cpu"]},
            "entrypoint": {"command": [sys.executable, RUNNER, str(out_dir / "request.json")]},
        }
        # the built-in evaluator is the platform's code, not the tenant's: it needs no user-code allowance
        principal = Principal(
            tenant_id=tenant_id,
            tenant_name=tenant.name,
            key_id="evaluation",
            admin=False,
            max_queued_jobs=tenant.max_queued_jobs,
            max_active_devices=tenant.max_active_devices,
            governed=governed,
            allow_user_code=True,
        )
        job = self._submit(principal, spec)
        with self.db.session() as s:
            row = s.scalars(select(EvaluationRow).where(EvaluationRow.id == eval_id)).one()
            row.job_id = job.id
            row.state = "running"
            row.doc = {**row.doc, "format": fmt, "n_requested": len(rows), "out_dir": str(out_dir)}

    # ---- launch and completion -----------------------------------------------------------------------
    def is_evaluation_job(self, job: Any) -> str | None:
        return ((job.spec or {}).get("tags") or {}).get(EVAL_TAG)

    def launch_env(self, job: Any) -> dict[str, str]:
        """Where the evaluation job's request is (``TRAINYARD_EVAL_REQUEST``): a sandboxed worker gets
        copies of what it names (both models' weights, the split) staged into its run directory, since
        the server's files are not readable there. Only the job's own tenant's evaluation is named."""
        eval_id = self.is_evaluation_job(job)
        if not eval_id:
            return {}
        with self.db.session() as s:
            mine = (EvaluationRow.id == eval_id, EvaluationRow.tenant_id == job.tenant_id)
            if s.scalars(select(EvaluationRow.id).where(*mine)).first() is None:
                return {}
            tenant = TenantRepo(s).by_id(job.tenant_id)
        if tenant is None:
            return {}
        out_dir = tenant_area(self.registry.root, tenant.name, "evaluations") / eval_id  # as create wrote it
        return {"TRAINYARD_EVAL_REQUEST": str(out_dir / "request.json")}

    @staticmethod
    def results_path(out_dir: Path, job: Any) -> Path:
        """``results.json`` beside the request (an unsandboxed worker), else the staged copy's output in
        the job's run directory (``outputs-a<attempt>/eval-results.json``)."""
        beside = out_dir / "results.json"
        if beside.is_file() or not getattr(job, "run_dir", None):
            return beside
        return Path(job.run_dir) / f"outputs-a{job.attempt}" / EVAL_RESULTS_FILE

    def finish(self, s: Session, job: Any) -> dict[str, Any]:
        """The evaluation job succeeded: compute the comparison and store it (inside the supervisor's
        transaction); returns the fields to put on the job's result."""
        row = s.scalars(select(EvaluationRow).where(EvaluationRow.job_id == job.id)).first()
        if row is None:
            return {}
        out_dir = Path(row.doc["out_dir"])
        found = self.results_path(out_dir, job)
        res = json.loads(found.read_text())
        if found != out_dir / "results.json":  # kept with the evaluation, beside its request
            (out_dir / "results.json").write_text(json.dumps(res))
        price = float((job.placement.price_usd_per_device_hour if job.placement else 0.0) or 0.0)
        doc = self.document_from_results(row, res, price)
        row.doc = {**row.doc, **doc}
        row.state = "succeeded"
        row.finished_at_s = self.clock()
        summary = {"id": row.id, "baseline": row.baseline, "verdict": doc["verdict"], "passed": doc["passed"]}
        try:
            v = self.registry.resolve_in(s, row.tenant_id, row.model)
            if v.tenant_id == row.tenant_id:
                self.registry.set_evaluation(s, row.tenant_id, row.model, summary)
                if v.source_job:
                    src = JobRepo(s).get(v.source_job)
                    if src is not None and src.result is not None:
                        JobRepo(s).update(src.id, result={**src.result, "evaluation": summary})
        except NotFoundError:
            pass
        return {"evaluation": summary, "model_version": None}

    def document_from_results(
        self, row: EvaluationRow, res: dict[str, Any], price_usd_per_hour: float
    ) -> dict[str, Any]:
        m, b = res["model"], res["baseline"]
        inputs: dict[str, MetricInput] = {
            "loss": MetricInput(m["loss"], b["loss"], higher_is_better=False),
        }
        if "exact_match" in m and "exact_match" in b:
            inputs["exact_match"] = MetricInput(m["exact_match"], b["exact_match"], binary=True)
        for name in METRICS:  # task plug-ins: per-example scores, higher is better
            if name not in inputs and isinstance(m.get(name), list) and isinstance(b.get(name), list):
                inputs[name] = MetricInput(m[name], b[name], higher_is_better=True)
        gate = dict(row.doc.get("gate") or gate_options(None, None, None, None))
        thresholds = dict(row.doc.get("guardrail_thresholds") or {})
        guardrails: list[Guardrail] = []
        lat_m, lat_b = m.get("latency_s_per_token"), b.get("latency_s_per_token")
        if lat_m is not None and lat_b is not None:
            # default: twice the baseline's latency plus 5 ms a token of timing noise, and that latency's
            # cost at this price (a tiny model's few milliseconds a token vary by more than 2x on a busy CPU)
            lat_limit = 2 * lat_b + 0.005
            guardrails.append(
                Guardrail(
                    "latency_s_per_token",
                    float(thresholds.get("latency_s_per_token", lat_limit)),
                    lat_m,
                )
            )
            cost_m = price_usd_per_hour * lat_m / 3600 * 1000
            cost_limit = price_usd_per_hour * lat_limit / 3600 * 1000 + 1e-6
            guardrails.append(
                Guardrail(
                    "cost_usd_per_1k_tokens",
                    float(thresholds.get("cost_usd_per_1k_tokens", cost_limit)),
                    cost_m,
                )
            )
        comp = compare(
            inputs,
            guardrails=guardrails,
            seed=0,
            alpha=float(gate["alpha"]),
            primary=gate["primary_metric"],
            non_inferiority=[NonInferiority(k, float(v)) for k, v in gate["non_inferiority"].items()],
            correction=gate["correction"],
            dataset_guardrails=dataset_guardrails(gate, res),
        )
        metrics = comp.metrics_document()
        lo, hi = comp.metrics["loss"].ci95
        ppl_m, ppl_b = float(m["perplexity"]), float(b["perplexity"])
        bl = float(b["mean_loss"])
        metrics["perplexity"] = {
            "model": ppl_m,
            "baseline": ppl_b,
            "delta": ppl_m - ppl_b,
            "ci95": [_exp(bl + lo) - ppl_b, _exp(bl + hi) - ppl_b],
            "p_value": comp.metrics["loss"].p_value,
            "test": "monotone transform of loss (not tested separately)",
        }
        rows = read_rows(
            Path(json.loads((Path(row.doc["out_dir"]) / "request.json").read_text())["split_path"]),
            limit=res["n"],
        )
        fmt = res["format"]
        deltas = [mi - bi for mi, bi in zip(m["loss"], b["loss"], strict=True)]
        wins, losses = largest_differences(deltas, higher_is_better=False, k=MAX_EXAMPLES_SHOWN)
        examples = []
        for i in [*wins, *losses]:
            prompt, ref = split_example(rows[i], fmt)
            examples.append(
                {
                    "index": i,
                    "input": prompt,
                    "reference": ref,
                    "model_output": (m.get("outputs") or [None] * res["n"])[i],
                    "baseline_output": (b.get("outputs") or [None] * res["n"])[i],
                    "model_loss": m["loss"][i],
                    "baseline_loss": b["loss"][i],
                    "delta_loss": deltas[i],
                    "outcome": "win" if deltas[i] < 0 else "loss",
                }
            )
        return {
            "n": comp.n,
            "metrics": metrics,
            "guardrails": [
                *({"kind": "threshold", **g.to_dict()} for g in comp.guardrails),
                *(_guardrail_doc(g.to_dict(), gate) for g in comp.non_inferiority),
            ],
            "guardrail_datasets": [
                {
                    "dataset": d["dataset"],
                    "split": d["split"],
                    "n": d["n"],
                    "format": d.get("format"),
                    "model": {"mean_loss": d["model"]["mean_loss"], "perplexity": d["model"]["perplexity"]},
                    "baseline": {
                        "mean_loss": d["baseline"]["mean_loss"],
                        "perplexity": d["baseline"]["perplexity"],
                    },
                }
                for d in res.get("guardrail_datasets") or []
            ],
            "verdict": comp.verdict,
            "passed": comp.passed,
            "reasons": comp.reasons,
            "alpha": comp.alpha,
            "min_examples": comp.min_examples,
            "examples": examples,
        }

    # ---- reads ---------------------------------------------------------------------------------------
    def _document(self, s: Session, row: EvaluationRow) -> dict[str, Any]:
        d = row.doc or {}
        state = row.state
        if state == "running" and row.job_id:
            job = JobRepo(s).get(row.job_id)
            if job is not None and job.state.value in ("failed", "cancelled"):
                state = "failed"
        return {
            "id": row.id,
            "model": row.model,
            "baseline": row.baseline,
            "dataset": row.dataset,
            "split": row.split,
            "n": d.get("n"),
            "metrics": d.get("metrics") or {},
            "guardrails": d.get("guardrails") or [],
            "guardrail_datasets": d.get("guardrail_datasets") or [],
            "verdict": d.get("verdict"),
            "passed": bool(d.get("passed", False)),
            "reasons": d.get("reasons") or [],
            "gate": d.get("gate"),
            "examples": d.get("examples") or [],
            "state": state,
            "job_id": row.job_id,
            "auto": bool(d.get("auto", False)),
            "error": d.get("error"),
            "created_at": iso(row.created_at_s),
            "finished_at": iso(row.finished_at_s),
        }

    def get(self, principal: Principal, eval_id: str) -> dict[str, Any]:
        with self.db.session() as s:
            row = s.scalars(
                select(EvaluationRow).where(
                    EvaluationRow.id == eval_id, EvaluationRow.tenant_id == principal.tenant_id
                )
            ).first()
            if row is None:
                raise NotFoundError(
                    f"no evaluation {eval_id!r}", hint="List them with `trainyard eval list`."
                )
            return self._document(s, row)

    def list(
        self, principal: Principal, *, model: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        with self.db.session() as s:
            q = select(EvaluationRow).where(EvaluationRow.tenant_id == principal.tenant_id)
            if model is not None:
                q = q.where(EvaluationRow.model == model)
            rows = s.scalars(q.order_by(EvaluationRow.seq.desc()).limit(max(1, min(limit, 500)))).all()
            return [self._document(s, r) for r in rows]


def _metric_input(scores: dict[str, Any], baseline: dict[str, Any], metric: str) -> MetricInput | None:
    """Per-example scores of one metric for both models (``None`` where it was not measured)."""
    m, b = scores.get(metric), baseline.get(metric)
    if not isinstance(m, list) or not isinstance(b, list):
        return None
    if metric == "loss":
        return MetricInput(m, b, higher_is_better=False)
    if metric == "exact_match":
        return MetricInput(m, b, binary=True)
    return MetricInput(m, b, higher_is_better=BUILTIN_METRICS.get(metric, True))


def dataset_label(dataset: str, split: str) -> str:
    return f"{dataset} ({split} split)"


def _guardrail_doc(doc: dict[str, Any], gate: dict[str, Any]) -> dict[str, Any]:
    """A dataset guardrail's entry names its dataset and split as given (``dataset``, ``split``)."""
    label = doc.get("dataset")
    if label is None:
        return doc
    for g in gate.get("guardrail_datasets") or []:
        if dataset_label(g["dataset"], g["split"]) == label:
            return {**doc, "dataset": g["dataset"], "split": g["split"]}
    return doc


def dataset_guardrails(gate: dict[str, Any], res: dict[str, Any]) -> list[DatasetNonInferiority]:
    """The gate's guardrail datasets with the scores the evaluation job measured on each."""
    scored = {(d["dataset"], d["split"]): d for d in res.get("guardrail_datasets") or []}
    out = []
    for g in gate.get("guardrail_datasets") or []:
        d = scored.get((g["dataset"], g["split"]))
        mi = _metric_input(d["model"], d["baseline"], g["metric"]) if d is not None else None
        out.append(
            DatasetNonInferiority(
                dataset_label(g["dataset"], g["split"]), g["metric"], float(g["margin"]), mi
            )
        )
    return out


def _exp(x: float) -> float:
    return math.exp(min(x, 50.0))
