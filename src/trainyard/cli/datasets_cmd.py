"""`trainyard datasets upload|list|get|rows|cost`: immutable, content-addressed dataset versions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import (
    WIDE_OPTION_HELP,
    Col,
    console,
    err_console,
    handle_errors,
    number,
    print_json,
    print_table,
)
from trainyard.errors import InvalidInputError, TrainyardError

app = typer.Typer(
    help="Upload, validate and read dataset versions.", no_args_is_help=True, add_completion=False
)

PROGRESS_MIN_BYTES = 4 << 20  # smaller uploads finish before a bar is worth drawing


def upload_file(
    path: Path,
    *,
    name: str,
    format: str = "auto",
    eval_fraction: float = 0.1,
    seed: int = 0,
    base: str | None = None,
    max_tokens: int | None = None,
    derived_from: str | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Upload one local file (with a progress bar on stderr for large files); also used by `submit`."""
    if not path.is_file():
        raise InvalidInputError(
            f"{path} is not a file", details={"errors": [{"field": "file", "message": "no such file"}]}
        )
    size = path.stat().st_size
    with client() as c:
        if not show_progress or size < PROGRESS_MIN_BYTES:
            return c.upload_dataset(
                path,
                name=name,
                format=format,
                eval_fraction=eval_fraction,
                seed=seed,
                base=base,
                max_tokens=max_tokens,
                derived_from=derived_from,
            )
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        with Progress(
            TextColumn("uploading {task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
        ) as bar:
            task = bar.add_task(path.name, total=size)
            doc = c.upload_dataset(
                path,
                name=name,
                format=format,
                eval_fraction=eval_fraction,
                seed=seed,
                base=base,
                max_tokens=max_tokens,
                derived_from=derived_from,
                progress=lambda n: bar.advance(task, n),
            )
        return doc


def _summary(doc: dict[str, Any]) -> None:
    sp = doc.get("splits") or {}
    tr, ev = sp.get("train") or {}, sp.get("eval") or {}
    console.print(
        f"[green]{doc['id']}[/] {doc['format']}: {doc['rows']} rows "
        f"(train {tr.get('rows')}, eval {ev.get('rows')}; {doc.get('duplicates_removed', 0)} duplicates "
        f"removed), sha256 {doc['sha256']}",
        soft_wrap=True,
    )
    if doc.get("derived_from"):
        console.print(f"  derived from {doc['derived_from']}", highlight=False)


def _epoch_line(doc: dict[str, Any]) -> None:
    """For a version counted with a base model's tokenizer: what an epoch costs (`datasets cost`)."""
    if doc.get("tokenizer") in (None, "bytes"):
        return
    try:
        with client() as c:
            est = c.dataset_epoch_cost(doc["id"])
    except TrainyardError as exc:
        console.print(f"  cost per epoch: not estimated ({exc.message})", highlight=False, soft_wrap=True)
        return
    console.print(f"  {_epoch_text(est)}", highlight=False, soft_wrap=True)


def _epoch_text(doc: dict[str, Any]) -> str:
    p = doc["placement"]
    where = p.get("pool") or p.get("instance_type") or p.get("region")
    return (
        f"{doc['model']}: {number(doc['steps_per_epoch'])} steps per epoch × {doc['step_time_s']:.3g} s on "
        f"{p['devices']}× {p['accelerator']} ({p['market']}, {where}) at ${doc['usd_per_hour']:.2f}/h ≈ "
        f"${doc['usd_per_epoch']:.4g} per epoch ({doc['hours_per_epoch']:.3g} h; seq_len {doc['seq_len']}, "
        f"global batch {doc['global_batch']})"
    )


@app.command("upload")
@handle_errors
def upload(
    file: Path = typer.Argument(..., help="JSON Lines file (text, completion or chat rows)."),
    name: str = typer.Option(..., "--name", help="Dataset name."),
    format: str = typer.Option("auto", "--format", help="auto | text | completion | chat"),
    eval_fraction: float = typer.Option(0.1, "--eval-fraction", min=0, max=0.99, help="Held-out share."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the held-out split."),
    base: str = typer.Option(None, "--base", help="Base model NAME@V whose tokenizer counts tokens."),
    max_tokens: int = typer.Option(None, "--max-tokens", min=1, help="Reject rows longer than this."),
    derived_from: str = typer.Option(None, "--derived-from", help="The version this one was made from."),
    as_json: bool = typer.Option(False, "--json", help="Print the version document as JSON."),
) -> None:
    """Validate a file and store it as an immutable dataset version."""
    doc = upload_file(
        file,
        name=name,
        format=format,
        eval_fraction=eval_fraction,
        seed=seed,
        base=base,
        max_tokens=max_tokens,
        derived_from=derived_from,
        show_progress=True,
    )
    if as_json:
        print_json(doc)
    else:
        _summary(doc)
        _epoch_line(doc)


@app.command("list")
@handle_errors
def list_(
    name: str = typer.Option(None, "--name", help="Only versions of this dataset."),
    wide: bool = typer.Option(False, "--wide", "-w", help=WIDE_OPTION_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print {datasets: [...]} as JSON."),
) -> None:
    """The tenant's dataset versions."""
    with client() as c:
        doc = c.list_datasets(name=name)
    if as_json:
        print_json(doc)
        return
    if not doc["datasets"]:
        console.print("no datasets yet: trainyard datasets upload FILE --name NAME")
        return
    cols = (
        Col("ID", key=True),
        Col("FORMAT"),
        Col("ROWS", justify="right"),
        Col("TRAIN", justify="right", priority=2),
        Col("EVAL", justify="right", priority=2),
        Col("DUPLICATES", justify="right", priority=3),
        Col("DERIVED FROM", key=True, priority=1),
        Col("CREATED", priority=4),
    )
    rows = []
    for d in doc["datasets"]:
        sp = d.get("splits") or {}
        rows.append(
            [
                d["id"],
                d["format"],
                number(d["rows"]),
                number((sp.get("train") or {}).get("rows")),
                number((sp.get("eval") or {}).get("rows")),
                number(d.get("duplicates_removed", 0)),
                d.get("derived_from") or "-",
                str(d.get("created_at") or "")[:19].replace("T", " "),
            ]
        )
    print_table(cols, rows, wide=wide)


@app.command("get")
@handle_errors
def get(
    ref: str = typer.Argument(..., help="ds://NAME@VERSION"),
    as_json: bool = typer.Option(False, "--json", help="Print the version document as JSON."),
) -> None:
    """One dataset version."""
    with client() as c:
        doc = c.get_dataset(ref)
    if as_json:
        print_json(doc)
    else:
        _summary(doc)
        _epoch_line(doc)


@app.command("cost")
@handle_errors
def cost(
    ref: str = typer.Argument(..., help="ds://NAME@VERSION"),
    model: str = typer.Option(None, "--model", help="Model NAME@V (default: the upload's --base)."),
    seq_len: int = typer.Option(2048, "--seq-len", min=1, help="Tokens per sample."),
    global_batch: int = typer.Option(16, "--global-batch", min=1, help="Samples per optimizer step."),
    as_json: bool = typer.Option(False, "--json", help="Print the estimate as JSON."),
) -> None:
    """What one epoch over the train split costs: steps × predicted step time × price, on the cheapest
    feasible placement."""
    with client() as c:
        doc = c.dataset_epoch_cost(ref, model=model, seq_len=seq_len, global_batch=global_batch)
    if as_json:
        print_json(doc)
        return
    console.print(f"{doc['dataset']} with {_epoch_text(doc)}", soft_wrap=True, highlight=False)


@app.command("rows")
@handle_errors
def rows(
    ref: str = typer.Argument(..., help="ds://NAME@VERSION"),
    split: str = typer.Option("train", "--split", help="train | eval"),
    offset: int = typer.Option(0, "--offset", min=0),
    limit: int = typer.Option(20, "--limit", min=1, max=1000),
    as_json: bool = typer.Option(False, "--json", help="Print the page as JSON."),
) -> None:
    """A page of one split's normalised rows."""
    with client() as c:
        doc = c.dataset_rows(ref, split=split, offset=offset, limit=limit)
    if as_json:
        print_json(doc)
        return
    import json

    for row in doc["rows"]:
        console.print(json.dumps(row, ensure_ascii=False), highlight=False, markup=False, soft_wrap=True)
    if doc.get("next_offset") is not None:
        err_console.print(f"more: --offset {doc['next_offset']}")
