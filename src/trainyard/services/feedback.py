"""Feedback: measured step times from running jobs go back into the predictor's calibration.

Heartbeats carry ``step_time_s``. The supervisor hands every heartbeat of a job attempt to
:meth:`Feedback.observe_heartbeat`; when the attempt ends (success, preemption, failure) its steady-state
step times (the first steps, which include warm-up, and stalls over 3 × the median, e.g. a synchronous
checkpoint, are dropped) are stored as one row of ``step_time_measurements`` (so every control plane on a
shared PostgreSQL database learns from them). :meth:`Feedback.refresh` folds rows it has not seen yet into
the calibration through the predictor's pure feedback API
(:func:`trainyard.predict.fit.ingest_measurement`), one measurement per sampled step (up to
``MAX_SAMPLES_PER_ATTEMPT`` per attempt, evenly spread), so a long attempt outweighs the predictor's prior
and a single noisy step does not. :meth:`Feedback.rebuild` replays the newest rows on start.

:meth:`Feedback.quote` is the control plane's quoter: ``trainyard.cost.quote.quote`` with the pools whose
accelerator has been measured re-priced on the updated calibration.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from trainyard.catalog.pools import Pool
from trainyard.executors.base import ExecutorEvent
from trainyard.predict.params import Calibration, default_calibration
from trainyard.services.domain import Job
from trainyard.spec.models import JobSpec
from trainyard.store.db import Database
from trainyard.store.repositories import StepTimeRepo

log = structlog.get_logger("trainyard.feedback")

WARMUP_SAMPLES = 3  # first heartbeats of an attempt: compile, allocator and data-loader warm-up
WARMUP_FRACTION = 0.05  # or this share of them, whichever is larger
STALL_FACTOR = 3.0  # a step over this × the median waited on something else (checkpoint write, I/O)
MIN_STEADY_SAMPLES = 3  # an attempt with fewer steady-state step times teaches nothing
MAX_SAMPLES_PER_ATTEMPT = 256  # step times kept (evenly spread) and ingested per attempt
MAX_BUFFERED_SAMPLES = 20_000  # per attempt in memory before thinning
REBUILD_ROWS = 64  # newest attempts considered on start
MAX_CALIBRATION_SAMPLES = 2048  # step times held in the calibration (newest attempts first)


def steady_state(step_times_s: Sequence[float]) -> list[float]:
    """The steady-state part of an attempt's step times: warm-up dropped, stalls dropped."""
    values = [float(x) for x in step_times_s if isinstance(x, int | float) and math.isfinite(x) and x > 0]
    skip = max(WARMUP_SAMPLES, int(len(values) * WARMUP_FRACTION))
    body = values[skip:]
    if not body:
        return []
    median = statistics.median(body)
    return [x for x in body if x <= STALL_FACTOR * median]


