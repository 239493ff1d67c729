"""The `trainyard` command: one grammar, ``trainyard <noun> <verb>``, with the short forms people type kept
as aliases (``trainyard submit`` = ``trainyard jobs submit``). This file only wires the command groups.

Command modules are imported lazily, when their command runs: the scheduler pulls in OR-Tools and SciPy,
the runtime pulls in PyTorch, the server FastAPI and SQLAlchemy, and `trainyard --help` or `jobs list`
should pay for none of them.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from trainyard import __version__

# noun -> (module, attribute, one-line help). An attribute that is a Typer app becomes the group.
GROUPS: dict[str, tuple[str, str, str]] = {
    "jobs": ("trainyard.cli.jobs_cmd", "app", "Submit, quote, follow and control training jobs."),
    "pools": ("trainyard.cli.pools_cmd", "app", "Live pools: capacity, prices, interruption rates."),
    "tenants": ("trainyard.cli.tenants_cmd", "app", "Tenants and their API keys (admin)."),
    "datasets": ("trainyard.cli.datasets_cmd", "app", "Upload, validate and read dataset versions."),
    "models": ("trainyard.cli.models_cmd", "app", "Model registry: versions, lineage, aliases, promotion."),
    "evals": ("trainyard.cli.eval_cmd", "app", "Evaluate a model against a baseline (paired statistics)."),
    "deployments": ("trainyard.cli.deployments_cmd", "app", "Serve model versions (OpenAI-compatible API)."),
    "usage": ("trainyard.cli.usage_cmd", "app", "Usage from the ledger: reports, invoices."),
    "budgets": ("trainyard.cli.budgets_cmd", "app", "Dollar budgets per tenant and tag."),
    "checkpoints": ("trainyard.cli.checkpoint_cmd", "app", "List, verify and convert checkpoints."),
    "specs": ("trainyard.cli.spec_cmd", "app", "Validate job specs and print their JSON Schema."),
    "catalog": ("trainyard.cli.catalog_cmd", "app", "Accelerators and priced instance offers."),
    "sweeps": ("trainyard.cli.sweeps_cmd", "app", "Hyperparameter sweeps priced and bounded as a group."),
    "export": ("trainyard.cli.export_cmd", "app", "Export a placement as a SkyPilot task or Kueue objects."),
    "traces": ("trainyard.cli.simulate_cmd", "trace_app", "Workload traces for the simulator."),
    "sim": ("", "", "Offline planning: simulate a trace, run one scheduling round."),
    "server": ("trainyard.cli.up_cmd", "app", "Start, inspect and stop the platform (up, status, down)."),
    "alerts": ("trainyard.cli.alerts_cmd", "app", "Prometheus alerting rules for trainyard's metrics."),
    "webhooks": (
        "trainyard.cli.webhooks_cmd",
        "app",
        "Webhooks for the tenant's alerts, and their deliveries.",
    ),
}

# verbs of a group that live in modules of their own: noun -> verb -> (module, function, help)
VERBS: dict[str, dict[str, tuple[str, str, str]]] = {
    "jobs": {
        "submit": ("trainyard.cli.submit_cmd", "submit", "Submit a job: placement, cost and time."),
        "quote": ("trainyard.cli.quote_cmd", "quote_command", "Rank every priced option for a job."),
        "predict": ("trainyard.cli.predict_cmd", "predict_command", "Predict step time and memory."),
    },
    "pools": {
        "profile": ("trainyard.cli.profile_cmd", "profile_command", "Time real training steps here."),
    },
    "sim": {
        "run": ("trainyard.cli.simulate_cmd", "simulate", "Simulate a workload trace under a policy."),
        "schedule": ("trainyard.cli.schedule_cmd", "schedule", "Run one scheduling round."),
    },
}

# what people type -> (noun, verb or None for the whole group)
ALIASES: dict[str, tuple[str, str | None]] = {
    "submit": ("jobs", "submit"),
    "quote": ("jobs", "quote"),
    "predict": ("jobs", "predict"),
    "profile": ("pools", "profile"),
    "simulate": ("sim", "run"),
    "schedule": ("sim", "schedule"),
    "up": ("server", "up"),
    "down": ("server", "down"),
    "status": ("server", "status"),
    "checkpoint": ("checkpoints", None),
    "eval": ("evals", None),
    "spec": ("specs", None),
    "trace": ("traces", None),
    "job": ("jobs", None),
    "pool": ("pools", None),
    "tenant": ("tenants", None),
    "dataset": ("datasets", None),
    "model": ("models", None),
    "deployment": ("deployments", None),
    "budget": ("budgets", None),
    "sweep": ("sweeps", None),
}

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 120}


class _TextOption(TyperOption):
    """An option taken as typed. Typer coerces every option value through a pydantic validator, and
    building the first one imports pydantic's validator machinery (most of a light command's start-up);
    the root's `--url` and every command's -h/--help are read as the string or flag they are."""

    def process_value(self, ctx: Any, value: Any) -> Any:
        if self.is_flag:
            value = bool(value)
        if self.callback is not None:
            value = self.callback(ctx, self, value)
        return value


def _light_help_option(command: Any) -> None:
    from typer._click.core import Context

    names = CONTEXT_SETTINGS["help_option_names"]
    option = command.get_help_option(Context(command, help_option_names=names))
    if option is not None and type(option) is TyperOption:
        option.__class__ = _TextOption


def _light_coercion(command: Any) -> None:
    """Plain strings, numbers (with their min/max) and flags are coerced without pydantic, with the
    same results and messages; anything else (paths, choices, files, parsers, clamping) keeps Typer's."""
    from trainyard.cli.coercion import light_runtime_param

    for param in command.params:
        if isinstance(param, TyperOption | TyperArgument) and param._runtime_param is None:
            light = light_runtime_param(param.type_descriptor)
            if light is not None:
                param._runtime_param = light


