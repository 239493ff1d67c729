"""Candidate generation: every (pool, device count) a job could run on, priced by the cost model.

Prices, step times, checkpoint intervals and the cost model's own feasibility reasons (memory, escape
hatches, compile needs, regions, budget, markets) come from ``trainyard.cost.quote.option_for``. On top
of those the scheduler adds what only it knows: the clock (deadline against *now*, not submission), the
pool's shape (whole nodes for multi-node gangs, the inter-node network) and the allowed markets.

Pricing is cached per (distinct spec, pool, device count, progress) and predictions per (workload shape,
accelerator, device count, pool topology): the predictor reads the model, the workload's shape (precision,
batch, sequence length, method, parallelism pins) and measured step times, never the job's length, name,
deadline or budget, so every job of one shape shares its predictions. The predictor gets the pool's
topology exactly as ``trainyard.cost.quote`` passes it (``predict_kwargs``), so step times agree with a
quote for the same pool. The cost model's own deadline check is left to the scheduler, which knows the
clock (see ``to_candidate`` and ``schedule_round``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from trainyard.catalog.accelerators import load_accelerators
from trainyard.catalog.pools import Pool
from trainyard.schedule.types import Candidate, SchedulerConfig
from trainyard.spec.models import JobSpec

if TYPE_CHECKING:
    from trainyard.catalog.accelerators import Accelerator
    from trainyard.cost.quote import QuoteOption
    from trainyard.predict import Prediction


def spec_key(spec: JobSpec) -> str:
    """Identity of a spec's content (two jobs with equal specs share quotes)."""
    return spec.model_dump_json(exclude={"name", "tags"})


#: Spec fields the predictor never reads: the job's identity, its length and its objective.
_NOT_SHAPE: dict[str, Any] = {
    "name": True,
    "tags": True,
    "objective": True,
    "workload": {"steps", "tokens", "epochs", "dataset_tokens"},
}


#: Spec fields a quote reads only through the job's length or in its last, length-dependent checks.
_NOT_BASE: dict[str, Any] = {
    "name": True,
    "tags": True,
    "workload": {"steps", "tokens", "epochs", "dataset_tokens"},
    "objective": {"deadline", "budget_usd"},
    "resources": {"accelerator_hours"},
}


def base_key(spec: JobSpec) -> str:
    """Identity of everything a quote reads from a spec except the job's length, deadline, budget and
    device-hour limit: two specs with equal base keys differ only in work, so one's quote on a pool
    rescales exactly to the other's (:func:`rescale_option`)."""
    return spec.model_dump_json(exclude=_NOT_BASE)


def shape_key(spec: JobSpec) -> str:
    """Identity of a spec's workload shape: everything the predictor reads (model, precision, batch,
    sequence length, method, parallelism pins, measured step times, device range), nothing else."""
    return spec.model_dump_json(exclude=_NOT_SHAPE)


_T = TypeVar("_T")
_O = TypeVar("_O")


def _per_object(table: dict[int, tuple[_O, _T]], obj: _O, make: Callable[[_O], _T]) -> _T:
    """``make(obj)`` memoised in ``table`` per object: keyed by ``id``, and the object is kept with its
    value so that an id reused by a new object after the old one was freed is not mistaken for it."""
    hit = table.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    value = make(obj)
    table[id(obj)] = (obj, value)
    return value


def _spec_facts(spec: JobSpec) -> Any:
    from trainyard.cost.quote import SpecFacts

    return SpecFacts.of(spec, None, math.inf)


#: ``calibrated(spec, accelerator, devices, topology)``: the step-time prediction to price ``devices`` x
#: ``accelerator`` with (``accelerator`` carries the pool's device memory, ``topology`` is the predictor's
#: keyword arguments for the pool as ``cost.quote.predict_kwargs`` gives them), or None to use the packaged
#: predictor (``trainyard.predict.predict``). It runs inside pricing, so it must be pure (no I/O).
CalibrationHook = Callable[[JobSpec, "Accelerator", int, Mapping[str, Any]], "Prediction | None"]


