"""`trainyard eval run|get|list`."""

from __future__ import annotations

import typer

from trainyard.api_models import EvaluationDoc
from trainyard.cli._remote import client
from trainyard.cli.common import WIDE_OPTION_HELP, Col, console, handle_errors, print_json, print_table

app = typer.Typer(help="Evaluate a model against a baseline (paired statistics).", no_args_is_help=True)


@app.command("run")
@handle_errors
def run(
    model: str = typer.Option(..., "--model", help="NAME@VERSION or NAME@ALIAS to evaluate."),
    baseline: str = typer.Option(None, "--baseline", help="Model to compare with (default: its base)."),
    dataset: str = typer.Option(..., "--dataset", help="ds://NAME@V (or a file:// URL in your storage)."),
    split: str = typer.Option("eval", "--split", help="Split of the dataset version."),
    max_examples: int = typer.Option(None, "--max-examples", min=1, help="Evaluate the first N rows."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait for the result."),
    timeout_s: float = typer.Option(3600.0, "--timeout-s", help="Give up waiting after this long."),
    as_json: bool = typer.Option(False, "--json", help="Print the evaluation document as JSON."),
) -> None:
    """Run an evaluation as a job; the result carries the verdict and the gate."""
    with client() as c:
        doc = c.run_evaluation(
            model=model, baseline=baseline, dataset=dataset, split=split, max_examples=max_examples
        )
        if wait:
            doc = c.wait_evaluation(doc["id"], timeout_s=timeout_s)
    if as_json:
        print_json(doc)
        return
    _print(doc)


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


def _print(doc: EvaluationDoc) -> None:
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
        console.print(f"  guardrail {g['name']}: {g['value']:.4g} (limit {g['threshold']:.4g}) {g['passed']}")
