"""What staging a replica's files costs (serving/staging.py): time and disk for a model of a few hundred
MB, and three ways of copying a file side by side.

A model directory is generated locally (``config.json``, a tokenizer file, one ``model.safetensors`` of
``--model-mib`` MiB of random bytes, written with safetensors) with a LoRA adapter of ``--adapter-mib``
MiB beside it. Each round stages the model and the adapter into a fresh replica directory with
:func:`stage_replica` (as a sandboxed replica's start does), then stages the adapter again over its copy
(:func:`stage_adapter`, an adapter loaded at run time), then removes the directory (a replica's stop).
Rounds rotate over the file copy used inside the staging (ABC, BCA, CAB, ...), so that load changes
hit every method alike:

- ``copyfile``: ``shutil.copyfile``, what staging uses (on Linux ``os.sendfile`` in the kernel);
- ``copy_file_range``: ``os.copy_file_range`` in a loop (in-kernel too; a reflink on file systems that
  have them, e.g. XFS and Btrfs, which this machine's ext4 has not);
- ``read_write``: ``shutil.copyfileobj`` with 1 MiB buffers (through user space).

Every method copies regular files only and follows no link (the staging walk decides what is copied).
Reported per method: the median wall time of a stage, and of a stage followed by ``os.sync()`` (the
copy is in the page cache when the stage returns; the sync includes writing it out), the disk a staged
replica takes (the file system's free blocks before and after the synced stage, and the staged files'
allocated blocks), the re-stage of the adapter and the removal. The source files are in the page cache
(just written and read once); the first read of a model from a cold cache costs more.

    .venv/bin/python benchmarks/bench_staging.py [--model-mib 400] [--adapter-mib 16] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from safetensors.numpy import save_file

from trainyard.executors.sandbox import Sandbox
from trainyard.serving.replicas import REPLICA_ROOT, LaunchSpec
from trainyard.serving.staging import stage_adapter, stage_replica

RESULTS = Path(__file__).resolve().parent / "results" / "bench_staging.json"
MIB = 1024 * 1024
REAL_COPYFILE = shutil.copyfile


def copy_file_range(src: Any, dst: Any, *, follow_symlinks: bool = True) -> Any:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        left = os.fstat(fin.fileno()).st_size
        while left > 0:
            n = os.copy_file_range(fin.fileno(), fout.fileno(), min(left, 1 << 30))
            if n == 0:
                break
            left -= n
    return dst


def read_write(src: Any, dst: Any, *, follow_symlinks: bool = True) -> Any:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, MIB)
    return dst


METHODS: dict[str, Callable[..., Any]] = {
    "copyfile": REAL_COPYFILE,
    "copy_file_range": copy_file_range,
    "read_write": read_write,
}


def make_model(root: Path, model_mib: int, adapter_mib: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    model = root / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 2048}))
    (model / "tokenizer.json").write_bytes(rng.bytes(2 * MIB))
    weights = np.frombuffer(rng.bytes(model_mib * MIB), dtype=np.uint8)
    save_file({"weight": weights}, model / "model.safetensors")
    adapter = root / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 16, "peft_type": "LORA"}))
    lora = np.frombuffer(rng.bytes(adapter_mib * MIB), dtype=np.uint8)
    save_file({"lora": lora}, adapter / "adapter_model.safetensors")
    for p in (*model.iterdir(), *adapter.iterdir()):  # in the page cache for every method alike
        p.read_bytes()
    return model, adapter


def tree_bytes(root: Path) -> tuple[int, int]:
    """(file sizes, allocated blocks × 512) of the regular files under ``root``."""
    size = blocks = 0
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            size += st.st_size
            blocks += st.st_blocks * 512
    return size, blocks


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def one_round(method: str, sandbox: Sandbox, model: Path, adapter: Path, work: Path) -> dict[str, float]:
    spec = LaunchSpec("rep-1", str(model), str(model), {"tiny-a": str(adapter)}, "tiny@1")
    out: dict[str, float] = {}
    with mock.patch.object(shutil, "copyfile", METHODS[method]):
        os.sync()
        staged = work / f"staged-{method}"
        free_before = free_bytes(work)
        t = time.perf_counter()
        stage_replica(sandbox, spec, staged, inside=REPLICA_ROOT)
        out["stage_s"] = time.perf_counter() - t
        os.sync()
        out["stage_sync_s"] = time.perf_counter() - t
        out["disk_bytes"] = free_before - free_bytes(work)
        out["file_bytes"], out["allocated_bytes"] = tree_bytes(staged)
        t = time.perf_counter()
        stage_adapter(sandbox, staged, "tiny-a", str(adapter))
        out["restage_adapter_s"] = time.perf_counter() - t
        t = time.perf_counter()
        shutil.rmtree(staged)
        out["remove_s"] = time.perf_counter() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-mib", type=int, default=400)
    ap.add_argument("--adapter-mib", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6, help="rounds per method")
    ap.add_argument("--dir", default=None, help="where to work (default: a temporary directory in /tmp)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_start = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="bench-staging-", dir=args.dir))
    try:
        model, adapter = make_model(root / "src", args.model_mib, args.adapter_mib)
        sandbox = Sandbox()
        names = list(METHODS)
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in names}
        for r in range(args.rounds):
            for i in range(len(names)):
                m = names[(r + i) % len(names)]
                runs[m].append(one_round(m, sandbox, model, adapter, root))
        source_bytes = tree_bytes(model)[0] + tree_bytes(adapter)[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary: dict[str, dict[str, float]] = {}
    for m, rs in runs.items():
        summary[m] = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        summary[m]["mib_per_s"] = source_bytes / MIB / summary[m]["stage_s"]
        summary[m]["mib_per_s_synced"] = source_bytes / MIB / summary[m]["stage_sync_s"]
    base = summary["copyfile"]
    ratios = {
        m: {k: s[k] / base[k] for k in ("stage_s", "stage_sync_s", "disk_bytes")} for m, s in summary.items()
    }
    out = {
        "command": "benchmarks/bench_staging.py "
        + f"--model-mib {args.model_mib} --adapter-mib {args.adapter_mib} --rounds {args.rounds}",
        "started": started,
        "cpus": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "source_bytes": source_bytes,
        "median": summary,
        "ratio_to_copyfile": ratios,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    for m, s in summary.items():
        print(
            f"{m:16s} stage {s['stage_s'] * 1000:8.1f} ms ({s['mib_per_s']:6.0f} MiB/s)  "
            f"+sync {s['stage_sync_s'] * 1000:8.1f} ms  disk {s['disk_bytes'] / MIB:7.1f} MiB  "
            f"re-stage adapter {s['restage_adapter_s'] * 1000:6.1f} ms  "
            f"remove {s['remove_s'] * 1000:6.1f} ms  "
            f"x{ratios[m]['stage_s']:.2f}"
        )
    print(f"load {load_start} -> {out['load_average_end']}")


if __name__ == "__main__":
    main()
