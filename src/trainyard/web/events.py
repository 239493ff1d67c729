"""Job and deployment events as people read them: one sentence per event, the remaining fields as
``name: value`` pairs (values as JSON, never Python reprs), and a multi-line traceback or log text kept
apart so it can be shown folded, line by line."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from trainyard.services.domain import iso
from trainyard.web.rendering import fmt_duration_s, fmt_num, fmt_usd

LONG_TEXT_KEYS = ("traceback", "stderr", "log", "output")
MAX_VALUE_CHARS = 300


@dataclass(frozen=True)
class EventView:
    id: int
    kind: str
    time: str | None
    summary: str
    fields: list[tuple[str, str]] = field(default_factory=list)
    text: str | None = None  # a traceback or log excerpt, shown folded

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "time": self.time,
            "summary": self.summary,
            "fields": [list(f) for f in self.fields],
            "text": self.text,
        }


def value_text(v: Any) -> str:
    """A field value for people: numbers rounded, strings as they are, the rest as compact JSON."""
    if isinstance(v, bool) or v is None:
        return fmt_num(v) if v is not None else "–"
    if isinstance(v, int | float):
        return fmt_num(v)
    if isinstance(v, str):
        out = v
    else:
        try:
            out = json.dumps(v, sort_keys=True, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            out = str(v)
    return out if len(out) <= MAX_VALUE_CHARS else out[: MAX_VALUE_CHARS - 1] + "…"


def _f(d: dict[str, Any], key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def _summary(kind: str, d: dict[str, Any]) -> tuple[str, set[str]]:
    """The sentence for an event and the fields it already says."""
    if kind == "state":
        reason = f": {d['reason']}" if d.get("reason") else ""
        return f"{d.get('from') or 'new'} → {d.get('to')}{reason}", {"from", "to", "reason"}
    if kind == "placement":
        price = fmt_usd(_f(d, "price_usd_per_device_hour"))
        exp = _f(d, "expected_cost_usd")
        text = (
            f"placed on {d.get('pool')}: {d.get('devices')}× {d.get('accelerator')} ({d.get('market')}) "
            f"at {price} per device-hour"
        )
        if exp is not None:
            text += f", expected {fmt_usd(exp)}"
        return text, {
            "pool",
            "devices",
            "accelerator",
            "market",
            "price_usd_per_device_hour",
            "expected_cost_usd",
        }
    if kind == "heartbeat":
        parts = [f"step {d.get('step')}" + (f" of {d['total_steps']}" if d.get("total_steps") else "")]
        if _f(d, "loss") is not None:
            parts.append(f"loss {fmt_num(_f(d, 'loss'))}")
        if _f(d, "step_time_s") is not None:
            parts.append(f"{fmt_num(_f(d, 'step_time_s'), 3)} s/step")
        return ", ".join(parts), {"step", "total_steps", "loss", "step_time_s"}
    if kind == "checkpoint":
        stall = _f(d, "stall_s")
        text = f"checkpoint at step {d.get('step')}"
        if stall is not None:
            text += f" (training paused {fmt_duration_s(stall)})"
        return text, {"step", "stall_s"}
    if kind == "cost":
        return f"attempt cost {fmt_usd(_f(d, 'usd'))}", {"usd"}
    if kind == "started":
        resumed = d.get("resumed_from_step")
        text = f"rank {d.get('rank')} started on {d.get('host')}"
        if resumed:
            text += f", resumed from step {resumed}"
        return text, {"rank", "host", "resumed_from_step"}
    if kind == "preempted":
        return (
            f"preempted at step {d.get('step')}, resumes from step {d.get('checkpoint_step')}",
            {"step", "checkpoint_step"},
        )
    if kind in ("failed", "lost"):
        msg = d.get("message") or d.get("reason") or d.get("error") or kind
        first_line = str(msg).strip().splitlines()[0] if str(msg).strip() else kind
        return f"{kind}: {first_line}", {"message", "reason", "error"}
    if kind == "traffic_changed":
        to = d.get("to") or []
        routes = ", ".join(
            f"{r.get('model')} {fmt_num(r.get('weight'))}" + (" (shadow)" if r.get("shadow") else "")
            for r in to
            if isinstance(r, dict)
        )
        return f"traffic set to {routes}", {"to"}
    if kind == "canary_rolled_back":
        return f"canary {d.get('model')} rolled back: {d.get('reason')}", {"model", "reason"}
    msg = d.get("message")
    return (str(msg).splitlines()[0] if msg else kind.replace("_", " ")), {"message"} if msg else set()


def describe(event_id: int, kind: str, data: dict[str, Any], time_s: float | None) -> EventView:
    d = dict(data or {})
    summary, said = _summary(kind, d)
    text_parts = []
    for k in LONG_TEXT_KEYS:
        v = d.get(k)
        if isinstance(v, str) and v.strip():
            text_parts.append(v.rstrip())
            said.add(k)
    msg = d.get("message")
    if isinstance(msg, str) and "\n" in msg.strip():
        text_parts.insert(0, msg.rstrip())
    fields = [(k, value_text(v)) for k, v in sorted(d.items()) if k not in said]
    return EventView(
        id=event_id,
        kind=kind,
        time=iso(time_s),
        summary=summary,
        fields=fields,
        text="\n".join(text_parts) or None,
    )
