"""`trainyard checkpoints list|verify|convert` (alias `checkpoint`): inspect and convert checkpoints."""

from __future__ import annotations

from typing import Any

import typer

from trainyard.cli.common import console, handle_errors, print_json
from trainyard.errors import CheckpointError

app = typer.Typer(help="Inspect, verify and convert training checkpoints.", no_args_is_help=True)


def _job_dir(target: str) -> tuple[str, list[dict[str, Any]] | None]:
    """A job id (``job-…``) becomes the job's checkpoint directory as the server reports it, with the
    server's list of its checkpoints; a URL or path is taken as the directory itself."""
    import os

    if "://" in target or os.path.exists(target) or not target.startswith("job-"):
        return _url(target), None
    from trainyard.cli._remote import client

    with client() as c:
        doc = c.get_job(target)
    cks = [ck for ck in doc.get("checkpoints") or [] if ck.get("path")]
    if not cks:
        return "", []
    return str(cks[-1]["path"]).rstrip("/").rsplit("/", 1)[0], cks


def _url(path_or_url: str) -> str:
    if "://" in path_or_url:
        return path_or_url
    import os

    return f"file://{os.path.abspath(path_or_url)}"


@app.command("list")
@handle_errors
def list_command(
    job: str = typer.Argument(
        ..., metavar="JOB", help="A job id, or a job's checkpoint directory <storage>/<job_id> (URL or path)."
    ),
    verify: bool = typer.Option(False, "--verify", help="Also check every file's sha256."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """List a job's checkpoint steps, newest first, with their commit state."""
    from trainyard.runtime.checkpoint import CheckpointManager

    job_url, reported = _job_dir(job)
    if reported == []:
        if as_json:
            print_json({"checkpoints": []})
        else:
            console.print(f"no checkpoints yet for {job}", soft_wrap=True)
        return
    rows: list[dict[str, Any]] = []
    for step, url in CheckpointManager.list_step_dirs(job_url):
        man = CheckpointManager.read_manifest(url)
        row: dict[str, Any] = {
            "step": step,
            "path": url,
            "committed": man is not None and not man.get("_unreadable"),
        }
        if row["committed"] and man is not None:
            row.update(
                world_size=man.get("world_size"),
                precision=(man.get("precision") or {}).get("name"),
                bytes=sum(f["bytes"] for f in man.get("files", {}).values()),
                emergency=bool(man.get("emergency")),
                loss=man.get("loss"),
            )
        if verify:
            ok, why, _ = CheckpointManager.verify(url)
            row.update(verified=ok, why=why)
        rows.append(row)
    if as_json:
        print_json({"checkpoints": rows})
        return
    if not rows:
        console.print(f"no checkpoints under {job_url}")
        return
    for r in rows:
        state = "committed" if r["committed"] else "torn"
        if verify:
            state = "ok" if r["verified"] else f"BAD ({r['why']})"
        extra = (
            f" ws={r.get('world_size')} {r.get('precision')} {r.get('bytes', 0):,} B"
            if r["committed"]
            else ""
        )
        console.print(f"step {r['step']:>8}  {state}{extra}  {r['path']}", highlight=False, soft_wrap=True)


@app.command("verify")
@handle_errors
def verify_command(
    url: str = typer.Argument(
        ..., help="A step directory (.../step-N) or a job directory (its newest step)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Check a checkpoint's manifest and the sha256 of every file; exit 9 when it does not verify."""
    from trainyard.runtime.checkpoint import CheckpointManager

    target = _url(url)
    last = target.rstrip("/").rsplit("/", 1)[-1]
    if not last.startswith("step-"):
        base, job = target.rstrip("/").rsplit("/", 1)
        steps = CheckpointManager.list_step_dirs(target)
        if not steps:
            raise CheckpointError(
                f"no checkpoint steps under {url}", hint="Check the storage URL and job id."
            )
        target = steps[0][1]
        del base, job
    ok, why, manifest = CheckpointManager.verify(target)
    doc = {"path": target, "ok": ok, "why": why, "step": (manifest or {}).get("step")}
    if as_json:
        print_json(doc)
    else:
        console.print(f"{'ok' if ok else 'FAILED'}: {target} ({why})", highlight=False)
    if not ok:
        raise SystemExit(CheckpointError.exit_code)


@app.command("convert")
@handle_errors
def convert_command(
    source: str = typer.Argument(
        ..., help="A step directory, or a job directory (its newest verifying step)."
    ),
    to: str = typer.Option(..., "--to", help="Destination storage URL or path; writes <to>/<job_id>/step-N."),
    precision: str = typer.Option(
        ..., "--precision", help="Target policy: fp32, bf16-mixed, fp16-mixed or bf16."
    ),
    job_id: str | None = typer.Option(
        None, "--job-id", help="Job id under the destination (default: the source's)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Convert a checkpoint's precision policy offline (any world size can load the result)."""
    from trainyard.runtime.convert import convert

    result = convert(_url(source), _url(to), precision=precision, job_id=job_id)
    if as_json:
        print_json(result)
        return
    console.print(
        f"converted step {result['step']} ({result['from_precision']}, "
        f"world size {result['from_world_size']}) → {result['precision']}: {result['path']}",
        highlight=False,
    )
