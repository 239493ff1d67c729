"""What `make run` shows: the worked example of DESIGN §4, quoted and explained.

One fine-tuning job whose step time is known on three accelerator families, four pools
(examples/seed-example.yaml, examples/seed-pools.yaml). The quote ranks them by expected cost and the
explanation below the table re-derives every $/step from its parts.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from trainyard.catalog.pools import load_pools
from trainyard.cli.quote_cmd import print_quote
from trainyard.cost import model as cm
from trainyard.cost.money import format_duration_s, format_usd
from trainyard.cost.quote import QuoteOption, quote
from trainyard.errors import TrainyardError
from trainyard.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def explain(o: QuoteOption) -> str:
    base = o.price_usd_per_hour * o.step_time_s / cm.SECONDS_PER_HOUR
    ckpt_pct = o.checkpoint_s / o.checkpoint_interval_s * 100
    head = (
        f"[bold]{o.pool}[/] ({o.accelerator}, {o.market.replace('_', '-')}): "
        f"{format_usd(o.price_usd_per_hour)}/h x {o.step_time_s:g} s/step = {base:.6f} $/step; "
        f"+{ckpt_pct:.2f} % for a {o.checkpoint_s:.1f} s checkpoint "
        f"every {format_duration_s(o.checkpoint_interval_s)}"
    )
    if o.interruption_rate_per_hour > 0:
        rate_s = o.interruption_rate_per_hour / cm.SECONDS_PER_HOUR
        yd = cm.young_daly_interval_s(o.checkpoint_s, rate_s)
        pre_pct = cm.preemption_fraction(o.checkpoint_interval_s, rate_s, o.restart_s) * 100
        head += (
            f"; +{pre_pct:.2f} % for preemptions ({o.interruption_rate_per_hour:g}/h, each losing half an "
            f"interval and {o.restart_s:.0f} s to restart). Interval: Young/Daly "
            f"sqrt(2 x {o.checkpoint_s:.1f} s / {o.interruption_rate_per_hour:g}/h) = {yd:.0f} s "
            f"-> {format_duration_s(o.checkpoint_interval_s)}"
        )
    if o.compile_s:
        head += f"; the first compile ({o.compile_s / 60:.0f} min) is in the expected hours, not in $/step"
    return head + f" -> [bold]{format_usd(o.usd_per_step)}/step[/]."


def main(argv: list[str] | None = None) -> int:
    out = Console(width=140) if not Console().is_terminal else Console()
    try:
        spec = load_spec(EXAMPLES / "seed-example.yaml")
        pools = load_pools(EXAMPLES / "seed-pools.yaml")
    except TrainyardError as exc:
        out.print(f"[red]error:[/] {exc.message}")
        return 2
    out.rule("[bold]trainyard[/]: where should this job run, and what will it really cost?")
    params_b = spec.params / 1e9
    out.print(
        f"Job [bold]{spec.name}[/]: {params_b:.2f} B-parameter decoder, full fine-tune in "
        f"{spec.workload.precision.value}, {spec.total_steps:,} steps of {spec.tokens_per_step:,} tokens. "
        f"Checkpoint: {cm.checkpoint_bytes(spec) / 1e9:.1f} GB (bf16 weights + fp32 master + AdamW state), "
        f"written at {cm.storage_write_gb_per_s(spec.checkpoint.storage):g} GB/s."
    )
    options = quote(spec, pools)
    print_quote(
        spec,
        options,
        limit=None,
        out=out,
        title="Quote: examples/seed-example.yaml on examples/seed-pools.yaml",
    )
    out.print("\n[bold]Where the numbers come from[/]")
    for o in options:
        out.print(" - " + explain(o), highlight=False)
    best = options[0]
    out.print(
        f"\nCheapest: [bold]{best.pool}[/] at {format_usd(best.expected_cost_usd)} expected "
        f"({best.expected_hours:.1f} h, p90 {best.expected_hours_p90:.1f} h), "
        f"{format_usd(best.preemption_overhead_usd)} of it lost to preemptions."
    )
    full = [p.name for p in pools if p.free_devices == 0]
    if full:
        out.print(
            f"Pools with no free devices right now ({', '.join(full)}) are still quoted: a quote prices "
            "capacity; the scheduler places jobs on what is free."
        )
    out.print(
        "Next: `trainyard quote examples/seed-example.yaml` prices the same job on the whole packaged "
        "catalog (AWS, GCP, Azure; on-demand, spot, reserved); `trainyard catalog offers` lists the offers; "
        "add `--json` for machine-readable output."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
