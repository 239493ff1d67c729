"""Checkpoint I/O against the disk: save and load throughput of the checkpoint manager vs raw writes/reads.

- save: a synchronous ``CheckpointManager.save`` (DCP shards written with fsync while each file is
  hashed in the same pass, ``.metadata``, the manifest committed by atomic rename) of a model + AdamW
  state, against writing and fsyncing the same number of bytes with plain ``write`` calls into the same
  directory (the disk's write bandwidth as this process sees it: one stream, and one stream per shard
  file at once; the "best disk write" is the faster of the two);
- load: ``CheckpointManager.latest_valid`` (every file's size and sha256 verified) plus
  ``CheckpointManager.load`` into preallocated tensors, against plainly reading the same files (same
  page-cache state: both run right after the save).

    python benchmarks/bench_checkpoint_io.py [--mb 400] [--repeats 3] [--baseline OLD/src]

``--baseline`` also times, interleaved with the others, the ``trainyard/runtime/checkpoint.py`` of another
source tree (``git archive <commit> src | tar -x -C /tmp/base``): old and new code side by side in one run.

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


def _target_like(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {
        "model": {k: torch.empty_like(v) for k, v in state["model"].items()},
        "optim": {
            "state": {
                k: {m: torch.empty_like(t) for m, t in v.items()} for k, v in state["optim"]["state"].items()
            },
            "param_groups": [dict(g) for g in state["optim"]["param_groups"]],
        },
    }


def _one_file(mgr: Any, *, crc32: bool) -> Any:
    """Configurations for the side-by-side comparison: one shard file per rank (one writer thread), with
    or without torch.save's own per-record CRC32 on top of the sha256 (with it: the previous save path)."""
    import contextlib

    from trainyard.runtime import checkpoint

    mgr.write_threads = 1
    real = checkpoint._without_zip_crc32

    @contextlib.contextmanager
    def swap() -> Any:
        if crc32:
            checkpoint._without_zip_crc32 = contextlib.nullcontext  # type: ignore[assignment]
        try:
            yield
        finally:
            checkpoint._without_zip_crc32 = real

    return swap


