"""`trainyard jobs list|get|cancel|preempt|events|logs|record|reproduce` (submit, quote and predict are
verbs of this group too; they live in their own modules)."""

from __future__ import annotations

import sys
import time
from typing import Any

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import (
    WIDE_OPTION_HELP,
    Col,
    console,
    handle_errors,
    market,
    print_json,
    print_table,
    usd,
)
from trainyard.cli.events_view import event_line, progress_text

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})

app = typer.Typer(help="Submit, quote, follow and control training jobs.", no_args_is_help=True)

JOB_COLUMNS = (
    Col("ID", key=True),
    Col("NAME", key=True),
    Col("STATE"),
    Col("POOL", key=True, priority=1),
    Col("DEVICES", justify="right", priority=3),
    Col("COST", justify="right", priority=2),
    Col("CREATED", priority=4),
)


@app.command("list")
@handle_errors
def list_jobs(
    state: list[str] = typer.Option(None, "--state", help="Only jobs in this state (repeatable)."),
    name: str = typer.Option(None, "--name", help="Only jobs with this name."),
    limit: int = typer.Option(50, "--limit", min=1, max=500, help="Jobs per page."),
    cursor: str = typer.Option(None, "--cursor", help="next_cursor of a previous page."),
    wide: bool = typer.Option(False, "--wide", "-w", help=WIDE_OPTION_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print {jobs, next_cursor} as JSON."),
) -> None:
    """List your jobs, newest first."""
    with client() as c:
        page = c.list_jobs(states=state or None, name=name, cursor=cursor, limit=limit)
    if as_json:
        print_json(page)
        return
    rows = []
    for j in page["jobs"]:
        p = j.get("placement") or {}
        created = str(j.get("created_at") or "")
        rows.append(
            [
                j["id"],
                j["name"],
                j["state"],
                p.get("pool", "-"),
                str(p.get("devices", "-")),
                usd(j.get("cost_usd")),
                created[:19].replace("T", " "),
            ]
        )
    if not rows:
        console.print("no jobs yet: trainyard jobs submit SPEC")
        return
    print_table(JOB_COLUMNS, rows, wide=wide)
    if page.get("next_cursor"):
        console.print(f"more: trainyard jobs list --cursor {page['next_cursor']}")


@app.command("get")
@handle_errors
def get_job(
    job_id: str = typer.Argument(..., help="Job id."),
    as_json: bool = typer.Option(False, "--json", help="Print the job document as JSON."),
) -> None:
    """Show one job: state, placement, cost, checkpoints, workers, result and events."""
    with client() as c:
        doc = c.get_job(job_id)
    if as_json:
        print_json(doc)
        return
    _print_job(doc)


def placement_text(p: dict[str, Any]) -> str:
    return (
        f"{p['pool']}: {p['devices']} × {p['accelerator']} {market(p.get('market'))} at "
        f"{usd(p.get('price_usd_per_device_hour'))}/device-h"
    )


def _print_job(doc: dict[str, Any]) -> None:
    console.print(
        f"[bold]{doc['id']}[/] {doc['name']}  state [bold]{doc['state']}[/]  attempt {doc.get('attempt', 0)}",
        soft_wrap=True,
    )
    if doc.get("reason"):
        console.print(f"  reason: {doc['reason']}", markup=False, soft_wrap=True)
    p = doc.get("placement")
    if p:
        console.print(f"  placement: {placement_text(p)}", soft_wrap=True)
    console.print(f"  cost so far: {usd(doc.get('cost_usd'))}")
    if doc.get("progress"):
        console.print(f"  progress: {progress_text(doc['progress'])}")
    for w in doc.get("workers") or []:
        console.print(f"  worker rank {w['rank']} pid {w['pid']} on {w['host']}")
    for ck in doc.get("checkpoints") or []:
        console.print(f"  checkpoint step {ck['step']}: {ck['path']}", soft_wrap=True)
    if doc.get("result"):
        console.print(
            f"  result: {doc['result'].get('model_version')} sha256 {doc['result'].get('model_sha256')}",
            soft_wrap=True,
        )
    events = [e for e in doc.get("events") or [] if e.get("kind") != "heartbeat"]
    if events:
        console.print("  events:")
        for e in events[-20:]:
            console.print(f"    {event_line(e)}", markup=False, soft_wrap=True)


@app.command("cancel")
@handle_errors
def cancel_job(
    job_id: str = typer.Argument(..., help="Job id."),
    as_json: bool = typer.Option(False, "--json", help="Print the job document as JSON."),
) -> None:
    """Cancel a job that has not finished (running workers are stopped)."""
    with client() as c:
        doc = c.cancel_job(job_id)
    if as_json:
        print_json(doc)
        return
    console.print(f"{doc['id']}: {doc['state']}", soft_wrap=True)


@app.command("preempt")
@handle_errors
def preempt_job(
    job_id: str = typer.Argument(..., help="Job id."),
    notice_s: float = typer.Option(
        None, "--notice-s", min=0, max=3600, help="Notice seconds (default: the pool's notice, else 30)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the job document as JSON."),
) -> None:
    """Inject a preemption (a drill): the workers checkpoint and exit, the job is requeued and resumes."""
    with client() as c:
        doc = c.preempt_job(job_id, notice_s=notice_s)
    if as_json:
        print_json(doc)
        return
    console.print(
        f"{doc['id']}: preemption notice sent; it checkpoints, goes preempted -> queued and resumes "
        f"(follow with `trainyard jobs events {doc['id']} --follow`)"
    )


@app.command("events")
@handle_errors
def events(
    job_id: str = typer.Argument(..., help="Job id."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events until the job ends."),
    poll_s: float = typer.Option(1.0, "--poll-s", min=0.05, help="Seconds between polls with --follow."),
    as_json: bool = typer.Option(
        False, "--json", help="JSON: one document, or one event per line (JSON Lines) with --follow."
    ),
) -> None:
    """Print a job's event log: state changes, placements, checkpoints, preemptions, resumes, costs."""
    with client() as c:
        page = c.job_events(job_id)
        if as_json and not follow:
            print_json(page)
            return
        for e in follow_events(c, job_id, page, poll_s=poll_s if follow else None):
            if as_json:
                print_json(e)
            else:
                console.print(event_line(e), markup=False, soft_wrap=True)


def follow_events(c: Any, job_id: str, page: dict[str, Any], *, poll_s: float | None) -> Any:
    """Yield the events of ``page`` and, with ``poll_s``, every later one until the job has ended and
    its last events are out."""
    while True:
        yield from page["events"]
        after = page["next_after"]
        if poll_s is None:
            return
        if c.get_job(job_id)["state"] in TERMINAL_STATES:
            tail = c.job_events(job_id, after=after)
            if not tail["events"]:
                return
            page = tail
            continue
        time.sleep(poll_s)
        page = c.job_events(job_id, after=after)


@app.command("logs")
@handle_errors
def logs(
    job_id: str = typer.Argument(..., help="Job id."),
    rank: int = typer.Option(0, "--rank", min=0, help="Worker rank."),
    attempt: int = typer.Option(None, "--attempt", min=1, help="One attempt's log (default: every attempt)."),
    tail: int = typer.Option(None, "--tail", min=0, help="Start with the last N lines."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
    poll_s: float = typer.Option(1.0, "--poll-s", min=0.05, help="Seconds each follow request may wait."),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="JSON: {job_id, rank, text, next_offset}, or one chunk per line (JSON Lines) with --follow.",
    ),
) -> None:
    """Print one rank's log (stdout and stderr of the worker: progress, checkpoints, resumes, errors)."""
    collected: list[str] = []
    with client() as c:
        chunk = c.job_logs(job_id, rank=rank, attempt=attempt, tail=tail)
        while True:
            text = chunk.get("text") or ""
            offset = chunk["next_offset"]
            if text:
                if as_json and follow:
                    print_json({"job_id": job_id, "rank": rank, "text": text, "next_offset": offset})
                elif as_json:
                    collected.append(text)
                else:
                    sys.stdout.write(text)
                    sys.stdout.flush()
            ended = chunk.get("job_state") in TERMINAL_STATES
            if not text and (not follow or ended):
                break
            # more may follow: the rest of a long log, or (with --follow) what the job prints next
            chunk = c.job_logs(
                job_id, rank=rank, attempt=attempt, offset=offset, wait_s=poll_s if follow else 0.0
            )
    if as_json and not follow:
        print_json({"job_id": job_id, "rank": rank, "text": "".join(collected), "next_offset": offset})


@app.command("record")
@handle_errors
def job_record(
    job_id: str = typer.Argument(..., help="Job id."),
    attempt: int = typer.Option(None, "--attempt", min=1, help="Which attempt (default: the newest)."),
    as_json: bool = typer.Option(False, "--json", help="Print the run record document as JSON."),
) -> None:
    """The immutable run record: data versions, code, spec hash, environment and seeds of an attempt."""
    with client() as c:
        doc = c.job_record(job_id, attempt=attempt)
    if as_json:
        print_json(doc)
        return
    rec = doc["record"]
    env = rec.get("environment") or {}
    console.print(f"[bold]{doc['job_id']}[/] attempt {doc['attempt']}  record sha256 {doc['sha256']}")
    console.print(f"  spec sha256 {rec.get('spec_sha256')}  seeds {rec.get('seeds')}", highlight=False)
    for d in rec.get("datasets") or []:
        splits = d.get("splits") or {}
        parts = ", ".join(f"{k} {v.get('rows')} rows {str(v.get('sha256'))[:12]}" for k, v in splits.items())
        console.print(f"  data {d.get('id')} ({parts})", highlight=False)
    code = rec.get("code") or {}
    console.print(f"  code git {code.get('git_sha')} source {str(code.get('trainyard_source_sha256'))[:12]}")
    console.print(
        f"  env python {env.get('python')} torch {env.get('torch')} cuda {env.get('cuda')} "
        f"device {env.get('device')} lock {str(env.get('lock_sha256'))[:12]} "
        f"({len(env.get('packages') or [])} packages)",
        highlight=False,
    )


@app.command("reproduce")
@handle_errors
def reproduce_job(
    job_id: str = typer.Argument(..., help="Job id whose run record to rerun."),
    wait: bool = typer.Option(False, "--wait", help="Block until the new job finishes."),
    as_json: bool = typer.Option(False, "--json", help="Print the new job document as JSON."),
) -> None:
    """Submit a new job from a run record: the same data version, resolved spec, seed and devices."""
    with client() as c:
        doc = c.reproduce_job(job_id)
        if wait:
            doc = c.wait(doc["id"])
    if as_json:
        print_json(doc)
        return
    console.print(f"[green]{doc['id']}[/] reproduces {job_id}: {doc['state']}")
