"""`trainyard spec validate|schema`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from trainyard.cli.common import console, error_document, handle_errors, print_error, print_json
from trainyard.errors import SpecError
from trainyard.spec import JobSpec, load_spec

app = typer.Typer(help="Validate job specs and print their JSON Schema.", no_args_is_help=True)


@app.command("validate")
@handle_errors
def validate(
    path: Path = typer.Argument(..., help="Job spec (YAML or JSON)."),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print {valid: true, spec, derived}, or {valid: false, error: {code, message, hint, details}}.",
    ),
) -> None:
    """Check a job spec (every problem is listed) and show what trainyard derived from it."""
    try:
        spec = load_spec(path)
    except SpecError as exc:
        if as_json:
            print_json({"valid": False, **error_document(exc)})
        print_error(exc)
        raise SystemExit(exc.exit_code) from None
    derived = {
        "params": spec.params,
        "active_params": spec.model.active_params,
        "trainable_params": spec.trainable_params,
        "tokens_per_step": spec.tokens_per_step,
        "total_steps": spec.workload.total_steps()
        if spec.workload.epochs is None or spec.workload.dataset_tokens
        else None,
    }
    if as_json:
        print_json({"valid": True, "spec": spec.to_document(), "derived": derived})
        return
    console.print(f"[green]valid[/] {path}: {spec.name}")
    console.print(
        f"  parameters {spec.params / 1e9:.3f} B (trainable {spec.trainable_params / 1e9:.4f} B), "
        f"{spec.tokens_per_step:,} tokens/step"
        + (f", {derived['total_steps']:,} steps" if derived["total_steps"] else "")
    )


@app.command("schema")
def schema(
    as_json: bool = typer.Option(
        False, "--json", help="Print the schema as one compact JSON document (the default is indented)."
    ),
) -> None:
    """Print the JSON Schema of trainyard/v1 TrainingJob (for editors and validators)."""
    doc = JobSpec.model_json_schema(by_alias=True)
    doc["$id"] = "https://trainyard.dev/schemas/trainyard-v1-trainingjob.json"
    doc["title"] = "trainyard/v1 TrainingJob"
    print(json.dumps(doc, indent=None if as_json else 2))
