"""TRACE parsing, the trace generator, spot trace replay."""

from __future__ import annotations

import json

import pytest

from trainyard.catalog.pools import Pool
from trainyard.sim import SimConfig, TraceError, TraceMix, dump_trace, generate_trace, parse_trace, simulate
from trainyard.sim.files import PACKAGED_SPOT_TRACES, load_spot_trace, read_trace
from trainyard.sim.spot import SpotTraceError, parse_spot_trace

SPEC = {
    "name": "j",
    "model": {"architecture": "custom", "params_b": 0.5},
    "workload": {"seq_len": 1024, "global_batch": 8, "steps": 2000},
    "resources": {"min_devices": 1, "max_devices": 1},
    "measured": {"step_time_s": {"a100-80gb": 1.0}},
}


def line(**kw: object) -> str:
    doc: dict[str, object] = {"submit_s": 0.0, "tenant": "t", "spec": SPEC}
    doc.update(kw)
    return json.dumps(doc)


def test_parse_sorts_by_submit_time_and_names_jobs() -> None:
    jobs = parse_trace("\n".join([line(submit_s=20.0), "", line(submit_s=5.0, job_id="b", priority=2)]))
    assert [j.job_id for j in jobs] == ["b", "j-00000"]
    assert jobs[0].priority == 2 and jobs[0].submit_s == 5.0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "line 1: malformed JSON"),
        (line(submit_s=-1), "submit_s"),
        (line(tenant=""), "tenant"),
        (line(extra=1), "unknown key 'extra'"),
        (json.dumps({"submit_s": 0, "tenant": "t", "spec": {"name": "x"}}), "line 1: spec."),
        (line(job_id="a") + "\n" + line(job_id="a"), "appears twice"),
        ("\n\n", "no jobs"),
    ],
)
def test_bad_traces_name_the_line(text: str, needle: str) -> None:
    with pytest.raises(TraceError) as exc:
        parse_trace(text, "t.jsonl")
    assert needle in exc.value.message
    assert exc.value.exit_code == 2


def test_generator_is_reproducible_and_follows_the_mix() -> None:
    mix = TraceMix(n_jobs=60, span_s=86400.0, deadline_fraction=0.5, gang_sizes={1: 1.0}, lora_fraction=1.0)
    a, b = generate_trace(mix, seed=4), generate_trace(mix, seed=4)
    assert dump_trace(a) == dump_trace(b)
    assert dump_trace(generate_trace(mix, seed=5)) != dump_trace(a)
    assert all(j.spec.workload.method.value == "lora" for j in a)
    with_deadline = sum(1 for j in a if j.spec.objective.deadline is not None)
    assert 15 <= with_deadline <= 45
    times = [j.submit_s for j in a]
    assert times == sorted(times) and times[-1] < 3 * 86400.0
    # round trip through the file format
    assert [j.job_id for j in parse_trace(dump_trace(a))] == [j.job_id for j in a]


def test_example_traces_parse(examples_dir: object) -> None:
    from pathlib import Path

    for name in ("trace-small.jsonl", "trace-week.jsonl"):
        jobs = read_trace(Path(str(examples_dir)) / name)
        assert len(jobs) >= 40


def test_packaged_spot_traces_load() -> None:
    for name in PACKAGED_SPOT_TRACES:
        t = load_spot_trace(name)
        assert t.gap_s == 300.0 and t.max_value == 4
        changes = []
        for ch in t.changes():
            changes.append(ch)
            if len(changes) > 50:
                break
        assert changes and all(0.0 <= f <= 1.0 for _, f in changes)
        assert [c[0] for c in changes] == sorted(c[0] for c in changes)


def test_spot_trace_validation() -> None:
    with pytest.raises(SpotTraceError):
        parse_spot_trace('{"metadata": {"gap_seconds": 0}, "data": [1]}')
    with pytest.raises(SpotTraceError):
        parse_spot_trace('{"metadata": {"gap_seconds": 60}, "data": [0, 0]}')
    with pytest.raises(SpotTraceError):
        parse_spot_trace('{"metadata": {"gap_seconds": 60}, "data": [1, -1]}')


def test_replayed_trace_reclaims_and_returns_capacity() -> None:
    # 4 nodes alive, then 1, then 4 again: a job on the pool's last-started nodes is reclaimed
    trace = parse_spot_trace(
        json.dumps({"metadata": {"gap_seconds": 600}, "data": [4] * 6 + [1] * 3 + [4] * 100})
    )
    spot = Pool(
        name="s",
        accelerator="a100-80gb",
        devices_per_node=1,
        nodes=4,
        market="spot",  # type: ignore[arg-type]
        price_usd_per_device_hour=1.0,
        region="r",
        notice_s=0.0,
    )
    spec = dict(SPEC, workload={"seq_len": 1024, "global_batch": 8, "steps": 20000})
    jobs = parse_trace("\n".join(line(job_id=f"j{i}", spec=dict(spec, name=f"j{i}")) for i in range(4)))
    r = simulate(jobs, [spot], "cheapest-hourly", SimConfig(seed=0), spot_traces={"s": trace})
    assert sum(j.preemptions for j in r.jobs) == 3  # 4 -> 1 node at 3600 s
    assert all(j.completion_s is not None for j in r.jobs)
    assert r.billed_device_s == pytest.approx(r.held_device_s)
