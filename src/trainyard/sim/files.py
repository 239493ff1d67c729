"""File access for the simulator (the only module of ``trainyard.sim`` that touches files).

Reading: TRACE files, packaged or user spot traces. Writing: the report directory — per-policy table
(CSV + Markdown), per-job outcomes, the time series, per-pool utilisation, and PNG plots (matplotlib,
Agg backend) of cost over time, queue length, per-pool utilisation and preemptions.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from trainyard.sim.engine import SimResult
from trainyard.sim.spot import SpotTrace, SpotTraceError, parse_spot_trace
from trainyard.sim.trace import TraceError, TraceJob, parse_trace

PACKAGED_SPOT_TRACES = ("aws-preemption-4node-us-east-2a", "aws-preemption-4node-us-west-2c")


def read_trace(path: str | Path) -> list[TraceJob]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise TraceError(
            f"{p}: cannot read ({exc.__class__.__name__})",
            hint="Give the path of a TRACE file: JSON Lines of {submit_s, tenant, spec}.",
        ) from None
    return parse_trace(text, str(p))


def load_spot_trace(ref: str) -> SpotTrace:
    """A packaged trace by name (see ``PACKAGED_SPOT_TRACES``) or a JSON file in the same format."""
    if ref in PACKAGED_SPOT_TRACES:
        text = resources.files("trainyard.sim").joinpath(f"data/{ref}.json").read_text(encoding="utf-8")
        return parse_spot_trace(text, ref)
    p = Path(ref)
    try:
        text = p.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise SpotTraceError(
            f"{ref}: cannot read ({exc.__class__.__name__})",
            hint=f"Give a spot trace JSON file or one of: {', '.join(PACKAGED_SPOT_TRACES)}.",
        ) from None
    return parse_spot_trace(text, str(p))


def write_trace(jobs: Sequence[TraceJob], path: str | Path) -> None:
    from trainyard.sim.trace import dump_trace

    Path(path).write_text(dump_trace(jobs), encoding="utf-8")


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def write_report(results: Sequence[SimResult], out_dir: str | Path) -> list[Path]:
    """Write the report for one or more runs of the same trace; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainyard.sim.metrics import SUMMARY_KEYS

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    summaries = [r.summary() for r in results]

    p = out / "summary.csv"
    _write_csv(p, SUMMARY_KEYS, [[s[k] for k in SUMMARY_KEYS] for s in summaries])
    written.append(p)
    p = out / "summary.json"
    p.write_text(json.dumps(summaries, indent=2) + "\n", encoding="utf-8")
    written.append(p)

    p = out / "summary.md"
    lines = [
        "| policy | completed | cost $ | usage $ | committed $ | × lower bound | mean JCT h | p99 JCT h "
        "| deadline misses | preemptions | lost work device-h | solver p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lb = s["lower_bound_cost_usd"]
        ratio = s["total_cost_usd"] / lb if lb > 0 else float("nan")
        cells = [
            s["policy"],
            f"{s['jobs_completed']}/{s['jobs_total']}",
            f"{s['total_cost_usd']:,.2f}",
            f"{s['total_cost_usd'] - s['committed_cost_usd']:,.2f}",
            f"{s['committed_cost_usd']:,.2f}",
            f"{ratio:.3f}",
            f"{s['mean_jct_s'] / 3600:.2f}",
            f"{s['p99_jct_s'] / 3600:.2f}",
            str(s["deadline_misses"]),
            str(s["preemptions"]),
            f"{s['lost_work_device_s'] / 3600:.2f}",
            f"{s['solver_time_p99_s'] * 1000:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    written.append(p)

    p = out / "jobs.csv"
    rows: list[list[object]] = []
    for r in results:
        for j in r.jobs:
            rows.append(
                [
                    r.policy, j.job_id, j.tenant, j.submit_s, j.completion_s, j.jct_s, round(j.cost_usd, 6),
                    round(j.lower_bound_cost_usd, 6), j.preemptions, j.migrations, j.attempts,
                    round(j.lost_work_device_s, 3), j.deadline_abs_s, j.missed_deadline, " ".join(j.pools),
                ]
            )  # fmt: skip
    _write_csv(
        p,
        ["policy", "job_id", "tenant", "submit_s", "completion_s", "jct_s", "cost_usd",
         "lower_bound_cost_usd", "preemptions", "migrations", "attempts", "lost_work_device_s",
         "deadline_abs_s", "missed_deadline", "pools"],
        rows,
    )  # fmt: skip
    written.append(p)

    p = out / "timeline.csv"
    rows = []
    for r in results:
        for smp in r.samples:
            rows.append([r.policy, round(smp.time_s, 3), round(smp.cost_usd, 6), smp.queued, smp.running,
                         smp.preemptions, sum(smp.used_devices.values())])  # fmt: skip
    _write_csv(p, ["policy", "time_s", "cost_usd", "queued", "running", "preemptions", "used_devices"], rows)
    written.append(p)

    p = out / "pools.csv"
    rows = []
    for r in results:
        for ps in r.pools:
            rows.append([r.policy, ps.name, ps.accelerator, ps.market, round(ps.held_device_s, 3),
                         round(ps.capacity_device_s, 3), round(ps.utilisation, 6),
                         ps.preemptions])  # fmt: skip
    _write_csv(
        p,
        ["policy", "pool", "accelerator", "market", "held_device_s", "capacity_device_s", "utilisation",
         "preemptions"],
        rows,
    )  # fmt: skip
    written.append(p)

    def series(fig_name: str, ylabel: str, pick: str) -> None:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for r in results:
            xs = [s.time_s / 3600.0 for s in r.samples]
            ys = [float(getattr(s, pick)) for s in r.samples]
            ax.step(xs, ys, where="post", label=r.policy)
        ax.set_xlabel("simulated time (h)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / fig_name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    series("cost_over_time.png", "cumulative cost (USD)", "cost_usd")
    series("queue_length.png", "queued jobs", "queued")
    series("preemptions.png", "cumulative preemptions", "preemptions")

    fig, ax = plt.subplots(figsize=(9, 4.5))
    pool_names = [ps.name for ps in results[0].pools] if results else []
    width = 0.8 / max(1, len(results))
    for i, r in enumerate(results):
        util = {ps.name: ps.utilisation * 100.0 for ps in r.pools}
        xs = [k + i * width for k in range(len(pool_names))]
        ax.bar(xs, [util.get(n, 0.0) for n in pool_names], width=width, label=r.policy)
    ax.set_xticks([k + width * (len(results) - 1) / 2 for k in range(len(pool_names))])
    ax.set_xticklabels(pool_names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("utilisation (% of device-hours available)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = out / "pool_utilisation.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written
