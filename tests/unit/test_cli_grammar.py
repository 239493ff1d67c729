"""The command tree itself: one noun-verb grammar whose aliases are the same commands, --json and -h on
every command, help that stands on its own, tables that fit without cutting ids, every validation error
listed, and a start-up that imports no heavy module."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import pytest
from rich.console import Console
from typer._click import Context
from typer.main import get_command
from typer.testing import CliRunner

from controlplane_support import ROOT, free_port
from trainyard.cli.common import Col, fit_columns, print_error, print_table
from trainyard.cli.main import ALIASES, GROUPS, app
from trainyard.cli.watch import RunView
from trainyard.errors import SpecError

ROOT_COMMAND: Any = get_command(app)
CTX = Context(ROOT_COMMAND)


def leaves(command: Any = ROOT_COMMAND, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    if hasattr(command, "list_commands"):
        for name in command.list_commands(CTX):
            if not path and name in ALIASES:
                continue
            out += leaves(command.get_command(CTX, name), (*path, name))
    else:
        out.append((path, command))
    return out


LEAVES = leaves()


def test_every_noun_is_a_group_and_every_leaf_takes_json_and_h() -> None:
    assert {"jobs", "pools", "tenants", "datasets", "models", "evals", "deployments", "usage", "budgets",
            "checkpoints"} <= set(GROUPS)  # fmt: skip
    assert len(LEAVES) > 60
    for path, command in LEAVES:
        names = {o for p in command.params for o in getattr(p, "opts", [])}
        assert "--json" in names, " ".join(path)
    result = CliRunner().invoke(app, ["jobs", "submit", "-h"])
    assert result.exit_code == 0 and "--dry-run" in result.stdout


def test_aliases_are_the_same_commands() -> None:
    for alias, (noun, verb) in ALIASES.items():
        target = ROOT_COMMAND.get_command(CTX, noun)
        if verb is not None:
            target = target.get_command(CTX, verb)
        aliased = ROOT_COMMAND.get_command(CTX, alias)
        assert aliased.callback is target.callback or aliased.callback.__wrapped__ is getattr(
            target.callback, "__wrapped__", None
        ), alias
        assert type(aliased) is type(target)
    root_help = CliRunner().invoke(app, ["--help"]).stdout
    assert "submit" in root_help and "= trainyard jobs submit" in root_help


def test_help_stands_on_its_own() -> None:
    """No help text sends people to a document they do not have."""
    for path, command in LEAVES:
        texts = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
        for text in texts:
            assert "DESIGN" not in text and "§" not in text, (path, text)


def test_version_flag_and_command() -> None:
    from trainyard import __version__

    assert CliRunner().invoke(app, ["--version"]).stdout.strip() == f"trainyard {__version__}"
    doc = json.loads(CliRunner().invoke(app, ["version", "--json"]).stdout)
    assert doc["version"] == __version__


def test_tables_drop_low_value_columns_first_and_never_key_columns() -> None:
    cols = [Col("ID", key=True), Col("NAME", key=True), Col("A", priority=1), Col("B", priority=2), Col("C")]
    rows = [["job-0123456789ab", "a-long-job-name", "x" * 20, "y" * 20, "z"]]
    assert fit_columns(cols, rows, 200) == [0, 1, 2, 3, 4]
    assert fit_columns(cols, rows, 70) == [0, 1, 2, 4]  # B (priority 2) goes first
    assert fit_columns(cols, rows, 10) == [0, 1, 4]  # priority-0 columns always stay
    out = io.StringIO()
    print_table(cols, rows, out=Console(file=out, width=30, force_terminal=True, color_system=None))
    shown = out.getvalue()
    assert "job-0123456789ab" in shown and "…" not in shown and "--wide shows all" in shown
    piped = io.StringIO()
    print_table(cols, rows, out=Console(file=piped, width=30))  # not a terminal: natural width
    assert "x" * 20 in piped.getvalue() and "y" * 20 in piped.getvalue() and "…" not in piped.getvalue()


def test_every_validation_error_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    errors = [{"field": f"workload.f{i}", "message": f"problem {i}"} for i in range(7)]
    print_error(SpecError("spec.yaml: workload.f0: problem 0 (and 6 more)", details={"errors": errors}))
    err = capsys.readouterr().err
    assert "more)" not in err and "7 problems" in err
    for i in range(7):
        assert f"  - workload.f{i}: problem {i}" in err


def test_run_view_costs_the_running_attempt() -> None:
    view = RunView()
    view.see({"kind": "placement", "time": "2026-01-01T00:00:00Z", "data": {}})
    doc = {
        "state": "running",
        "cost_usd": 1.0,
        "placement": {"devices": 4, "price_usd_per_device_hour": 2.0},
        "progress": {"step": 50, "total_steps": 100, "step_time_s": 2.0, "loss": 1.5, "tokens_per_s": 1000.0},
    }
    start = 1767225600.0  # 2026-01-01T00:00:00Z
    assert view.cost_so_far(doc, start + 1800) == pytest.approx(1.0 + 0.5 * 4 * 2.0)
    fields = view.fields(doc)
    assert fields["step"] == 50 and fields["total"] == 100 and "ETA 2 min" in fields["info"]
    view.see({"kind": "preempted", "time": "2026-01-01T00:30:00Z", "data": {"step": 50}})
    assert view.cost_so_far(doc, start + 3600) == 1.0 and "preempted 1×" in view.fields(doc)["info"]


HEAVY = ("torch", "fastapi", "sqlalchemy", "ortools", "ray", "numpy", "scipy", "uvicorn", "yaml")

PROBE = """
import sys
from trainyard.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stderr.write("LOADED " + ",".join(m for m in %r if m in sys.modules) + "\\n")
"""


@pytest.mark.parametrize("args", [["--help"], ["jobs", "list"], ["--version"], ["status"], ["jobs", "-h"]])
def test_start_up_imports_no_heavy_module(args: list[str], tmp_path: Any) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "TRAINYARD_HOME": str(tmp_path),
        "TRAINYARD_URL": f"http://127.0.0.1:{free_port()}",
        "TRAINYARD_API_KEY": "x",
    }
    import os

    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,), *args],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )
    loaded = next(ln for ln in proc.stderr.splitlines() if ln.startswith("LOADED"))
    assert loaded == "LOADED ", (args, loaded)
    if args == ["jobs", "list"]:  # no server there: one line, exit 8
        assert "cannot reach" in proc.stderr and "Traceback" not in proc.stderr
    if args in (["--version"], ["status"], ["--help"], ["jobs", "list"]):
        # nor pydantic's validators: strings, numbers and flags are coerced without them
        light = subprocess.run(
            [sys.executable, "-c", PROBE % (("typer._adapters",),), *args],
            env=env,
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "LOADED \n" in light.stderr, light.stderr


def test_light_coercion_matches_typers_own() -> None:
    """Strings, numbers and flags coerced without pydantic give Typer's results and messages."""
    from typer._coercion import build_runtime_param

    from trainyard.cli.coercion import light_runtime_param

    checked = 0
    for path, command in LEAVES:
        for param in command.params:
            light = light_runtime_param(param.type_descriptor)
            if light is None:
                continue
            typer_own = build_runtime_param(param.type_descriptor)
            samples: list[Any] = [param.default, None]
            if not (param.multiple or param.nargs == -1):
                samples += ["7", "0", "-3", "2.5", "x", "1e3", "600"] if param.type_descriptor.annotation in (
                    int, float, str) else []  # fmt: skip
            else:
                samples += [("a", "b"), ("3",)]
            for value in samples:
                outcomes = []
                for runtime in (light, typer_own):
                    try:
                        outcomes.append(("ok", runtime.coerce(value, param=param, ctx=CTX)))
                    except Exception as exc:  # the message is what a user sees
                        outcomes.append(("error", getattr(exc, "message", str(exc))))
                assert outcomes[0] == outcomes[1], (path, param.name, value, outcomes)
            checked += 1
    assert checked > 100
