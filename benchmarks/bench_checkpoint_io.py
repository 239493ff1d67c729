"""Checkpoint I/O against the disk: save and load throughput of the checkpoint manager vs raw writes/reads.

- save: a synchronous ``CheckpointManager.save`` (DCP shards written with fsync while each file is
  hashed in the same pass, ``.metadata``, the manifest committed by atomic rename) of a model + AdamW
  state, against writing and fsyncing the same number of bytes with plain ``write`` calls into the same
  directory (the disk's write bandwidth as this process sees it);
- load: ``CheckpointManager.latest_valid`` (every file's size and sha256 verified) plus
  ``CheckpointManager.load`` into preallocated tensors, against plainly reading the same files (same
  page-cache state: both run right after the save).

    python benchmarks/bench_checkpoint_io.py [--mb 400] [--repeats 3]

Prints a table and writes benchmarks/results/bench_checkpoint_io.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_checkpoint_io.json"

warnings.filterwarnings("ignore", message="torch.distributed is disabled")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runtime import disk_write_bandwidth  # noqa: E402  (the same fsync'd write ceiling)


def plain_read_bandwidth(files: list[Path]) -> float:
    t0 = time.perf_counter()
    n = 0
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(4 * 2**20):
                n += len(chunk)
    return n / (time.perf_counter() - t0)


def state_of(mb: int) -> dict[str, Any]:
    """Model-like tensors plus AdamW-like moments: ``mb`` megabytes of fp32 in all."""
    import torch

    n = mb * 2**20 // 4 // 3  # parameters; the optimizer state holds two moments of the same size
    rows = 1024
    cols = max(1, n // rows // 8)
    gen = torch.Generator().manual_seed(0)
    model = {f"layer{i}.weight": torch.randn(rows, cols, generator=gen) for i in range(8)}
    optim = {
        "state": {
            k: {"exp_avg": torch.randn_like(v), "exp_avg_sq": torch.rand_like(v)} for k, v in model.items()
        },
        "param_groups": [{"lr": 1e-3, "params": list(model)}],
    }
    return {"model": model, "optim": optim}


def run(mb: int, repeats: int) -> dict[str, Any]:
    import torch

    from trainyard.runtime.checkpoint import CheckpointManager

    state = state_of(mb)
    saves, loads, writes, reads = [], [], [], []
    nbytes = 0
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-io-", dir=os.environ.get("TMPDIR")) as tmp:
        mgr = CheckpointManager(f"file://{tmp}", "io", keep_last=1)
        for step in range(1, repeats + 1):
            res = mgr.save(step, state, {}, blocking=True).result()
            saves.append(res.total_s)
            nbytes = res.bytes_written
            writes.append(disk_write_bandwidth(Path(tmp), nbytes))
            files = [p for p in (Path(tmp) / "io" / f"step-{step}").iterdir() if p.name != "manifest.json"]
            reads.append(plain_read_bandwidth(files))
            target = {
                "model": {k: torch.empty_like(v) for k, v in state["model"].items()},
                "optim": {
                    "state": {
                        k: {m: torch.empty_like(t) for m, t in v.items()}
                        for k, v in state["optim"]["state"].items()
                    },
                    "param_groups": [dict(g) for g in state["optim"]["param_groups"]],
                },
            }
            t0 = time.perf_counter()
            ref = mgr.latest_valid(report=False)
            assert ref is not None and ref.step == step
            mgr.load(ref, target)
            loads.append(time.perf_counter() - t0)
            assert torch.equal(target["model"]["layer0.weight"], state["model"]["layer0.weight"])
        mgr.close()
    save_bw = nbytes / statistics.median(saves)
    load_bw = nbytes / statistics.median(loads)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "checkpoint_bytes": nbytes,
        "repeats": repeats,
        "save_s": statistics.median(saves),
        "save_mb_per_s": save_bw / 1e6,
        "disk_write_mb_per_s": statistics.median(writes) / 1e6,
        "save_vs_disk_pct": 100 * save_bw / statistics.median(writes),
        "load_verify_s": statistics.median(loads),
        "load_mb_per_s": load_bw / 1e6,
        "plain_read_mb_per_s": statistics.median(reads) / 1e6,
        "load_vs_read_pct": 100 * load_bw / statistics.median(reads),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=400, help="checkpoint size in MB")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    doc = run(args.mb, args.repeats)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    mb, n, load = doc["checkpoint_bytes"] / 1e6, doc["repeats"], doc["load_1m"]
    print(f"checkpoint {mb:.0f} MB, {n} repeats, load avg {load:.1f}")
    save, save_pct = doc["save_mb_per_s"], doc["save_vs_disk_pct"]
    print(f"save (write+fsync+hash+commit)  {save:8.0f} MB/s  {save_pct:5.1f} % of disk write")
    print(f"disk write + fsync              {doc['disk_write_mb_per_s']:8.0f} MB/s")
    load_bw, load_pct = doc["load_mb_per_s"], doc["load_vs_read_pct"]
    print(f"load (verify sha256 + DCP load) {load_bw:8.0f} MB/s  {load_pct:5.1f} % of plain read")
    print(f"plain read                      {doc['plain_read_mb_per_s']:8.0f} MB/s")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
