"""The `trainyard` command. Each command group lives in its own module; this file only wires them."""

from __future__ import annotations

import typer

from trainyard import __version__
from trainyard.cli import schedule_cmd, spec_cmd
from trainyard.cli import catalog_cmd, quote_cmd
from trainyard.cli import simulate_cmd
from trainyard.cli import jobs_cmd, pools_cmd, submit_cmd, tenants_cmd, up_cmd
from trainyard.cli import predict_cmd, profile_cmd
from trainyard.cli import checkpoint_cmd

app = typer.Typer(
    name="trainyard",
    help="Train and fine-tune models on heterogeneous accelerators at the lowest expected cost.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(spec_cmd.app, name="spec")
app.add_typer(catalog_cmd.app, name="catalog")
app.command("quote")(quote_cmd.quote_command)
app.command("simulate")(simulate_cmd.simulate)
app.add_typer(simulate_cmd.trace_app, name="trace")
app.command("schedule")(schedule_cmd.schedule)
app.command("up")(up_cmd.up)
app.command("submit")(submit_cmd.submit)
app.add_typer(jobs_cmd.app, name="jobs")
app.add_typer(tenants_cmd.app, name="tenants")
app.add_typer(pools_cmd.app, name="pools")
app.command("predict")(predict_cmd.predict_command)
app.command("profile")(profile_cmd.profile_command)
app.add_typer(checkpoint_cmd.app, name="checkpoint")


@app.command("version")
def version() -> None:
    """Print the trainyard version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
