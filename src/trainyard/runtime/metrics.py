"""Step metrics at training resolution: the worker side of ``GET /v1/jobs/{id}/metrics``.

A :class:`MetricsStream` keeps one row per logged step (every ``every_steps`` steps, at most
``max_rows_per_s`` rows a second so a model that trains thousands of steps a second cannot flood the
control plane; the first and the last step are always kept) and sends them in batches as ``metrics``
events, packed by column::

    {"rank": 0, "steps": [1, 2, ...], "time_s": [...], "values": {"loss": [...], "step_time_s": [...]}}

A batch goes out every ``flush_s`` seconds, when ``max_batch_rows`` rows are waiting, and on
``flush()`` (before a checkpoint, a preemption and the end), so a row reaches the control plane at
most about a second after its step. Values are finite floats or None (a metric a row does not have,
or one that was NaN or infinite).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

DEFAULT_EVERY_STEPS = 1
DEFAULT_MAX_ROWS_PER_S = 100.0
DEFAULT_FLUSH_S = 1.0
MAX_BATCH_ROWS = 1024
MAX_METRICS_PER_ROW = 32  # names beyond this many in one row are dropped


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None  # JSON has no NaN; a diverging loss fails the job anyway


class MetricsStream:
    def __init__(
        self,
        emit: Callable[..., Any],
        rank: int,
        *,
        every_steps: int = DEFAULT_EVERY_STEPS,
        max_rows_per_s: float = DEFAULT_MAX_ROWS_PER_S,
        flush_s: float = DEFAULT_FLUSH_S,
        max_batch_rows: int = MAX_BATCH_ROWS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.emit = emit
        self.rank = rank
        self.every_steps = max(1, int(every_steps))
        self.min_gap_s = 1.0 / max_rows_per_s if max_rows_per_s and max_rows_per_s > 0 else 0.0
        self.flush_s = flush_s
        self.max_batch_rows = max(1, max_batch_rows)
        self.clock = clock
        self.wall = wall
        self._rows: dict[int, tuple[float, dict[str, float | None]]] = {}
        self._last_row_t: float | None = None
        self._last_flush_t = clock()
        self.rows_sent = 0

    def due(self, step: int, *, final: bool = False) -> bool:
        """Whether ``step`` is logged: a multiple of ``every_steps`` (or the first or ``final`` step),
        and not within ``1 / max_rows_per_s`` of the previous row (``final`` always is)."""
        if final or step <= 1:
            return True
        if step % self.every_steps:
            return False
        return self._last_row_t is None or self.clock() - self._last_row_t >= self.min_gap_s

    def record(self, step: int, *, final: bool = False, **values: Any) -> bool:
        """Log the metrics of ``step`` when it is due; True when the row was kept."""
        if not self.due(step, final=final):
            self.maybe_flush()
            return False
        self._last_row_t = self.clock()
        self._put(step, values)
        self.maybe_flush()
        return True

    def attach(self, step: int, **values: Any) -> None:
        """Add metrics to ``step``'s row (e.g. the eval loss measured after it), kept whatever the rate."""
        self._put(step, values)
        self.maybe_flush()

    def _put(self, step: int, values: dict[str, Any]) -> None:
        t, row = self._rows.get(step, (self.wall(), {}))
        for name, value in values.items():
            if len(row) >= MAX_METRICS_PER_ROW and name not in row:
                continue
            row[str(name)] = _number(value)
        self._rows[step] = (t, row)

    def maybe_flush(self) -> None:
        if self._rows and (
            len(self._rows) >= self.max_batch_rows or self.clock() - self._last_flush_t >= self.flush_s
        ):
            self.flush()

    def flush(self) -> None:
        """Send the rows waiting, as one ``metrics`` event."""
        self._last_flush_t = self.clock()
        if not self._rows:
            return
        steps = sorted(self._rows)
        names: list[str] = []
        for s in steps:
            for n in self._rows[s][1]:
                if n not in names:
                    names.append(n)
        values = {n: [self._rows[s][1].get(n) for s in steps] for n in names}
        times = [round(self._rows[s][0], 6) for s in steps]
        self._rows.clear()
        self.emit("metrics", rank=self.rank, steps=steps, time_s=times, values=values)
        self.rows_sent += len(steps)


def unpack(data: dict[str, Any]) -> list[tuple[int, float, dict[str, float | None]]]:
    """The rows of one ``metrics`` event: ``[(step, time_s, {name: value})]`` (malformed parts dropped)."""
    steps = data.get("steps")
    if not isinstance(steps, list):
        return []
    raw_times, raw_values = data.get("time_s"), data.get("values")
    times: list[Any] = raw_times if isinstance(raw_times, list) else []
    values: dict[str, Any] = raw_values if isinstance(raw_values, dict) else {}
    out = []
    for i, step in enumerate(steps):
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            continue
        t = times[i] if i < len(times) and isinstance(times[i], int | float) else 0.0
        row: dict[str, float | None] = {}
        for name, col in list(values.items())[:MAX_METRICS_PER_ROW]:
            if isinstance(col, list) and i < len(col):
                row[str(name)[:64]] = _number(col[i])
        out.append((step, float(t), row))
    return out
