"""`trainyard quote` in-process: the ranked table and the reasons table."""

from __future__ import annotations

import json
from pathlib import Path

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
