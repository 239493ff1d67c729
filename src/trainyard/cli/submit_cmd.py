"""`trainyard submit SPEC [--wait] [--json]`."""

from __future__ import annotations

from pathlib import Path

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import console, handle_errors, print_json
from trainyard.errors import InvalidInputError
from trainyard.services.code import pack_directory
from trainyard.spec import load_spec


@handle_errors
def submit(
    path: Path = typer.Argument(..., help="Job spec (YAML or JSON)."),
    wait: bool = typer.Option(
        False, "--wait", help="Block until the job finishes; print the final document."
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
    as_json: bool = typer.Option(False, "--json", help="Print the job document as JSON."),
) -> None:
    """Submit a training job to the platform."""
    spec = load_spec(path)
    document = spec.to_document()
    if workdir is not None and spec.entrypoint is None:
        raise InvalidInputError(
            "--workdir uploads code for entrypoint.command, and the spec has no entrypoint",
            hint="Add entrypoint: {command: [python, train.py]} to the spec, or leave out --workdir.",
        )
    with client() as c:
        if workdir is not None:
            uploaded = c.upload_code(pack_directory(workdir))
            document["entrypoint"]["code"] = uploaded["url"]
        doc = c.submit(document, idempotency_key=idempotency_key)
        if wait:
            doc = c.wait(doc["id"], timeout_s=timeout_s)
    if as_json:
        print_json(doc)
        return
    console.print(f"[green]{doc['id']}[/] {doc['name']}: {doc['state']}")
    if doc.get("reason"):
        console.print(f"  {doc['reason']}")
    console.print(f"  follow it: trainyard jobs events {doc['id']} --follow")
    if doc["state"] == "failed":
        raise SystemExit(1)
