"""The evaluation job's program: ``python -m trainyard.evaluation.runner REQUEST.json``.

It runs as the entrypoint of an evaluation job (placed, started and billed like any job), scores the
model and the baseline on the split named in the request (and on each guardrail dataset's split)
with :mod:`trainyard.evaluation.evaluator` and writes ``results.json`` (per-example scores and outputs
of both, per dataset) beside the request. The control plane computes the paired statistics when the
job succeeds.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m trainyard.evaluation.runner REQUEST.json\n")
        return 2
    import trainyard.runtime as ty
    from trainyard.evaluation.evaluator import DEFAULT_BATCH_SIZE, evaluate_pair, read_rows

    session = ty.init()
    # a sandboxed worker reads the staged copy of the request (TRAINYARD_EVAL_REQUEST, set by staging)
    req_path = Path(os.environ.get("TRAINYARD_EVAL_REQUEST") or args[0])
    req = json.loads(req_path.read_text())
    rows = read_rows(req["split_path"], limit=req.get("max_examples"))
    extra = [
        (g, read_rows(g["split_path"], limit=req.get("max_examples")))
        for g in req.get("guardrail_datasets") or []
    ]
    total = 2 * (len(rows) + sum(len(r) for _, r in extra))
    offset = 0  # rows scored before the current pass (the heartbeat's step)

    def progress(i: int) -> None:  # after each batch: a large model's batch can take minutes on a CPU
        session.events.emit("heartbeat", rank=session.rank, step=offset + i, total_steps=total)

    res = evaluate_pair(
        req["model_dir"],
        req["baseline_dir"],
        rows,
        fmt=req.get("format"),
        max_new_tokens=int(req.get("max_new_tokens", 32)),
        batch_size=int(req.get("batch_size", DEFAULT_BATCH_SIZE)),
        progress=progress,
    )
    # guardrail datasets: both models on each one's rows, per-example scores kept per dataset
    guarded = []
    offset = 2 * len(rows)
    for g, g_rows in extra:
        scored = evaluate_pair(
            req["model_dir"],
            req["baseline_dir"],
            g_rows,
            fmt=g.get("format"),
            max_new_tokens=int(req.get("max_new_tokens", 32)),
            batch_size=int(req.get("batch_size", DEFAULT_BATCH_SIZE)),
            progress=progress,
        )
        guarded.append({"dataset": g["dataset"], "split": g["split"], **scored})
        offset += 2 * len(g_rows)
    if guarded:
        res["guardrail_datasets"] = guarded
    out = Path(req["results_path"]) if req.get("results_path") else req_path.parent / "results.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res))
    tmp.replace(out)
    session.finish(final_step=total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
