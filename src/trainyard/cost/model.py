"""The cost model: pure functions from step time, prices, checkpoint and preemption parameters to expected
wall time and dollars.

Notation (DESIGN §4): useful work ``W`` seconds (steps × step time), checkpoint stall ``C`` seconds per
save, interval ``τ`` seconds of work between saves, preemption rate ``λ`` per second and restart cost
``R`` seconds (provision + checkpoint load + recompile). To first order in ``λ`` the expected wall time is

    T = W · (1 + C/τ + λ·(τ/2 + R))

(every save stalls ``C``; each preemption loses on average half an interval of work and pays ``R``).
``τ* = √(2C/λ)`` (Young/Daly) minimises it exactly. Money stays at full float precision; round only
for display.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainyard.spec.models import JobSpec, Method, Optimizer, Precision

SECONDS_PER_HOUR = 3600.0
GB = 1e9

# Storage write/read bandwidth per node, GB/s, by checkpoint URL scheme. Local NVMe sustains 2-3 GB/s
# writes (file://); object stores reach about 1 GB/s per node with parallel multipart uploads (s3://,
# gs://, az://); we use the conservative end of both ranges.
STORAGE_WRITE_GB_PER_S = {
    "file": 2.0,
    "s3": 1.0,
    "gs": 1.0,
    "gcs": 1.0,
    "az": 1.0,
    "abfs": 1.0,
    "memory": 10.0,
}
STORAGE_READ_GB_PER_S = {
    "file": 3.0,
    "s3": 1.5,
    "gs": 1.5,
    "gcs": 1.5,
    "az": 1.5,
    "abfs": 1.5,
    "memory": 10.0,
}
DEFAULT_STORAGE_GB_PER_S = 1.0

# Time from asking for a replacement VM to a running process: 2-5 min for GPU VMs (boot, image pull,
# NCCL rendezvous), TPU slices and Trainium a little longer (queued resources, Neuron runtime start).
PROVISIONING_S = {"nvidia": 180.0, "amd": 180.0, "intel-gaudi": 240.0, "google-tpu": 300.0,
                  "aws-trainium": 240.0, "cpu": 60.0}  # fmt: skip
DEFAULT_PROVISIONING_S = 180.0


@dataclass(frozen=True)
class CostParams:
    """Knobs of the cost model, all with documented defaults (see docs/spec.md "Quotes")."""

    async_checkpoint: bool = False  # async saves cost only their device→host stall
    host_copy_gb_per_s: float = 10.0  # device→host staging per device (PCIe Gen4 x16, pinned memory)
    storage_write_gb_per_s: float | None = None  # None: from the checkpoint URL scheme
    storage_read_gb_per_s: float | None = None
    # Intervals come from a grid: whole minutes below 10 min, 5-minute steps above (round numbers are
    # what operators read and compare; the expected overhead is flat near the optimum: τ = x·τ* raises
    # the interval-dependent part by (x + 1/x)/2 - 1, under 1 % for x within ±13 %). The grid point
    # with the least expected overhead is chosen, capped at 30 min: hardware fails on every market, and
    # without preemption (λ = 0) the cap is the interval.
    interval_granularity_s: float = 60.0
    interval_coarse_granularity_s: float = 300.0
    interval_coarse_above_s: float = 600.0
    min_interval_s: float = 60.0
    max_interval_s: float = 1800.0
    deadline_quantile: float = 0.9  # pessimistic percentile used for deadlines on spot
    # Unbilled wall time per preemption while spot capacity is unavailable (nothing runs, nothing is paid).
    # The reference p3.2xlarge preemption traces show 0.8-3.0 h without capacity per preemption (instance
    # held 31-79 % of the time); GCP CPU traces show none. Off by default (the quote reports billed
    # time); set it to make expected hours and deadlines account for waiting.
    spot_capacity_wait_s: float = 0.0
    provisioning_s: dict[str, float] = field(default_factory=lambda: dict(PROVISIONING_S))
    reserved_discount: float = 0.35


DEFAULT_PARAMS = CostParams()


# ---- checkpoint size and time -------------------------------------------------------------------------
def checkpoint_bytes(spec: JobSpec) -> float:
    """Bytes of one training checkpoint: weights + fp32 master copy + optimizer state.

    Full fine-tuning saves every weight; LoRA saves only the adapters (the frozen base is reloaded from
    its registry copy). Gradients are not saved.
    """
    w = spec.workload
    weight = 4.0 if w.precision == Precision.FP32 else 2.0
    master = 0.0 if w.precision == Precision.FP32 else 4.0
    opt = {Optimizer.ADAMW: 8.0, Optimizer.SGD: 4.0, Optimizer.ADAFACTOR: 0.1}[w.optimizer]
    n = spec.params if w.method == Method.FULL else spec.trainable_params
    return float(n) * (weight + master + opt)


def _scheme(url: str | None) -> str:
    if not url or "://" not in url:
        return "file"
    return url.split("://", 1)[0].lower()


def storage_write_gb_per_s(url: str | None, params: CostParams = DEFAULT_PARAMS) -> float:
    if params.storage_write_gb_per_s is not None:
        return params.storage_write_gb_per_s
    return STORAGE_WRITE_GB_PER_S.get(_scheme(url), DEFAULT_STORAGE_GB_PER_S)


def storage_read_gb_per_s(url: str | None, params: CostParams = DEFAULT_PARAMS) -> float:
    if params.storage_read_gb_per_s is not None:
        return params.storage_read_gb_per_s
    return STORAGE_READ_GB_PER_S.get(_scheme(url), DEFAULT_STORAGE_GB_PER_S)


def checkpoint_write_s(ckpt_bytes: float, nodes: int, write_gb_per_s: float) -> float:
    """Time to write a checkpoint: every node writes its shards in parallel."""
    return ckpt_bytes / (max(1, nodes) * write_gb_per_s * GB)


def checkpoint_stall_s(
    ckpt_bytes: float, *, devices: int, nodes: int, write_gb_per_s: float, params: CostParams = DEFAULT_PARAMS
) -> float:
    """Training time lost per save: the whole write when synchronous, the device→host copy when async."""
    if params.async_checkpoint:
        return ckpt_bytes / (max(1, devices) * params.host_copy_gb_per_s * GB)
    return checkpoint_write_s(ckpt_bytes, nodes, write_gb_per_s)


def checkpoint_load_s(ckpt_bytes: float, nodes: int, read_gb_per_s: float) -> float:
    return ckpt_bytes / (max(1, nodes) * read_gb_per_s * GB)


def restart_s(*, provisioning_s: float, load_s: float, recompile_s: float) -> float:
    """Cost of one preemption besides lost work: new VM, checkpoint load, recompile where needed."""
    return provisioning_s + load_s + recompile_s


# ---- checkpoint interval ------------------------------------------------------------------------------
def young_daly_interval_s(checkpoint_s: float, rate_per_s: float) -> float:
    """τ* = √(2C/λ): the interval that minimises :func:`overhead_fraction` (∞ when λ = 0)."""
    if rate_per_s <= 0:
        return math.inf
    return math.sqrt(2.0 * max(checkpoint_s, 0.0) / rate_per_s)


def interval_grid_neighbours(tau_s: float, params: CostParams = DEFAULT_PARAMS) -> list[float]:
    """The grid points around ``tau_s`` (clamped to [min_interval_s, max_interval_s])."""
    lo_s, hi_s = params.min_interval_s, params.max_interval_s
    if tau_s >= hi_s:
        return [hi_s]
    if tau_s <= lo_s:
        return [lo_s]
    g = (
        params.interval_coarse_granularity_s
        if tau_s >= params.interval_coarse_above_s
        else params.interval_granularity_s
    )
    down, up = math.floor(tau_s / g) * g, math.ceil(tau_s / g) * g
    if tau_s < params.interval_coarse_above_s <= up:
        up = params.interval_coarse_above_s
    return sorted({min(max(t, lo_s), hi_s) for t in (down, up)})


def choose_interval_s(
    pinned_s: float | None, checkpoint_s: float, rate_per_s: float, params: CostParams = DEFAULT_PARAMS
) -> float:
    """The spec's pinned interval, else the grid point nearest Young/Daly with the least overhead.

    Because the interval-dependent overhead ``C/τ + λτ/2`` is convex in τ, the best grid point is one of
    the two around τ* = √(2C/λ); choosing it makes the overhead non-decreasing in λ. With λ = 0 the
    interval is the cap (``max_interval_s``).
    """
    if pinned_s is not None:
        return pinned_s
    if rate_per_s <= 0:
        return params.max_interval_s
    tau = min(young_daly_interval_s(checkpoint_s, rate_per_s), params.max_interval_s)
    return min(
        interval_grid_neighbours(tau, params),
        key=lambda t: checkpoint_s / t + rate_per_s * t / 2.0,
    )


def overhead_fraction(interval_s: float, checkpoint_s: float, rate_per_s: float, restart_s: float) -> float:
    """Extra wall time per second of useful work: C/τ + λ·(τ/2 + R)."""
    if interval_s <= 0:
        raise ValueError("interval_s must be positive")
    return checkpoint_s / interval_s + rate_per_s * (interval_s / 2.0 + restart_s)


def checkpoint_fraction(interval_s: float, checkpoint_s: float) -> float:
    return checkpoint_s / interval_s


def preemption_fraction(interval_s: float, rate_per_s: float, restart_s: float) -> float:
    return rate_per_s * (interval_s / 2.0 + restart_s)


# ---- wall time and money -------------------------------------------------------------------------------
def expected_wall_s(work_s: float, overhead: float, startup_s: float = 0.0) -> float:
    """Expected wall time: one-time startup plus useful work inflated by the overhead fraction."""
    return startup_s + work_s * (1.0 + overhead)


def dollars(price_usd_per_hour: float, seconds: float) -> float:
    return price_usd_per_hour * seconds / SECONDS_PER_HOUR


def usd_per_effective_step(price_usd_per_hour: float, step_time_s: float, overhead: float) -> float:
    """Dollars per step that counts, in steady state (checkpoint and preemption overhead included)."""
    return dollars(price_usd_per_hour, step_time_s * (1.0 + overhead))


def poisson_quantile(mean: float, q: float) -> int:
    """Smallest k with P(N ≤ k) ≥ q for N ~ Poisson(mean) (normal approximation for large means)."""
    if not 0.0 < q < 1.0:
        raise ValueError("q must be in (0, 1)")
    if mean <= 0:
        return 0
    if mean > 500:
        from statistics import NormalDist

        z = NormalDist().inv_cdf(q)
        # Cornish-Fisher: normal quantile + skewness term (z² - 1)/6, continuity-corrected; within ±1.
        return max(0, math.ceil(mean + z * math.sqrt(mean) + (z * z - 1) / 6 - 0.5))
    p = math.exp(-mean)
    cdf, k = p, 0
    while cdf < q:
        k += 1
        p *= mean / k
        cdf += p
    return k


def pessimistic_wall_s(
    *,
    work_p_s: float,
    checkpoint_frac: float,
    interval_s: float,
    rate_per_s: float,
    restart_s: float,
    startup_s: float,
    quantile: float = 0.9,
    wait_s: float = 0.0,
) -> float:
    """A ``quantile`` wall time: pessimistic work, a Poisson count of preemptions at that quantile, each
    losing a uniform share of an interval (the sum's spread at the same quantile), a restart and an
    unbilled wait for capacity."""
    base = work_p_s * (1.0 + checkpoint_frac)
    if rate_per_s <= 0:
        return startup_s + base
    # Preemptions happen over the whole run, which they themselves lengthen: iterate the mean once.
    mean_n = rate_per_s * base * (1.0 + rate_per_s * (interval_s / 2.0 + restart_s))
    n = poisson_quantile(mean_n, quantile)
    from statistics import NormalDist

    z = NormalDist().inv_cdf(quantile)
    lost = n * interval_s / 2.0 + z * interval_s * math.sqrt(n / 12.0)
    return startup_s + base + lost + n * (restart_s + wait_s)