@dataclass
class CandidateCache:
    """In-memory memo of quotes and predictions; the caller may keep one across rounds.

    Keys include every priced field of the pool (not its free capacity), so a price change naturally
    misses the cache while a capacity change does not.

    ``calibrated`` is the calibration hook: a control plane that learns step times from running jobs
    passes one so that pricing predicts on its feedback calibration (see :data:`CalibrationHook`). Its
    predictions are memoised like the packaged predictor's, and everything priced depends on them, so the
    hook is fixed for the cache's life: a new calibration takes a new cache.
    """

    options: dict[tuple[str, tuple[Any, ...], int, float], QuoteOption] = field(default_factory=dict)
    predictions: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    device_counts: dict[tuple[Any, ...], list[int]] = field(default_factory=dict)
    eligible: dict[tuple[Any, ...], str] = field(default_factory=dict)
    views: dict[tuple[Any, ...], Any] = field(
        default_factory=dict
    )  # priced candidate lists per spec and pools
    _keys: dict[int, tuple[JobSpec, str]] = field(default_factory=dict)
    _shapes: dict[int, tuple[JobSpec, str]] = field(default_factory=dict)
    _facts: dict[int, tuple[JobSpec, Any]] = field(default_factory=dict)
    _bases: dict[int, tuple[JobSpec, str]] = field(default_factory=dict)
    _pool_keys: dict[int, tuple[Pool, tuple[Any, ...]]] = field(default_factory=dict)
    # one full quote per (base key, pool prices, device count): other lengths and progress rescale it
    base_options: dict[tuple[Any, ...], QuoteOption] = field(default_factory=dict)
    _accelerators: dict[str, Any] = field(default_factory=dict)
    max_entries: int = 500_000
    calibrated: CalibrationHook | None = None

    def key(self, spec: JobSpec) -> str:
        """:func:`spec_key` of ``spec``, memoised per spec object."""
        return _per_object(self._keys, spec, spec_key)

    def facts(self, spec: JobSpec) -> Any:
        """``cost.quote.SpecFacts`` of ``spec`` without its deadline (the scheduler checks deadlines
        against its clock), memoised per spec object."""
        return _per_object(self._facts, spec, _spec_facts)

    def accelerator(self, pool: Pool) -> Any:
        """The catalog accelerator of the pool (``option_for`` applies the pool's memory to it)."""
        hit = self._accelerators.get(pool.accelerator)
        if hit is None:
            from trainyard.catalog.accelerators import get_accelerator

            hit = get_accelerator(pool.accelerator)
            self._accelerators[pool.accelerator] = hit
        return hit

    def pool_key(self, pool: Pool) -> tuple[Any, ...]:
        """:func:`pool_price_key` of ``pool``, memoised per pool object (a round's pools)."""
        if len(self._pool_keys) > 4096 and id(pool) not in self._pool_keys:
            self._pool_keys.clear()
        return _per_object(self._pool_keys, pool, pool_price_key)

    def base(self, spec: JobSpec) -> str:
        """:func:`base_key` of ``spec``, memoised per spec object."""
        return _per_object(self._bases, spec, base_key)

    def shape(self, spec: JobSpec) -> str:
        """:func:`shape_key` of ``spec``, memoised per spec object."""
        return _per_object(self._shapes, spec, shape_key)

    def trim(self) -> None:
        """Drop everything once the memo grows past ``max_entries`` (each round starts with this)."""
        if len(self.options) + len(self.views) + len(self._keys) + len(self.base_options) > self.max_entries:
            self.options.clear()
            self.predictions.clear()
            self.device_counts.clear()
            self.eligible.clear()
            self.views.clear()
            self._keys.clear()
            self._shapes.clear()
            self._facts.clear()
            self._bases.clear()
            self.base_options.clear()


Pricer = Callable[[JobSpec, Pool, int, float, "CandidateCache"], "QuoteOption"]


_PRICE_FIELDS = tuple(f for f in Pool.model_fields if f != "available_devices")


def pool_price_key(pool: Pool) -> tuple[Any, ...]:
    """Everything about a pool that changes a quote (its free capacity does not)."""
    return tuple(getattr(pool, f) for f in _PRICE_FIELDS)


