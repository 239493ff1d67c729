"""`trainyard eval run|get|list`."""

from __future__ import annotations

from typing import Any

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import WIDE_OPTION_HELP, Col, console, handle_errors, print_json, print_table
from trainyard.errors import InvalidInputError

app = typer.Typer(help="Evaluate a model against a baseline (paired statistics).", no_args_is_help=True)


@app.command("run")
@handle_errors
def run(
    model: str = typer.Option(..., "--model", help="NAME@VERSION or NAME@ALIAS to evaluate."),
    baseline: str = typer.Option(None, "--baseline", help="Model to compare with (default: its base)."),
    dataset: str = typer.Option(..., "--dataset", help="ds://NAME@V (or a file:// URL in your storage)."),
    split: str = typer.Option("eval", "--split", help="Split of the dataset version."),
    max_examples: int = typer.Option(None, "--max-examples", min=1, help="Evaluate the first N rows."),
    primary_metric: str = typer.Option(
        None, "--primary-metric", help="Metric that must be significantly better (default: loss)."
    ),
    non_inferiority: list[str] = typer.Option(
        None,
        "--non-inferiority",
        help="METRIC=MARGIN (repeatable): a guardrail metric that must be non-inferior within MARGIN, "
        "in the metric's units (e.g. exact_match=0.02).",
    ),
    alpha: float = typer.Option(None, "--alpha", min=0.0, max=0.5, help="Significance level (default 0.05)."),
    correction: str = typer.Option(
        None, "--correction", help="Correction across guardrails: holm (default) or none."
    ),
    guardrail_dataset: list[str] = typer.Option(
        None,
        "--guardrail-dataset",
        help="DATASET[#SPLIT]:METRIC=MARGIN (repeatable): also run both models on that dataset's split "
        "(default eval); the metric must be non-inferior there within MARGIN "
        "(e.g. ds://safety@2:loss=0.05, ds://safety@2#train:exact_match=0.02).",
    ),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait for the result."),
    timeout_s: float = typer.Option(3600.0, "--timeout-s", help="Give up waiting after this long."),
    as_json: bool = typer.Option(False, "--json", help="Print the evaluation document as JSON."),
) -> None:
    """Run an evaluation as a job; the result carries the verdict and the gate."""
    margins = _margins(non_inferiority or [])
    guarded = _guardrail_datasets(guardrail_dataset or [])
    with client() as c:
        doc = c.run_evaluation(
            model=model,
            baseline=baseline,
            dataset=dataset,
            split=split,
            max_examples=max_examples,
            primary_metric=primary_metric,
            non_inferiority=margins or None,
            alpha=alpha,
            correction=correction,
            guardrail_datasets=guarded or None,
        )
        if wait:
            doc = c.wait_evaluation(doc["id"], timeout_s=timeout_s)
    if as_json:
        print_json(doc)
        return
    _print(doc)


def _margins(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            margin = float(value)
        except ValueError:
            margin = float("nan")
        if not sep or not name.strip() or not margin > 0:
            raise InvalidInputError(
                f"--non-inferiority {item!r}: expected METRIC=MARGIN with a positive margin",
                hint="For example --non-inferiority exact_match=0.02 (the margin is in the metric's units).",
                details={"errors": [{"field": "non_inferiority", "message": "expected METRIC=MARGIN"}]},
            )
        out[name.strip()] = margin
    return out


def _guardrail_datasets(items: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in items:
        where, sep, rule = item.rpartition(":")
        dataset, _, split = where.partition("#")
        metric, eq, value = rule.partition("=")
        try:
            margin = float(value)
        except ValueError:
            margin = float("nan")
        if not sep or not dataset.strip() or not eq or not metric.strip() or not margin > 0:
            raise InvalidInputError(
                f"--guardrail-dataset {item!r}: expected DATASET[#SPLIT]:METRIC=MARGIN, a positive margin",
                hint="For example --guardrail-dataset ds://safety@2:loss=0.05 (the margin is in the metric's "
                "units; #train picks another split than eval).",
                details={
                    "errors": [
                        {"field": "guardrail_datasets", "message": "expected DATASET[#SPLIT]:METRIC=MARGIN"}
                    ]
                },
            )
        out.append(
            {
                "dataset": dataset.strip(),
                "split": split.strip() or "eval",
                "metric": metric.strip(),
                "margin": margin,
            }
        )
    return out


@app.command("get")
@handle_errors
def get(
    eval_id: str = typer.Argument(..., help="Evaluation id."),
    as_json: bool = typer.Option(False, "--json", help="Print the evaluation document as JSON."),
) -> None:
    """Show one evaluation."""
    with client() as c:
        doc = c.get_evaluation(eval_id)
    if as_json:
        print_json(doc)
        return
    _print(doc)


@app.command("list")
@handle_errors
def list_(
    model: str = typer.Option(None, "--model", help="Only evaluations of this model version."),
    wide: bool = typer.Option(False, "--wide", "-w", help=WIDE_OPTION_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print {evaluations} as JSON."),
) -> None:
    """List evaluations, newest first."""
    with client() as c:
        doc = c.list_evaluations(model=model)
    if as_json:
        print_json(doc)
        return
    cols = (
        Col("ID", key=True),
        Col("MODEL", key=True),
        Col("BASELINE", key=True, priority=2),
        Col("DATASET", key=True, priority=1),
        Col("STATE"),
        Col("VERDICT", priority=3),
        Col("PASSED"),
    )
    rows = [
        [
            e["id"],
            e["model"],
            e["baseline"],
            e["dataset"],
            e["state"],
            e.get("verdict") or "-",
            "yes" if e.get("passed") else "no",
        ]
        for e in doc["evaluations"]
    ]
    print_table(cols, rows, wide=wide)


def _print(doc: dict[str, Any]) -> None:
    console.print(
        f"[bold]{doc['id']}[/] {doc['model']} vs {doc['baseline']} on {doc['dataset']} ({doc['split']}): "
        f"{doc['state']}, verdict [bold]{doc.get('verdict') or '-'}[/], passed {doc.get('passed')}"
    )
    for name, m in (doc.get("metrics") or {}).items():
        console.print(
            f"  {name}: model {m['model']:.4g} baseline {m['baseline']:.4g} delta {m['delta']:+.4g} "
            f"ci95 [{m['ci95'][0]:+.4g}, {m['ci95'][1]:+.4g}] p {m['p_value']:.3g} ({m['test']})"
        )
    for g in doc.get("guardrails") or []:
        if g.get("kind") == "non_inferiority":
            where = f" on {g['dataset']} ({g.get('split', 'eval')})" if g.get("dataset") else ""
            console.print(
                f"  non-inferiority {g['name']}{where} (margin {g['margin']:g}): bound {g['value']:+.4g} "
                f"vs {g['threshold']:+.4g}, p {g['p_adjusted']:.3g} ({g['test']}) {g['passed']}"
            )
        else:
            console.print(
                f"  guardrail {g['name']}: {g['value']:.4g} (limit {g['threshold']:.4g}) {g['passed']}"
            )
    for reason in doc.get("reasons") or []:
        console.print(f"  - {reason}")