def baseline_manager_class(src: Path) -> Any:
    """``CheckpointManager`` of another source tree's ``trainyard/runtime/checkpoint.py`` (it imports the
    rest of ``trainyard`` from this one)."""
    import importlib.util

    path = src / "trainyard" / "runtime" / "checkpoint.py"
    spec = importlib.util.spec_from_file_location("baseline_checkpoint", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.CheckpointManager


def run(mb: int, repeats: int, compare: bool = True, baseline: Path | None = None) -> dict[str, Any]:
    import contextlib

    import torch

    from trainyard.runtime.checkpoint import CheckpointManager

    state = state_of(mb)
    saves, save_cpu, writes, write_cpu, par_writes = [], [], [], [], []
    verifies, dcp_loads, loads, reads = [], [], [], []
    nbytes, n_files = 0, 0
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-io-", dir=os.environ.get("TMPDIR")) as tmp:
        # every step is kept while the saves are timed: deleting an older step (retention, after the
        # commit) is not writing, and the disk's own measurement leaves its unlink out too; it is timed
        # on its own below
        keep = repeats + 1
        mgr = CheckpointManager(f"file://{tmp}", "io", keep_last=keep)
        others: dict[str, tuple[Any, Any]] = {}
        for name, crc32 in (("previous", True), ("one_file", False)) if compare else ():
            one = CheckpointManager(f"file://{tmp}", f"io-{name}", keep_last=keep)
            others[name] = (one, _one_file(one, crc32=crc32))
        if baseline is not None:
            base_cls = baseline_manager_class(baseline)
            others["baseline"] = (
                base_cls(f"file://{tmp}", "io-baseline", keep_last=keep),
                contextlib.nullcontext,
            )
        other_s: dict[str, list[float]] = {name: [] for name in others}
        other_cpu: dict[str, list[float]] = {name: [] for name in others}
        for step in range(1, repeats + 1):
            # interleaved, in an order rotated every repeat (what ran just before skews a measurement):
            # the current save, the disk's own fsync'd write of the same bytes, the one-file configurations
            def current(step: int = step) -> None:
                nonlocal nbytes, n_files
                c0, t0 = time.process_time(), time.perf_counter()
                res = mgr.save(step, state, {}, blocking=True).result()
                saves.append(time.perf_counter() - t0)
                save_cpu.append(time.process_time() - c0)
                nbytes, n_files = res.bytes_written, len(res.files)

            def disk() -> None:
                c0 = time.process_time()
                writes.append(disk_write_bandwidth(Path(tmp), nbytes or 3 * mb * 2**20 // 3))
                write_cpu.append(time.process_time() - c0)
                shards = max(1, n_files - 1)  # the save's shard files (its .metadata is tiny)
                par_writes.append(disk_write_bandwidth(Path(tmp), nbytes or mb * 2**20, streams=shards))

            def other_save(name: str, step: int = step) -> None:
                other, ctx = others[name]
                with ctx():
                    c0, t0 = time.process_time(), time.perf_counter()
                    other.save(step, state, {}, blocking=True).result()
                    other_s[name].append(time.perf_counter() - t0)
                    other_cpu[name].append(time.process_time() - c0)

            order: list[Any] = [current, disk]
            order += [lambda n=name: other_save(n) for name in others]
            k = (step - 1) % len(order)
            for fn in order[k:] + order[:k]:
                fn()
            files = [p for p in (Path(tmp) / "io" / f"step-{step}").iterdir() if p.name != "manifest.json"]
            reads.append(plain_read_bandwidth(files))
            target = _target_like(state)
            t0 = time.perf_counter()
            ref = mgr.latest_valid(report=False)
            t1 = time.perf_counter()
            assert ref is not None and ref.step == step
            mgr.load(ref, target)
            t2 = time.perf_counter()
            verifies.append(t1 - t0)
            dcp_loads.append(t2 - t1)
            loads.append(t2 - t0)
            assert torch.equal(target["model"]["layer0.weight"], state["model"]["layer0.weight"])
        # retention: delete all but the newest step, as keep_last=1 does after each commit
        mgr.keep_last = 1
        t0 = time.perf_counter()
        removed = mgr.apply_retention(current_step=repeats)
        retention_s_per_step = (time.perf_counter() - t0) / max(1, len(removed))
        mgr.close()
        for other, _ in others.values():
            other.close()
    med = statistics.median
    save_bw = nbytes / med(saves)
    load_bw = nbytes / med(loads)
    disk = med(writes)
    best_disk = max(disk, med(par_writes))
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_1m_at_start": load_start,
        "load_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "checkpoint_bytes": nbytes,
        "files_in_step": n_files,  # shards + .metadata
        "repeats": repeats,
        "save_s": med(saves),
        "save_cpu_s": med(save_cpu),
        "save_mb_per_s": save_bw / 1e6,
        "disk_write_mb_per_s": disk / 1e6,
        "disk_write_cpu_s": med(write_cpu),
        "disk_parallel_write_mb_per_s": med(par_writes) / 1e6,
        "best_disk_write_mb_per_s": best_disk / 1e6,
        "save_vs_best_disk_write_pct": 100 * save_bw / best_disk,
        "save_vs_disk_pct": 100 * save_bw / disk,
        "retention_s_per_step": retention_s_per_step,
        "load_verify_s": med(loads),
        "verify_s": med(verifies),
        "dcp_load_s": med(dcp_loads),
        "load_mb_per_s": load_bw / 1e6,
        "plain_read_mb_per_s": med(reads) / 1e6,
        "load_vs_read_pct": 100 * load_bw / med(reads),
    }
    if baseline is not None:
        doc["baseline_src"] = str(baseline)
    # every repeat, in the order run (the medians above hide how much the disk moved within the run)
    doc["raw"] = {
        "save_s": saves,
        "disk_write_mb_per_s": [w / 1e6 for w in writes],
        "disk_parallel_write_mb_per_s": [w / 1e6 for w in par_writes],
        **{f"{name}_save_s": other_s[name] for name in others},
    }
    for name in others:
        doc[f"{name}_save_s"] = med(other_s[name])
        doc[f"{name}_save_cpu_s"] = med(other_cpu[name])
        doc[f"{name}_save_vs_disk_pct"] = 100 * (nbytes / med(other_s[name])) / disk
        doc[f"{name}_save_vs_best_disk_write_pct"] = 100 * (nbytes / med(other_s[name])) / best_disk
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=400, help="checkpoint size in MB")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-compare", action="store_true", help="skip the one-file configurations")
    ap.add_argument("--baseline", type=Path, default=None, help="another tree's src/ to time side by side")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    doc = run(args.mb, args.repeats, compare=not args.no_compare, baseline=args.baseline)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    mb, n, load = doc["checkpoint_bytes"] / 1e6, doc["repeats"], doc["load_1m"]
    print(f"checkpoint {mb:.0f} MB, {n} repeats, load avg {load:.1f}")
    save, save_pct = doc["save_mb_per_s"], doc["save_vs_disk_pct"]
    print(f"save (write+fsync+hash+commit)  {save:8.0f} MB/s  {save_pct:5.1f} % of disk write")
    cpu, wall, n_files = doc["save_cpu_s"], doc["save_s"], doc["files_in_step"]
    print(f"  CPU {cpu:.3f} s in {wall:.3f} s, {n_files} files incl. .metadata")
    labels = (
        ("one_file", "1 file, no CRC32"),
        ("previous", "previous: 1 file, CRC32"),
        ("baseline", f"baseline {doc.get('baseline_src', '')}"),
    )
    for name, label in labels:
        if f"{name}_save_s" in doc:
            pct, cpu = doc[f"{name}_save_vs_disk_pct"], doc[f"{name}_save_cpu_s"]
            best_pct = doc[f"{name}_save_vs_best_disk_write_pct"]
            print(f"  {label:29} {pct:5.1f} % of disk write ({best_pct:5.1f} % of the best), CPU {cpu:.3f} s")
    print(f"  deleting an older step (retention, after the commit): {doc['retention_s_per_step']:.3f} s")
    best = doc["save_vs_best_disk_write_pct"]
    print(f"  {best:5.1f} % of the better of one stream and parallel streams (one file per shard)")
    disk_bw, disk_cpu = doc["disk_write_mb_per_s"], doc["disk_write_cpu_s"]
    print(f"disk write + fsync              {disk_bw:8.0f} MB/s  CPU {disk_cpu:.3f} s")
    load_bw, load_pct = doc["load_mb_per_s"], doc["load_vs_read_pct"]
    print(f"disk write + fsync, parallel    {doc['disk_parallel_write_mb_per_s']:8.0f} MB/s")
    print(f"load (verify sha256 + DCP load) {load_bw:8.0f} MB/s  {load_pct:5.1f} % of plain read")
    print(f"  verify {doc['verify_s']:.3f} s + DCP load {doc['dcp_load_s']:.3f} s")
    print(f"plain read                      {doc['plain_read_mb_per_s']:8.0f} MB/s")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
