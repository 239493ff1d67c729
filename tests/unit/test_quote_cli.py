"""`trainyard quote` in-process: the ranked table and the reasons table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from trainyard.cli.quote_cmd import quote_command

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
app = typer.Typer()
app.command()(quote_command)
runner = CliRunner()


def test_catalog_quote_table_ranks_and_explains() -> None:
    r = runner.invoke(app, [str(EXAMPLES / "lora-7b.yaml"), "--limit", "5"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "Quote for lora-7b on the packaged catalog" in out
    assert "more feasible options" in out and "Not feasible" in out
    for header in ("accelerator", "market", "$/step", "expected $", "ckpt"):
        assert header in out


def test_quote_json_is_one_document_sorted() -> None:
    r = runner.invoke(app, [str(EXAMPLES / "lora-7b.yaml"), "--json"])
    assert r.exit_code == 0
    options = json.loads(r.stdout)["options"]
    feasible = [o for o in options if o["feasible"]]
    costs = [o["expected_cost_usd"] for o in feasible]
    assert costs == sorted(costs)
    assert options[: len(feasible)] == feasible  # feasible first, then the rest with reasons
    assert all(o["reason"] for o in options[len(feasible) :])


GOOD_SPEC = """\
name: t
model: {architecture: custom, params_b: 1.0}
workload: {seq_len: 1024, global_batch: 8, steps: 100}
"""
BAD = {
    "wrong type": (GOOD_SPEC.replace("seq_len: 1024", "seq_len: lots"), None, "workload.seq_len"),
    "absurd value": (GOOD_SPEC.replace("params_b: 1.0", "params_b: 1e30"), None, "model.params_b"),
    "zero seq_len": (GOOD_SPEC.replace("seq_len: 1024", "seq_len: 0"), None, "workload.seq_len"),
    "zero devices": (GOOD_SPEC + "resources: {min_devices: 0}\n", None, "resources.min_devices"),
    "missing file": (None, None, "no such file"),
    "pool price unknown": (
        GOOD_SPEC,
        "pools:\n- {name: p, accelerator: h100, devices_per_node: 8, nodes: 1, market: spot, region: mars-1, "
        "instance_type: p5.48xlarge}\n",
        "instance_type",
    ),
    "pool without a price": (
        GOOD_SPEC,
        "pools:\n- {name: p, accelerator: h100, devices_per_node: 8, nodes: 1, market: spot, region: r}\n",
        "price_usd_per_device_hour",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_exits_2_with_the_field(case: str, tmp_path: Path) -> None:
    spec_text, pools_text, needle = BAD[case]
    spec = tmp_path / "job.yaml"
    if spec_text is not None:
        spec.write_text(spec_text)
    args = [str(spec)]
    if pools_text is not None:
        (tmp_path / "pools.yaml").write_text(pools_text)
        args += ["--pools", str(tmp_path / "pools.yaml")]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert needle in r.output and "hint:" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
