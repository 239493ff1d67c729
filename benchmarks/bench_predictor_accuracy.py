"""Predictor accuracy on published measurements: leave-one-model-out error, and the packaged fit.

    .venv/bin/python benchmarks/bench_predictor_accuracy.py                 # report only
    .venv/bin/python benchmarks/bench_predictor_accuracy.py --write-params  # also refit the package data
    .venv/bin/python benchmarks/bench_predictor_accuracy.py --prior-scale 1  # one fixed prior width

For every model (architecture) in ``predict/data/throughput_calibration.csv`` the efficiency parameters are
refitted on the rows of all *other* models and that model's rows are predicted (each refit chooses its
per-accelerator prior width by cross-validation over its own training models); MdAPE is reported overall,
per kind (dense / MoE), per family and per (family, stack, precision). ``--write-params`` fits on all
rows and writes ``src/trainyard/predict/data/calibration.json`` with p10/p90 bands from the held-out
residuals.
Results go to ``benchmarks/results/predictor_accuracy.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from rich.progress import Progress

from trainyard.predict.calib_data import packaged_rows
from trainyard.predict.fit import (
    choose_accelerator_prior_scale,
    fit_calibration,
    leave_one_model_out,
    prepare_row,
    summarize,
    with_residual_bands,
)

ROOT = Path(__file__).resolve().parents[1]
PARAMS_PATH = ROOT / "src/trainyard/predict/data/calibration.json"
RESULTS = ROOT / "benchmarks/results/predictor_accuracy.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--write-params", action="store_true", help="refit on all rows and write the package data"
    )
    ap.add_argument(
        "--prior-scale",
        type=float,
        default=None,
        help="fix the per-accelerator prior width (default: chosen in each refit by cross-validation "
        "over its own training models)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the results go (JSON)")
    args = ap.parse_args()
    rows, skipped = packaged_rows()
    models = sorted({r.model_key for r in rows})
    t0 = time.perf_counter()
    with Progress(transient=True) as bar:
        task = bar.add_task("leave-one-model-out", total=len(models))
        held = leave_one_model_out(
            rows, accelerator_prior_scale=args.prior_scale, progress=lambda _m: bar.advance(task)
        )
    lomo_s = time.perf_counter() - t0
    summary = summarize(held)
    chosen = {h.row.model_key: h.accelerator_prior_scale for h in held}
    print(
        f"leave-one-model-out over {len(rows)} rows ({len(models)} models), "
        f"{len(skipped)} rows skipped, {lomo_s:.1f} s"
    )
    print(
        "per-accelerator prior width of each refit: "
        + ", ".join(f"{s:g}x in {n}" for s, n in sorted(Counter(chosen.values()).items()))
        + (" (fixed)" if args.prior_scale is not None else " (chosen inside each refit)")
    )
    print(
        f"{'row':>4} {'model':18} {'accelerator':10} {'dev':>5} {'seq':>6} {'measured_s':>11} "
        f"{'predicted_s':>11} {'err':>7}  params"
    )
    for h in sorted(held, key=lambda h: h.row.index):
        r = h.row
        print(
            f"{r.index:>4} {r.model_name:18} {r.accelerator:10} {r.devices:>5} {r.spec.workload.seq_len:>6} "
            f"{r.measured_step_time_s:>11.3f} {h.predicted_s:>11.3f} "
            f"{h.predicted_s / r.measured_step_time_s - 1:>+7.1%}  {h.key}"
        )
    print(
        f"\nMdAPE overall {summary['mdape']:.1%} "
        f"(mean {summary['mean_ape']:.1%}, p90 {summary['p90_ape']:.1%})"
    )
    for kind, v in summary["by_kind"].items():
        print(f"  {kind:14} rows {v['rows']:>3}  MdAPE {v['mdape']:.1%}")
    for fam, v in summary["by_family"].items():
        print(f"  {fam:14} rows {v['rows']:>3}  MdAPE {v['mdape']:.1%}")
    for grp, v in summary["by_group"].items():
        print(f"  {grp:28} rows {v['rows']:>3}  MdAPE {v['mdape']:.1%}")
    doc = {
        "benchmark": "predictor leave-one-model-out",
        "rows": len(rows),
        "models": len({r.model_key for r in rows}),
        "skipped": [{"row": s.index, "model": s.model_name, "reason": s.reason} for s in skipped],
        "summary": summary,
        "lomo_seconds": lomo_s,
        "accelerator_prior_scale": "fixed" if args.prior_scale is not None else "nested cross-validation",
        "accelerator_prior_scale_by_model": chosen,
        "per_row": [
            {
                "row": h.row.index,
                "model": h.row.model_name,
                "accelerator": h.row.accelerator,
                "devices": h.row.devices,
                "group": h.row.group,
                "measured_step_time_s": h.row.measured_step_time_s,
                "predicted_step_time_s": h.predicted_s,
                "ape": h.ape,
                "params": h.key,
                "source": h.source,
                "assumptions": list(h.row.assumptions),
            }
            for h in held
        ],
    }
    if args.write_params:
        prep = {r.index: prepare_row(r) for r in rows}
        scale = args.prior_scale
        if scale is None:
            scale, by_scale = choose_accelerator_prior_scale(rows, prepared=prep)
            print(
                "packaged fit's per-accelerator prior width: "
                + ", ".join(f"{s:g}x {e:.1%}" for s, e in by_scale.items())
                + f" -> {scale:g}x"
            )
            doc["packaged_prior_scale_errors"] = {str(s): e for s, e in by_scale.items()}
        doc["packaged_prior_scale"] = scale
        cal = fit_calibration(rows, prepared=prep, version="published-v1", accelerator_prior_scale=scale)
        cal = with_residual_bands(cal, held)
        PARAMS_PATH.write_text(
            json.dumps(cal.to_document(), indent=1, sort_keys=True) + "\n", encoding="utf-8"
        )
        print(f"wrote {PARAMS_PATH.relative_to(ROOT)} ({len(cal.params)} parameter sets)")
        doc["params_written"] = str(PARAMS_PATH.relative_to(ROOT))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