def _predict_fn(cache: CandidateCache, spec: JobSpec, pool: Pool) -> Callable[[JobSpec, Any, int], Any]:
    """The cost model's predictor with ``pool``'s topology (as ``cost.quote`` passes it), memoised per
    (workload shape, accelerator and its memory, device count, topology); the cache's calibration hook
    answers first when it has one."""
    from trainyard.cost.quote import predict_kwargs
    from trainyard.predict import predict

    shape = cache.shape(spec)

    def cached(s: JobSpec, accelerator: Any, devices: int) -> Any:
        topology = predict_kwargs(pool, accelerator)
        pk = (shape, accelerator.name, accelerator.memory_gib, devices, *sorted(topology.items()))
        hit = cache.predictions.get(pk)
        if hit is None:
            if cache.calibrated is not None:
                hit = cache.calibrated(s, accelerator, devices, topology)
            if hit is None:
                hit = predict(s, accelerator, devices, **topology)
            cache.predictions[pk] = hit
        return hit

    return cached


def price_option(
    spec: JobSpec, pool: Pool, devices: int, elapsed_fraction: float, cache: CandidateCache
) -> QuoteOption:
    """One quote from the cost model (``trainyard.cost.quote.option_for``), memoised."""
    from trainyard.cost.quote import option_for

    key = cache.key(spec)
    pkey = cache.pool_key(pool)
    ok = (key, pkey, devices, round(elapsed_fraction, 6))
    hit = cache.options.get(ok)
    if hit is not None:
        return hit
    bk = (cache.base(spec), pkey, devices)
    base = cache.base_options.get(bk)
    if base is not None:
        opt = rescale_option(base, spec, pool, elapsed_fraction, cache)
        cache.options[ok] = opt
        return opt
    # deadline_s=inf: the scheduler checks deadlines itself, against its clock (to_candidate,
    # schedule_round), and places a job that can no longer meet its deadline rather than stranding it
    opt = option_for(
        spec,
        pool,
        devices,
        elapsed_fraction=elapsed_fraction,
        deadline_s=math.inf,
        predict_fn=_predict_fn(cache, spec, pool),
        accelerator=cache.accelerator(pool),
        facts=cache.facts(spec),
    )
    cache.options[ok] = opt
    cache.base_options[bk] = opt
    return opt


def rescale_option(
    base: QuoteOption, spec: JobSpec, pool: Pool, elapsed_fraction: float, cache: CandidateCache
) -> QuoteOption:
    """``option_for(spec, pool, base.devices, elapsed_fraction=..., deadline_s=inf)`` from ``base``, the
    same pool's quote for a spec with the same :func:`base_key` (another length, budget or progress).

    Everything before the work enters a quote (step times, price, checkpoint interval and stall,
    restart, interruption rate, the step-independent reasons) is taken from ``base``; the rest is the
    cost model's own arithmetic (``trainyard.cost.model``) in ``option_for``'s order, so the numbers are
    identical (a property test compares the two on random specs, pools and progress).
    """
    from trainyard.cost import model as cm
    from trainyard.cost.quote import interconnect_gbps, pool_accelerator, price_work, work_reason

    if not 0.0 <= elapsed_fraction < 1.0:
        raise ValueError(f"elapsed_fraction must be in [0, 1), got {elapsed_fraction}")
    if base.total_steps == 0:
        return base  # rejected before any work was priced (eligibility, shape, price, memory): no length
    params = cm.DEFAULT_PARAMS
    facts = cache.facts(spec)
    dl = facts.deadline_s
    if dl is not None and math.isfinite(dl):
        raise ValueError("rescale_option prices without a deadline (the scheduler checks deadlines)")
    acc = cache.accelerator(pool)
    devices, nodes = base.devices, base.nodes
    w = price_work(
        spec, facts, acc, nodes, elapsed_fraction, step_s=base.step_time_s, step_p90_s=base.step_time_p90_s,
        price_h=base.price_usd_per_hour, interval_s=base.checkpoint_interval_s, stall_s=base.checkpoint_s,
        rate_h=base.interruption_rate_per_hour, restart_s=base.restart_s, compile_s=base.compile_s,
        params=params,
    )  # fmt: skip
    reason = ""
    need = spec.resources.min_interconnect_gbps
    if need is not None:
        link = interconnect_gbps(pool, pool_accelerator(pool, acc), devices)
        if link < need:
            reason = (
                f"resources.min_interconnect_gbps: {devices} x {base.accelerator} on {nodes} node(s) has "
                f"{link:g} Gbit/s per device < {need:g}"
            )
    reason = reason or work_reason(
        spec,
        facts,
        devices,
        w,
        rate_h=base.interruption_rate_per_hour,
        restart_s=base.restart_s,
        interval_s=base.checkpoint_interval_s,
        params=params,
    )
    # dataclasses.replace without re-running __init__ (a copy of the frozen option with these fields)
    out = object.__new__(type(base))
    out.__dict__.update(base.__dict__)
    out.__dict__.update(**w.option_fields(facts.total_steps), feasible=not reason, reason=reason)
    return out


