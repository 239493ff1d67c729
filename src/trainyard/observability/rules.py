"""The Prometheus alerting rules shipped with trainyard (``data/alert_rules.yml``), over the metrics
``/metrics`` exports: stalled jobs, NaN or diverging loss, checkpoint failures, restarts, budgets,
deployment error rate and latency. ``trainyard alerts rules`` prints them."""

from __future__ import annotations

from importlib import resources


def alert_rules_text() -> str:
    """The rules file, as Prometheus loads it (``rule_files:``)."""
    return (resources.files("trainyard.observability") / "data" / "alert_rules.yml").read_text("utf-8")
