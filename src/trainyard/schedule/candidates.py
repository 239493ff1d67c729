"""Candidate generation: every (pool, device count) a job could run on, priced by the cost model.

Prices, step times, checkpoint intervals and the cost model's own feasibility reasons (memory, escape
hatches, compile needs, regions, budget, markets) come from ``trainyard.cost.quote.option_for``. On top
of those the scheduler adds what only it knows: the clock (deadline against *now*, not submission), the
pool's shape (whole nodes for multi-node gangs, the inter-node network) and the allowed markets.

Pricing is cached at three levels, each keyed by exactly what it reads:

* options per (distinct spec, pool prices, device count, progress);
* ``cost.quote.AllocationTimes`` (step times, checkpointing, restart, interruptions) per (spec without its
  length, deadline, budget and device-hour limit: :func:`base_key`; pool class: :func:`pool_class_key`;
  device count): pools that differ only in price, region, market or size share them, and only the cheap
  last step of a quote (``cost.quote.priced_option``) runs per pool;
* predictions per (workload shape, accelerator and its memory, device count, pool topology): the
  predictor reads the model, the workload's shape (precision, batch, sequence length, method, parallelism
  pins) and measured step times, never the job's length, name, deadline or budget, so every job of one
  shape shares its predictions. :func:`candidates_for` computes all device counts of one accelerator and
  topology in one vectorised ``predict_many`` call (:func:`prefetch_predictions`).

The predictor gets the pool's topology exactly as ``trainyard.cost.quote`` passes it (``predict_kwargs``),
so step times agree with a quote for the same pool, and every option equals ``option_for``'s (property
tests compare them). The cost model's own deadline check is left to the scheduler, which knows the clock
(see ``to_candidate`` and ``schedule_round``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from trainyard.catalog.accelerators import Accelerator, get_accelerator, load_accelerators
from trainyard.catalog.offers import pool_interruption_rate_per_hour
from trainyard.catalog.pools import Pool
from trainyard.cost.quote import (
    AllocationTimes,
    QuoteOption,
    SpecFacts,
    allocation_times,
    candidate_device_counts,
    eligibility_reason,
    pool_accelerator,
    predict_kwargs,
    priced_option,
    screen_option,
)
from trainyard.predict import Prediction, predict, predict_grouped, predict_many
from trainyard.schedule.types import Candidate, SchedulerConfig
from trainyard.spec.models import JobSpec


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
    device-hour limit: two specs with equal base keys differ only in work, so they share everything a
    quote computes before the work (``cost.quote.AllocationTimes``, :func:`price_option`)."""
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
    return SpecFacts.of(spec, None, math.inf)


