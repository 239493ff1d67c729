"""Migration economics and the deadline-aware spot fallback, as worked examples computed by hand.

The job is the scheduler tests' 936,445,952-parameter model in bf16 with AdamW, fully fine-tuned: its
checkpoint is 14 bytes a parameter (2 weight + 4 fp32 master + 8 optimizer), 13,110,243,328 bytes, which
takes 13,110,243,328 × 8 / 10e9 = 10.4881946624 s to copy at the default 10 Gbit/s.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_scheduler_round import spec
from test_scheduler_solver import cand

from trainyard.schedule.migration import (
    MigrationCost,
    ProgressCheck,
    dwell_ok,
    migration_cost,
    uniform_progress,
    worth_moving,
)
from trainyard.schedule.types import RunningJob, SchedulerConfig

CFG = SchedulerConfig()  # checkpoint write 60 s, conversion 300 s, 10 Gbit/s between pools
TRANSFER_S = 13_110_243_328 * 8 / 10e9  # 10.4881946624 s
SPEC = spec("r", workload={"steps": 20000})


def _to(accelerator: str, devices: int = 1, price: float = 4.0):
    return replace(cand("r", "p", devices, 10.0), accelerator=accelerator, price_usd_per_hour=price)


def _cost(accelerator: str, devices: int = 1) -> MigrationCost:
    # from one a100-80gb at $2/h to `devices` × `accelerator` at $4/h; restart 200 s, recompile 300 s
    return migration_cost(
        SPEC,
        from_accelerator="a100-80gb",
        from_devices=1,
        from_price_usd_per_hour=2.0,
        to=_to(accelerator, devices),
        restart_s=200.0,
        compile_s=300.0,
        config=CFG,
    )


def test_the_checkpoint_copy_takes_its_bytes_over_the_link() -> None:
    assert _cost("a100-80gb").parts["transfer"] == pytest.approx(10.4881946624, rel=1e-12)
    slow = replace(CFG, transfer_gbps=2.5)  # a quarter of the bandwidth: four times as long
    cost = migration_cost(SPEC, from_accelerator="a100-80gb", from_devices=1, from_price_usd_per_hour=2.0,
                          to=_to("a100-80gb"), restart_s=0.0, compile_s=0.0, config=slow)  # fmt: skip
    assert cost.parts["transfer"] == pytest.approx(4 * TRANSFER_S, rel=1e-12)


def test_a_move_to_the_same_accelerator_and_count_pays_checkpoint_copy_and_restart_only() -> None:
    c = _cost("a100-80gb")
    assert not c.cross_family
    assert c.parts == pytest.approx(
        {"checkpoint": 60.0, "transfer": TRANSFER_S, "conversion": 0.0, "restart": 200.0, "recompile": 0.0}
    )
    assert list(c.parts) == ["checkpoint", "transfer", "conversion", "restart", "recompile"]
    # idle 60 + 10.488 + 200 = 270.488 s; the write is paid at the old $2/h, the rest at the new $4/h
    assert c.downtime_s == pytest.approx(60.0 + TRANSFER_S + 200.0, rel=1e-12)
    assert c.usd == pytest.approx(60.0 * 2.0 / 3600 + (TRANSFER_S + 200.0) * 4.0 / 3600, rel=1e-12)
    assert c.usd == pytest.approx(0.26720910518, rel=1e-9)
    assert c.describe() == "$0.27 (5 min idle: checkpoint 60 s, transfer 10 s, restart 200 s)"


def test_another_accelerator_of_the_same_family_recompiles_but_needs_no_conversion() -> None:
    c = _cost("h100")
    assert not c.cross_family
    assert (c.parts["conversion"], c.parts["recompile"]) == (0.0, 300.0)
    assert c.downtime_s == pytest.approx(60.0 + TRANSFER_S + 200.0 + 300.0, rel=1e-12)
    assert c.usd == pytest.approx(60.0 * 2.0 / 3600 + (TRANSFER_S + 500.0) * 4.0 / 3600, rel=1e-12)


def test_a_new_device_count_converts_the_layout_and_recompiles() -> None:
    c = _cost("a100-80gb", devices=2)
    assert not c.cross_family
    assert (c.parts["conversion"], c.parts["recompile"]) == (300.0, 300.0)
    assert c.downtime_s == pytest.approx(60.0 + TRANSFER_S + 300.0 + 200.0 + 300.0, rel=1e-12)


def test_a_cross_family_move_converts_and_recompiles() -> None:
    c = _cost("tpu-v4")
    assert c.cross_family
    assert (c.parts["conversion"], c.parts["recompile"]) == (300.0, 300.0)
    assert c.usd == pytest.approx(60.0 * 2.0 / 3600 + (TRANSFER_S + 800.0) * 4.0 / 3600, rel=1e-12)
    # 60 + 10.49 + 300 + 200 + 300 = 870.49 s (14.5 min) idle; $0.0333 + 810.49 s × $4/h = $0.934
    assert c.describe() == (
        "$0.93 (15 min idle: checkpoint 60 s, transfer 10 s, conversion 300 s, restart 200 s, "
        "recompile 300 s)"
    )


def test_describe_lists_only_the_parts_that_take_time() -> None:
    c = MigrationCost(downtime_s=3000.0, usd=1234.5, cross_family=False,
                      parts={"checkpoint": 0.0, "restart": 0.6, "recompile": 2999.4})  # fmt: skip
    assert c.describe() == "$1,234.50 (50 min idle: restart 1 s, recompile 2999 s)"


def test_hysteresis_savings_must_beat_the_cost_with_margin_and_floor() -> None:
    cost = MigrationCost(downtime_s=0.0, usd=4.0, cross_family=False, parts={})
    # 4 × (1 + 0.25) + 1 = 6: a saving of exactly 6 is not enough, a cent more is
    assert not worth_moving(10.0, 4.0, cost, CFG)
    assert worth_moving(10.0, 3.99, cost, CFG)
    assert not worth_moving(10.0, 5.0, cost, CFG)
    assert not worth_moving(10.0, 10.5, cost, CFG)  # moving to a dearer option never pays
    assert worth_moving(100.0, 50.0, cost, replace(CFG, migration_margin=11.0))  # 4 × 12 + 1 = 49
    assert not worth_moving(100.0, 50.0, cost, replace(CFG, migration_margin=11.5))  # 4 × 12.5 + 1 = 51


def test_dwell_counts_from_the_current_placement() -> None:
    rj = RunningJob("r", "t", SPEC, submit_s=0.0, pool="p", devices=1, market="on_demand", placed_s=1000.0)
    assert dwell_ok(rj, 2800.0, CFG)  # exactly the 1800 s minimum
    assert not dwell_ok(rj, 2799.0, CFG)


DEADLINE_SPEC = spec("d", objective={"deadline": "10h"})


def _running(
    progress: float, *, submit_s: float = 1000.0, market: str = "spot", s=DEADLINE_SPEC
) -> RunningJob:
    return RunningJob("d", "t", s, submit_s=submit_s, pool="p", devices=1, market=market, placed_s=0.0,
                      progress_fraction=progress)  # fmt: skip


def test_jobs_without_a_deadline_or_off_spot_are_never_behind() -> None:
    none = ProgressCheck(False, 0.0, None, "")
    assert uniform_progress(_running(0.0, s=SPEC), 30000.0, 100.0, CFG) == none
    # on demand with a deadline, far behind the line: it has nowhere cheaper-but-safe to go
    assert uniform_progress(_running(0.0, market="on_demand"), 30000.0, 40000.0, CFG) == none


def test_uniform_progress_line_is_the_share_of_the_window_spent() -> None:
    # submitted at 1000 s with a 10 h deadline: the window is 1000..37000 s
    at_6h = 1000.0 + 6 * 3600
    check = uniform_progress(_running(0.6), at_6h, None, CFG)
    assert check == ProgressCheck(False, pytest.approx(0.6), None, "")
    # 1 h left, 30 min of on-demand work: slack 30 min, not under the 30 min safety margin
    ok = uniform_progress(_running(0.95), 37000.0 - 3600.0, 1800.0, CFG)
    assert ok == ProgressCheck(False, pytest.approx(0.9), 1800.0, "")
    # past the deadline the line stays at the whole job
    late = uniform_progress(_running(0.9), 40000.0, None, CFG)
    assert late.required_fraction == 1.0 and late.behind
    # before submission (a clock a little behind) the line is at zero
    assert uniform_progress(_running(0.0), 500.0, None, CFG).required_fraction == 0.0


def test_behind_the_line_beyond_the_tolerance_is_behind() -> None:
    at_6h = 1000.0 + 6 * 3600
    check = uniform_progress(_running(0.5), at_6h, 3600.0, CFG)
    assert check == ProgressCheck(
        True,
        pytest.approx(0.6),
        pytest.approx(37000.0 - at_6h - 3600.0),
        "behind uniform progress: 50% done, 60% of the deadline window spent",
    )
    # within the 2-point tolerance: not behind
    assert not uniform_progress(_running(0.59), at_6h, None, CFG).behind
    # exactly on the tolerance line (0.25 + 0.25 = the 0.5 spent): not behind
    half = 1000.0 + 5 * 3600
    assert not uniform_progress(
        _running(0.25), half, None, replace(CFG, uniform_progress_tolerance=0.25)
    ).behind


def test_slack_under_the_safety_margin_on_demand_is_behind() -> None:
    at_5h = 1000.0 + 5 * 3600
    # 5 h left, on demand needs 4.8 h: 12 min slack < the 30 min safety, although the job is on its line
    check = uniform_progress(_running(0.5), at_5h, 4.8 * 3600, CFG)
    assert check == ProgressCheck(
        True,
        pytest.approx(0.5),
        pytest.approx(720.0),
        "deadline slack on on-demand is 12 min (< 30 min safety)",
    )
    # with a 2 h margin: 119 min of slack is short of it
    two_h = replace(CFG, deadline_safety_s=7200.0)
    check = uniform_progress(_running(0.5), at_5h, 5 * 3600 - 7140.0, two_h)
    assert check.reason == "deadline slack on on-demand is 119 min (< 120 min safety)"
    # slack of exactly the margin is enough
    assert not uniform_progress(_running(0.5), at_5h, 5 * 3600 - 1800.0, CFG).behind


def test_a_deadline_at_submission_has_a_one_second_window() -> None:
    # an absolute deadline half a second after submission (1,000,000 s on the Unix clock)
    s = spec("d", objective={"deadline": "1970-01-12T13:46:40.500000+00:00"})
    rj = _running(0.0, submit_s=1_000_000.0, s=s)
    assert rj.deadline_abs_s == 1_000_000.5
    check = uniform_progress(rj, 1_000_000.25, None, CFG)
    assert check.required_fraction == 0.25 and check.behind  # 0.25 s of a 1 s window
