"""`trainyard alerts rules`: the Prometheus alerting rules for the metrics trainyard exports."""

from __future__ import annotations

import sys

import typer
import yaml

from trainyard.cli.common import handle_errors, print_json

app = typer.Typer(help="Alerting rules for Prometheus.", no_args_is_help=True)


@app.command("rules")
@handle_errors
def rules(
    as_json: bool = typer.Option(False, "--json", help="Print the rules as one JSON document."),
) -> None:
    """Print the Prometheus rules file (load it with `rule_files:`; check it with `promtool check rules`)."""
    from trainyard.observability.rules import alert_rules_text

    text = alert_rules_text()
    if as_json:
        print_json(yaml.safe_load(text))
        return
    sys.stdout.write(text)