#: ``calibrated(spec, accelerator, devices, topology)``: the step-time prediction to price ``devices`` x
#: ``accelerator`` with (``accelerator`` carries the pool's device memory, ``topology`` is the predictor's
#: keyword arguments for the pool as ``cost.quote.predict_kwargs`` gives them), or None to use the packaged
#: predictor (``trainyard.predict.predict``). It runs inside pricing, so it must be pure (no I/O).
CalibrationHook = Callable[[JobSpec, Accelerator, int, Mapping[str, Any]], "Prediction | None"]


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
    _eligibility_keys: dict[int, tuple[JobSpec, tuple[Any, ...]]] = field(default_factory=dict)
    _markets: dict[int, tuple[Pool, str]] = field(default_factory=dict)
    _nevers: dict[tuple[Any, ...], tuple[Pool, Candidate]] = field(default_factory=dict)
    _pool_tokens: dict[tuple[Any, ...], int] = field(default_factory=dict)
    _pool_keys: dict[int, tuple[Pool, tuple[Any, ...]]] = field(default_factory=dict)
    _pool_classes: dict[int, tuple[Pool, tuple[Any, tuple[Any, ...]]]] = field(default_factory=dict)
    _pool_topologies: dict[int, tuple[Pool, Any]] = field(default_factory=dict)
    # ``grid._pool_infos`` of the last pools priced on: (those pools, their infos)
    _pool_infos: tuple[list[Pool], list[Any]] | None = None
    # ``cost.quote.AllocationTimes`` per (base key, pool class, device count): every length, progress and
    # price of pools of that class is priced from it (``cost.quote.priced_option``)
    times: dict[tuple[Any, ...], AllocationTimes] = field(default_factory=dict)
    # the numbers of each entry of ``times`` that array pricing reads (``grid.time_row``), same keys
    time_rows: dict[tuple[Any, ...], tuple[float, ...]] = field(default_factory=dict)
    _accelerators: dict[str, Any] = field(default_factory=dict)
    max_entries: int = 500_000
    calibrated: CalibrationHook | None = None
    # the last round's greedy seeds and solution with the model they answered (``round.schedule_round``
    # reuses them when the next round's model is equal)
    round_memo: dict[str, tuple[Any, Any]] = field(default_factory=dict)

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
            hit = get_accelerator(pool.accelerator)
            self._accelerators[pool.accelerator] = hit
        return hit

    def pool_key(self, pool: Pool) -> tuple[Any, ...]:
        """:func:`pool_price_key` of ``pool``, memoised per pool object (a round's pools)."""
        if len(self._pool_keys) > 4096 and id(pool) not in self._pool_keys:
            self._pool_keys.clear()
        return _per_object(self._pool_keys, pool, pool_price_key)

    def pool_class(self, pool: Pool) -> tuple[Any, tuple[Any, ...]]:
        """The pool's accelerator with the pool's device memory (``cost.quote.pool_accelerator``) and
        :func:`pool_class_key`, memoised per pool object."""
        if len(self._pool_classes) > 4096 and id(pool) not in self._pool_classes:
            self._pool_classes.clear()
        return _per_object(self._pool_classes, pool, self._pool_class)

    def pool_topology(self, pool: Pool) -> tuple[Any, dict[str, Any], tuple[Any, ...]]:
        """The pool's accelerator (``cost.quote.pool_accelerator``), its topology for the predictor
        (``cost.quote.predict_kwargs``) and the group key of both (accelerator, memory, sorted topology),
        memoised per pool object."""
        if len(self._pool_topologies) > 4096 and id(pool) not in self._pool_topologies:
            self._pool_topologies.clear()
        return _per_object(self._pool_topologies, pool, self._pool_topology)

    def _pool_topology(self, pool: Pool) -> tuple[Any, dict[str, Any], tuple[Any, ...]]:
        acc = pool_accelerator(pool, self.accelerator(pool))
        topology = predict_kwargs(pool, acc)
        return acc, topology, (acc.name, acc.memory_gib, *sorted(topology.items()))

    def _pool_class(self, pool: Pool) -> tuple[Any, tuple[Any, ...]]:
        acc = pool_accelerator(pool, self.accelerator(pool))
        return acc, pool_class_key(pool, acc)

    def base(self, spec: JobSpec) -> str:
        """:func:`base_key` of ``spec``, memoised per spec object."""
        return _per_object(self._bases, spec, base_key)

    def shape(self, spec: JobSpec) -> str:
        """:func:`shape_key` of ``spec``, memoised per spec object."""
        return _per_object(self._shapes, spec, shape_key)

    def pools_token(self, pools_key: tuple[Any, ...]) -> int:
        """A small integer standing for ``pools_key`` (every priced field of a round's pools) in this cache:
        equal keys get equal tokens, so memo keys can carry it instead of hashing the whole tuple again."""
        token = self._pool_tokens.get(pools_key)
        if token is None:
            token = self._pool_tokens[pools_key] = len(self._pool_tokens)
        return token

    def trim(self) -> None:
        """Drop everything once the memo grows past ``max_entries`` (each round starts with this)."""
        if len(self.options) + len(self.views) + len(self._keys) + len(self.times) > self.max_entries:
            self.options.clear()
            self.predictions.clear()
            self.device_counts.clear()
            self.eligible.clear()
            self.views.clear()
            self._keys.clear()
            self._shapes.clear()
            self._facts.clear()
            self._bases.clear()
            self._eligibility_keys.clear()
            self.times.clear()
            self.time_rows.clear()
            if len(self._pool_tokens) > 1024:  # views keyed by the old tokens are gone with the views
                self._pool_tokens.clear()


