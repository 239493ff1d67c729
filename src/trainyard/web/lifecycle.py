"""What the lifecycle pages show: datasets, model versions (paged), aliases and lineage, evaluations,
deployments and usage against budgets. Read-only, built on the same services as the API and scoped to
the logged-in tenant: another tenant's resource is not found, exactly as in the API."""

from __future__ import annotations

import math
import statistics
from typing import Any

from sqlalchemy import func, or_, select

from trainyard.errors import InvalidInputError, NotFoundError, TrainyardError
from trainyard.services.domain import Principal, iso
from trainyard.store.registry_models import ModelAliasRow, ModelVersionRow
from trainyard.store.serving_models import ServingRequestRow
from trainyard.web import charts
from trainyard.web.events import describe

MODELS_PAGE = 50
SAMPLE_ROWS = 5
MAX_OFFSET = 10_000_000
REQUEST_WINDOW = 5000  # the newest serving requests a deployment page summarises


def page_offset(value: str | None) -> int:
    if value in (None, ""):
        return 0
    if not value.isdigit() or int(value) > MAX_OFFSET:
        raise InvalidInputError(
            f"offset {value[:20]!r} is not a page offset",
            details={"errors": [{"field": "offset", "message": "a whole number ≥ 0"}]},
        )
    return int(value)


# ---- datasets ------------------------------------------------------------------------------------
def datasets_view(platform: Any, principal: Principal) -> list[dict[str, Any]]:
    """The tenant's datasets, one entry per name with its versions (newest first)."""
    by_name: dict[str, list[Any]] = {}
    for v in platform.datasets.list(principal):
        by_name.setdefault(v.name, []).append(v)
    return [
        {"name": name, "latest": versions[0], "versions": versions}
        for name, versions in sorted(by_name.items())
    ]


def dataset_view(platform: Any, principal: Principal, ref: str) -> dict[str, Any]:
    ref = ref if ref.startswith("ds://") else f"ds://{ref}"
    v = platform.datasets.get(principal, ref)
    samples = {}
    for split in ("train", "eval"):
        try:
            rows = platform.datasets.rows(principal, v.id, split=split, limit=SAMPLE_ROWS)["rows"]
            samples[split] = [row_parts(r) for r in rows]
        except (OSError, TrainyardError):
            samples[split] = []
    versions = platform.datasets.list(principal, name=v.name)
    trained = trained_on(platform, principal, v.id)
    lines = int(v.stats.get("lines") or v.rows + v.duplicates_removed)
    report = [
        ("lines read", lines),
        ("rows kept", v.rows),
        ("exact duplicates removed", v.duplicates_removed),
        ("near-duplicates kept on the train side", int(v.stats.get("near_duplicates_kept_in_train") or 0)),
        ("format", v.format),
        ("tokenizer", v.tokenizer),
        ("held-out fraction", v.eval_fraction),
        ("split seed", v.seed),
    ]
    split_bars = charts.bars(
        "split-sizes",
        title="Rows per split",
        unit="rows",
        values=[("train", float(v.train.rows)), ("eval", float(v.eval.rows))],
    )
    return {
        "v": v,
        "doc": v.to_document(),
        "report": report,
        "samples": samples,
        "versions": versions,
        "models": trained,
        "split_chart": split_bars,
    }


def row_parts(row: Any) -> list[tuple[str, str]]:
    """A canonical dataset row as (label, text) parts: chat turns by role, prompt and completion, or
    the text; anything else as its fields."""
    if not isinstance(row, dict):
        return [("row", str(row))]
    if isinstance(row.get("messages"), list):
        return [
            (str(m.get("role", "?")), str(m.get("content", "")))
            for m in row["messages"]
            if isinstance(m, dict)
        ]
    if "prompt" in row or "completion" in row:
        return [("prompt", str(row.get("prompt", ""))), ("completion", str(row.get("completion", "")))]
    if "text" in row:
        return [("text", str(row["text"]))]
    return [(str(k), str(v)) for k, v in sorted(row.items())]


MAX_LINEAGE_ROWS = 100


def trained_on(platform: Any, principal: Principal, dataset_id: str) -> list[str]:
    """The tenant's model versions trained on ``dataset_id``, newest first (reads three columns)."""
    with platform.db.session() as s:
        rows = s.execute(
            select(ModelVersionRow.name, ModelVersionRow.version, ModelVersionRow.datasets)
            .where(ModelVersionRow.tenant_id == principal.tenant_id)
            .order_by(ModelVersionRow.seq.desc())
        )
        out = [f"{n}@{v}" for n, v, ds in rows if dataset_id in (ds or [])]
    return out[:MAX_LINEAGE_ROWS]