def thin(values: Sequence[float], n: int) -> list[float]:
    """At most ``n`` values, evenly spread over ``values`` (order kept)."""
    if len(values) <= n:
        return list(values)
    return [values[(i * len(values)) // n] for i in range(n)]


def calibrated_accelerators(cal: Calibration) -> set[str]:
    """Accelerators ``cal`` knows more about than the packaged calibration: feedback corrections (keys
    family/stack/precision/accelerator) and this machine's profiles (measured peaks, fitted params)."""
    # family/stack/precision/accelerator[/xN] (a device count's own, ``params.correction_key``)
    out = {key.split("/")[3] for key in cal.corrections if key.count("/") >= 3}
    out |= set(cal.peaks_override)
    out |= {
        key.split("/")[3]
        for key, params in cal.params.items()
        if key.count("/") >= 3 and str(getattr(params, "key", "")).endswith("/profiled")
    }
    return out


def calibrated_quote(
    spec: JobSpec, pools: Sequence[Pool], calibration: Calibration, **quote_kwargs: Any
) -> list[Any]:
    """``trainyard.cost.quote.quote`` where options on pools whose accelerator the calibration has measured
    (feedback corrections, local profiles) are priced with step times predicted on ``calibration`` (same
    pool topology as the cost model passes)."""
    from trainyard.cost.quote import option_for, pool_accelerator, predict_kwargs, quote, sort_key
    from trainyard.predict import predict

    options = list(quote(spec, list(pools), **quote_kwargs))
    corrected = calibrated_accelerators(calibration)
    if not corrected:
        return options
    by_name = {p.name: p for p in pools}
    out = []
    for opt in options:
        pool = by_name.get(getattr(opt, "pool", None) or "")
        if pool is None or pool.accelerator not in corrected:
            out.append(opt)
            continue
        topology = predict_kwargs(pool, pool_accelerator(pool))

        def pf(s: JobSpec, a: Any, d: int, _topology: dict[str, Any] = topology) -> Any:
            return predict(s, a, d, calibration=calibration, **_topology)

        extra = {k: v for k, v in quote_kwargs.items() if k in ("params", "now", "deadline_s")}
        out.append(option_for(spec, pool, opt.devices, predict_fn=pf, **extra))
    out.sort(key=sort_key(spec))
    return out


class Feedback:
    """Measured step times in, an updated calibration (and a quoter that uses it) out."""

    def __init__(
        self,
        db: Database,
        live_pools: Callable[[], list[Pool]],
        clock: Callable[[], float] = time.time,
        base: Calibration | None = None,
        home: Path | None = None,
    ) -> None:
        from trainyard.services.profiles import profile_calibration, profiles_signature

        self.db = db
        self.live_pools = live_pools
        self.clock = clock
        # ``home``: this machine's profiles ($TRAINYARD_HOME/profiles) join the base calibration, and a
        # profile stored later (``trainyard profile``, the first-start measurement) is picked up
        self.home = home
        self._profiles_sig = profiles_signature(home) if home is not None else (0, 0.0)
        self._explicit_base = base
        self.base = base if base is not None else profile_calibration(home, default_calibration())
        self._calibration = self.base
        self._last_id = 0
        self._samples: dict[tuple[str, int], list[float]] = {}
        self._devices: dict[tuple[str, int], str | None] = {}  # the accelerator rank 0 reported
        self._lock = threading.Lock()
        self.version = 0  # bumps whenever the calibration changes

    @property
    def calibration(self) -> Calibration:
        return self._calibration

    # ---- collecting ------------------------------------------------------------------------------
    def observe_started(self, job: Job, ev: ExecutorEvent) -> None:
        """Keep the accelerator rank 0 says it really runs on (``started.data.device.accelerator``)."""
        if ev.data.get("rank", 0) not in (0, None):
            return
        device = ev.data.get("device")
        acc = device.get("accelerator") if isinstance(device, dict) else None
        with self._lock:
            self._devices[(job.id, ev.attempt)] = str(acc) if acc else None

    def observe_heartbeat(self, job: Job, ev: ExecutorEvent) -> None:
        """Keep rank 0's step time of this attempt (every rank of a gang steps together)."""
        value = ev.data.get("step_time_s")
        rank = ev.data.get("rank", 0)
        if rank not in (0, None) or not isinstance(value, int | float) or isinstance(value, bool):
            return
        if not (math.isfinite(value) and value > 0):
            return
        with self._lock:
            buf = self._samples.setdefault((job.id, ev.attempt), [])
            buf.append(float(value))
            if len(buf) > MAX_BUFFERED_SAMPLES:
                buf[:] = buf[::2]

    def attempt_closed(self, s: Any, job: Job, ended_s: float) -> dict[str, Any] | None:
        """Store the ending attempt's steady-state step times in the caller's transaction (or nothing when
        it has too few, or the worker did not report running on the placement's accelerator). Returns the
        stored document."""
        with self._lock:
            samples = self._samples.pop((job.id, job.attempt), [])
            reported = self._devices.pop((job.id, job.attempt), None)
        placement = job.placement
        if placement is None or not placement.accelerator:
            return None
        if reported != placement.accelerator:
            # a measurement belongs to the accelerator the worker reported it ran on, never to the
            # placement's label alone: unreported or different devices teach nothing
            log.warning(
                "step_times_not_stored",
                job_id=job.id,
                attempt=job.attempt,
                placed=placement.accelerator,
                reported=reported,
            )
            return None
        steady = steady_state(samples)
        if len(steady) < MIN_STEADY_SAMPLES:
            return None
        doc = {
            "job_id": job.id,
            "attempt": job.attempt,
            "pool": placement.pool,
            "accelerator": placement.accelerator,
            "devices": placement.devices,
            "spec": job.spec,
            "median_step_time_s": statistics.median(steady),
            "samples": len(steady),
            "step_times_s": thin(steady, MAX_SAMPLES_PER_ATTEMPT),
            "measured_at_s": ended_s,
        }
        if not StepTimeRepo(s).add(doc):
            return None
        log.info(
            "step_times_measured",
            job_id=job.id,
            attempt=job.attempt,
            accelerator=placement.accelerator,
            median_step_time_s=doc["median_step_time_s"],
            samples=len(steady),
        )
        return doc

    # ---- learning --------------------------------------------------------------------------------
    def rebuild(self) -> None:
        """Start over from the packaged calibration and replay the newest stored attempts."""
        with self.db.session() as s:
            rows = StepTimeRepo(s).recent(REBUILD_ROWS)
        kept: list[dict[str, Any]] = []
        total = 0
        for row in reversed(rows):
            total += len(row["step_times_s"])
            if kept and total > MAX_CALIBRATION_SAMPLES:
                break
            kept.append(row)
        rows = kept[::-1]
        self._calibration = self.base
        self._last_id = 0
        self._apply(rows)
        self.version += 1

    def _profiles_changed(self) -> bool:
        """Rebuild on a new base when a profile was stored since; True when it did."""
        if self.home is None or self._explicit_base is not None:
            return False
        from trainyard.services.profiles import profile_calibration, profiles_signature

        sig = profiles_signature(self.home)
        if sig == self._profiles_sig:
            return False
        self._profiles_sig = sig
        self.base = profile_calibration(self.home, default_calibration())
        self.rebuild()
        return True

    def refresh(self) -> bool:
        """Fold rows stored since the last call into the calibration; True when it changed."""
        if self._profiles_changed():
            return True
        with self.db.session() as s:
            rows = StepTimeRepo(s).list(after_id=self._last_id)
        if not rows:
            return False
        if len(self._calibration.measurements) > 2 * MAX_CALIBRATION_SAMPLES:
            self.rebuild()  # bounded memory: keep the newest attempts only
            return True
        changed = self._apply(rows)
        if changed:
            self.version += 1
        return changed

    def _apply(self, rows: Sequence[dict[str, Any]]) -> bool:
        from trainyard.catalog.accelerators import get_accelerator
        from trainyard.cost.quote import pool_accelerator, predict_kwargs
        from trainyard.errors import TrainyardError
        from trainyard.predict.fit import ingest_measurement
        from trainyard.spec.loader import spec_from_dict

        pools = {p.name: p for p in self.live_pools()}
        cal = self._calibration
        changed = False
        for row in rows:
            self._last_id = max(self._last_id, int(row["id"]))
            try:
                spec = spec_from_dict(row["spec"])
                pool = pools.get(row["pool"])
                if pool is not None and pool.accelerator == row["accelerator"]:
                    acc = pool_accelerator(pool)
                    kwargs = predict_kwargs(pool, acc)
                else:
                    acc, kwargs = get_accelerator(row["accelerator"]), {}
                label = f"{row['job_id']}#{row['attempt']}"
                for value in row["step_times_s"]:
                    cal = ingest_measurement(
                        cal, spec, acc, int(row["devices"]), float(value), label=label, **kwargs
                    )
                changed = True
            except (TrainyardError, ValueError, KeyError, TypeError) as exc:
                log.warning("measurement_skipped", job_id=row.get("job_id"), error=str(exc)[:300])
        self._calibration = cal
        return changed

    # ---- using -----------------------------------------------------------------------------------
    def quote(self, spec: JobSpec, pools: Sequence[Pool]) -> list[Any]:
        """The control plane's quoter (``QuoteFn``): the cost model on the current calibration."""
        from trainyard.predict.model import mark_executability

        with self._lock:
            self._profiles_changed()
        return mark_executability(spec, calibrated_quote(spec, pools, self._calibration))

    def summary(self) -> list[dict[str, Any]]:
        """Per calibration key: the correction factor on predicted step times and how many measurements."""
        cal = self._calibration
        counts: dict[str, int] = {}
        for m in cal.measurements:
            counts[m.key] = counts.get(m.key, 0) + 1
        return [
            {"key": key, "correction": factor, "measurements": counts.get(key, 0)}
            for key, factor in sorted(cal.corrections.items())
        ]