def eligibility(spec: JobSpec, pool: Pool, cache: CandidateCache) -> str:
    """Why the pool can never serve the spec ('' when it can), memoised."""
    from trainyard.cost.quote import eligibility_reason

    k = (cache.key(spec), pool.name, pool.accelerator, pool.market, pool.region, pool.cloud)
    hit = cache.eligible.get(k)
    if hit is None:
        hit = eligibility_reason(spec, pool)
        cache.eligible[k] = hit
    return hit


def device_counts(spec: JobSpec, pool: Pool, cache: CandidateCache) -> list[int]:
    from trainyard.cost.quote import candidate_device_counts

    # availability and price do not change which sizes make sense, only whether they fit now
    k = (cache.key(spec), pool.devices_per_node, pool.nodes, pool.whole_nodes_only)
    hit = cache.device_counts.get(k)
    if hit is None:
        hit = list(candidate_device_counts(spec, pool))
        cache.device_counts[k] = hit
    return hit


def _inter_node_gbps(pool: Pool) -> float:
    if pool.inter_node_gbps is not None:
        return pool.inter_node_gbps
    acc = load_accelerators().get(pool.accelerator)
    return acc.inter_node_gbps if acc is not None else 0.0


def _fmt_h(hours: float) -> str:
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:.1f} h"


def to_candidate(
    *,
    job_id: str,
    tenant: str,
    spec: JobSpec,
    pool: Pool,
    option: QuoteOption,
    now_s: float,
    deadline_abs_s: float | None,
    config: SchedulerConfig,
) -> Candidate:
    """Turn a quote into a scheduler candidate, adding the checks that need the clock or the pool shape."""
    devices = int(option.devices)
    n = pool.devices_per_node
    nodes = max(1, math.ceil(devices / n))
    reasons: list[str] = []
    if not option.feasible:
        reasons.append(option.reason or "the cost model rejected this option")
    market = str(getattr(option.market, "value", option.market))
    allowed = [str(getattr(m, "value", m)) for m in spec.objective.markets]
    if not reasons and market not in allowed:
        reasons.append(f"objective.markets: {market} is not in {', '.join(allowed)}")
    if not reasons and nodes > pool.nodes:
        reasons.append(f"needs {nodes} nodes of {n} × {pool.accelerator}; {pool.name} has {pool.nodes}")
    need_gbps = spec.resources.min_interconnect_gbps
    if not reasons and nodes > 1 and need_gbps is not None and _inter_node_gbps(pool) < need_gbps:
        reasons.append(
            f"spans {nodes} nodes but {pool.name}'s inter-node network gives {_inter_node_gbps(pool):g} Gbps "
            f"per device < resources.min_interconnect_gbps {need_gbps:g}"
        )
    hours_p90 = float(getattr(option, "expected_hours_p90", 0.0) or option.expected_hours)
    finish_s = now_s + hours_p90 * 3600.0
    if deadline_abs_s is not None and finish_s > deadline_abs_s and not reasons:
        left_h = max(0.0, (deadline_abs_s - now_s) / 3600.0)
        reasons.append(
            f"would finish in ~{_fmt_h(hours_p90)} (p90) but the deadline is {_fmt_h(left_h)} away"
        )
    price = float(option.price_usd_per_hour)
    cost = float(option.expected_cost_usd)
    objective = cost
    if market == "reserved":
        # already paid for: only a token share enters the objective, so reserved capacity fills first
        objective = cost * config.reserved_cost_factor + 1e-3 * option.expected_hours * devices
    capacity = nodes * n if nodes > 1 else devices
    return Candidate(
        job_id=job_id,
        tenant=tenant,
        pool=pool.name,
        accelerator=pool.accelerator,
        devices=devices,
        nodes=nodes,
        devices_per_node=n,
        market=market,
        expected_cost_usd=cost,
        expected_hours=float(option.expected_hours),
        expected_hours_p90=hours_p90,
        step_time_s=float(option.step_time_s),
        price_usd_per_hour=price,
        checkpoint_interval_s=float(option.checkpoint_interval_s or 0.0),
        finish_s=finish_s,
        feasible=not reasons,
        reasons=tuple(reasons),
        capacity_devices=capacity,
        objective_usd=objective,
    )