def children_of(platform: Any, principal: Principal, model_id: str) -> list[str]:
    """Versions the tenant can see that were fine-tuned from ``model_id``."""
    with platform.db.session() as s:
        rows = s.execute(
            select(ModelVersionRow.name, ModelVersionRow.version)
            .where(_visible(principal), ModelVersionRow.base == model_id)
            .order_by(ModelVersionRow.seq.desc())
            .limit(MAX_LINEAGE_ROWS)
        )
        return [f"{n}@{v}" for n, v in rows]


# ---- models --------------------------------------------------------------------------------------
def _visible(principal: Principal) -> Any:
    return or_(ModelVersionRow.tenant_id == principal.tenant_id, ModelVersionRow.public.is_(True))


def _aliases_of(s: Any, rows: list[ModelVersionRow]) -> dict[tuple[str, str, int], list[str]]:
    keys = {(r.tenant_id, r.name) for r in rows}
    if not keys:
        return {}
    q = select(ModelAliasRow.tenant_id, ModelAliasRow.name, ModelAliasRow.version, ModelAliasRow.alias).where(
        ModelAliasRow.tenant_id.in_({k[0] for k in keys}), ModelAliasRow.name.in_({k[1] for k in keys})
    )
    out: dict[tuple[str, str, int], list[str]] = {}
    for tenant_id, name, version, alias in s.execute(q):
        out.setdefault((tenant_id, name, version), []).append(alias)
    return out


def _model_row(r: ModelVersionRow, aliases: list[str]) -> dict[str, Any]:
    return {
        "id": f"{r.name}@{r.version}",
        "name": r.name,
        "version": r.version,
        "kind": r.kind,
        "public": r.public,
        "base": r.base,
        "source_job": r.source_job,
        "datasets": list(r.datasets or []),
        "aliases": sorted(aliases),
        "created_at": iso(r.created_at_s),
        "evaluation": ((r.doc or {}).get("evaluation") or {}).get("verdict")
        if isinstance((r.doc or {}).get("evaluation"), dict)
        else None,
    }


def models_page(
    platform: Any, principal: Principal, *, name: str | None, offset: int, limit: int = MODELS_PAGE
) -> dict[str, Any]:
    """One page of the model versions the tenant can see (its own and public bases), newest first,
    with their aliases: two indexed queries whatever the number of versions."""
    with platform.db.session() as s:
        cond = [_visible(principal)]
        if name:
            cond.append(ModelVersionRow.name == name)
        total = int(s.scalar(select(func.count()).select_from(ModelVersionRow).where(*cond)) or 0)
        rows = list(
            s.scalars(
                select(ModelVersionRow)
                .where(*cond)
                .order_by(ModelVersionRow.seq.desc())
                .offset(offset)
                .limit(limit)
            )
        )
        aliases = _aliases_of(s, rows)
        items = [_model_row(r, aliases.get((r.tenant_id, r.name, r.version), [])) for r in rows]
    return {
        "rows": items,
        "total": total,
        "offset": offset,
        "limit": limit,
        "next_offset": offset + limit if offset + limit < total else None,
        "prev_offset": max(0, offset - limit) if offset > 0 else None,
        "name_filter": name,
    }


def model_view(platform: Any, principal: Principal, ref: str, *, offset: int) -> dict[str, Any]:
    """One version: its document, the other versions of its name (paged), its aliases with their
    history, and its lineage from the datasets it was trained on to the deployments serving it."""
    v = platform.registry.get(principal, ref)
    doc = v.document()
    versions = models_page(platform, principal, name=v.name, offset=offset, limit=20)
    try:
        aliases = platform.registry.aliases(principal, v.name)
    except NotFoundError:
        aliases = {"aliases": {}, "history": []}
    children = children_of(platform, principal, v.id)
    evaluations = platform.evaluations.list(principal, model=v.id, limit=20)
    deployments = []
    for row in platform.serving.list(principal.tenant_id):
        served = [
            r
            for r in row.routes
            if (row.resolved or {}).get(r.get("model")) == v.id or r.get("model") == v.id
        ]
        if served:
            deployments.append(
                {
                    "name": row.name,
                    "state": row.state,
                    "routes": [
                        {"model": r.get("model"), "weight": r.get("weight"), "shadow": bool(r.get("shadow"))}
                        for r in served
                    ],
                }
            )
    lineage = {
        "datasets": list(v.datasets),
        "source_job": v.source_job,
        "base": v.base,
        "model": v.id,
        "children": children,
        "evaluations": [
            {"id": e["id"], "baseline": e["baseline"], "verdict": e["verdict"]} for e in evaluations
        ],
        "deployments": deployments,
    }
    passing = [e["id"] for e in evaluations if e.get("passed")]
    return {
        "v": v,
        "doc": doc,
        "versions": versions,
        "aliases": aliases["aliases"],
        "history": list(reversed(aliases["history"])),
        "lineage": lineage,
        "passing_evaluations": passing,
        "own": v.tenant_id == principal.tenant_id,
    }


