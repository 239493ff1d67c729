"""A hyperparameter sweep (``kind: Sweep``): a job spec template, the fields to vary, and how to search.

```yaml
apiVersion: trainyard/v1
kind: Sweep
name: lora-lr
method: grid                      # grid | random
parameters:                       # dotted paths into the template
  workload.learning_rate: {values: [1.0e-4, 3.0e-4, 1.0e-3]}
  workload.lora_rank: {values: [8, 16]}
  # random only: {min: 1.0e-5, max: 1.0e-3, scale: log}
trials: 6                         # random: how many; grid: at most this many of the grid (optional)
max_parallel: 3
budget_usd: 20                    # a hard limit across all trials
metric: {name: eval_loss, goal: minimize}
early_stopping: {method: successive_halving, reduction_factor: 3, min_fraction: 0.25}
template: {...a TrainingJob spec...}
```

Pure: expanding a sweep into trial specs reads nothing and draws random values from its own seeded
generator, so the same sweep always yields the same trials.
"""

from __future__ import annotations

import copy
import itertools
import math
from enum import StrEnum
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from trainyard.errors import SpecError
from trainyard.spec.models import JobSpec

MAX_TRIALS = 1000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class SearchMethod(StrEnum):
    GRID = "grid"
    RANDOM = "random"


class Values(_Strict):
    values: Annotated[list[Any], Field(min_length=1, max_length=MAX_TRIALS)]


class Range(_Strict):
    min: float
    max: float
    scale: Literal["linear", "log"] = "linear"
    integer: bool = False

    @model_validator(mode="after")
    def _check(self) -> Range:
        if not (math.isfinite(self.min) and math.isfinite(self.max)) or self.min >= self.max:
            raise ValueError(f"min {self.min} must be below max {self.max}")
        if self.scale == "log" and self.min <= 0:
            raise ValueError("a log scale needs min > 0")
        return self


def _kind(v: Any) -> str:
    if isinstance(v, dict):
        return "values" if "values" in v else "range"
    return "values" if isinstance(v, Values) else "range"


Parameter = Annotated[Annotated[Values, Tag("values")] | Annotated[Range, Tag("range")], Discriminator(_kind)]


class Metric(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=100)] = "eval_loss"
    goal: Literal["minimize", "maximize"] = "minimize"


class SuccessiveHalving(_Strict):
    """Every rung keeps the best 1/reduction_factor of the trials and multiplies their steps by it; the
    first rung trains each trial for ``min_fraction`` of the template's steps, the last for all of them."""

    method: Literal["successive_halving"] = "successive_halving"
    reduction_factor: Annotated[int, Field(ge=2, le=10)] = 3
    min_fraction: Annotated[float, Field(gt=0, le=1)] = 0.25


class SweepSpec(_Strict):
    api_version: Literal["trainyard/v1"] = Field("trainyard/v1", alias="apiVersion")
    kind: Literal["Sweep"] = "Sweep"
    name: Annotated[str, Field(min_length=1, max_length=150, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")]
    method: SearchMethod = SearchMethod.GRID
    parameters: Annotated[dict[str, Parameter], Field(min_length=1, max_length=32)]
    trials: Annotated[int, Field(ge=1, le=MAX_TRIALS)] | None = None
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    max_parallel: Annotated[int, Field(ge=1, le=256)] = 4
    budget_usd: Annotated[float, Field(gt=0, le=1e9)] | None = None
    metric: Metric = Field(default_factory=Metric)
    early_stopping: SuccessiveHalving | None = None
    template: JobSpec

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        if self.method == SearchMethod.GRID:
            ranges = [k for k, v in self.parameters.items() if isinstance(v, Range)]
            if ranges:
                raise ValueError(
                    f"parameters.{ranges[0]}: a grid needs `values`; ranges are for random search"
                )
        elif self.trials is None:
            raise ValueError("trials: random search needs the number of trials")
        for path in self.parameters:
            _check_path(self.template.to_document(), path)
        return self


def _check_path(doc: dict[str, Any], path: str) -> None:
    parts = path.split(".")
    if parts[0] in ("name", "apiVersion", "kind") or len(parts) < 2:
        raise ValueError(f"parameters.{path}: vary a field inside a section, such as workload.learning_rate")
    node: Any = doc
    for p in parts[:-1]:
        if not isinstance(node, dict) or p not in node or not isinstance(node[p], dict):
            raise ValueError(f"parameters.{path}: the template has no section {p!r} there")
        node = node[p]


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    node = doc
    parts = path.split(".")
    for p in parts[:-1]:
        node = node[p]
    node[parts[-1]] = value


def _draw(rng: np.random.Generator, spec: Values | Range) -> Any:
    if isinstance(spec, Values):
        return spec.values[int(rng.integers(len(spec.values)))]
    if spec.scale == "log":
        v = float(math.exp(rng.uniform(math.log(spec.min), math.log(spec.max))))
    else:
        v = float(rng.uniform(spec.min, spec.max))
    return round(v) if spec.integer else v


def trial_parameters(sweep: SweepSpec) -> list[dict[str, Any]]:
    """The parameter values of every trial, in trial order."""
    names = list(sweep.parameters)
    if sweep.method == SearchMethod.GRID:
        grids = [sweep.parameters[n].values for n in names]  # type: ignore[union-attr]
        combos = [dict(zip(names, c, strict=True)) for c in itertools.product(*grids)]
        if len(combos) > MAX_TRIALS:
            raise SpecError(f"the grid has {len(combos)} points, more than {MAX_TRIALS}")
        return combos[: sweep.trials] if sweep.trials else combos
    rng = np.random.default_rng(sweep.seed)
    assert sweep.trials is not None
    return [{n: _draw(rng, sweep.parameters[n]) for n in names} for _ in range(sweep.trials)]


def trial_name(sweep: SweepSpec, index: int) -> str:
    return f"{sweep.name}-t{index:03d}"


def trial_specs(sweep: SweepSpec) -> list[tuple[dict[str, Any], JobSpec]]:
    """(parameters, spec) per trial. Every trial carries the sweep's name in its tags; a value that makes
    the template invalid is a SpecError naming the trial, the field and the value."""
    out: list[tuple[dict[str, Any], JobSpec]] = []
    for i, params in enumerate(trial_parameters(sweep)):
        doc = copy.deepcopy(sweep.template.to_document())
        for path, value in params.items():
            _set(doc, path, value)
        doc["name"] = trial_name(sweep, i)
        doc.setdefault("tags", {})
        doc["tags"] = {**doc["tags"], "sweep": sweep.name, "trial": str(i)}
        try:
            out.append((params, JobSpec.model_validate(doc)))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise SpecError(
                f"sweep {sweep.name!r} trial {i} ({params}): {where}: {first['msg']}",
                hint="Narrow the parameter's values or range to what the template accepts.",
            ) from None
    return out


def sweep_from_dict(doc: Any, source: str = "sweep") -> SweepSpec:
    if not isinstance(doc, dict):
        raise SpecError(f"{source}: a sweep is a mapping with kind: Sweep")
    try:
        return SweepSpec.model_validate(doc)
    except ValidationError as exc:
        errors = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise SpecError(
            f"{source}: {errors[0]}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
            hint="See docs/sweeps.md for the fields of a sweep.",
            details={"errors": errors},
        ) from None
