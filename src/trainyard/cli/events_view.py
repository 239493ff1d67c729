"""Job events as people read them: one line per event (state changes, placements, checkpoints,
preemptions, resumes, costs), shared by `jobs events`, `jobs get` and `jobs submit --wait`."""

from __future__ import annotations

import json
from typing import Any

from trainyard.cli.common import duration, hours, market, usd


def describe(e: dict[str, Any]) -> str:
    """One human-readable line for a job event."""
    d = e.get("data") or {}
    kind = e.get("kind")
    if kind == "state":
        to = d.get("to")
        text = f"{d.get('from') or '-'} → {to}"
        if d.get("reason"):
            text += f": {d['reason']}"
        if to == "queued" and d.get("from") == "preempted" and "resume" not in text:
            text += " (resumes from its last checkpoint)"
        return text
    if kind == "placement":
        price = d.get("price_usd_per_device_hour")
        return (
            f"placed on {d.get('pool')}: {d.get('devices')} × {d.get('accelerator')} "
            f"{market(d.get('market'))} at {usd(price)}/device-h, expected {usd(d.get('expected_cost_usd'))}"
            + (f" (attempt {d['attempt']})" if d.get("attempt") else "")
        )
    if kind == "workers":
        ws = d.get("workers") or []
        return f"{len(ws)} worker(s) launched: " + ", ".join(
            f"rank {w.get('rank')} pid {w.get('pid')}" for w in ws[:8]
        )
    if kind == "started":
        step = d.get("resumed_from_step") or d.get("start_step") or d.get("step")
        return "training started" + (f", resumed from step {step}" if step else "")
    if kind == "heartbeat":
        return progress_text(d) or "heartbeat"
    if kind == "checkpoint":
        return f"checkpoint at step {d.get('step')}" + (" (emergency)" if d.get("emergency") else "")
    if kind == "preemption_notice":
        return f"preemption notice: {duration(d.get('notice_s'))} to checkpoint" + (
            f" ({d['by']})" if d.get("by") else ""
        )
    if kind == "preempted":
        text = "preempted" + (f" at step {d['step']}" if d.get("step") is not None else "")
        if d.get("checkpoint_step") is not None:
            text += f", resumes from the checkpoint at step {d['checkpoint_step']}"
        return text
    if kind == "restart":
        return f"restart {d.get('restart')} ({d.get('classification')}): {d.get('reason', '')}".rstrip(": ")
    if kind == "cost":
        return (
            f"attempt {d.get('attempt')} cost {usd(d.get('usd'))} ({duration(d.get('device_s'))} device time)"
        )
    if kind == "migration":
        return f"migrating {d.get('from_pool')} → {d.get('to_pool')}" + (
            f": {d['reason']}" if d.get("reason") else ""
        )
    if kind == "lost":
        return f"workers lost: {d.get('reason', '')}"
    if kind == "quote":
        best = d.get("best") or {}
        text = f"quoted {d.get('options')} option(s)"
        if best:
            text += (
                f"; best {best.get('pool') or best.get('accelerator')}: {best.get('devices')} × "
                f"{best.get('accelerator')} {market(best.get('market'))}, "
                f"{usd(best.get('expected_cost_usd'))} in {hours(best.get('expected_hours'))}"
            )
        return text
    if kind == "record":
        return f"run record of attempt {d.get('attempt')} (spec sha256 {str(d.get('spec_sha256'))[:12]})"
    return json.dumps(d, separators=(",", ":"), default=str)[:200]


def progress_text(p: dict[str, Any]) -> str:
    parts = []
    if p.get("step") is not None:
        total = p.get("total_steps")
        parts.append(f"step {p['step']}" + (f"/{total}" if total else ""))
    if isinstance(p.get("loss"), int | float):
        parts.append(f"loss {p['loss']:.4g}")
    if isinstance(p.get("tokens_per_s"), int | float):
        parts.append(f"{p['tokens_per_s']:,.0f} tokens/s")
    if isinstance(p.get("step_time_s"), int | float):
        parts.append(f"{p['step_time_s']:.3g} s/step")
    return ", ".join(parts)


def event_line(e: dict[str, Any]) -> str:
    """``TIME  KIND  what happened`` (the time as HH:MM:SS when it is an ISO timestamp)."""
    t = str(e.get("time") or "")
    short = t[11:19] if len(t) >= 19 and t[10] == "T" else t
    return f"{short}  {e.get('kind')!s:<17} {describe(e)}"
