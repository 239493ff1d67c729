"""CPU gangs on one host: the local pool's "devices" are cores of this machine, one worker process per
rank, gloo over loopback. Ranks share the host's cores (and the control plane runs there too), so two
ranks on a 2-core host are not twice as fast as one; a measured gang step calibrates that, and a finished
multi-rank job's step times are kept apart from one-rank ones."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from trainyard.catalog.accelerators import get_accelerator
from trainyard.cost.quote import pool_accelerator, predict_kwargs
from trainyard.predict import Calibration, default_calibration, predict, predict_grouped, predict_many
from trainyard.predict.engine import host_sharing
from trainyard.predict.fit import calibrate_from_profiles, ingest_measurement
from trainyard.predict.params import PRIORS, EfficiencyParams
from trainyard.schedule import schedule_round
from trainyard.schedule.types import QueuedJob, SchedulerConfig
from trainyard.services.pools import local_cpu_pool
from trainyard.spec import spec_from_dict
from trainyard.spec.models import JobSpec

CPU = get_accelerator("cpu")
KEY = "cpu/torch-cpu/fp32/cpu"
DEVICE = {"matmul_flops": 5e10, "matmul_flops_fp32": 5e10, "mem_bw_bytes_s": 1.5e10}
PEAKS = {"cpu": {"fp32_flops": 5e10, "bf16_flops": 5e10, "fp16_flops": 5e10, "mem_bw_bytes_s": 1.5e10}}


def decoder(layers: int, d_model: int, seq: int, batch: int, vocab: int = 1024, **resources: Any) -> JobSpec:
    doc: dict[str, Any] = {
        "name": f"d{layers}x{d_model}-s{seq}-b{batch}",
        "model": {"architecture": "decoder", "n_layers": layers, "d_model": d_model, "n_heads": 4,
                  "vocab_size": vocab},
        "workload": {"seq_len": seq, "global_batch": batch, "steps": 40, "precision": "fp32"},
        "requirements": {"allow": ["cpu"]},
    }  # fmt: skip
    if resources:
        doc["resources"] = resources
    return spec_from_dict(doc)


DDP = {"fsdp": False, "tensor": 1, "pipeline": 1}
SMALL = [decoder(2, 64, 64, 8, 384), decoder(6, 96, 96, 8, 512), decoder(3, 192, 256, 4, 2048)]


@pytest.mark.parametrize("s", [*SMALL, decoder(2, 128, 128, 16)], ids=lambda s: s.name)
def test_two_ranks_on_a_two_core_host_are_not_faster_than_one(s: JobSpec) -> None:
    local = predict_kwargs(local_cpu_pool(2), CPU)  # devices_per_node = 2 cores
    one, two = (predict(s, CPU, n, **local) for n in (1, 2))
    assert two.fits and two.plan["data"] == 2
    # FSDP would pay three collectives per block per micro-batch on the loaded loopback: plain DDP is chosen
    assert two.plan["fsdp"] is False
    # each rank computes half the batch but both share the core the control plane leaves free: the
    # per-layer overhead is paid twice and the gang synchronises once per step
    assert two.step_time_s > one.step_time_s
    # the vectorised paths agree
    many = predict_many(s, [CPU], [1, 2], **local)
    assert [p.step_time_s for p in many] == pytest.approx([one.step_time_s, two.step_time_s], rel=1e-12)
    (grouped,) = predict_grouped([(s, [1, 2])], CPU, **local)
    assert [p.step_time_s for p in grouped] == pytest.approx([one.step_time_s, two.step_time_s], rel=1e-12)
    # the catalog's cpu (one whole host per device) is not a shared host: two hosts do split the work
    assert predict(s, CPU, 2).step_time_s < predict(s, CPU, 1).step_time_s


def test_a_host_with_free_cores_still_speeds_up_a_gang() -> None:
    s = decoder(4, 256, 256, 16)
    big = predict_kwargs(local_cpu_pool(64), CPU)
    assert predict(s, CPU, 2, **big).step_time_s < 0.75 * predict(s, CPU, 1, **big).step_time_s
    # 4 ranks on 4 cores: three are free, the fourth time-shares
    slow, sync = host_sharing([1, 2, 3, 4], 4, PRIORS["cpu"])
    assert list(slow) == pytest.approx([1.0, 1.0, 1.0, 4 / 3])
    assert list(sync) == [
        0.0,
        PRIORS["cpu"].gang_sync_s,
        PRIORS["cpu"].gang_sync_s,
        PRIORS["cpu"].gang_sync_s,
    ]


def _truth() -> Calibration:
    params = replace(PRIORS["cpu"], mm_max=0.4, step_overhead_s=0.002, gang_slowdown=1.8, gang_sync_s=0.004)
    return Calibration(params={"cpu/torch-cpu/fp32": params}, peaks_override=PEAKS)


def _profile(s: JobSpec, cal: Calibration, ranks: int = 1) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "spec": s.to_document(),
        "accelerator": "cpu",
        "device": DEVICE if ranks == 1 else {"type": "cpu"},
        "plan": {"micro_batch": -(-s.workload.global_batch // ranks), "activation_checkpointing": "none"},
        # a gang profile runs data parallel (one all-reduce of the gradients per step)
        "step_time_s": predict(s, CPU, ranks, calibration=cal, devices_per_node=2, plan=DDP).step_time_s,
    }
    if ranks > 1:
        doc.update(devices=ranks, host_cores=2)
    return doc


def test_a_measured_two_rank_step_calibrates_two_rank_quotes() -> None:
    truth = _truth()
    shapes = [decoder(2, 64, 64, 4, 256), decoder(4, 256, 128, 4)]
    ones = [_profile(s, truth) for s in shapes]
    gangs = [_profile(s, truth, ranks=2) for s in shapes]
    alone = calibrate_from_profiles(ones)
    cal = calibrate_from_profiles(ones + gangs)
    fitted = cal.params[KEY]
    assert fitted.gang_slowdown == pytest.approx(1.8, rel=1e-3)
    assert fitted.gang_sync_s == pytest.approx(0.004, rel=1e-3)
    assert fitted.mm_max == pytest.approx(0.4, rel=1e-3)  # the gang profiles leave one rank's fit alone
    local = predict_kwargs(local_cpu_pool(2), CPU)
    for s in SMALL:
        want = predict(s, CPU, 2, calibration=truth, **local).step_time_s
        assert predict(s, CPU, 2, calibration=cal, **local).step_time_s == pytest.approx(want, rel=1e-3)
        # without the gang profiles the 2-rank quote is the prior's (so the comparison above can fail)
        assert predict(s, CPU, 2, calibration=alone, **local).step_time_s < 0.9 * want
        # one rank is quoted from one-rank profiles alike
        assert predict(s, CPU, 1, calibration=cal, **local).step_time_s == pytest.approx(
            predict(s, CPU, 1, calibration=alone, **local).step_time_s
        )
    # one gang profile fits the slowdown with the synchronisation at its prior
    single = calibrate_from_profiles([*ones, gangs[1]]).params[KEY]
    assert single.gang_sync_s == EfficiencyParams().gang_sync_s
    assert 1.3 < single.gang_slowdown < 2.5


def test_a_gang_profile_timed_against_one_rank_is_fitted_by_that_ratio() -> None:
    """The machine's load differed while the gang was timed (its step 3x slower than the truth): the
    back-to-back ratio to one rank carries the gang's cost, not the absolute time."""
    truth = _truth()
    shapes = [decoder(2, 64, 64, 4, 256), decoder(4, 256, 128, 4)]
    ones = [_profile(s, truth) for s in shapes]
    gangs = []
    for s in shapes:
        doc = _profile(s, truth, ranks=2)
        one = predict(s, CPU, 1, calibration=truth).step_time_s
        gangs.append(
            {**doc, "ratio_to_one_rank": doc["step_time_s"] / one, "step_time_s": 3 * doc["step_time_s"]}
        )
    fitted = calibrate_from_profiles(ones + gangs).params[KEY]
    assert fitted.gang_slowdown == pytest.approx(1.8, rel=1e-3)
    assert fitted.gang_sync_s == pytest.approx(0.004, rel=1e-3)
    unratioed = [{k: v for k, v in g.items() if k != "ratio_to_one_rank"} for g in gangs]
    assert calibrate_from_profiles(ones + unratioed).params[KEY].gang_slowdown > 3


