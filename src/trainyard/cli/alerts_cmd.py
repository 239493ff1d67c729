"""`trainyard alerts rules`: the Prometheus alerting rules for the metrics trainyard exports."""

from __future__ import annotations

import sys

import typer

from trainyard.cli.common import handle_errors

app = typer.Typer(help="Alerting rules for Prometheus.", no_args_is_help=True)


@app.command("rules")
@handle_errors
def rules() -> None:
    """Print the Prometheus rules file (load it with `rule_files:`; check it with `promtool check rules`)."""
    from trainyard.observability.rules import alert_rules_text

    sys.stdout.write(alert_rules_text())
