"""Mutation score per module from the last ``mutmut run`` (``make mutation`` / ``make mutation-fast``).

Reads ``mutmut results --all true`` in the repository root, drops the mutants written down as equivalent
in ``benchmarks/data/mutation_equivalent.json`` (each with its reason), prints a table per module and
writes ``benchmarks/results/mutation.json``. Exits 1 when a module is below ``--min-score`` (percent of
non-equivalent mutants killed), so a target can gate on it.

    python benchmarks/mutation_score.py [--min-score 90]
    git diff --name-only main -- src | python benchmarks/mutation_score.py --globs-for-changed
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = ROOT / "benchmarks" / "data" / "mutation_equivalent.json"
OUT = ROOT / "benchmarks" / "results" / "mutation.json"
KILLED = {"killed", "caught by type check", "timeout"}  # a timeout is a behaviour change the tests saw


def module_of(mutant: str) -> str:
    """``trainyard.cost.model.x_dollars__mutmut_3`` -> ``trainyard.cost.model``."""
    head = mutant.split("__mutmut_")[0]
    parts = head.split(".")
    for i, part in enumerate(parts):
        if part.startswith(("x_", "x\u01c1")):  # a function (x_name) or a method (xǁClassǁname)
            return ".".join(parts[:i])
    return ".".join(parts[:-1])


def globs_for_changed(paths: list[str]) -> list[str]:
    """The mutant-name globs (``trainyard.cost.model.*``) of the changed files that are mutated."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    mutated = set(config["only_mutate"])
    out = []
    for path in paths:
        if path in mutated and path.endswith(".py"):
            out.append(path.removeprefix("src/").removesuffix(".py").replace("/", ".") + ".*")
    return out


def parse_results(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, status = line.strip().partition(": ")
        if sep and "__mutmut_" in name:
            out[name] = status.strip()
    return out


def score(statuses: dict[str, str], equivalent: dict[str, str]) -> dict[str, dict[str, object]]:
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    survivors: dict[str, list[str]] = defaultdict(list)
    for name, status in sorted(statuses.items()):
        mod = module_of(name)
        if name in equivalent:
            by_module[mod]["equivalent"] += 1
            continue
        by_module[mod][status] += 1
        if status not in KILLED:
            survivors[mod].append(name)
    table: dict[str, dict[str, object]] = {}
    for mod, counts in sorted(by_module.items()):
        counted = sum(n for s, n in counts.items() if s not in ("equivalent", "skipped", "not checked"))
        killed = sum(counts[s] for s in KILLED)
        table[mod] = {
            "mutants": sum(counts.values()),
            "equivalent": counts["equivalent"],
            "killed": killed,
            "survived": counted - killed,
            "not_checked": counts["not checked"] + counts["skipped"],
            "score_pct": round(100.0 * killed / counted, 1) if counted else None,
            "survivors": survivors.get(mod, []),
        }
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-score", type=float, default=None, help="fail below this score (percent)")
    ap.add_argument(
        "--globs-for-changed", action="store_true", help="read changed paths on stdin, print mutant globs"
    )
    args = ap.parse_args()
    if args.globs_for_changed:
        print(" ".join(globs_for_changed(sys.stdin.read().split())))
        return 0
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "mutmut"), "results", "--all", "true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr or proc.stdout)
        return proc.returncode
    equivalent: dict[str, str] = json.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    table = score(parse_results(proc.stdout), equivalent)
    if not table:
        print("no mutation results: run `make mutation` first", file=sys.stderr)
        return 1
    print(f"{'module':<40} {'mutants':>8} {'equiv':>6} {'killed':>7} {'survived':>9} {'score':>7}")
    for mod, row in table.items():
        pct = "-" if row["score_pct"] is None else f"{row['score_pct']:.1f} %"
        print(
            f"{mod:<40} {row['mutants']:>8} {row['equivalent']:>6} {row['killed']:>7} "
            f"{row['survived']:>9} {pct:>7}"
        )
    for row in table.values():
        for name in row["survivors"]:  # type: ignore[attr-defined]
            print(f"  survived: {name}   (mutmut show {name})")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(table, indent=1) + "\n")
    if args.min_score is not None:
        low = [m for m, r in table.items() if r["score_pct"] is not None and r["score_pct"] < args.min_score]
        if low:
            print(f"below {args.min_score:.0f} %: {', '.join(low)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
