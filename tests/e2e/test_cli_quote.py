"""`trainyard quote` and `trainyard catalog` through the installed console script (`make run`'s demo,
which shows the worked example, is tests/e2e/test_make_run.py)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainyard.cost.quote import CONTRACT_KEYS

ROOT = Path(__file__).resolve().parents[2]
TRAINYARD = ROOT / ".venv" / "bin" / "trainyard"
EXAMPLES = ROOT / "examples"

GOOD_SPEC = """\
name: t
model: {architecture: custom, params_b: 1.0}
workload: {seq_len: 1024, global_batch: 8, steps: 100}
"""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _commands(tmp: Path) -> dict[str, list[str]]:
    """Every invocation this module checks, keyed by name; they run concurrently (start-up dominates)."""
    ty = str(TRAINYARD)
    seed, pools = str(EXAMPLES / "seed-example.yaml"), str(EXAMPLES / "seed-pools.yaml")
    cmds = {
        "quote-json": [ty, "quote", seed, "--pools", pools, "--json"],
    }
    for case, (spec_text, pools_text, _) in BAD.items():
        d = tmp / case.replace(" ", "-")
        d.mkdir()
        (d / "job.yaml").write_text(spec_text)
        args = [ty, "quote", str(d / "job.yaml")]
        if pools_text is not None:
            (d / "pools.yaml").write_text(pools_text)
            args += ["--pools", str(d / "pools.yaml")]
        cmds[case] = args
    return cmds


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    assert TRAINYARD.exists(), f"{TRAINYARD} missing: run `make test` (it installs the console script)"
    procs = {
        name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        for name, cmd in _commands(tmp_path_factory.mktemp("cli")).items()
    }
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        out[name] = Result(p.returncode, stdout, stderr)
    return out


def test_quote_json_contract(results: dict[str, Result]) -> None:
    r = results["quote-json"]
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert list(doc) == ["options"]
    opts = doc["options"]
    assert all(tuple(o) == CONTRACT_KEYS for o in opts)
    assert [round(o["usd_per_step"], 5) for o in opts] == [0.00016, 0.00037, 0.00042, 0.00056]
    costs = [o["expected_cost_usd"] for o in opts]
    assert costs == sorted(costs)


# The other bad-input cases (wrong types, absurd values, 0 devices, unknown instance prices) run in-process
# in tests/unit/test_quote_cli.py; these go through the installed console script end to end.
BAD = {
    "malformed YAML": ("name: [unclosed\n", None, "malformed YAML"),
    "unknown accelerator": (GOOD_SPEC + "requirements: {allow: [a200]}\n", None, "requirements.allow"),
    "pool larger than its nodes": (
        GOOD_SPEC,
        "pools:\n- {name: p, accelerator: h100, devices_per_node: 8, nodes: 1, available_devices: 9, "
        "market: spot, region: r, price_usd_per_device_hour: 2}\n",
        "available_devices",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2(case: str, results: dict[str, Result]) -> None:
    needle = BAD[case][2]
    r = results[case]
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert len(lines) <= 3 and any(ln.startswith("hint:") for ln in lines)