def test_multi_rank_measurements_are_kept_per_device_count() -> None:
    s = decoder(2, 64, 64, 8, 384)
    pool = local_cpu_pool(2)
    acc = pool_accelerator(pool)
    local = predict_kwargs(pool, acc)
    base = default_calibration()
    one, two = (predict(s, acc, n, calibration=base, **local).step_time_s for n in (1, 2))
    cal = base
    for _ in range(20):
        cal = ingest_measurement(cal, s, acc, 2, 3.0 * two, **local)
    assert f"{KEY}/x2" in cal.corrections and KEY not in cal.corrections
    # the 2-rank quote learned from the gang; one rank's is untouched by it
    assert predict(s, acc, 2, calibration=cal, **local).step_time_s == pytest.approx(3.0 * two, rel=0.15)
    assert predict(s, acc, 1, calibration=cal, **local).step_time_s == pytest.approx(one)
    (grouped,) = predict_grouped([(s, [1, 2])], acc, calibration=cal, **local)
    assert [p.step_time_s for p in grouped] == pytest.approx(
        [predict(s, acc, n, calibration=cal, **local).step_time_s for n in (1, 2)]
    )
    # a one-rank measurement corrects one rank, and is the 2-rank prior until a gang is measured
    cal1 = ingest_measurement(base, s, acc, 1, 2.0 * one, **local)
    assert predict(s, acc, 2, calibration=cal1, **local).step_time_s == pytest.approx(
        two * cal1.corrections[KEY]
    )
    both = ingest_measurement(cal1, s, acc, 2, two * cal1.corrections[KEY], **local)
    assert both.corrections[f"{KEY}/x2"] == pytest.approx(cal1.corrections[KEY])
    # GPUs (own devices, not a shared host) keep one correction per accelerator
    h100 = get_accelerator("h100")
    big = decoder(8, 1024, 1024, 16, 32000)
    g = ingest_measurement(base, big, h100, 8, 1.0, devices_per_node=8)
    assert len(g.corrections) == 1 and all("/x" not in k for k in g.corrections)


@pytest.mark.parametrize("price", [0.0, 0.05])
def test_the_scheduler_places_a_small_cpu_job_on_one_rank_when_two_are_slower(price: float) -> None:
    pool = local_cpu_pool(2).model_copy(update={"price_usd_per_device_hour": price})
    acc = pool_accelerator(pool)
    for s in SMALL:
        s = s.model_copy(
            update={"resources": s.resources.model_copy(update={"min_devices": 1, "max_devices": 2})}
        )
        local = predict_kwargs(pool, acc)
        assert predict(s, acc, 2, **local).step_time_s > predict(s, acc, 1, **local).step_time_s
        r = schedule_round(
            [QueuedJob(job_id=s.name, tenant="t", spec=s, submit_s=0.0)],
            [pool],
            config=SchedulerConfig(time_limit_s=0.2),
        )
        (p,) = r.placements
        assert (p.pool, p.devices) == ("local-cpu", 1), p.reason