# ---- evaluations ---------------------------------------------------------------------------------
def evaluations_view(platform: Any, principal: Principal, *, model: str | None) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = platform.evaluations.list(principal, model=model or None, limit=200)
    return docs


def _outcome(m: dict[str, Any], name: str) -> str:
    lo, hi = (m.get("ci95") or [None, None])[:2]
    if not isinstance(lo, int | float) or not isinstance(hi, int | float):
        return "inconclusive"
    lower_is_better = name in ("loss", "perplexity") or name.endswith("latency_s") or "loss" in name
    if hi < 0:
        return "better" if lower_is_better else "worse"
    if lo > 0:
        return "worse" if lower_is_better else "better"
    return "inconclusive"


def _relative(m: dict[str, Any]) -> tuple[str, float, float | None, float | None, str] | None:
    """A metric's delta and interval in % of the baseline (so metrics of any scale share one axis);
    None when the baseline is 0 or missing."""
    base, delta = m.get("baseline"), m.get("delta")
    if not isinstance(base, int | float) or not isinstance(delta, int | float) or base == 0:
        return None
    ci = m.get("ci95") or [None, None]
    scale = 100.0 / abs(float(base))

    def rel(v: Any) -> float | None:
        return float(v) * scale if isinstance(v, int | float) else None

    return (str(m["name"]), float(delta) * scale, rel(ci[0]), rel(ci[1]), str(m["outcome"]))


def evaluation_view(platform: Any, principal: Principal, eval_id: str) -> dict[str, Any]:
    if not eval_id or len(eval_id) > 40:
        raise NotFoundError(f"no evaluation {eval_id[:40]!r}")
    doc = platform.evaluations.get(principal, eval_id)
    metrics = []
    for name, m in sorted((doc.get("metrics") or {}).items()):
        if not isinstance(m, dict):
            continue
        metrics.append({"name": name, **m, "outcome": _outcome(m, name)})
    chart = charts.intervals(
        "metric-deltas",
        title="Model vs baseline: change in % of the baseline, with 95 % intervals",
        unit="%",
        rows=[r for r in (_relative(m) for m in metrics) if r is not None],
    )
    examples = doc.get("examples") or []
    wins = [e for e in examples if e.get("outcome") == "win"]
    losses = [e for e in examples if e.get("outcome") == "loss"]
    return {"doc": doc, "metrics": metrics, "chart": chart, "wins": wins, "losses": losses}


# ---- deployments ---------------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
    return values[k]


def request_stats(platform: Any, principal: Principal, deployment: str) -> list[dict[str, Any]]:
    """Per served version: requests, errors, latency p50/p95, tokens, over the newest requests."""
    with platform.db.session() as s:
        rows = s.execute(
            select(
                ServingRequestRow.model_version,
                ServingRequestRow.route,
                ServingRequestRow.status,
                ServingRequestRow.latency_s,
                ServingRequestRow.prompt_tokens,
                ServingRequestRow.completion_tokens,
            )
            .where(
                ServingRequestRow.tenant_id == principal.tenant_id,
                ServingRequestRow.deployment == deployment,
            )
            .order_by(ServingRequestRow.id.desc())
            .limit(REQUEST_WINDOW)
        ).all()
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for version, route, status, latency, pt, ct in rows:
        g = groups.setdefault(
            (version, route),
            {"version": version, "route": route, "requests": 0, "errors": 0, "latencies": [], "tokens": 0},
        )
        g["requests"] += 1
        g["errors"] += 1 if status >= 400 else 0
        g["latencies"].append(float(latency))
        g["tokens"] += int(pt) + int(ct)
    out = []
    for g in groups.values():
        lat = g.pop("latencies")
        g["latency_p50_s"] = statistics.median(lat) if lat else None
        g["latency_p95_s"] = _pct(lat, 0.95)
        g["error_rate"] = g["errors"] / g["requests"] if g["requests"] else None
        out.append(g)
    return sorted(out, key=lambda g: (g["route"], g["version"]))


