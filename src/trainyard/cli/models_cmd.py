"""`trainyard models import|list|get|promote|aliases|lineage`."""

from __future__ import annotations

from pathlib import Path

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import WIDE_OPTION_HELP, Col, console, handle_errors, print_json, print_table

app = typer.Typer(help="Model registry: versions, lineage, aliases and promotion.", no_args_is_help=True)


@app.command("import")
@handle_errors
def import_model(
    directory: Path = typer.Argument(
        ..., help="A Hugging Face model directory (config, safetensors, tokenizer)."
    ),
    name: str = typer.Option(..., "--name", help="Model name; versions are numbered NAME@1, NAME@2 ..."),
    public: bool = typer.Option(False, "--public", help="Admin: every tenant may fine-tune from it."),
    as_json: bool = typer.Option(False, "--json", help="Print the model document as JSON."),
) -> None:
    """Upload and import a base model (verified and hashed)."""
    with client() as c:
        doc = c.import_model(directory, name, public=public)
    if as_json:
        print_json(doc)
        return
    console.print(f"imported [bold]{doc['id']}[/] sha256 {doc['sha256']}", soft_wrap=True)


@app.command("list")
@handle_errors
def list_models(
    name: str = typer.Option(None, "--name", help="Only versions of this model."),
    dataset: str = typer.Option(None, "--dataset", help="Only versions trained on this dataset."),
    wide: bool = typer.Option(False, "--wide", "-w", help=WIDE_OPTION_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print {models} as JSON."),
) -> None:
    """List model versions: yours and the public base models."""
    with client() as c:
        doc = c.list_models(name=name, dataset=dataset)
    if as_json:
        print_json(doc)
        return
    cols = (
        Col("ID", key=True),
        Col("KIND", priority=2),
        Col("BASE", key=True, priority=1),
        Col("ALIASES"),
        Col("SOURCE JOB", key=True, priority=3),
        Col("CREATED", priority=4),
    )
    rows = [
        [
            m["id"],
            m["kind"] + (" (public)" if m.get("public") else ""),
            m.get("base") or "-",
            ",".join(m.get("aliases") or []) or "-",
            m.get("source_job") or "-",
            str(m.get("created_at") or "")[:19].replace("T", " "),
        ]
        for m in doc["models"]
    ]
    print_table(cols, rows, wide=wide)


@app.command("get")
@handle_errors
def get_model(
    ref: str = typer.Argument(..., help="NAME@VERSION or NAME@ALIAS."),
    as_json: bool = typer.Option(False, "--json", help="Print the model document as JSON."),
) -> None:
    """Show one model version with its lineage."""
    with client() as c:
        doc = c.get_model(ref)
    if as_json:
        print_json(doc)
        return
    console.print(f"[bold]{doc['id']}[/] ({doc['kind']}) sha256 {doc['sha256']}")
    for k in ("base", "source_job", "datasets", "aliases", "evaluation", "created_at"):
        console.print(f"  {k}: {doc.get(k)}")


@app.command("lineage")
@handle_errors
def lineage(
    ref: str = typer.Argument(..., help="NAME@VERSION or NAME@ALIAS."),
    as_json: bool = typer.Option(False, "--json", help="Print the lineage as JSON."),
) -> None:
    """A version's base, datasets, source job, evaluations and the versions made from it."""
    with client() as c:
        doc = c.model_lineage(ref)
    if as_json:
        print_json(doc)
        return
    for k, v in doc.items():
        console.print(f"{k}: {v}")


@app.command("promote")
@handle_errors
def promote(
    ref: str = typer.Argument(..., help="NAME@VERSION to point the alias at."),
    alias: str = typer.Option(..., "--alias", help="staging, production or any alias."),
    force: bool = typer.Option(False, "--force", help="Admin: skip the evaluation gate (needs --reason)."),
    reason: str = typer.Option("", "--reason", help="Why; kept in the alias history."),
    evaluation: str = typer.Option(None, "--evaluation", help="The evaluation that justifies the move."),
    as_json: bool = typer.Option(False, "--json", help="Print the model document as JSON."),
) -> None:
    """Move an alias; `production` needs a passing evaluation (exit 4, promotion_blocked, otherwise)."""
    with client() as c:
        doc = c.promote_model(ref, alias, force=force, reason=reason, evaluation=evaluation)
    if as_json:
        print_json(doc)
        return
    p = doc["promotion"]
    console.print(f"{alias}: {p['from'] or '-'} -> {p['to']}" + (" (forced)" if p["forced"] else ""))


@app.command("aliases")
@handle_errors
def aliases(
    name: str = typer.Argument(..., help="Model name."),
    as_json: bool = typer.Option(False, "--json", help="Print {name, aliases, history} as JSON."),
) -> None:
    """Current aliases and the append-only history of every move."""
    with client() as c:
        doc = c.model_aliases(name)
    if as_json:
        print_json(doc)
        return
    for a, v in doc["aliases"].items():
        console.print(f"{a} -> {v}")
    cols = (
        Col("AT", priority=3),
        Col("ALIAS", key=True),
        Col("FROM", key=True),
        Col("TO", key=True),
        Col("BY", priority=2),
        Col("EVALUATION", key=True, priority=1),
        Col("FORCED", priority=4),
        Col("REASON", priority=5),
    )
    rows = [
        [
            h["at"],
            h["alias"],
            h["from"] or "-",
            h["to"],
            h["actor"],
            h["evaluation"] or "-",
            "yes" if h["forced"] else "",
            h["reason"],
        ]
        for h in doc["history"]
    ]
    print_table(cols, rows)
