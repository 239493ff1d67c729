"""`trainyard submit SPEC [--wait] [--json]`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import console, handle_errors, print_json
from trainyard.errors import InvalidInputError, SpecError
from trainyard.services.code import pack_directory
from trainyard.spec import load_spec


def upload_local_dataset(spec_doc: dict[str, Any], spec_dir: Path, *, quiet: bool) -> dict[str, Any] | None:
    """A ``workload.dataset`` that names a local file is uploaded as a dataset version first, and the
    spec then names that version (DESIGN §3.6): the server never reads a path a client typed. A path
    relative to the spec file is taken from the spec's directory."""
    workload = spec_doc.get("workload") or {}
    ref = workload.get("dataset")
    if not isinstance(ref, str) or ref.startswith("ds://"):
        return None
    if ref.startswith("file://"):
        local = Path(ref[len("file://") :])
    elif "://" in ref:
        return None  # a URL: the server checks it against the tenant's storage roots
    else:
        local = Path(ref).expanduser()
        if not local.is_absolute() and not local.exists():
            local = spec_dir / local
    if not local.is_file():
        raise SpecError(
            f"workload.dataset: {ref} is not a file on this machine",
            hint="Name an existing JSONL file, or a registered version such as ds://NAME@3.",
            details={"errors": [{"field": "workload.dataset", "message": "no such file"}]},
        )
    from trainyard.cli.datasets_cmd import upload_file

    name = re.sub(r"[^a-z0-9._-]+", "-", local.stem.lower()).strip("-._")[:100] or "dataset"
    doc = upload_file(local, name=name, show_progress=not quiet)
    spec_doc["workload"] = {**workload, "dataset": doc["id"]}
    return doc


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
    dataset_doc = upload_local_dataset(document, path.parent, quiet=as_json)
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
    if dataset_doc is not None:
        console.print(f"uploaded {dataset_doc['id']} ({dataset_doc['rows']} rows)", highlight=False)
    console.print(f"[green]{doc['id']}[/] {doc['name']}: {doc['state']}")
    if doc.get("reason"):
        console.print(f"  {doc['reason']}")
    console.print(f"  follow it: trainyard jobs events {doc['id']} --follow")
    if doc["state"] == "failed":
        raise SystemExit(1)
