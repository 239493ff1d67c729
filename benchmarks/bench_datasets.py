"""Dataset ingestion throughput and peak memory (issue 14 numbers).

Generates a chat JSONL file of the requested size (OpenAI fine-tuning rows: a shared system prompt, a
user turn, an assistant turn; about 1 % exact duplicates and 1 % near-duplicates), then measures, each
in a fresh child process so its peak resident set is its own:

- ``sha256sum FILE`` — the ceiling: reading and hashing the bytes once;
- ingestion passes 1-2 (stream, validate, normalise, hash rows, de-duplicate, content address,
  hash split + MinHash near-duplicate clusters) — the work done before anything is stored;
- the whole upload: passes 1-3 (also writing the canonical train and eval files and their sha256s);
  pass 1 goes in worker processes (one per CPU) as it does for an upload the server spooled to a file;
  CPU seconds include the workers', and the peak RSS bounds the process's and its workers' together;
- with ``--baseline-src``, the same two with another checkout's code, alternating with this one's;
- with ``--tokenizer``, passes 1-2 counting tokens with a byte-level BPE trained on the file, one
  ``encode`` call per string against one batched call per batch of rows (same counts, checked).

Every variant is checked to give the same dataset (content address, counts, split hashes).

Usage:  python benchmarks/bench_datasets.py [--mb 1024] [--keep FILE] [--budget BYTES]
            [--baseline-src OTHER_CHECKOUT/src] [--tokenizer]
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
import json, sys, time, resource, tempfile, shutil
from pathlib import Path
from trainyard.datasets.ingest import IngestOptions, ingest
cfg = json.loads(sys.argv[1])
extra = {}
if cfg.get("budget"):
    extra["memory_budget"] = cfg["budget"]
if cfg.get("tokenizer"):
    from trainyard.datasets.tokens import TokenizerSpec, token_counters
    one, batch = token_counters(TokenizerSpec("bench", cfg["tokenizer"]))
    extra["count_tokens"] = one
    extra["tokenizer"] = "bench"
    if cfg.get("batch"):
        extra["count_tokens_batch"] = batch
tmp = Path(tempfile.mkdtemp(prefix="bench-ds-", dir=cfg.get("spool")))
t0 = time.perf_counter()
with open(cfg["path"], "rb") as fh:
    ing = ingest(fh, IngestOptions(eval_fraction=0.1, max_bytes=1 << 40, **extra), tmp)
t1 = time.perf_counter()
def cpu():  # this process and its waited-for children (pass 1's workers)
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime
cpu1 = cpu()
if cfg["write"]:
    ing.write(f"file://{tmp}/out")
t2 = time.perf_counter()
cpu2 = cpu()
ru = resource.getrusage(resource.RUSAGE_SELF)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
workers = (getattr(ing, "work", None) or {}).get("pass1", {})
ing.close()
doc = {"ingest_s": t1 - t0, "write_s": t2 - t1, "rows": ing.rows, "sha256": ing.sha256,
       "duplicates_removed": ing.duplicates_removed,
       "near_duplicates_kept_in_train": ing.near_duplicates_kept_in_train, "train_rows": ing.train.rows,
       "eval_rows": ing.eval.rows, "train_sha256": ing.train.sha256, "eval_sha256": ing.eval.sha256,
       "train_tokens": ing.train.tokens, "eval_tokens": ing.eval.tokens,
       "work": getattr(ing, "work", None),
       "ingest_cpu_s": sum(cpu1), "cpu_s": sum(cpu2), "worker_cpu_s": cpu2[1],
       "workers": workers.get("workers", 1),
       "parent_max_rss_mib": ru.ru_maxrss / 1024,
       "worker_max_rss_mib": [b / 2**20 for b in workers.get("worker_max_rss", [])],
       "vm_hwm_mib": hwm / 1024}
# what the process and pass 1's workers held at once, at most: during pass 1 the parent's peak so far
# plus each worker's peak; after it (workers gone) the process's own peak
pass1_bound = workers.get("parent_max_rss", 0) / 2**20 + sum(doc["worker_max_rss_mib"])
doc["max_rss_mb"] = max(pass1_bound, doc["parent_max_rss_mib"])
doc["sum_of_peaks_mib"] = doc["parent_max_rss_mib"] + sum(doc["worker_max_rss_mib"])
shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps(doc))
"""


def child_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def run_ingest(path: Path, write: bool, src: Path = ROOT / "src", **cfg: Any) -> dict[str, Any]:
    """One ingestion in a fresh child process with ``src`` on its path (another checkout's ``src``
    measures that code side by side)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps({"path": str(path), "write": write, **cfg})],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    doc["process_s"] = time.perf_counter() - t0
    return doc


def train_tokenizer(path: Path, out_dir: Path, lines: int = 20_000, vocab: int = 8000) -> Path:
    """A byte-level BPE trained on the file's first ``lines`` rows (what a base model's tokenizer.json
    is; nothing downloaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = []
    with path.open("rb") as fh:
        for _, raw in zip(range(lines), fh, strict=False):
            texts.extend(m["content"] for m in json.loads(raw)["messages"])
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    return out_dir


