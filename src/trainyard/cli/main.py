"""The `trainyard` command. Each command group lives in its own module; this file only wires them.

Command modules are imported lazily, when their command runs: the scheduler pulls in OR-Tools and SciPy,
the runtime pulls in PyTorch, and `trainyard quote` should not pay for either.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperGroup

from trainyard import __version__

# name -> (module, attribute, one-line help shown in `trainyard --help`). An attribute that is a Typer app
# becomes a command group; a function becomes a single command.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "spec": ("trainyard.cli.spec_cmd", "app", "Validate job specs and print their JSON Schema."),
    "catalog": ("trainyard.cli.catalog_cmd", "app", "Accelerators and priced instance offers."),
    "predict": ("trainyard.cli.predict_cmd", "predict_command", "Predict step time and memory."),
    "profile": ("trainyard.cli.profile_cmd", "profile_command", "Time real training steps on this machine."),
    "quote": ("trainyard.cli.quote_cmd", "quote_command", "Rank every priced option for a job."),
    "schedule": ("trainyard.cli.schedule_cmd", "schedule", "Run one scheduling round over jobs and pools."),
    "simulate": ("trainyard.cli.simulate_cmd", "simulate", "Simulate a workload trace under a policy."),
    "trace": ("trainyard.cli.simulate_cmd", "trace_app", "Workload traces for the simulator."),
    "up": ("trainyard.cli.up_cmd", "up", "Start the platform (API, scheduler, executor, dashboard)."),
    "submit": ("trainyard.cli.submit_cmd", "submit", "Submit a job spec to the platform."),
    "jobs": ("trainyard.cli.jobs_cmd", "app", "Follow and control jobs on the platform."),
    "tenants": ("trainyard.cli.tenants_cmd", "app", "Tenants and their API keys (admin)."),
    "pools": ("trainyard.cli.pools_cmd", "app", "Live pools: capacity, prices, interruption rates."),
    "checkpoint": ("trainyard.cli.checkpoint_cmd", "app", "Inspect, verify and convert checkpoints."),
    "usage": ("trainyard.cli.usage_cmd", "app", "Usage from the ledger: reports, invoices."),
    "budgets": ("trainyard.cli.budgets_cmd", "app", "Dollar budgets per tenant and tag."),
    "models": ("trainyard.cli.models_cmd", "app", "Model registry: versions, lineage, aliases, promotion."),
    "eval": ("trainyard.cli.eval_cmd", "app", "Evaluate a model against a baseline (paired statistics)."),
    "deployments": ("trainyard.cli.deployments_cmd", "app", "Serve model versions (OpenAI-compatible API)."),
    "sweeps": ("trainyard.cli.sweeps_cmd", "app", "Hyperparameter sweeps priced and bounded as a group."),
    "export": ("trainyard.cli.export_cmd", "app", "Export a placement as a SkyPilot task or Kueue objects."),
    "datasets": ("trainyard.cli.datasets_cmd", "app", "Upload, validate and read dataset versions."),
}


def load_command(name: str) -> Any:
    """Import a command's module and turn its Typer app or function into a click command."""
    module_name, attribute, _ = COMMANDS[name]
    obj: Any = getattr(importlib.import_module(module_name), attribute)
    if isinstance(obj, typer.Typer):
        command = typer.main.get_command(obj)
        if not isinstance(command, TyperGroup):
            # Typer collapses an app with a single command into that command; keep it a group so that
            # `trainyard trace generate` stays `trace generate`.
            command = TyperGroup(name=name, commands=[command], help=COMMANDS[name][2], no_args_is_help=True)
    else:
        single = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
        single.command(name)(obj)
        command = typer.main.get_command(single)
    command.name = name
    return command


class LazyGroup(TyperGroup):
    """A Typer group whose registered commands are joined by the lazily imported ones."""

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in COMMANDS:
            return load_command(cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, COMMANDS[name][2]) for name in sorted(COMMANDS)]
        rows += [(n, c.get_short_help_str()) for n, c in sorted(self.commands.items())]
        with formatter.section("Commands"):
            formatter.write_dl(sorted(rows))


app = typer.Typer(
    name="trainyard",
    cls=LazyGroup,
    help="Train and fine-tune models on heterogeneous accelerators at the lowest expected cost.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    """Train and fine-tune models on heterogeneous accelerators at the lowest expected cost."""


@app.command("version")
def version() -> None:
    """Print the trainyard version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