Pricer = Callable[[JobSpec, Pool, int, float, "CandidateCache"], "QuoteOption"]


_PRICE_FIELDS = tuple(f for f in Pool.model_fields if f != "available_devices")


def pool_price_key(pool: Pool) -> tuple[Any, ...]:
    """Everything about a pool that changes a quote (its free capacity does not)."""
    return tuple(getattr(pool, f) for f in _PRICE_FIELDS)


def pool_class_key(pool: Pool, accelerator: Any) -> tuple[Any, ...]:
    """Everything about a pool that ``cost.quote.allocation_times`` reads: the accelerator and its
    device memory (``accelerator`` is ``cost.quote.pool_accelerator``'s), the devices per node and the
    inter-node network (the predictor's topology) and the interruption rate. Pools equal in it differ only
    in price, region, cloud, market, size or free capacity, which enter a quote after those times."""
    return (
        accelerator.name,
        accelerator.memory_gib,
        pool.devices_per_node,
        pool.inter_node_gbps,
        pool_interruption_rate_per_hour(pool),
    )


def _prediction_key(
    shape: str, accelerator: Any, devices: int, topology: Mapping[str, Any]
) -> tuple[Any, ...]:
    """Key of one memoised prediction: workload shape, accelerator and its memory, device count, topology."""
    return (shape, accelerator.name, accelerator.memory_gib, devices, *sorted(topology.items()))


def prefetch_predictions(
    spec: JobSpec, pools_counts: Sequence[tuple[Pool, Sequence[int]]], cache: CandidateCache
) -> None:
    """Fill the prediction memo for ``spec`` on every (pool, device count) about to be priced, with one
    vectorised predictor call (``trainyard.predict.predict_many``) per accelerator, device memory and
    topology instead of one ``predict`` per device count. ``predict_many`` equals ``predict`` called one by
    one, so pricing reads the same predictions it would have computed itself.

    The calibration hook answers first, per device count, as in :func:`_predict_fn`; the packaged predictor
    takes the counts it declines. Where the spec has a measured step time on the accelerator, its reference
    device count is predicted too (``option_for`` scales from it). A count the hook rejects and a batch the
    predictor rejects (``ValueError``) are left to the one-by-one path, which turns the error into the
    option's reason, as ``option_for`` does.
    """
    for acc, topology, missing in _missing_predictions(spec, pools_counts, cache).values():
        _predict_one_spec(spec, acc, topology, missing, cache)


#: Per accelerator, device memory and topology (a group key, ``CandidateCache.pool_topology``): the
#: accelerator, the topology and the device counts wanted there.
CountGroups = dict[tuple[Any, ...], tuple[Any, dict[str, Any], list[int]]]


def count_groups(pools_counts: Sequence[tuple[Pool, Sequence[int]]], cache: CandidateCache) -> CountGroups:
    """The device counts of ``pools_counts`` grouped by what the predictor reads of a pool; specs screened
    alike on a round's pools (same eligibility and device range) share them."""
    groups: dict[tuple[Any, ...], tuple[Any, dict[str, Any], set[int]]] = {}
    for pool, counts in pools_counts:
        acc, topology, gk = cache.pool_topology(pool)
        group = groups.get(gk)
        if group is None:
            group = groups[gk] = (acc, topology, set())
        group[2].update(counts)
    return {gk: (acc, topology, sorted(counts)) for gk, (acc, topology, counts) in groups.items()}


