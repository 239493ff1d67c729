"""`trainyard jobs list|get|cancel|preempt|events|logs|record|reproduce`."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import typer
from rich.table import Column, Table

from trainyard.cli._remote import client, money
from trainyard.cli.common import console, handle_errors, print_json
from trainyard.client.client import TERMINAL_STATES

app = typer.Typer(help="Follow and control jobs on the platform.", no_args_is_help=True)


@app.command("list")
@handle_errors
def list_jobs(
    state: list[str] = typer.Option(None, "--state", help="Only jobs in this state (repeatable)."),
    name: str = typer.Option(None, "--name", help="Only jobs with this name."),
    limit: int = typer.Option(50, "--limit", min=1, max=500, help="Jobs per page."),
    cursor: str = typer.Option(None, "--cursor", help="next_cursor of a previous page."),
    as_json: bool = typer.Option(False, "--json", help="Print {jobs, next_cursor} as JSON."),
) -> None:
    """List your jobs, newest first."""
    with client() as c:
        page = c.list_jobs(states=state or None, name=name, cursor=cursor, limit=limit)
    if as_json:
        print_json(page)
        return
    table = Table(Column("ID", no_wrap=True), "NAME", "STATE", "POOL", "DEVICES", "COST", "CREATED")
    for j in page["jobs"]:
        p = j.get("placement") or {}
        table.add_row(
            j["id"],
            j["name"],
            j["state"],
            p.get("pool", "-"),
            str(p.get("devices", "-")),
            money(j.get("cost_usd")),
            j.get("created_at") or "",
        )
    console.print(table)
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


def _print_job(doc: dict[str, Any]) -> None:
    console.print(
        f"[bold]{doc['id']}[/] {doc['name']}  state [bold]{doc['state']}[/]  attempt {doc.get('attempt', 0)}"
    )
    if doc.get("reason"):
        console.print(f"  reason: {doc['reason']}")
    p = doc.get("placement")
    if p:
        console.print(
            f"  placement: {p['pool']} x{p['devices']} {p['accelerator']} ({p['market']}, "
            f"${p['price_usd_per_device_hour']:.4f}/device-h)"
        )
    console.print(f"  cost so far: {money(doc.get('cost_usd'))}")
    if doc.get("progress"):
        prog = doc["progress"]
        console.print(f"  progress: step {prog.get('step')} loss {prog.get('loss')}")
    for w in doc.get("workers") or []:
        console.print(f"  worker rank {w['rank']} pid {w['pid']} on {w['host']}")
    for ck in doc.get("checkpoints") or []:
        console.print(f"  checkpoint step {ck['step']}: {ck['path']}")
    if doc.get("result"):
        console.print(
            f"  result: {doc['result'].get('model_version')} sha256 {doc['result'].get('model_sha256')}"
        )
    events = doc.get("events") or []
    if events:
        table = Table("TIME", "KIND", "DETAIL")
        for e in events[-20:]:
            table.add_row(e.get("time") or "", e["kind"], _detail(e))
        console.print(table)


def _detail(e: dict[str, Any]) -> str:
    d = e.get("data") or {}
    if e["kind"] == "state":
        return f"{d.get('from')} → {d.get('to')}: {d.get('reason', '')}"
    return json.dumps(d, separators=(",", ":"), default=str)[:160]


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
    console.print(f"{doc['id']}: {doc['state']}")


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
        False, "--json", help="JSON: one document, or one event per line with --follow."
    ),
) -> None:
    """Print a job's event log (state changes, placements, checkpoints, preemptions, costs)."""
    with client() as c:
        page = c.job_events(job_id)
        if as_json and not follow:
            print_json(page)
            return
        after = 0
        while True:
            for e in page["events"]:
                if as_json:
                    sys.stdout.write(json.dumps(e, separators=(",", ":"), default=str) + "\n")
                    sys.stdout.flush()
                else:
                    console.print(f"{e.get('time')}  [bold]{e['kind']:<10}[/] {_detail(e)}", highlight=False)
            after = page["next_after"]
            if not follow:
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
) -> None:
    """Print one rank's log (stdout and stderr of the worker: progress, checkpoints, resumes, errors)."""
    with client() as c:
        chunk = c.job_logs(job_id, rank=rank, attempt=attempt, tail=tail)
        while True:
            if chunk["text"]:
                sys.stdout.write(chunk["text"])
                sys.stdout.flush()
            offset = chunk["next_offset"]
            ended = chunk.get("job_state") in TERMINAL_STATES
            if not chunk["text"] and (not follow or ended):
                return
            # more may follow: the rest of a long log, or (with --follow) what the job prints next
            chunk = c.job_logs(
                job_id, rank=rank, attempt=attempt, offset=offset, wait_s=poll_s if follow else 0.0
            )


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