def _plain_help(command: Any) -> Any:
    """Plain help text everywhere (option names are never cut, whatever the width), and -h."""
    if isinstance(command, TyperCommand | TyperGroup):
        command.rich_markup_mode = None
        _light_help_option(command)
        _light_coercion(command)
    if getattr(command, "context_settings", None) is not None:
        command.context_settings = {**CONTEXT_SETTINGS, **command.context_settings}
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)
    return command


def _function_command(module_name: str, attribute: str, name: str, help_text: str | None = None) -> Any:
    obj: Any = getattr(importlib.import_module(module_name), attribute)
    single = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    single.command(name)(obj)
    command = typer.main.get_command(single)
    command.name = name
    return _plain_help(command)


class LazyGroup(TyperGroup):
    """A group whose commands are joined by lazily imported ones (``lazy``: verb -> module, attr, help)
    and aliases (``aliases``: what people type -> the real command)."""

    def __init__(
        self,
        *args: Any,
        lazy: dict[str, tuple[str, str, str]] | None = None,
        aliases: dict[str, tuple[str, str | None]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})
        self.aliases = dict(aliases or {})
        self.rich_markup_mode = None

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in self.lazy:
            module_name, attribute, help_text = self.lazy[cmd_name]
            return load_command(cmd_name, module_name, attribute, help_text)
        if cmd_name in self.aliases:
            noun, verb = self.aliases[cmd_name]
            group = self.get_command(ctx, noun)
            if verb is None:
                return group
            return group.get_command(ctx, verb) if group is not None else None
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, spec[2]) for name, spec in self.lazy.items()]
        rows += [(n, c.get_short_help_str(limit=300)) for n, c in self.commands.items() if not c.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(sorted(rows))
        if self.aliases:
            shortcuts = [
                (alias, f"= trainyard {noun}{' ' + verb if verb else ''}")
                for alias, (noun, verb) in sorted(self.aliases.items())
                if verb is not None or alias not in _SINGULARS
            ]
            with formatter.section("Shortcuts"):
                formatter.write_dl(shortcuts)


_SINGULARS = {"job", "pool", "tenant", "dataset", "model", "deployment", "budget", "sweep"}


class NounGroup(LazyGroup):
    """A noun built from a Typer app one verb at a time: a command's parameters are converted (Typer
    builds a validator per parameter) only when that verb runs, not for every verb of the group."""

    def __init__(self, *args: Any, verbs: dict[str, tuple[str, Any]], app_: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.verbs = verbs
        self.app_ = app_
        self._built: dict[str, Any] = {}

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.verbs})

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.verbs:
            return super().get_command(ctx, cmd_name)
        if cmd_name not in self._built:
            kind, info = self.verbs[cmd_name]
            short = self.app_.pretty_exceptions_short
            if kind == "command":
                built = typer.main.get_command_from_info(
                    info, pretty_exceptions_short=short, rich_markup_mode=None
                )
            else:
                built = typer.main.get_group_from_info(
                    info, pretty_exceptions_short=short, suggest_commands=True, rich_markup_mode=None
                )
            built.name = cmd_name
            self._built[cmd_name] = _plain_help(built)
        return self._built[cmd_name]

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, spec[2]) for name, spec in self.lazy.items()]
        rows += [(verb, _short_help(kind, info)) for verb, (kind, info) in self.verbs.items()]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(sorted(rows))


def _short_help(kind: str, info: Any) -> str:
    import inspect

    if kind == "group":
        text = info.help or (info.typer_instance.info.help if info.typer_instance else "") or ""
    else:
        text = info.help or inspect.getdoc(info.callback) or ""
    return inspect.cleandoc(str(text)).split("\n\n", 1)[0].replace("\n", " ")


def _noun_from_app(obj: Any, name: str, help_text: str, extra: dict[str, tuple[str, str, str]]) -> Any:
    import copy

    from typer.main import get_command_name

    shell = copy.copy(obj)  # the group's own callback and options, without its verbs
    shell.registered_commands = []
    shell.registered_groups = []
    base = typer.main.get_group(shell)
    verbs: dict[str, tuple[str, Any]] = {}
    for info in obj.registered_commands:
        verbs[info.name or get_command_name(info.callback.__name__)] = ("command", info)
    for info in obj.registered_groups:
        verbs[info.name] = ("group", info)
    return NounGroup(
        name=name,
        verbs=verbs,
        app_=obj,
        lazy=extra,
        help=base.help or help_text,
        params=base.params,
        callback=base.callback,
        invoke_without_command=base.invoke_without_command,
        no_args_is_help=base.no_args_is_help,
    )