def baseline_python_rss_mb() -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    code = (
        "import resource, trainyard.datasets.ingest; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    return float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)


SAME = ("sha256", "rows", "duplicates_removed", "near_duplicates_kept_in_train", "train_rows", "eval_rows")
SAME_WRITTEN = ("train_sha256", "eval_sha256", "train_tokens", "eval_tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024, help="size of the generated file in MiB")
    ap.add_argument("--keep", type=Path, default=None, help="generate into (or reuse) this file")
    ap.add_argument("--budget", type=int, default=0, help="IngestOptions.memory_budget (0: its default)")
    ap.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="another checkout's src/ (e.g. the previous commit's) to measure side by side, alternating",
    )
    ap.add_argument(
        "--tokenizer",
        action="store_true",
        help="also ingest with a BPE tokenizer trained on the file: encode per string vs batched",
    )
    ap.add_argument(
        "--upload-only",
        action="store_true",
        help="skip the passes-1-2-only runs (the upload runs report passes 1-2 CPU time as well)",
    )
    ap.add_argument("--spool", type=Path, default=None, help="directory for the spool (default: /tmp)")
    ap.add_argument("--results", type=Path, default=RESULTS, help=f"JSON output (default: {RESULTS})")
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
    cfg: dict[str, Any] = {"budget": args.budget, "spool": str(args.spool) if args.spool else None}
    load_start = os.getloadavg()

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(["sha256sum", str(path)], check=True, capture_output=True)
    sha_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    sha_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    sha_rss = child_rss_mb()
    runs: dict[str, dict[str, Any]] = {}
    # alternate this code and the baseline so both see the same load
    if args.baseline_src and not args.upload_only:
        runs["baseline ingest"] = run_ingest(path, False, args.baseline_src.resolve())
    if not args.upload_only:
        runs["ingest"] = run_ingest(path, False, **cfg)
    if args.baseline_src:
        runs["baseline upload"] = run_ingest(path, True, args.baseline_src.resolve())
    runs["upload"] = run_ingest(path, True, **cfg)
    passes12 = runs.get("ingest", runs["upload"])
    if args.tokenizer:
        tok_dir = train_tokenizer(path, tmpdir / "tokenizer")
        runs["tokenizer: encode per string"] = run_ingest(path, False, tokenizer=str(tok_dir), **cfg)
        runs["tokenizer: batched"] = run_ingest(path, False, tokenizer=str(tok_dir), batch=True, **cfg)
    load_end = os.getloadavg()
    base_rss = baseline_python_rss_mb()
    for name, doc in runs.items():  # every variant must produce the same dataset
        ref = runs["upload"] if "upload" in name else passes12
        keys = SAME + (SAME_WRITTEN if "upload" in name else ())
        if not name.startswith("tokenizer"):
            assert all(doc[k] == ref[k] for k in keys), f"{name} differs from this code's outcome"
    if args.tokenizer:
        a, b = runs["tokenizer: encode per string"], runs["tokenizer: batched"]
        assert (a["train_tokens"], a["eval_tokens"]) == (b["train_tokens"], b["eval_tokens"])

    table = [("sha256sum (ceiling)", 1, sha_s, sha_s, sha_cpu, sha_cpu, sha_rss)]
    labels = {
        "baseline ingest": "baseline: ingest",
        "ingest": "ingest: validate+normalise+hash+dedup+split",
        "baseline upload": "baseline: upload",
        "upload": "upload: the above + write both splits",
    }
    for name, doc in runs.items():
        wall = doc["ingest_s"] + doc["write_s"]
        table.append(
            (
                labels.get(name, name),
                doc.get("workers", 1),
                wall,
                doc["ingest_s"],
                doc["cpu_s"],
                doc["ingest_cpu_s"],
                doc["max_rss_mb"],
            )
        )
    print(
        f"\nfile: {size_mb:.0f} MiB, {passes12['rows']} unique rows,"
        f" {passes12['duplicates_removed']} duplicates,"
        f" {passes12['near_duplicates_kept_in_train']} near-duplicates kept in train;"
        f" load {load_start[0]:.1f} -> {load_end[0]:.1f}; pass 2: {passes12['work']}"
    )
    print(
        f"{'what':<46} {'procs':>5} {'wall s':>7} {'MiB/s':>6} {'1-2 wall s':>10} {'1-2 MiB/s':>9}"
        f" {'CPU s':>7} {'MiB/CPU-s':>9} {'1-2 MiB/CPU-s':>13} {'peak RSS MiB':>12}"
    )
    for name, procs, wall, wall12, cpu, cpu12, rss in table:
        print(
            f"{name:<46} {procs:>5} {wall:7.2f} {size_mb / wall:6.1f} {wall12:10.2f} {size_mb / wall12:9.1f}"
            f" {cpu:7.2f} {size_mb / cpu:9.1f} {size_mb / cpu12:13.1f} {rss:12.1f}"
        )
    print(
        "(procs: pass 1's worker processes; peak RSS bounds what the process and its workers held at"
        " once: the larger of its own peak and, for pass 1, its peak then plus each worker's peak)"
    )
    print(f"(a Python process with the ingest module imported and nothing read: {base_rss:.0f} MiB)")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    doc_out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
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
        "python_baseline_rss_mib": base_rss,
        "goal": {"mib_per_s": 50, "max_rss_mib": 200},
    }
    for name, doc in runs.items():
        wall = doc["ingest_s"] + doc["write_s"]
        doc_out[name] = {
            **doc,
            "mib_per_s": size_mb / wall,
            "passes12_mib_per_s": size_mb / doc["ingest_s"],
            "mib_per_cpu_s": size_mb / doc["cpu_s"],
        }
    args.results.write_text(json.dumps(doc_out, indent=1) + "\n")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
