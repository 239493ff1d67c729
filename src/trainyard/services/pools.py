"""Live pools: capacity, prices and interruption rates, updatable while the platform runs."""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from trainyard.catalog.pools import Pool
from trainyard.errors import NotFoundError, PoolsFileError
from trainyard.services.domain import PoolRecord
from trainyard.store.db import Database
from trainyard.store.repositories import PoolRepo

LOCAL_POOL = "local-cpu"
LOCAL_GPU_POOL = "local-gpu"
PLANNING_ONLY = "none"


def pool_backend(pool: Pool, executor: Any = None) -> str:
    """The backend that serves ``pool`` (DESIGN §3.4): ``local``, ``ray`` or ``none`` (planning only).

    An explicit ``backend`` wins. Left out: this machine's own pools (``cloud: local``) are ``local``; a
    pool the executor serves takes the executor's name (a Ray cluster whose nodes carry the pool's
    label); everything else — cloud pools from a POOLS file, catalog offers — is planning only.
    """
    if pool.backend is not None:
        return pool.backend
    if pool.cloud == "local":
        return "local"
    if executor is not None and executor_serves(executor, pool):
        return str(getattr(executor, "name", PLANNING_ONLY))
    return PLANNING_ONLY


def executor_serves(executor: Any, pool: Pool) -> bool:
    """True when ``executor`` can start work on ``pool`` (an executor without ``serves`` serves none)."""
    if executor is None or pool.backend == PLANNING_ONLY:
        return False
    serves = getattr(executor, "serves", None)
    if serves is None:
        return False
    try:
        return bool(serves(pool))
    except Exception:  # an unreachable cluster serves nothing this round
        return False


def planning_only_reason(pool_names: builtins.list[str]) -> str:
    names = ", ".join(sorted(pool_names)[:6]) + (" …" if len(pool_names) > 6 else "")
    return (
        f"the only capacity that fits is planning-only ({names}: no executor of this server serves it, "
        "backend none); it is quoted and explained but never started — add a pool with backend local "
        "or ray, or relax the job's requirements"
    )


def local_cpu_pool(cpu_count: int | None = None) -> Pool:
    """The real pool of this machine: accelerator ``cpu``, one device per CPU core.

    One device is one job slot of one core: a job placed with ``devices = n`` runs ``n`` worker ranks,
    each pinned to one core's worth of threads, so ``devices_per_node`` equals the core count. The
    machine is already paid for, so its price is $0 per device-hour (set another one with
    ``trainyard pools set local-cpu --price-usd-per-device-hour X`` to allocate costs).
    """
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return Pool(
        name=LOCAL_POOL,
        accelerator="cpu",
        devices_per_node=max(1, cores),
        nodes=1,
        market="on_demand",
        price_usd_per_device_hour=0.0,
        instance_type=None,
        cloud="local",
        region="local",
        interruption_rate_per_hour=0.0,
    )


def local_gpu_pools(gpus: builtins.list[dict[str, Any]]) -> builtins.list[Pool]:
    """Pools of this machine's CUDA GPUs, one per catalog accelerator (``local-gpu``, then
    ``local-gpu-<accelerator>`` for a second kind). ``gpus``: ``[{index, name, accelerator, memory_gib}]``
    as :func:`trainyard.executors.local.detect_local_gpus` reports them; unknown models are left out."""
    by_acc: dict[str, builtins.list[dict[str, Any]]] = {}
    for g in gpus:
        if g.get("accelerator"):
            by_acc.setdefault(str(g["accelerator"]), []).append(g)
    out = []
    for i, (acc, members) in enumerate(sorted(by_acc.items(), key=lambda kv: -len(kv[1]))):
        out.append(
            Pool(
                name=LOCAL_GPU_POOL if i == 0 else f"{LOCAL_GPU_POOL}-{acc}",
                accelerator=acc,
                devices_per_node=len(members),
                nodes=1,
                market="on_demand",
                price_usd_per_device_hour=0.0,
                cloud="local",
                region="local",
                interruption_rate_per_hour=0.0,
                memory_per_device_gib=min(float(m.get("memory_gib") or 0) for m in members) or None,
                backend="local",
            )
        )
    return out


def with_price(pool: Pool) -> Pool:
    """A pool that names only its instance type gets the catalog's price for its market."""
    if pool.price_usd_per_device_hour is not None or pool.instance_type is None:
        return pool
    from trainyard.catalog.offers import with_catalog_price
    from trainyard.errors import TrainyardError

    try:
        return with_catalog_price(pool)
    except TrainyardError:
        return pool


def _pool_doc(pool: Pool) -> dict[str, Any]:
    return pool.model_dump(mode="json", exclude_none=True)


def pool_from_record(rec: PoolRecord) -> Pool:
    return Pool.model_validate(rec.doc)


class PoolService:
    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock

    def list(self) -> builtins.list[PoolRecord]:
        with self.db.session() as s:
            return PoolRepo(s).list()

    def pools(self) -> builtins.list[Pool]:
        return [pool_from_record(r) for r in self.list()]

    def get(self, name: str) -> PoolRecord:
        with self.db.session() as s:
            rec = PoolRepo(s).get(name)
        if rec is None:
            raise NotFoundError(f"no pool named {name!r}", hint="List pools with `trainyard pools list`.")
        return rec

    def put(self, pool: Pool, *, source: str = "user") -> PoolRecord:
        pool = with_price(pool)
        with self.db.session() as s:
            return PoolRepo(s).upsert(pool.name, _pool_doc(pool), source, self.clock())

    def update(self, name: str, changes: dict[str, Any]) -> PoolRecord:
        """Change some fields of an existing pool (capacity, price, interruption rate, ...)."""
        from trainyard.spec.loader import describe_validation_error

        with self.db.session() as s:
            repo = PoolRepo(s)
            rec = repo.get(name)
            if rec is None:
                raise NotFoundError(f"no pool named {name!r}", hint="List pools with `trainyard pools list`.")
            doc = {**rec.doc, **{k: v for k, v in changes.items()}, "name": name}
            doc = {k: v for k, v in doc.items() if v is not None}
            try:
                pool = Pool.model_validate(doc)
            except ValidationError as exc:
                errors = describe_validation_error(exc)
                raise PoolsFileError(
                    f"pool {name}: {errors[0]['field']}: {errors[0]['message']}", details={"errors": errors}
                ) from None
            return repo.upsert(name, _pool_doc(pool), rec.source, self.clock())

    def delete(self, name: str) -> None:
        with self.db.session() as s:
            if not PoolRepo(s).delete(name):
                raise NotFoundError(f"no pool named {name!r}")

    def ensure_local(self, pool: Pool) -> PoolRecord:
        """Register the local pool on first start; keep an operator's later edits (price, capacity)."""
        with self.db.session() as s:
            repo = PoolRepo(s)
            rec = repo.get(pool.name)
            if rec is not None:
                return rec
            return repo.upsert(pool.name, _pool_doc(pool), "local", self.clock())
