"""Quotes for the control plane: live pools plus the packaged catalog, priced by trainyard.cost.quote."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from trainyard.catalog.pools import Pool
from trainyard.spec.models import JobSpec

MAX_STORED_FEASIBLE = 12
MAX_STORED_INFEASIBLE = 4


class Quoter(Protocol):
    def __call__(self, spec: JobSpec, pools: Sequence[Pool]) -> list[Any]: ...


def cost_quote(spec: JobSpec, pools: Sequence[Pool]) -> list[Any]:
    """Interface A: ``trainyard.cost.quote.quote(spec, pools)``."""
    from trainyard.cost.quote import quote
    from trainyard.predict.model import mark_executability

    return mark_executability(spec, list(quote(spec, list(pools))))


def catalog_pools() -> list[Pool]:
    """The packaged cloud catalog turned into pools (cached by the catalog)."""
    from trainyard.catalog.offers import catalog_pools as packaged

    return list(packaged())


def option_document(opt: Any) -> dict[str, Any]:
    """One stored quote option: the §3.3 keys plus the pool name and node count."""
    doc = dict(opt.to_contract())
    doc["pool"] = getattr(opt, "pool", None)
    doc["nodes"] = getattr(opt, "nodes", None)
    doc["expected_cost_p90_usd"] = expected_cost_p90_usd(opt)
    return doc


def expected_cost_p90_usd(opt: Any) -> float | None:
    """The option's cost at its p90 wall time: the expected cost scaled by p90 / expected billed hours
    (None when the option has no p90)."""
    hours = float(getattr(opt, "expected_hours", 0.0) or 0.0)
    wait = float(getattr(opt, "capacity_wait_hours", 0.0) or 0.0)
    p90 = float(getattr(opt, "expected_hours_p90", 0.0) or 0.0)
    cost = float(getattr(opt, "expected_cost_usd", 0.0) or 0.0)
    billed, billed_p90 = hours - wait, p90 - wait
    if p90 <= 0 or billed <= 0 or billed_p90 <= 0 or not getattr(opt, "feasible", False):
        return None
    return cost * max(1.0, billed_p90 / billed)


def stored_quote(options: Sequence[Any]) -> list[dict[str, Any]]:
    """What we keep with the job: the best feasible options and, chosen from the whole quote before the
    cut, the infeasible options that name the most telling distinct reasons
    (``trainyard.cost.quote.telling_infeasible``: constraints met only after pricing first), so a job
    nothing can run is told the constraint that binds, not the first pools' escape hatches."""
    from trainyard.cost.quote import telling_infeasible

    feasible = [option_document(o) for o in options if o.feasible][:MAX_STORED_FEASIBLE]
    infeasible = [option_document(o) for o in telling_infeasible(options)[:MAX_STORED_INFEASIBLE]]
    return feasible + infeasible


def quote_pools(live: Sequence[Pool], with_catalog: bool = True) -> list[Pool]:
    """Pools a quote considers: every live pool at full capacity (occupancy is the scheduler's business)
    plus, optionally, the catalog offers whose names do not clash with a live pool."""
    pools = [p.model_copy(update={"available_devices": None}) for p in live]
    if with_catalog:
        names = {p.name for p in pools}
        pools += [p for p in catalog_pools() if p.name not in names]
    return pools


QuoteFn = Callable[[JobSpec, Sequence[Pool]], list[Any]]