def prefetch_predictions_many(
    work: Sequence[tuple[JobSpec, Sequence[tuple[Pool, Sequence[int]]] | CountGroups]], cache: CandidateCache
) -> None:
    """:func:`prefetch_predictions` of many specs at once: per accelerator, device memory and topology, one
    ``trainyard.predict.predict_grouped`` call evaluates the plans of every spec that needs predictions
    there in one vectorised pass (equal to ``predict_many`` per spec). A group the predictor rejects is
    predicted spec by spec, as :func:`prefetch_predictions` does. A spec's pools may come as their
    :func:`count_groups`."""
    groups: dict[tuple[Any, ...], tuple[Any, dict[str, Any], list[tuple[JobSpec, dict[int, Any]]]]] = {}
    requested: set[tuple[Any, ...]] = set()  # asked for by an earlier spec of the same shape
    for spec, pools_counts in work:
        for gk, (acc, topology, missing) in _missing_predictions(
            spec, pools_counts, cache, requested
        ).items():
            if not missing:
                continue
            group = groups.get(gk)
            if group is None:
                group = groups[gk] = (acc, topology, [])
            group[2].append((spec, missing))
            requested.update(missing.values())
    for acc, topology, members in groups.values():
        items = [(spec, sorted(missing)) for spec, missing in members]
        try:
            preds = predict_grouped(items, acc, lazy=True, **topology)
        except ValueError:
            for spec, missing in members:
                _predict_one_spec(spec, acc, topology, missing, cache)
            continue
        for (_spec, missing), (_s, counts), got in zip(members, items, preds, strict=True):
            for d, p in zip(counts, got, strict=True):
                cache.predictions[missing[d]] = p


def _missing_predictions(
    spec: JobSpec,
    pools_counts: Sequence[tuple[Pool, Sequence[int]]] | CountGroups,
    cache: CandidateCache,
    requested: set[tuple[Any, ...]] | None = None,
) -> dict[tuple[Any, ...], tuple[Any, dict[str, Any], dict[int, tuple[Any, ...]]]]:
    """Per accelerator, device memory and topology: the device counts ``spec`` still needs predicted there
    (with their memo keys; none already memoised or in ``requested``), after the calibration hook answered
    what it could."""
    shape = cache.shape(spec)
    cg = pools_counts if isinstance(pools_counts, dict) else count_groups(pools_counts, cache)
    measured = spec.measured.step_time_s
    ref = spec.resources.min_devices or 1
    predictions = cache.predictions
    groups: dict[tuple[Any, ...], tuple[Any, dict[str, Any], dict[int, tuple[Any, ...]]]] = {}
    for gk, (acc, topology, counts) in cg.items():
        missing: dict[int, tuple[Any, ...]] = {}
        groups[gk] = (acc, topology, missing)
        wanted = [*counts, ref] if acc.name in measured else counts
        name, mem, rest = gk[0], gk[1], gk[2:]
        for d in wanted:
            if d not in missing:
                pk = (shape, name, mem, d, *rest)  # ``_prediction_key``
                if pk not in predictions and (requested is None or pk not in requested):
                    missing[d] = pk
    if cache.calibrated is not None:
        for acc, topology, missing in groups.values():
            for d, pk in list(missing.items()):
                try:
                    hit = cache.calibrated(spec, acc, d, topology)
                except ValueError:
                    del missing[d]  # the one-by-one path asks again and turns the error into the reason
                    continue
                if hit is not None:
                    cache.predictions[pk] = hit
                    del missing[d]
    return groups


def _predict_one_spec(
    spec: JobSpec,
    acc: Any,
    topology: dict[str, Any],
    missing: dict[int, tuple[Any, ...]],
    cache: CandidateCache,
) -> None:
    if not missing:
        return
    counts = sorted(missing)
    try:
        preds = predict_many(spec, [acc], counts, **topology)
    except ValueError:
        return
    for d, p in zip(counts, preds, strict=True):
        cache.predictions[missing[d]] = p


