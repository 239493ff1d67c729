"""Dataset ingestion throughput and peak memory (issue 14 numbers).

Generates a chat JSONL file of the requested size (OpenAI fine-tuning rows: a shared system prompt, a
user turn, an assistant turn; about 1 % exact duplicates and 1 % near-duplicates), then measures, each
in a fresh child process so its peak resident set is its own:

- ``sha256sum FILE`` — the ceiling: reading and hashing the bytes once;
- ingestion passes 1-2 (stream, validate, normalise, hash rows, de-duplicate, content address,
  hash split + MinHash near-duplicate clusters) — the work done before anything is stored;
- the whole upload: passes 1-3 (also writing the canonical train and eval files and their sha256s).

Usage:  python benchmarks/bench_datasets.py [--mb 1024] [--keep FILE]
Writes: benchmarks/results/bench_datasets.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_datasets.json"
WORDS = [
    "model", "data", "train", "the", "a", "of", "cost", "spot", "price", "gpu", "tpu", "step", "loss",
    "eval", "split", "token", "batch", "seed", "run", "job", "queue", "pool", "region", "memory", "time",
    "fast", "slow", "cheap", "why", "how", "what", "when", "does", "is", "can", "should", "and", "or",
]  # fmt: skip


def generate(path: Path, target_bytes: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    system = "You are a helpful assistant for a machine-learning platform. Answer briefly and precisely."
    rows = 0
    written = 0
    recent: list[str] = []
    with path.open("w", encoding="utf-8") as out:
        while written < target_bytes:
            r = rng.random()
            if r < 0.01 and recent:
                line = rng.choice(recent)  # exact duplicate
            else:
                q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80)))
                if r < 0.02 and recent:  # near-duplicate of a recent question
                    q = json.loads(rng.choice(recent))["messages"][1]["content"] + " please"
                a = " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 120)))
                doc = {
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"{q} ({rows})?"},
                        {"role": "assistant", "content": a + "."},
                    ]
                }
                line = json.dumps(doc, ensure_ascii=False)
                if len(recent) < 1000:
                    recent.append(line)
                else:
                    recent[rng.randrange(1000)] = line
            out.write(line + "\n")
            written += len(line) + 1
            rows += 1
    return rows


CHILD = """
import json, sys, time, resource, tempfile
from pathlib import Path
from trainyard.datasets.ingest import IngestOptions, ingest
path, write = sys.argv[1], sys.argv[2] == "1"
tmp = Path(tempfile.mkdtemp(prefix="bench-ds-"))
t0 = time.perf_counter()
with open(path, "rb") as fh:
    ing = ingest(fh, IngestOptions(eval_fraction=0.1, max_bytes=1 << 40), tmp)
t1 = time.perf_counter()
if write:
    ing.write(f"file://{tmp}/out")
t2 = time.perf_counter()
ru = resource.getrusage(resource.RUSAGE_SELF)
ing.close()
doc = {"ingest_s": t1 - t0, "write_s": t2 - t1, "rows": ing.rows,
       "duplicates_removed": ing.duplicates_removed,
       "near_duplicates_kept_in_train": ing.near_duplicates_kept_in_train, "train_rows": ing.train.rows,
       "eval_rows": ing.eval.rows,
       "max_rss_mb": ru.ru_maxrss / 1024, "cpu_s": ru.ru_utime + ru.ru_stime}
import shutil; shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps(doc))
"""


def child_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def run_ingest(path: Path, write: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), "1" if write else "0"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(out.stdout)
    doc["process_s"] = time.perf_counter() - t0
    return doc


def baseline_python_rss_mb() -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    code = (
        "import resource, trainyard.datasets.ingest; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    return float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024, help="size of the generated file in MiB")
    ap.add_argument("--keep", type=Path, default=None, help="generate into (or reuse) this file")
    args = ap.parse_args()
    tmpdir = Path(tempfile.mkdtemp(prefix="bench-datasets-"))
    path = args.keep or tmpdir / "chat.jsonl"
    target = args.mb * 2**20
    if not path.exists() or path.stat().st_size < target:
        t0 = time.perf_counter()
        rows = generate(path, target)
        took = time.perf_counter() - t0
        print(f"generated {path} ({path.stat().st_size / 2**20:.0f} MiB, {rows} rows) in {took:.0f} s")
    size_mb = path.stat().st_size / 2**20
    load_start = os.getloadavg()

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(["sha256sum", str(path)], check=True, capture_output=True)
    sha_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    sha_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    sha_rss = child_rss_mb()
    passes12 = run_ingest(path, write=False)
    full = run_ingest(path, write=True)
    load_end = os.getloadavg()
    base_rss = baseline_python_rss_mb()

    rows = [
        ("sha256sum (ceiling)", sha_s, sha_cpu, sha_rss),
        (
            "ingest: validate+normalise+hash+dedup+split",
            passes12["ingest_s"],
            passes12["cpu_s"],
            passes12["max_rss_mb"],
        ),
        (
            "upload: the above + write both splits",
            full["ingest_s"] + full["write_s"],
            full["cpu_s"],
            full["max_rss_mb"],
        ),
    ]
    print(
        f"\nfile: {size_mb:.0f} MiB, {passes12['rows']} unique rows,"
        f" {passes12['duplicates_removed']} duplicates,"
        f" {passes12['near_duplicates_kept_in_train']} near-duplicates kept in train;"
        f" load {load_start[0]:.1f} -> {load_end[0]:.1f}"
    )
    print(f"{'what':<46} {'wall s':>8} {'MiB/s':>7} {'CPU s':>7} {'MiB/CPU-s':>10} {'peak RSS MiB':>13}")
    for name, wall, cpu, rss in rows:
        print(f"{name:<46} {wall:8.2f} {size_mb / wall:7.1f} {cpu:7.2f} {size_mb / cpu:10.1f} {rss:13.1f}")
    print(f"(a Python process with the ingest module imported and nothing read: {base_rss:.0f} MiB)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "machine": {
                    "platform": platform.platform(),
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                },
                "load_avg_1m": {"start": load_start[0], "end": load_end[0]},
                "file_mib": round(size_mb, 1),
                "sha256sum": {
                    "seconds": sha_s,
                    "cpu_s": sha_cpu,
                    "mib_per_s": size_mb / sha_s,
                    "mib_per_cpu_s": size_mb / sha_cpu,
                    "max_rss_mib": sha_rss,
                },
                "ingest": {
                    **passes12,
                    "mib_per_s": size_mb / passes12["ingest_s"],
                    "mib_per_cpu_s": size_mb / passes12["cpu_s"],
                },
                "upload": {
                    **full,
                    "mib_per_s": size_mb / (full["ingest_s"] + full["write_s"]),
                    "mib_per_cpu_s": size_mb / full["cpu_s"],
                },
                "python_baseline_rss_mib": base_rss,
                "goal": {"mib_per_s": 50, "max_rss_mib": 200},
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