def load_command(name: str, module_name: str, attribute: str, help_text: str) -> Any:
    """Import a command's module and turn its Typer app (a group, built verb by verb) or function (a
    command) into a click command; a group with verbs in other modules gets those lazily."""
    extra = VERBS.get(name, {})
    if not module_name:
        return _plain_help(LazyGroup(name=name, lazy=extra, help=help_text, no_args_is_help=True))
    obj: Any = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(obj, typer.Typer):
        return _function_command(module_name, attribute, name, help_text)
    return _plain_help(_noun_from_app(obj, name, help_text, extra))


class RootGroup(LazyGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, aliases=ALIASES, **kwargs)
        for param in self.params:
            if param.name == "url" and type(param) is TyperOption:
                param.__class__ = _TextOption
        _light_help_option(self)
        _light_coercion(self)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in GROUPS:
            module_name, attribute, help_text = GROUPS[cmd_name]
            return load_command(cmd_name, module_name, attribute, help_text)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted({*super().list_commands(ctx), *GROUPS})

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, spec[2]) for name, spec in GROUPS.items()]
        rows += [(n, c.get_short_help_str(limit=70)) for n, c in self.commands.items() if not c.hidden]
        with formatter.section("Commands"):
            formatter.write_dl(sorted(rows))
        shortcuts = [
            (alias, f"= trainyard {noun}{' ' + verb if verb else ''}")
            for alias, (noun, verb) in sorted(self.aliases.items())
            if alias not in _SINGULARS
        ]
        with formatter.section("Shortcuts"):
            formatter.write_dl(shortcuts)
        formatter.write_paragraph()
        formatter.write_text(
            "Every command takes --json (one JSON document on stdout; on failure the error document "
            "{error: {code, message, hint, details}} and a non-zero exit status) and -h for its help. "
            "The server is found through --url, TRAINYARD_URL, or $TRAINYARD_HOME/server.json written by "
            "`trainyard up`; the API key through TRAINYARD_API_KEY or $TRAINYARD_HOME/api_key."
        )


app = typer.Typer(
    name="trainyard",
    cls=RootGroup,
    help="Train and fine-tune models on heterogeneous accelerators at the lowest expected cost.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
    context_settings=CONTEXT_SETTINGS,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"trainyard {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    url: str = typer.Option(
        None, "--url", metavar="URL", help="Server to talk to (default: TRAINYARD_URL, then server.json)."
    ),
    version_: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Train and fine-tune models on heterogeneous accelerators at the lowest expected cost."""


@app.command("version")
def version(as_json: bool = typer.Option(False, "--json", help="Print {version, python} as JSON.")) -> None:
    """Print the trainyard version."""
    if as_json:
        from trainyard.cli.common import print_json

        print_json({"version": __version__, "python": sys.version.split()[0]})
        return
    typer.echo(__version__)


def _json_flag(argv: list[str]) -> bool:
    head = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in head


def main(argv: list[str] | None = None) -> None:
    """Entry point: click usage errors and unexpected exceptions become one line (and, with --json, an
    error document on stdout), never a traceback (TRAINYARD_DEBUG=1 shows it)."""
    from typer._click.exceptions import ClickException

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        rv = app(args=args, prog_name="trainyard", standalone_mode=False)
    except ClickException as exc:
        if _json_flag(args):
            from trainyard.cli.common import print_json

            print_json(
                {
                    "error": {
                        "code": "usage",
                        "message": exc.format_message(),
                        "hint": "Run the command with -h for its arguments and options.",
                        "details": {},
                    }
                }
            )
        exc.show()
        raise SystemExit(exc.exit_code) from None
    except (typer.Abort, EOFError):
        typer.echo("aborted", err=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise SystemExit(130) from None
    except SystemExit:
        raise
    except ModuleNotFoundError as exc:  # a command that needs an install extra that is not installed
        from trainyard.cli.common import fail
        from trainyard.errors import TrainyardError
        from trainyard.extras import missing_extra

        extra: TrainyardError | None = missing_extra(exc)
        if extra is None:
            if os.environ.get("TRAINYARD_DEBUG"):
                raise
            extra = TrainyardError(f"unexpected {type(exc).__name__}: {exc}")
        fail(extra, as_json=_json_flag(args))
    except Exception as exc:  # a bug: say so in one line, keep the traceback for TRAINYARD_DEBUG
        if os.environ.get("TRAINYARD_DEBUG"):
            raise
        from trainyard.errors import TrainyardError

        err = TrainyardError(f"unexpected {type(exc).__name__}: {exc}")
        from trainyard.cli.common import fail

        fail(err, as_json=_json_flag(args))
    raise SystemExit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
