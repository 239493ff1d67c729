"""Pools: capacity the scheduler may use (DESIGN §3.4 POOLS file)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainyard.catalog.names import ACCELERATOR_NAMES, normalize_accelerator_name
from trainyard.errors import PoolsFileError, SpecError, list_errors
from trainyard.spec.models import Market


class Pool(BaseModel):
    """A homogeneous set of nodes in one region and market."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=200)]
    accelerator: str
    devices_per_node: Annotated[int, Field(ge=1, le=1024)]
    nodes: Annotated[int, Field(ge=1, le=1_000_000)]
    available_devices: Annotated[int, Field(ge=0)] | None = None
    market: Market
    price_usd_per_device_hour: Annotated[float, Field(ge=0, le=1e6)] | None = None
    instance_type: str | None = None
    cloud: str | None = None
    region: Annotated[str, Field(min_length=1)]
    interruption_rate_per_hour: Annotated[float, Field(ge=0, le=1000)] | None = None
    notice_s: Annotated[float, Field(ge=0, le=86400)] | None = None
    inter_node_gbps: Annotated[float, Field(gt=0, le=1e7)] | None = None
    # True when the pool rents whole instances only (catalog offers, TPU slices): an allocation is a
    # multiple of devices_per_node. False (the default) lets a job take a power-of-two share of one node.
    whole_nodes_only: bool = False
    # Device memory when the pool's SKU differs from the accelerator table (a 16 GB V100 vs the 32 GB row).
    memory_per_device_gib: Annotated[float, Field(gt=0, le=1e5)] | None = None
    # Which executor can start work here (service only): ``local`` (this machine), ``ray`` (nodes carrying
    # the pool's label) or ``none`` (planning only: quoted and explained, never started). Left out, the
    # service decides: local pools are ``local``, pools a Ray cluster labels are ``ray``, the rest ``none``.
    backend: Literal["local", "ray", "none"] | None = None

    @field_validator("accelerator")
    @classmethod
    def _canonical(cls, v: str) -> str:
        c = normalize_accelerator_name(v)
        if c is None:
            raise ValueError(f"{v!r} is not an accelerator; accelerators: {', '.join(ACCELERATOR_NAMES)}")
        return c

    @model_validator(mode="after")
    def _capacity(self) -> Pool:
        if self.available_devices is not None and self.available_devices > self.total_devices:
            raise ValueError(
                f"available_devices {self.available_devices} exceeds nodes x devices_per_node = "
                f"{self.nodes} x {self.devices_per_node} = {self.total_devices}"
            )
        return self

    @property
    def total_devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def free_devices(self) -> int:
        return self.total_devices if self.available_devices is None else self.available_devices


class PoolsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pools: list[Pool]

    @model_validator(mode="after")
    def _unique(self) -> PoolsFile:
        seen: set[str] = set()
        for p in self.pools:
            if p.name in seen:
                raise ValueError(f"pool name {p.name!r} appears twice")
            seen.add(p.name)
        return self


def pools_from_dict(data: Any, source: str = "pools") -> list[Pool]:
    from trainyard.spec.loader import describe_validation_error

    if not isinstance(data, dict):
        raise PoolsFileError(f"{source}: expected a mapping with a 'pools' list")
    try:
        return PoolsFile.model_validate(data).pools
    except ValidationError as exc:
        errors = describe_validation_error(exc)
        raise PoolsFileError(f"{source}: {list_errors(errors)}", details={"errors": errors}) from None


def load_pools(path: str | Path) -> list[Pool]:
    from trainyard.spec.loader import parse_document

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise PoolsFileError(
            f"{p}: cannot read ({exc.__class__.__name__})", hint="Give the path of a POOLS YAML file."
        ) from None
    try:
        data = parse_document(text, str(p))
    except SpecError as exc:  # the shared parser speaks of specs; re-badge it as a pools error
        raise PoolsFileError(str(exc)) from None
    return pools_from_dict(data, str(p))
