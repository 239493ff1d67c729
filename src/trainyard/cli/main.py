"""The `trainyard` command. Each command group lives in its own module; this file only wires them."""

from __future__ import annotations

import typer

from trainyard import __version__
from trainyard.cli import schedule_cmd, spec_cmd

app = typer.Typer(
    name="trainyard",
    help="Train and fine-tune models on heterogeneous accelerators at the lowest expected cost.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(spec_cmd.app, name="spec")
app.command("schedule")(schedule_cmd.schedule)


@app.command("version")
def version() -> None:
    """Print the trainyard version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
