"""`trainyard export skypilot|kueue SPEC|JOB`: hand trainyard's placement decision to SkyPilot or Kueue.

SPEC is a job spec file, quoted here against `--pools` (or the packaged catalog); JOB is the id of a job
on the platform, quoted against the server's pools, and a placed job exports the pool it was placed on.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import typer
import yaml

from trainyard.catalog.offers import catalog_pools, load_offers, with_catalog_price
from trainyard.catalog.pools import Pool, load_pools, pools_from_dict
from trainyard.cli.common import handle_errors, print_json
from trainyard.cost.model import CostParams
from trainyard.cost.quote import QuoteOption, quote
from trainyard.errors import InvalidInputError
from trainyard.settings import load_settings
from trainyard.spec import JobSpec, load_spec

app = typer.Typer(
    help="Export a job's placement as a SkyPilot task or Kueue objects.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

TARGET = typer.Argument(..., metavar="SPEC|JOB", help="A job spec file, or the id of a job on the platform.")
POOLS = typer.Option(None, "--pools", help="POOLS file to quote a SPEC against (default: the catalog).")
OPTION = typer.Option(1, "--option", min=1, help="Export the N-th feasible option of the quote.")
AS_JSON = typer.Option(False, "--json", help="Print the document as JSON instead of YAML.")


def _resolve(target: str, pools_path: Path | None) -> tuple[JobSpec, list[Pool], str | None, str | None]:
    """(spec, pools, job id, placed pool) for a spec file or a job id."""
    path = Path(target)
    if path.exists():
        spec = load_spec(path)
        pools = load_pools(pools_path) if pools_path else list(catalog_pools())
        return spec, pools, None, None
    if not target.startswith("job-"):
        raise InvalidInputError(
            f"{target!r} is neither a spec file nor a job id",
            hint="Pass a job spec (YAML or JSON) or a job id such as job-3f2a9c1b7d4e.",
        )
    from trainyard.cli._remote import client

    with client() as c:
        doc = c.get_job(target)
        pools_doc = c.list_pools()
    if not doc.get("spec"):
        raise InvalidInputError(f"job {target} has no stored spec to export")
    spec = JobSpec.model_validate(doc["spec"])
    if pools_path:
        pools = load_pools(pools_path)
    else:
        keep = set(Pool.model_fields)
        pools = pools_from_dict(
            {"pools": [{k: v for k, v in p.items() if k in keep} for p in pools_doc.get("pools", [])]},
            source="the server's pools",
        )
    placed = (doc.get("placement") or {}).get("pool")
    return spec, pools, target, placed


def _quote(spec: JobSpec, pools: list[Pool]) -> tuple[list[QuoteOption], list[Pool]]:
    params = CostParams(reserved_discount=load_settings().reserved_discount_1y)
    priced = [with_catalog_price(p, reserved_discount=params.reserved_discount) for p in pools]
    return quote(spec, priced, params=params, now=datetime.now(UTC)), priced


def _option_index(options: list[QuoteOption], placed: str | None, option: int) -> int:
    """A placed job exports its own pool unless --option says otherwise."""
    if placed is None or option != 1:
        return option
    from trainyard.interop.launch import exportable

    for i, o in enumerate(exportable(options), 1):
        if o.pool == placed:
            return i
    return option


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (run scripts) as literal blocks, so the YAML reads like a hand-written task."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def _emit(doc: object, as_json: bool, out: Path | None) -> None:
    if as_json:
        print_json(doc)
        return
    if isinstance(doc, list):
        text = yaml.dump_all(doc, Dumper=_BlockDumper, sort_keys=False, width=1000)
    else:
        text = yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False, width=1000)
    if out is not None:
        out.write_text(text)
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text, nl=False)


@app.command("skypilot")
def skypilot(
    target: str = TARGET,
    pools_path: Path | None = POOLS,
    option: int = OPTION,
    any_of: int = typer.Option(0, "--any-of", min=0, help="Add up to N runner-ups as `any_of` resources."),
    setup: str | None = typer.Option(
        None, "--setup", help="Setup command that installs trainyard on the nodes."
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the YAML here instead of stdout."),
    as_json: bool = AS_JSON,
) -> None:
    """A SkyPilot task YAML for the chosen quote option (`sky launch` runs trainyard's worker on it)."""
    _skypilot(target, pools_path, option, any_of, setup, out, as_json)


@handle_errors
def _skypilot(
    target: str, pools_path: Path | None, option: int, any_of: int, setup: str | None, out: Path | None,
    as_json: bool,
) -> None:  # fmt: skip
    from trainyard.interop.skypilot import skypilot_task

    spec, pools, job_id, placed = _resolve(target, pools_path)
    options, _ = _quote(spec, pools)
    task = skypilot_task(
        spec,
        options,
        offers=load_offers(),
        option_index=_option_index(options, placed, option),
        any_of=any_of,
        job_id=job_id,
        setup=setup,
    )
    _emit(task, as_json, out)


@app.command("kueue")
def kueue(
    target: str = TARGET,
    pools_path: Path | None = POOLS,
    option: int = OPTION,
    flavors: int = typer.Option(4, "--flavors", min=1, help="ResourceFlavors: the option and runner-ups."),
    namespace: str = typer.Option("default", "--namespace", help="Namespace of the Workload and LocalQueue."),
    image: str = typer.Option("trainyard-worker:latest", "--image", help="Container image with trainyard."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the YAML here instead of stdout."),
    as_json: bool = AS_JSON,
) -> None:
    """A Kueue Workload plus the ResourceFlavors, ClusterQueue and LocalQueue of the pools involved."""
    _kueue(target, pools_path, option, flavors, namespace, image, out, as_json)


@handle_errors
def _kueue(
    target: str, pools_path: Path | None, option: int, flavors: int, namespace: str, image: str,
    out: Path | None, as_json: bool,
) -> None:  # fmt: skip
    from trainyard.interop.kueue import kueue_manifests

    spec, pools, job_id, placed = _resolve(target, pools_path)
    options, priced = _quote(spec, pools)
    objects = kueue_manifests(
        spec,
        options,
        priced,
        option_index=_option_index(options, placed, option),
        flavors=flavors,
        job_id=job_id,
        namespace=namespace,
        image=image,
    )
    _emit({"items": objects} if as_json else objects, as_json, out)
