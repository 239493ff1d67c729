"""Mutation testing in CI, sized to fit: mutmut mutates the cost model (the arithmetic that decides what
every option costs and how long it takes) and its own unit tests must kill every mutant that is not
written down as equivalent (``benchmarks/data/mutation_equivalent.json``, with the reason for each).
``make mutation`` is the full run over every module where a bug costs money or crosses a wall
(docs/testing.md)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from mutation_score import parse_results, score  # noqa: E402

pytestmark = pytest.mark.slow

# module -> the unit tests that specify it
SAMPLE = {"src/trainyard/cost/model.py": "tests/unit/test_cost_model.py"}
# mutmut's CPU-time limit per mutant is (estimated test time + 1 s) x multiplier x 2
TIMEOUT_MULTIPLIER = 2.0


def _project(tmp: Path) -> Path:
    """A copy of the package and the sample's tests, with a [tool.mutmut] section for just the sample."""
    proj = tmp / "proj"
    shutil.copytree(ROOT / "src", proj / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (proj / "tests" / "unit").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", proj / "tests" / "conftest.py")
    for test in SAMPLE.values():
        shutil.copy(ROOT / test, proj / test)
    text = (ROOT / "pyproject.toml").read_text()
    text = text[: text.index("[tool.mutmut]")] + (
        "[tool.mutmut]\n"
        'source_paths = ["src/"]\n'
        f"only_mutate = {json.dumps(list(SAMPLE))}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(list(SAMPLE.values()))}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]\n'
        # a mutant whose tests use more than 4x their CPU time (plus 4 s) is a timeout, which counts as
        # killed: the loops of poisson_quantile that never end are stopped after ~14 CPU-s, not
        # mutmut's default 15x (~100 CPU-s each, half the run's time)
        f"timeout_multiplier = {TIMEOUT_MULTIPLIER}\n"
    )
    (proj / "pyproject.toml").write_text(text)
    return proj


def test_every_mutant_of_the_cost_model_is_killed_by_its_unit_tests(tmp_path: Path) -> None:
    proj = _project(tmp_path)
    mutmut = Path(sys.executable).parent / "mutmut"
    env = {**os.environ, "HYPOTHESIS_PROFILE": "mutation", "PYTHONPATH": ""}
    run = subprocess.run(
        [str(mutmut), "run", "--max-children", "2"],
        cwd=proj,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    tail = re.sub(r"[^\n]*\r", "", run.stdout)[-3000:] + run.stderr[-3000:]
    assert run.returncode == 0, tail
    results = [str(mutmut), "results", "--all", "true"]
    listed = subprocess.run(results, cwd=proj, env=env, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr
    statuses = parse_results(listed.stdout)
    equivalent = json.loads((ROOT / "benchmarks" / "data" / "mutation_equivalent.json").read_text())
    table = score(statuses, equivalent)
    assert set(table) == {"trainyard.cost.model"}, table.keys()
    for module, row in table.items():
        assert row["mutants"] >= 50, (module, row)  # the module really was mutated
        assert row["not_checked"] == 0, (module, row)
        assert row["survivors"] == [], (module, row["survivors"])
    # every equivalence written down still names a mutant that survives (mutant numbers move when the
    # code changes: a stale entry would excuse some other mutant)
    stale = [m for m in equivalent if m.startswith(tuple(table)) and statuses.get(m) != "survived"]
    assert not stale, [(m, statuses.get(m)) for m in stale]
