"""Quotes: every pool × allowed device count × market, priced and ranked (pure).

``quote(spec, pools)`` is what `trainyard quote`, the API and the scheduler use. Each option says what
the job would cost and how long it would take on one pool with one device count; infeasible options
carry the reason, naming the numbers (memory, deadline, budget, escape hatches).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from fnmatch import fnmatch
from typing import Any

from trainyard.catalog.accelerators import Accelerator, get_accelerator
from trainyard.catalog.names import FRAMEWORKS, family_of
from trainyard.catalog.offers import (
    RESERVED_DISCOUNT_1Y,
    catalog_pools,
    offers_as_pools,
    pool_interruption_rate_per_hour,
    pool_notice_s,
    price_usd_per_device_hour_for,
)
from trainyard.catalog.pools import Pool
from trainyard.cost import model as cm
from trainyard.errors import PoolsFileError
from trainyard.predict import Prediction, predict
from trainyard.spec.models import JobSpec, Minimize

CONTRACT_KEYS = (
    "accelerator", "devices", "cloud", "region", "instance_type", "market", "step_time_s",
    "price_usd_per_hour", "usd_per_step", "expected_hours", "expected_cost_usd", "preemption_overhead_usd",
    "checkpoint_interval_s", "feasible", "reason",
)  # fmt: skip
MEASURED_P90_FACTOR = 1.05  # a measured step time still jitters (data loading, stragglers): +5 % at p90


@dataclass(frozen=True)
class QuoteOption:
    # DESIGN §3.3 fields
    accelerator: str
    devices: int
    cloud: str | None
    region: str
    instance_type: str | None
    market: str  # "spot" | "on_demand" | "reserved"
    step_time_s: float
    price_usd_per_hour: float  # the whole allocation (all devices) per hour
    usd_per_step: float  # per *effective* step, checkpoint + preemption overhead included
    expected_hours: float
    expected_cost_usd: float
    preemption_overhead_usd: float
    checkpoint_interval_s: float
    feasible: bool
    reason: str
    # extras
    pool: str = ""
    nodes: int = 0
    expected_hours_p90: float = 0.0
    restart_s: float = 0.0
    compile_s: float = 0.0
    prediction: Prediction | None = None
    checkpoint_s: float = 0.0  # stall per save
    checkpoint_overhead_usd: float = 0.0
    interruption_rate_per_hour: float = 0.0  # of the whole allocation: the per-instance rate × nodes
    notice_s: float = 0.0
    step_time_p90_s: float = 0.0
    step_time_source: str = ""  # "measured", "measured-scaled" or the predictor's source
    total_steps: int = 0
    capacity_wait_hours: float = 0.0  # unbilled part of expected_hours (CostParams.spot_capacity_wait_s)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_contract(self) -> dict[str, Any]:
        """Exactly the DESIGN §3.3 keys."""
        return {k: getattr(self, k) for k in CONTRACT_KEYS}

    def to_dict(self) -> dict[str, Any]:
        """The contract keys plus the extras (without the nested prediction's internals)."""
        d = self.to_contract()
        d.update(
            pool=self.pool,
            nodes=self.nodes,
            expected_hours_p90=self.expected_hours_p90,
            restart_s=self.restart_s,
            compile_s=self.compile_s,
            checkpoint_s=self.checkpoint_s,
            checkpoint_overhead_usd=self.checkpoint_overhead_usd,
            interruption_rate_per_hour=self.interruption_rate_per_hour,
            notice_s=self.notice_s,
            step_time_p90_s=self.step_time_p90_s,
            step_time_source=self.step_time_source,
            total_steps=self.total_steps,
            capacity_wait_hours=self.capacity_wait_hours,
        )
        return d


# ---- device counts ------------------------------------------------------------------------------------
def _device_bounds(spec: JobSpec) -> tuple[int, int | None]:
    r = spec.resources
    return (r.min_devices or 1), r.max_devices


def _shape_ok(pool: Pool, devices: int) -> bool:
    dpn = pool.devices_per_node
    if devices < 1 or devices > pool.total_devices:
        return False
    if devices % dpn == 0:
        return True
    if pool.whole_nodes_only:
        return False
    # A share of one node: a power of two that divides the node (1, 2, 4 of 8 GPUs).
    return devices < dpn and dpn % devices == 0 and (devices & (devices - 1)) == 0


def candidate_device_counts(spec: JobSpec, pool: Pool) -> list[int]:
    """Device counts worth pricing on ``pool`` within the spec's min/max devices.

    Powers of two of whole nodes (plus all nodes), power-of-two shares of one node unless the pool rents
    whole instances only, and the spec's own bounds when the pool's shape allows them.
    """
    lo, hi = _device_bounds(spec)
    dpn = pool.devices_per_node
    cand: set[int] = set()
    k = 1
    while k <= pool.nodes:
        cand.add(k * dpn)
        k *= 2
    cand.add(pool.nodes * dpn)
    if not pool.whole_nodes_only:
        s = 1
        while s < dpn:
            cand.add(s)
            s *= 2
    cand.add(lo)
    cand.add(math.ceil(lo / dpn) * dpn)  # the fewest whole nodes that reach lo
    if hi is not None:
        cand.add(hi)
        cand.add(hi // dpn * dpn)  # the most whole nodes within hi
    upper = pool.total_devices if hi is None else min(hi, pool.total_devices)
    return sorted(d for d in cand if lo <= d <= upper and _shape_ok(pool, d))


# ---- eligibility --------------------------------------------------------------------------------------
def predict_kwargs(pool: Pool, accelerator: Accelerator) -> dict[str, Any]:
    """The pool's topology for the predictor: devices per node and network, or the slice for TPUs."""
    kw: dict[str, Any] = {"inter_node_gbps": pool.inter_node_gbps}
    if accelerator.family == "google-tpu":
        kw["fast_domain_devices"] = pool.devices_per_node  # one slice shares the ICI torus
    else:
        kw["devices_per_node"] = pool.devices_per_node
    return kw


def pool_accelerator(pool: Pool, accelerator: Accelerator | None = None) -> Accelerator:
    """The pool's accelerator, with the pool's own device memory where it states one."""
    acc = accelerator if accelerator is not None else get_accelerator(pool.accelerator)
    mem = pool.memory_per_device_gib
    if mem is not None and mem != acc.memory_gib:
        acc = replace(acc, memory_gib=mem)
    return acc


def eligibility_reason(spec: JobSpec, pool: Pool, accelerator: Accelerator | None = None) -> str:
    """Why ``pool`` can never serve ``spec`` whatever the device count ('' when it can)."""
    acc_name = pool.accelerator
    family = family_of(acc_name)
    req = spec.requirements
    for fw in req.frameworks:
        if family not in FRAMEWORKS[fw]:
            need = " or ".join(sorted(FRAMEWORKS[fw]))
            return f"requirements.frameworks: {fw} needs {need}, {acc_name} is {family}"
    if req.allow and acc_name not in req.allow and family not in req.allow:
        return f"requirements.allow: {acc_name} ({family}) is not in {', '.join(req.allow)}"
    if acc_name in req.deny or family in req.deny:
        return f"requirements.deny: {acc_name} ({family}) is denied"
    if req.regions:
        where = [pool.region] + (
            [f"{pool.cloud}/{pool.region}", f"{pool.cloud}:{pool.region}"] if pool.cloud else []
        )
        if not any(fnmatch(w, g) for w in where for g in req.regions):
            return f"requirements.regions: {pool.region} matches none of {', '.join(req.regions)}"
    if pool.market not in spec.objective.markets:
        allowed = ", ".join(m.value for m in spec.objective.markets)
        return f"objective.markets: {pool.market.value} is not in {allowed}"
    min_mem = spec.resources.min_memory_per_device_gib
    if min_mem is not None:
        acc = pool_accelerator(pool, accelerator)
        if acc.memory_gib < min_mem:
            have = f"{acc.memory_gib:g} GiB < {min_mem:g} GiB"
            return f"resources.min_memory_per_device_gib: {acc_name} has {have}"
    return ""


def interconnect_gbps(pool: Pool, accelerator: Accelerator, devices: int) -> float:
    """Per-device link of an allocation in Gbit/s: intra-node links on one node, the network beyond."""
    nodes = math.ceil(devices / pool.devices_per_node)
    if nodes <= 1:
        return accelerator.intra_node_gbs * 8.0
    return pool.inter_node_gbps if pool.inter_node_gbps is not None else accelerator.inter_node_gbps


# ---- one option ---------------------------------------------------------------------------------------
def _measured_reference_devices(spec: JobSpec) -> int:
    return spec.resources.min_devices or 1


def _fmt_h(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def _infeasible(spec: JobSpec, pool: Pool, devices: int, reason: str, **extra: Any) -> QuoteOption:
    base: dict[str, Any] = dict(
        accelerator=pool.accelerator,
        devices=devices,
        cloud=pool.cloud,
        region=pool.region,
        instance_type=pool.instance_type,
        market=pool.market.value,
        step_time_s=0.0,
        price_usd_per_hour=(pool.price_usd_per_device_hour or 0.0) * devices,
        usd_per_step=0.0,
        expected_hours=0.0,
        expected_cost_usd=0.0,
        preemption_overhead_usd=0.0,
        checkpoint_interval_s=0.0,
        feasible=False,
        reason=reason,
        pool=pool.name,
        nodes=math.ceil(devices / pool.devices_per_node) if devices else 0,
    )
    base.update(extra)
    return QuoteOption(**base)


PredictFn = Callable[[JobSpec, Accelerator, int], Prediction]


def _finite_positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


@dataclass(frozen=True)
class SpecFacts:
    """What option_for needs from a spec that does not depend on the pool (computed once per quote)."""

    total_steps: int
    checkpoint_bytes: float
    deadline_s: float | None

    @classmethod
    def of(cls, spec: JobSpec, now: datetime | None = None, deadline_s: float | None = None) -> SpecFacts:
        dl = deadline_s
        if dl is None:
            try:
                dl = spec.objective.deadline_s(now)
            except ValueError:
                dl = None  # an absolute deadline without the submission time cannot be checked
        return cls(spec.workload.total_steps(), cm.checkpoint_bytes(spec), dl)


@dataclass(frozen=True)
class WorkPricing:
    """The part of a quote that depends on how much work is left (the rest depends only on the shape)."""

    billed_s: float
    wall_s: float
    wall_p90_s: float
    cost_usd: float
    checkpoint_frac: float
    preemption_frac: float
    checkpoint_overhead_usd: float
    preemption_overhead_usd: float

    def option_fields(self, total_steps: int) -> dict[str, Any]:
        """The QuoteOption fields these numbers fill."""
        return dict(
            expected_hours=self.wall_s / cm.SECONDS_PER_HOUR,
            expected_cost_usd=self.cost_usd,
            preemption_overhead_usd=self.preemption_overhead_usd,
            expected_hours_p90=self.wall_p90_s / cm.SECONDS_PER_HOUR,
            checkpoint_overhead_usd=self.checkpoint_overhead_usd,
            total_steps=total_steps,
            capacity_wait_hours=(self.wall_s - self.billed_s) / cm.SECONDS_PER_HOUR,
        )


def price_work(
    spec: JobSpec,
    facts: SpecFacts,
    acc: Accelerator,
    nodes: int,
    elapsed_fraction: float,
    *,
    step_s: float,
    step_p90_s: float,
    price_h: float,
    interval_s: float,
    stall_s: float,
    rate_h: float,
    restart_s: float,
    compile_s: float,
    params: cm.CostParams,
) -> WorkPricing:
    """Expected and pessimistic wall time and dollars for the remaining work of one allocation."""
    remaining_steps = facts.total_steps * (1.0 - elapsed_fraction)
    work_s = remaining_steps * step_s
    work_p90_s = remaining_steps * step_p90_s
    url = spec.checkpoint.storage
    load_s = cm.checkpoint_load_s(facts.checkpoint_bytes, nodes, cm.storage_read_gb_per_s(url, params))
    provisioning_s = params.provisioning_s.get(acc.family, cm.DEFAULT_PROVISIONING_S)
    rate_s = rate_h / cm.SECONDS_PER_HOUR
    ckpt_frac = cm.checkpoint_fraction(interval_s, stall_s)
    pre_frac = cm.preemption_fraction(interval_s, rate_s, restart_s)
    startup_s = provisioning_s + compile_s + (load_s if elapsed_fraction > 0 else 0.0)
    billed_s = cm.expected_wall_s(work_s, ckpt_frac + pre_frac, startup_s)
    wait_s = params.spot_capacity_wait_s if rate_s > 0 else 0.0
    wall_s = billed_s + rate_s * work_s * wait_s  # waiting for capacity lengthens the run, costs nothing
    wall_p90_s = cm.pessimistic_wall_s(
        work_p_s=work_p90_s,
        checkpoint_frac=ckpt_frac,
        interval_s=interval_s,
        rate_per_s=rate_s,
        restart_s=restart_s,
        startup_s=startup_s,
        quantile=params.deadline_quantile,
        wait_s=wait_s,
    )
    return WorkPricing(
        billed_s=billed_s,
        wall_s=wall_s,
        wall_p90_s=wall_p90_s,
        cost_usd=cm.dollars(price_h, billed_s),
        checkpoint_frac=ckpt_frac,
        preemption_frac=pre_frac,
        checkpoint_overhead_usd=cm.dollars(price_h, work_s * ckpt_frac),
        preemption_overhead_usd=cm.dollars(price_h, work_s * pre_frac),
    )


def work_reason(
    spec: JobSpec,
    facts: SpecFacts,
    devices: int,
    w: WorkPricing,
    *,
    rate_h: float,
    restart_s: float,
    interval_s: float,
    params: cm.CostParams,
) -> str:
    """Why the priced work is infeasible (preemptions, deadline, budget, device-hours), or ''."""
    if w.preemption_frac >= 1.0:
        return (
            f"preemptions every {1 / rate_h:.1f} h cost {restart_s:.0f} s restart + half a "
            f"{interval_s:.0f} s interval each: more wall time is lost than trained"
        )
    dl = facts.deadline_s
    if dl is not None and w.wall_p90_s > dl:
        which = f"p{round(params.deadline_quantile * 100)}" if rate_h > 0 else "p90 step time"
        return (
            f"objective.deadline: {which} wall time {_fmt_h(w.wall_p90_s / 3600)} exceeds the deadline "
            f"{_fmt_h(dl / 3600)} (expected {_fmt_h(w.wall_s / 3600)})"
        )
    budget = spec.objective.budget_usd
    if budget is not None and w.cost_usd > budget:
        return f"objective.budget_usd: expected ${w.cost_usd:,.2f} exceeds the budget ${budget:,.2f}"
    limit = spec.resources.accelerator_hours
    if limit is not None:
        dev_h = devices * w.billed_s / cm.SECONDS_PER_HOUR
        if dev_h > limit:
            return f"resources.accelerator_hours: {dev_h:,.1f} device-hours exceed the limit {limit:g}"
    return ""


def screen_option(
    spec: JobSpec,
    pool: Pool,
    devices: int,
    acc: Accelerator,
    params: cm.CostParams = cm.DEFAULT_PARAMS,
) -> QuoteOption | float:
    """The checks of :func:`option_for` that need no prediction, in its order: the pool's eligibility, the
    spec's device range, the pool's shape and its price. Returns the rejected option, or the price per
    device-hour when the allocation passes (``acc`` is :func:`pool_accelerator`'s)."""
    why = eligibility_reason(spec, pool, acc)
    if why:
        return _infeasible(spec, pool, devices, why)
    lo, hi = _device_bounds(spec)
    if devices < lo or (hi is not None and devices > hi):
        rng = f"{lo}..{hi}" if hi is not None else f"at least {lo}"
        return _infeasible(spec, pool, devices, f"resources: {devices} devices is outside {rng}")
    if not _shape_ok(pool, devices):
        shape = (
            "whole instances only"
            if pool.whole_nodes_only
            else "power-of-two shares of a node or whole nodes"
        )
        return _infeasible(
            spec, pool, devices,
            f"pool {pool.name}: {devices} devices does not fit "
            f"{pool.nodes} x {pool.devices_per_node} ({shape})",
        )  # fmt: skip
    try:
        return price_usd_per_device_hour_for(pool, reserved_discount=params.reserved_discount)
    except PoolsFileError as exc:  # no price anywhere: this pool cannot be quoted (callers may pre-check)
        return _infeasible(spec, pool, devices, f"no price: {exc.message}")


@dataclass(frozen=True)
class AllocationTimes:
    """The part of one option that depends on neither the pool's price nor the job's length: step times,
    checkpointing, restart and interruptions of ``devices`` x ``accelerator``.

    It reads the pool only through the accelerator (with the pool's device memory), the devices per node
    and the inter-node network (the predictor's topology) and the pool's interruption rate, so pools that
    differ only in price, region or size share it (the scheduler does). ``prediction`` None: the predictor
    cannot model the combination (``reason`` says why); ``reason`` with a prediction: it does not fit.
    """

    accelerator: Accelerator
    devices: int
    nodes: int
    prediction: Prediction | None
    reason: str = ""
    step_s: float = 0.0
    step_p90_s: float = 0.0
    source: str = ""
    stall_s: float = 0.0
    compile_s: float = 0.0
    restart_s: float = 0.0
    rate_h: float = 0.0  # interruptions of the whole allocation per hour
    interval_s: float = 0.0


def allocation_times(
    spec: JobSpec,
    pool: Pool,
    devices: int,
    acc: Accelerator,
    facts: SpecFacts,
    *,
    prediction: Prediction | None = None,
    predict_fn: PredictFn | None = None,
    params: cm.CostParams = cm.DEFAULT_PARAMS,
) -> AllocationTimes:
    """:class:`AllocationTimes` of ``devices`` on ``pool`` (``acc`` is :func:`pool_accelerator`'s)."""
    nodes = math.ceil(devices / pool.devices_per_node)

    # Step time: measured where the spec names this accelerator, else the predictor's.
    if predict_fn is not None:
        pf = predict_fn
    else:
        topology = predict_kwargs(pool, acc)

        def pf(s: JobSpec, a: Accelerator, d: int) -> Prediction:
            return predict(s, a, d, **topology)

    try:
        pred = prediction if prediction is not None else pf(spec, acc, devices)
    except ValueError as exc:  # the predictor cannot model this combination: say so, do not crash a quote
        return AllocationTimes(acc, devices, nodes, None, f"predictor: {exc}")
    step_s, step_p90_s, fits, fit_reason = pred.step_time_s, pred.step_time_p90_s, pred.fits, pred.reason
    source = pred.source
    measured = spec.measured.step_time_s.get(acc.name)
    if measured is not None:
        d0 = _measured_reference_devices(spec)
        if devices == d0:
            step_s, step_p90_s, fits, fit_reason, source = (
                measured,
                measured * MEASURED_P90_FACTOR,
                True,
                "",
                "measured",
            )
        else:
            try:
                ref_s = pf(spec, acc, d0).step_time_s
            except ValueError:
                ref_s = math.nan
            usable = _finite_positive(pred.step_time_s) and _finite_positive(ref_s)
            # the predictor's scaling from the measured count; linear scaling when it has none
            scale = pred.step_time_s / ref_s if usable else d0 / devices
            p90_ratio = (
                pred.step_time_p90_s / pred.step_time_s
                if usable and _finite_positive(pred.step_time_p90_s)
                else MEASURED_P90_FACTOR
            )
            step_s = measured * scale
            step_p90_s = step_s * max(p90_ratio, MEASURED_P90_FACTOR)
            source = "measured-scaled"
    if not fits or not _finite_positive(step_s):
        reason = fit_reason or f"does not fit in memory on {devices} x {acc.name}"
        return AllocationTimes(
            acc, devices, nodes, pred, reason, step_s=step_s, step_p90_s=step_p90_s, source=source
        )
    if not _finite_positive(step_p90_s) or step_p90_s < step_s:
        step_p90_s = step_s

    # Checkpoint and preemption.
    ckpt_bytes = facts.checkpoint_bytes
    url = spec.checkpoint.storage
    write_bw = cm.storage_write_gb_per_s(url, params)
    stall_s = cm.checkpoint_stall_s(
        ckpt_bytes, devices=devices, nodes=nodes, write_gb_per_s=write_bw, params=params
    )
    compile_s = 0.0
    if acc.compile_required:
        compile_s = pred.compile_time_s if pred.compile_time_s > 0 else acc.first_compile_s
    load_s = cm.checkpoint_load_s(ckpt_bytes, nodes, cm.storage_read_gb_per_s(url, params))
    provisioning_s = params.provisioning_s.get(acc.family, cm.DEFAULT_PROVISIONING_S)
    rst_s = cm.restart_s(provisioning_s=provisioning_s, load_s=load_s, recompile_s=compile_s)
    # The pool's rate is per instance; a gang stops when any of its nodes is reclaimed.
    rate_h = pool_interruption_rate_per_hour(pool) * nodes
    interval_s = cm.choose_interval_s(
        spec.checkpoint.interval_s, stall_s, rate_h / cm.SECONDS_PER_HOUR, params
    )
    return AllocationTimes(
        acc, devices, nodes, pred, step_s=step_s, step_p90_s=step_p90_s, source=source, stall_s=stall_s,
        compile_s=compile_s, restart_s=rst_s, rate_h=rate_h, interval_s=interval_s,
    )  # fmt: skip


def priced_option(
    t: AllocationTimes,
    spec: JobSpec,
    pool: Pool,
    facts: SpecFacts,
    price_dev_h: float,
    elapsed_fraction: float,
    params: cm.CostParams = cm.DEFAULT_PARAMS,
) -> QuoteOption:
    """The option of ``t`` on ``pool`` at ``price_dev_h`` per device-hour for the work ``facts`` and
    ``elapsed_fraction`` leave: the last step of :func:`option_for`."""
    devices, nodes, acc, pred = t.devices, t.nodes, t.accelerator, t.prediction
    if pred is None:
        return _infeasible(spec, pool, devices, t.reason)
    price_h = price_dev_h * devices
    if t.reason:
        return _infeasible(
            spec, pool, devices, t.reason, price_usd_per_hour=price_h, prediction=pred,
            step_time_s=t.step_s if _finite_positive(t.step_s) else 0.0, step_time_source=t.source,
        )  # fmt: skip
    rate_h, rst_s, interval_s = t.rate_h, t.restart_s, t.interval_s
    w = price_work(
        spec, facts, acc, nodes, elapsed_fraction, step_s=t.step_s, step_p90_s=t.step_p90_s, price_h=price_h,
        interval_s=interval_s, stall_s=t.stall_s, rate_h=rate_h, restart_s=rst_s, compile_s=t.compile_s,
        params=params,
    )  # fmt: skip
    opt: dict[str, Any] = dict(
        accelerator=acc.name,
        devices=devices,
        cloud=pool.cloud,
        region=pool.region,
        instance_type=pool.instance_type,
        market=pool.market.value,
        step_time_s=t.step_s,
        price_usd_per_hour=price_h,
        usd_per_step=cm.usd_per_effective_step(price_h, t.step_s, w.checkpoint_frac + w.preemption_frac),
        checkpoint_interval_s=interval_s,
        pool=pool.name,
        nodes=nodes,
        restart_s=rst_s,
        compile_s=t.compile_s,
        prediction=pred,
        checkpoint_s=t.stall_s,
        interruption_rate_per_hour=rate_h,
        notice_s=pool_notice_s(pool) if rate_h > 0 else 0.0,
        step_time_p90_s=t.step_p90_s,
        step_time_source=t.source,
        **w.option_fields(facts.total_steps),
    )
    reason = ""
    if spec.resources.min_interconnect_gbps is not None:
        link = interconnect_gbps(pool, acc, devices)
        if link < spec.resources.min_interconnect_gbps:
            reason = (
                f"resources.min_interconnect_gbps: {devices} x {acc.name} on {nodes} node(s) has "
                f"{link:g} Gbit/s per device < {spec.resources.min_interconnect_gbps:g}"
            )
    reason = reason or work_reason(
        spec, facts, devices, w, rate_h=rate_h, restart_s=rst_s, interval_s=interval_s, params=params
    )
    opt.update(feasible=not reason, reason=reason)
    return QuoteOption(**opt)


def option_for(
    spec: JobSpec,
    pool: Pool,
    devices: int,
    *,
    prediction: Prediction | None = None,
    elapsed_fraction: float = 0.0,
    params: cm.CostParams = cm.DEFAULT_PARAMS,
    now: datetime | None = None,
    deadline_s: float | None = None,
    predict_fn: PredictFn | None = None,
    accelerator: Accelerator | None = None,
    facts: SpecFacts | None = None,
) -> QuoteOption:
    """Price ``spec`` on ``devices`` devices of ``pool``; infeasible options carry their reason.

    ``elapsed_fraction`` is the share of the job already done (re-planning a running job): only the rest
    is priced. ``deadline_s`` overrides the spec's deadline (seconds from now), e.g. for a job that has
    already waited; an absolute deadline needs ``now``. ``predict_fn(spec, accelerator, devices)`` lets
    callers share a cache (without one, the pool's topology from :func:`predict_kwargs` is passed on);
    ``accelerator`` and ``facts`` (from :meth:`SpecFacts.of`) save repeated look-ups in a loop.

    Three steps: :func:`screen_option` (eligibility, device range, shape, price), :func:`allocation_times`
    (prediction, checkpointing, interruptions) and :func:`priced_option` (price and work).
    """
    if not 0.0 <= elapsed_fraction < 1.0:
        raise ValueError(f"elapsed_fraction must be in [0, 1), got {elapsed_fraction}")
    acc = pool_accelerator(pool, accelerator)
    if facts is None:
        facts = SpecFacts.of(spec, now, deadline_s)
    price_dev_h = screen_option(spec, pool, devices, acc, params)
    if isinstance(price_dev_h, QuoteOption):
        return price_dev_h
    t = allocation_times(
        spec, pool, devices, acc, facts, prediction=prediction, predict_fn=predict_fn, params=params
    )
    return priced_option(t, spec, pool, facts, price_dev_h, elapsed_fraction, params)


# ---- the whole quote ----------------------------------------------------------------------------------
def sort_key(spec: JobSpec) -> Callable[[QuoteOption], tuple[Any, ...]]:
    by_time = spec.objective.minimize == Minimize.TIME

    def key(o: QuoteOption) -> tuple[Any, ...]:
        primary = (
            (o.expected_hours, o.expected_cost_usd) if by_time else (o.expected_cost_usd, o.expected_hours)
        )
        return (not o.feasible, *primary, o.pool, o.devices)

    return key


def quote(
    spec: JobSpec,
    pools: Sequence[Pool] | None = None,
    *,
    params: cm.CostParams = cm.DEFAULT_PARAMS,
    now: datetime | None = None,
    deadline_s: float | None = None,
    elapsed_fraction: float = 0.0,
) -> list[QuoteOption]:
    """Every pool (the packaged catalog when ``pools`` is None) × candidate device counts, ranked.

    Feasible options first, by expected cost (or expected hours when ``objective.minimize: time``);
    infeasible ones after, each with its reason. A pool excluded outright (escape hatches, markets,
    regions, memory per device, device range) appears once, at its smallest device count.
    """
    if pools is None:
        if params.reserved_discount == RESERVED_DISCOUNT_1Y:
            pools = catalog_pools()
        else:
            pools = offers_as_pools(reserved_discount=params.reserved_discount)
    cache: dict[tuple[Any, ...], Prediction] = {}

    def cached_predictor(pool: Pool, acc: Accelerator) -> PredictFn:
        topology = predict_kwargs(pool, acc)
        topo_key = tuple(sorted(topology.items()))

        def cached(s: JobSpec, a: Accelerator, devices: int) -> Prediction:
            key = (a.name, a.memory_gib, devices, topo_key)
            p = cache.get(key)
            if p is None:
                p = predict(s, a, devices, **topology)
                cache[key] = p
            return p

        return cached

    options: list[QuoteOption] = []
    facts = SpecFacts.of(spec, now, deadline_s)
    accs: dict[str, Accelerator] = {}
    for pool in pools:
        acc = accs.get(pool.accelerator) or accs.setdefault(
            pool.accelerator, get_accelerator(pool.accelerator)
        )
        why = eligibility_reason(spec, pool, acc)
        counts = candidate_device_counts(spec, pool)
        if why:
            options.append(_infeasible(spec, pool, counts[0] if counts else pool.devices_per_node, why))
            continue
        if not counts:
            lo, hi = _device_bounds(spec)
            rng = f"{lo}..{hi}" if hi is not None else f"at least {lo}"
            options.append(
                _infeasible(
                    spec, pool, pool.devices_per_node,
                    f"resources: the job needs {rng} devices; "
                    + (
                        f"the offer rents whole instances of {pool.devices_per_node}"
                        if pool.whole_nodes_only
                        else f"the pool has {pool.nodes} node(s) of {pool.devices_per_node}"
                    ),
                )
            )  # fmt: skip
            continue
        pf = cached_predictor(pool, acc)
        for d in counts:
            options.append(
                option_for(
                    spec, pool, d, params=params, now=now, deadline_s=deadline_s,
                    elapsed_fraction=elapsed_fraction, predict_fn=pf,
                    accelerator=acc, facts=facts,
                )
            )  # fmt: skip
    options.sort(key=sort_key(spec))
    return options


def best_option(options: Sequence[QuoteOption]) -> QuoteOption | None:
    return next((o for o in options if o.feasible), None)


def telling_infeasible(options: Sequence[QuoteOption]) -> list[QuoteOption]:
    """The infeasible options of a whole quote, one per distinct reason, most telling first.

    An option the cost model priced before refusing it (a step time was predicted: the deadline, budget,
    device-hour limit or preemptions ruled it out) names the constraint that binds once the escape
    hatches, markets, regions and memory are met, so those come first, the cheapest near miss first;
    options refused before pricing follow, the reason shared by most options first. Computed on the
    whole quote, so a cut that keeps only a few options cannot blame the wrong constraint.
    """
    counts: dict[str, int] = {}
    first: dict[str, QuoteOption] = {}
    for o in options:
        if o.feasible:
            continue
        counts[o.reason] = counts.get(o.reason, 0) + 1
        best = first.get(o.reason)
        if best is None or (
            o.step_time_s > 0 and (best.step_time_s <= 0 or o.expected_cost_usd < best.expected_cost_usd)
        ):
            first[o.reason] = o

    def key(o: QuoteOption) -> tuple[Any, ...]:
        priced = o.step_time_s > 0
        return (not priced, o.expected_cost_usd if priced else -counts[o.reason], o.reason)

    return sorted(first.values(), key=key)