def candidates_for(
    *,
    job_id: str,
    tenant: str,
    spec: JobSpec,
    pools: Sequence[Pool],
    now_s: float,
    deadline_abs_s: float | None,
    config: SchedulerConfig,
    cache: CandidateCache,
    elapsed_fraction: float = 0.0,
) -> list[Candidate]:
    """Every (pool, device count) option of one job, feasible or not, in pool order."""
    out: list[Candidate] = []
    for pool in pools:
        counts = device_counts(spec, pool, cache)
        why = eligibility(spec, pool, cache)
        if why or not counts:
            out.append(
                _never(
                    job_id,
                    tenant,
                    pool,
                    counts[0] if counts else pool.devices_per_node,
                    why or _no_counts(spec, pool),
                )
            )
            continue
        for devices in counts:
            opt = price_option(spec, pool, devices, elapsed_fraction, cache)
            out.append(
                to_candidate(
                    job_id=job_id,
                    tenant=tenant,
                    spec=spec,
                    pool=pool,
                    option=opt,
                    now_s=now_s,
                    deadline_abs_s=deadline_abs_s,
                    config=config,
                )
            )
    return out


def _no_counts(spec: JobSpec, pool: Pool) -> str:
    lo, hi = spec.resources.min_devices or 1, spec.resources.max_devices
    rng = f"{lo}..{hi}" if hi is not None else f"at least {lo}"
    return (
        f"resources: the job needs {rng} devices; {pool.name} offers {pool.devices_per_node} per node "
        f"× {pool.nodes} node(s)"
    )


def _never(job_id: str, tenant: str, pool: Pool, devices: int, reason: str) -> Candidate:
    """A pool that can never serve the job (escape hatches, markets, regions, memory, device range)."""
    n = pool.devices_per_node
    nodes = max(1, math.ceil(devices / n))
    return Candidate(
        job_id=job_id,
        tenant=tenant,
        pool=pool.name,
        accelerator=pool.accelerator,
        devices=devices,
        nodes=nodes,
        devices_per_node=n,
        market=pool.market.value,
        expected_cost_usd=0.0,
        expected_hours=0.0,
        expected_hours_p90=0.0,
        step_time_s=0.0,
        price_usd_per_hour=0.0,
        checkpoint_interval_s=0.0,
        finish_s=math.inf,
        feasible=False,
        reasons=(reason,),
        capacity_devices=nodes * n if nodes > 1 else devices,
    )


def fits_now(c: Candidate, pool: Pool) -> bool:
    """Whether the pool's free capacity could hold this option if nothing else were placed."""
    free = pool.free_devices
    whole = free // pool.devices_per_node
    if c.nodes > 1:
        return c.nodes <= whole
    partial = free - whole * pool.devices_per_node
    return c.devices <= (pool.devices_per_node if whole > 0 else partial)


def capacity_reason(c: Candidate, pool: Pool) -> str:
    free = pool.free_devices
    whole = free // pool.devices_per_node
    if c.nodes > 1:
        return (
            f"needs {c.nodes} whole {pool.devices_per_node}-device nodes on {pool.name}; "
            f"{whole} whole node(s) free ({free} devices available)"
        )
    return f"needs {c.devices} × {c.accelerator} in one node on {pool.name}; {free} available"