def _predict_fn(cache: CandidateCache, spec: JobSpec, pool: Pool) -> Callable[[JobSpec, Any, int], Any]:
    """The cost model's predictor with ``pool``'s topology (as ``cost.quote`` passes it), memoised per
    (workload shape, accelerator and its memory, device count, topology); the cache's calibration hook
    answers first when it has one."""
    shape = cache.shape(spec)
    acc0, topology0, gk = cache.pool_topology(pool)
    name0, mem0, rest0 = gk[0], gk[1], gk[2:]

    def cached(s: JobSpec, accelerator: Any, devices: int) -> Any:
        if accelerator.name == name0 and accelerator.memory_gib == mem0 and accelerator.family == acc0.family:
            # the pool's own accelerator (``cost.quote.pool_accelerator``): its topology and key are the
            # pool's, memoised (``CandidateCache.pool_topology``)
            topology = topology0
            pk = (shape, name0, mem0, devices, *rest0)  # ``_prediction_key``
        else:
            topology = predict_kwargs(pool, accelerator)
            pk = _prediction_key(shape, accelerator, devices, topology)
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
    """``cost.quote.option_for(spec, pool, devices, elapsed_fraction=..., deadline_s=inf)``, memoised.

    The quote is ``option_for``'s own three steps: ``screen_option`` on this pool, ``allocation_times``
    (the prediction, checkpointing, restart and interruptions) and ``priced_option`` (price and work). The
    middle step, the expensive one, is shared by every spec with the same :func:`base_key` (other lengths,
    budgets, progress) on every pool with the same :func:`pool_class_key` (other prices, regions, markets
    of equal interruption rate, sizes), so the options equal ``option_for``'s field for field (a property
    test compares them).

    ``deadline_s=inf``: the scheduler checks deadlines itself, against its clock (``to_candidate``,
    ``schedule_round``), and places a job that can no longer meet its deadline rather than stranding it.
    """
    key = cache.key(spec)
    pkey = cache.pool_key(pool)
    ok = (key, pkey, devices, float(elapsed_fraction))  # exact: a rounded progress would price other work
    hit = cache.options.get(ok)
    if hit is not None:
        return hit
    if not 0.0 <= elapsed_fraction < 1.0:
        raise ValueError(f"elapsed_fraction must be in [0, 1), got {elapsed_fraction}")
    acc, pclass = cache.pool_class(pool)
    screened = screen_option(spec, pool, devices, acc)
    if isinstance(screened, QuoteOption):
        opt = screened
    else:
        facts = cache.facts(spec)
        tk = (cache.base(spec), pclass, devices)
        times = cache.times.get(tk)
        if times is None:
            times = allocation_times(
                spec, pool, devices, acc, facts, predict_fn=_predict_fn(cache, spec, pool)
            )
            cache.times[tk] = times
        opt = priced_option(times, spec, pool, facts, screened, elapsed_fraction)
    cache.options[ok] = opt
    return opt


def _eligibility_key(spec: JobSpec) -> tuple[Any, ...]:
    """What ``cost.quote.eligibility_reason`` reads from a spec: the escape hatches, the allowed markets and
    the memory per device (specs equal in it are eligible for the same pools, for the same reasons)."""
    return (
        spec.requirements.model_dump_json(),
        tuple(m.value for m in spec.objective.markets),
        spec.resources.min_memory_per_device_gib,
    )


def screen_key(spec: JobSpec, cache: CandidateCache) -> tuple[Any, ...]:
    """What :func:`eligibility` and :func:`device_counts` read of a spec: specs equal in it are screened
    alike on every pool."""
    r = spec.resources
    return (_per_object(cache._eligibility_keys, spec, _eligibility_key), r.min_devices, r.max_devices)


def eligibility(spec: JobSpec, pool: Pool, cache: CandidateCache) -> str:
    """Why the pool can never serve the spec ('' when it can), memoised per what it reads of both."""
    k = (
        _per_object(cache._eligibility_keys, spec, _eligibility_key), pool.name, pool.accelerator,
        pool.market, pool.region, pool.cloud, pool.memory_per_device_gib,
    )  # fmt: skip
    hit = cache.eligible.get(k)
    if hit is None:
        hit = eligibility_reason(spec, pool)
        cache.eligible[k] = hit
    return hit


def device_counts(spec: JobSpec, pool: Pool, cache: CandidateCache) -> list[int]:
    # availability and price do not change which sizes make sense, only whether they fit now
    r = spec.resources  # ``candidate_device_counts`` reads the device range and the pool's shape
    k = (r.min_devices, r.max_devices, pool.devices_per_node, pool.nodes, pool.whole_nodes_only)
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
    screened = [(pool, device_counts(spec, pool, cache), eligibility(spec, pool, cache)) for pool in pools]
    prefetch_predictions(
        spec, [(pool, counts) for pool, counts, why in screened if counts and not why], cache
    )
    for pool, counts, why in screened:
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
