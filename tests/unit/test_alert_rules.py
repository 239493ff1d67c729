"""The Prometheus rules that `trainyard alerts rules` prints: valid for promtool, and each alert fires
(and stays quiet) as its promtool unit tests say (tests/unit/alert_rules_test.yml)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trainyard.cli.main import app

HERE = Path(__file__).resolve().parent


def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is required (Debian package prometheus): run `make prometheus`")
    return exe


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    result = CliRunner().invoke(app, ["alerts", "rules"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "alert_rules.yml"
    path.write_text(result.stdout)
    return path


def test_rules_pass_promtool_check(rules_file: Path) -> None:
    p = subprocess.run([promtool(), "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


def test_the_json_form_passes_promtool_check_too(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["alerts", "rules", "--json"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "alert_rules.json"
    path.write_text(result.stdout)
    assert json.loads(result.stdout)["groups"]
    p = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_rules_pass_their_promtool_unit_tests(rules_file: Path) -> None:
    shutil.copy(HERE / "alert_rules_test.yml", rules_file.parent / "alert_rules_test.yml")
    p = subprocess.run(
        [promtool(), "test", "rules", "alert_rules_test.yml"],
        capture_output=True,
        text=True,
        cwd=rules_file.parent,
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_alert_has_a_severity_and_a_summary_and_a_test(rules_file: Path) -> None:
    doc = yaml.safe_load(rules_file.read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"]]
    assert {a["labels"]["severity"] for a in alerts} <= {"info", "warning", "critical"}
    assert all(a["annotations"].get("summary") for a in alerts)
    tested = {
        t["alertname"]
        for case in yaml.safe_load((HERE / "alert_rules_test.yml").read_text())["tests"]
        for t in case["alert_rule_test"]
    }
    assert {a["alert"] for a in alerts} == tested
