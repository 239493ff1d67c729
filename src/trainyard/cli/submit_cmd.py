"""`trainyard jobs submit SPEC` (alias `trainyard submit`): where the job runs, what it is expected to
cost and how long it takes; `--dry-run` for the quote and placement only, `--wait` to follow it live."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import Col, console, handle_errors, hours, market, print_json, print_table, usd
from trainyard.errors import InvalidInputError
from trainyard.spec import load_spec


def upload_local_dataset(spec_doc: dict[str, Any], spec_dir: Path, *, quiet: bool) -> dict[str, Any] | None:
    """A ``workload.dataset`` that names a local file is uploaded as a dataset version first, and the
    spec then names that version (DESIGN §3.6): the server never reads a path a client typed. A path
    relative to the spec file is taken from the spec's directory. The same rules as the Python client's
    (``client._calls.local_dataset``); here with a progress bar for large files."""
    from trainyard.cli.datasets_cmd import upload_file
    from trainyard.client._calls import dataset_name_for, local_dataset

    local = local_dataset(spec_doc, spec_dir)
    if local is None:
        return None
    doc = upload_file(local, name=dataset_name_for(local), show_progress=not quiet)
    spec_doc["workload"] = {**(spec_doc.get("workload") or {}), "dataset": doc["id"]}
    return doc


@handle_errors
def submit(
    path: Path = typer.Argument(..., metavar="SPEC", help="Job spec (YAML or JSON)."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Quote and choose a placement only; nothing is uploaded or stored."
    ),
    wait: bool = typer.Option(
        False, "--wait", help="Follow the job to its end (live progress on a terminal); print the result."
    ),
    timeout_s: float = typer.Option(
        None, "--timeout-s", min=0, help="Give up waiting after this many seconds."
    ),
    idempotency_key: str = typer.Option(None, "--idempotency-key", help="Retry-safe submission key."),
    workdir: Path = typer.Option(
        None,
        "--workdir",
        help="Upload this directory as the code entrypoint.command runs in (a content-addressed archive).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also show the runner-up options."),
    as_json: bool = typer.Option(
        False, "--json", help="Print the job document (with --dry-run: {dry_run, placement, options})."
    ),
) -> None:
    """Submit a training job: prints the chosen placement, expected cost and time."""
    spec = load_spec(path)
    document = spec.to_document()
    if workdir is not None and spec.entrypoint is None:
        raise InvalidInputError(
            "--workdir uploads code for entrypoint.command, and the spec has no entrypoint",
            hint="Add entrypoint: {command: [python, train.py]} to the spec, or leave out --workdir.",
        )
    if dry_run:
        _dry_run(document, verbose=verbose, as_json=as_json)
        return
    dataset_doc = upload_local_dataset(document, path.parent, quiet=as_json)
    with client() as c:
        if workdir is not None:
            from trainyard.services.code import pack_directory

            uploaded = c.upload_code(pack_directory(workdir))
            document["entrypoint"]["code"] = uploaded["url"]
        doc = c.submit(document, idempotency_key=idempotency_key)
        if as_json:
            if wait:
                doc = c.wait(doc["id"], timeout_s=timeout_s)
            print_json(doc)
            if doc["state"] == "failed":
                raise SystemExit(1)
            return
        if dataset_doc is not None:
            console.print(f"uploaded {dataset_doc['id']} ({dataset_doc['rows']} rows)")
        doc = _await_placement(c, doc, patience_s=5.0)
        print_submitted(doc, verbose=verbose)
        if wait:
            from trainyard.cli.watch import watch

            doc = watch(c, doc["id"], out=console, timeout_s=timeout_s)
            _print_outcome(doc)
        else:
            console.print(f"  follow     trainyard jobs events {doc['id']} --follow", soft_wrap=True)
    if doc["state"] == "failed":
        raise SystemExit(1)


def _await_placement(c: Any, doc: dict[str, Any], *, patience_s: float) -> dict[str, Any]:
    """The job document once the scheduler has placed it (or has said why not), for at most
    ``patience_s``: the placement is what the user wants to see first."""
    deadline = time.monotonic() + patience_s
    waiting = ("pending", "queued")
    while doc.get("placement") is None and doc["state"] in waiting and time.monotonic() < deadline:
        time.sleep(0.2)
        doc = c.get_job(doc["id"])
    return doc


def _matching_option(options: list[dict[str, Any]], p: dict[str, Any]) -> dict[str, Any] | None:
    for o in options:
        if o.get("pool") == p.get("pool") and o.get("devices") == p.get("devices"):
            return o
    return None


def _expected(o: dict[str, Any] | None, cost: Any) -> str:
    if o is None:
        return f"{usd(cost)}"
    p90 = o.get("expected_cost_p90_usd")
    text = (
        f"{usd(cost if cost is not None else o.get('expected_cost_usd'))} in {hours(o.get('expected_hours'))}"
    )
    if o.get("expected_hours_p90"):
        text += f" (p90 {hours(o['expected_hours_p90'])})"
    elif p90:
        text += f" (p90 {usd(p90)})"
    return text


def print_submitted(doc: dict[str, Any], *, verbose: bool) -> None:
    options = [o for o in doc.get("quote") or [] if o.get("feasible")]
    console.print(f"[green]{doc['id']}[/] {doc['name']}: {doc['state']}", soft_wrap=True)
    p = doc.get("placement")
    if p:
        o = _matching_option(options, p)
        console.print(
            f"  placement  {p['pool']}: {p['devices']} × {p['accelerator']} {market(p.get('market'))} "
            f"at {usd(p.get('price_usd_per_device_hour'))}/device-h",
            soft_wrap=True,
        )
        console.print(f"  expected   {_expected(o, p.get('expected_cost_usd'))}", soft_wrap=True)
    else:
        if doc.get("reason") and doc.get("reason") not in ("submitted", "admitted"):
            console.print(f"  waiting    {doc['reason']}", markup=False, soft_wrap=True)
        if options:
            best = options[0]
            console.print(
                f"  best quote {best.get('pool')}: {best['devices']} × {best['accelerator']} "
                f"{market(best.get('market'))}, {_expected(best, best.get('expected_cost_usd'))}",
                soft_wrap=True,
            )
    if verbose and options:
        options_table(options[:6], title="options considered")


def options_table(options: list[dict[str, Any]], *, title: str) -> None:
    cols = (
        Col("#", justify="right"),
        Col("POOL", key=True),
        Col("ACCELERATOR"),
        Col("DEV", justify="right"),
        Col("MARKET"),
        Col("$/STEP", justify="right", priority=2),
        Col("TIME", justify="right"),
        Col("EXPECTED", justify="right"),
        Col("RUNS HERE", priority=1),
    )
    rows = [
        [
            str(i),
            o.get("pool") or "-",
            o["accelerator"],
            str(o["devices"]),
            market(o.get("market")),
            usd(o.get("usd_per_step")),
            hours(o.get("expected_hours")),
            usd(o.get("expected_cost_usd")),
            "yes" if o.get("executable", True) else "planning only",
        ]
        for i, o in enumerate(options, 1)
    ]
    print_table(cols, rows, title=title)


def _dry_run(document: dict[str, Any], *, verbose: bool, as_json: bool) -> None:
    """Quote on the server's live pools (and catalog) and pick what the scheduler would: the cheapest
    feasible option on a pool an executor serves. Nothing is uploaded or stored."""
    with client() as c:
        quote = c.quote(document)
        pools = c.list_pools()["pools"]
    runnable = {p["name"] for p in pools if p.get("executable", p.get("backend", "local") != "none")}
    options = [dict(o, executable=o.get("pool") in runnable) for o in quote["options"]]
    feasible = [o for o in options if o.get("feasible")]
    chosen = next((o for o in feasible if o["executable"]), None)
    if as_json:
        print_json({"dry_run": True, "placement": chosen, "options": options})
        return
    name = document.get("name", "job")
    console.print(f"[bold]dry run[/] {name}: nothing submitted", soft_wrap=True)
    if chosen is not None:
        console.print(
            f"  placement  {chosen['pool']}: {chosen['devices']} × {chosen['accelerator']} "
            f"{market(chosen.get('market'))} at {usd(chosen.get('price_usd_per_hour'))}/h",
            soft_wrap=True,
        )
        console.print(f"  expected   {_expected(chosen, chosen.get('expected_cost_usd'))}", soft_wrap=True)
    else:
        console.print("  placement  none: no live pool with an executor can run it", soft_wrap=True)
    cheapest = feasible[0] if feasible else None
    if cheapest is not None and cheapest is not chosen:
        console.print(
            f"  cheapest   {cheapest.get('pool')}: {cheapest['devices']} × {cheapest['accelerator']} "
            f"{market(cheapest.get('market'))}, {_expected(cheapest, cheapest.get('expected_cost_usd'))} "
            "(planning only: no executor serves it)",
            soft_wrap=True,
        )
    if not feasible:
        reasons = sorted({str(o.get("reason")) for o in options if o.get("reason")})[:5]
        for r in reasons:
            console.print(f"  not feasible: {r}", markup=False, soft_wrap=True)
    if verbose and feasible:
        options_table(feasible[:10], title="options considered")


def _print_outcome(doc: dict[str, Any]) -> None:
    from trainyard.cli.events_view import progress_text

    colour = "green" if doc["state"] == "succeeded" else "red"
    progress = progress_text(doc.get("progress") or {})
    console.print(
        f"[{colour}]{doc['id']} {doc['state']}[/] (attempt {doc.get('attempt', 1)}"
        f"{', ' + progress if progress else ''}), cost {usd(doc.get('cost_usd'))}",
        soft_wrap=True,
    )
    if doc.get("reason") and doc["state"] != "succeeded":
        console.print(f"  reason: {doc['reason']}", markup=False, soft_wrap=True)
    result = doc.get("result") or {}
    if result.get("model_version"):
        console.print(
            f"  model  {result['model_version']} (sha256 {result.get('model_sha256')})", soft_wrap=True
        )
