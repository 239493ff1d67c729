"""Follow a job to its end with live feedback: a progress bar (steps, loss, tokens/s, ETA, cost so far)
on a terminal, and one line per event as it happens (state changes, placement, checkpoints,
preemptions, resumes). Reads the job document (heartbeat progress) and its events API."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from rich.console import Console

from trainyard.cli.common import duration, usd
from trainyard.cli.events_view import event_line, progress_text
from trainyard.errors import ServiceUnavailableError

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


def _epoch(iso: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(iso).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class RunView:
    """What the bar shows, kept from the job document and the events seen so far."""

    def __init__(self) -> None:
        self.attempt_started_s: float | None = None
        self.preemptions = 0
        self.resumes = 0

    def see(self, e: dict[str, Any]) -> None:
        d = e.get("data") or {}
        if e.get("kind") == "placement":
            self.attempt_started_s = _epoch(e.get("time"))
        elif e.get("kind") == "preempted":
            self.preemptions += 1
            self.attempt_started_s = None
        elif e.get("kind") == "started" and d.get("resumed_from_step") and d.get("rank", 0) == 0:
            self.resumes += 1
        elif e.get("kind") == "cost":
            self.attempt_started_s = None

    def cost_so_far(self, doc: dict[str, Any], now_s: float) -> float:
        """Billed cost plus the running attempt's devices × price × time since it was placed."""
        cost = float(doc.get("cost_usd") or 0.0)
        p = doc.get("placement") or {}
        if self.attempt_started_s is not None and doc.get("state") in ("starting", "running"):
            hours = max(0.0, now_s - self.attempt_started_s) / 3600.0
            cost += hours * float(p.get("devices") or 0) * float(p.get("price_usd_per_device_hour") or 0.0)
        return cost

    def fields(self, doc: dict[str, Any]) -> dict[str, Any]:
        prog = doc.get("progress") or {}
        step = int(prog.get("step") or 0)
        total = prog.get("total_steps") or _total_steps(doc)
        eta = None
        if total and isinstance(prog.get("step_time_s"), int | float) and doc.get("state") == "running":
            eta = max(0, int(total) - step) * float(prog["step_time_s"])
        info = []
        if isinstance(prog.get("loss"), int | float):
            info.append(f"loss {prog['loss']:.4g}")
        if isinstance(prog.get("tokens_per_s"), int | float):
            info.append(f"{prog['tokens_per_s']:,.0f} tok/s")
        info.append(f"ETA {duration(eta)}" if eta is not None else "ETA -")
        info.append(f"cost {usd(self.cost_so_far(doc, time.time()))}")
        if self.preemptions:
            info.append(f"preempted {self.preemptions}×")
        return {
            "state": doc.get("state", "?"),
            "step": step,
            "total": int(total) if total else None,
            "info": " · ".join(info),
        }


def _total_steps(doc: dict[str, Any]) -> int | None:
    wl = (doc.get("spec") or {}).get("workload") or {}
    steps = wl.get("steps")
    return int(steps) if isinstance(steps, int) else None


def watch(
    c: Any,
    job_id: str,
    *,
    out: Console,
    timeout_s: float | None = None,
    poll_s: float = 0.5,
) -> dict[str, Any]:
    """Follow the job until it ends and return its final document. On a terminal a live bar is drawn
    beneath the event lines; otherwise only the event lines (heartbeats included) are printed."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    view = RunView()
    after = 0
    live = out.is_terminal
    progress: Any = None
    task: Any = None
    if live:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        progress = Progress(
            TextColumn("[bold]{task.fields[state]:<9}[/]"),
            BarColumn(bar_width=None),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            console=out,
            transient=True,
            expand=True,
        )
        progress.start()
        task = progress.add_task("job", total=None, state="pending", info="")
    try:
        while True:
            page = c.job_events(job_id, after=after)
            for e in page["events"]:
                view.see(e)
                if e.get("kind") == "heartbeat" and live:
                    continue
                line = event_line(e)
                (progress.console if live else out).print(line, markup=False, soft_wrap=True)
            after = page["next_after"]
            doc = c.get_job(job_id)
            if live:
                f = view.fields(doc)
                progress.update(task, total=f["total"], completed=f["step"], state=f["state"], info=f["info"])
            if doc["state"] in TERMINAL_STATES:
                tail = c.job_events(job_id, after=after)
                for e in tail["events"]:
                    view.see(e)
                    if e.get("kind") != "heartbeat":
                        (progress.console if live else out).print(event_line(e), markup=False, soft_wrap=True)
                return doc
            if deadline is not None and time.monotonic() > deadline:
                raise ServiceUnavailableError(
                    f"job {job_id} still {doc['state']} after {timeout_s:.0f} s",
                    hint=f"It keeps running; follow it with `trainyard jobs events {job_id} --follow`.",
                )
            time.sleep(poll_s)
    finally:
        if progress is not None:
            progress.stop()


def summary_line(doc: dict[str, Any]) -> str:
    prog = doc.get("progress") or {}
    return f"{doc['id']} {doc['state']}: {progress_text(prog)}; cost {usd(doc.get('cost_usd'))}"