def deployments_view(platform: Any, principal: Principal, openai_url: str) -> list[dict[str, Any]]:
    from trainyard.serving.service import deployment_document

    svc = platform.serving
    return [deployment_document(svc, r, openai_url) for r in svc.list(principal.tenant_id)]


def deployment_view(platform: Any, principal: Principal, name: str, openai_url: str) -> dict[str, Any]:
    from trainyard.serving.service import deployment_document

    if not name or len(name) > 63:
        raise NotFoundError(f"no deployment named {name[:63]!r}")
    svc = platform.serving
    row = svc.get(principal.tenant_id, name)  # NotFoundError for another tenant's
    doc = deployment_document(svc, row, openai_url)
    stats = request_stats(platform, principal, row.name)
    try:
        usage = platform.governance.usage(principal, by="deployment")
        cost = next((r for r in usage["rows"] if r["group"] == row.name), None)
    except TrainyardError:
        cost = None
    events = [describe(e.id, e.kind, e.data, e.time_s) for e in reversed(svc.events(row.id, limit=100))]
    rollbacks = [e for e in events if e.kind == "canary_rolled_back"]
    weights = charts.bars(
        "route-weights",
        title="Traffic weights",
        unit="weight",
        values=[(r["model"], float(r["weight"])) for r in doc["routes"] if not r.get("shadow")],
    )
    return {
        "doc": doc,
        "stats": stats,
        "cost": cost,
        "events": events,
        "rollbacks": rollbacks,
        "weights_chart": weights,
    }


def parse_traffic_form(form: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Routes from the traffic form: repeated ``model``/``weight`` fields, ``shadow`` naming the
    models that are shadows, ``canary`` the canary; a row with an empty model is skipped. Every bad
    weight is reported at once."""
    models = form.get("model", [])
    weights = form.get("weight", [])
    shadows = set(form.get("shadow", []))
    canary = set(form.get("canary", []))
    routes, errors = [], []
    for i, model in enumerate(models):
        model = model.strip()
        if not model:
            continue
        raw = weights[i].strip() if i < len(weights) else "0"
        try:
            weight = float(raw or "0")
            if not math.isfinite(weight) or weight < 0:
                raise ValueError
        except ValueError:
            errors.append({"field": f"routes[{i}].weight", "message": f"{raw[:20]!r} is not a weight ≥ 0"})
            continue
        routes.append(
            {"model": model, "weight": weight, "shadow": model in shadows, "canary": model in canary}
        )
    if not routes and not errors:
        errors.append({"field": "routes", "message": "name at least one model"})
    if errors:
        raise InvalidInputError(f"{errors[0]['field']}: {errors[0]['message']}", details={"errors": errors})
    return routes


# ---- usage ---------------------------------------------------------------------------------------
def usage_view(platform: Any, principal: Principal, *, tag: str | None) -> dict[str, Any]:
    gov = platform.governance
    budgets = gov.list_budgets(principal, principal.tenant_name)
    invoice = gov.invoice(principal)
    daily = gov.usage(principal, by="day", tenant_name=principal.tenant_name)
    by_kind = gov.usage(principal, by="kind", tenant_name=principal.tenant_name)
    tag_keys = sorted(invoice.get("by_tag") or {})
    tag = tag if tag in tag_keys else (tag_keys[0] if tag_keys else None)
    by_tag = gov.usage(principal, by=f"tag:{tag}", tenant_name=principal.tenant_name)["rows"] if tag else []
    day_chart = charts.line(
        "spend-by-day",
        title="Spend per day",
        x_label="day",
        y_label="USD",
        y_unit="USD",
        series=[("spend", [(_day_s(r["group"]), r["usd"]) for r in daily["rows"] if r["group"] != "(none)"])],
    )
    tag_chart = charts.bars(
        "cost-by-tag",
        title=f"Cost by tag {tag}" if tag else "Cost by tag",
        unit="USD",
        values=[(r["group"], r["usd"]) for r in by_tag],
    )
    return {
        "budgets": budgets,
        "invoice": invoice,
        "by_kind": by_kind["rows"],
        "tag": tag,
        "tag_keys": tag_keys,
        "by_tag": by_tag,
        "day_chart": day_chart,
        "tag_chart": tag_chart,
    }


def _day_s(day: str) -> float:
    from datetime import UTC, datetime

    try:
        return datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return math.nan
