"""`trainyard deployments create|get|list|traffic|delete`: serve model versions (DESIGN §3.9)."""

from __future__ import annotations

from typing import Any

import typer

from trainyard.cli._remote import client
from trainyard.cli.common import Col, console, handle_errors, print_json, print_table
from trainyard.errors import InvalidInputError

app = typer.Typer(help="Serve model versions behind an OpenAI-compatible API.", no_args_is_help=True)


def _contract(doc: dict[str, Any]) -> dict[str, Any]:
    """The deployment document with the additive fields the server adds."""
    return doc


def _print(doc: dict[str, Any]) -> None:
    console.print(
        f"deployment [bold]{doc['name']}[/] {doc['state']} · {doc['replicas']} replica(s) · {doc['url']}"
    )
    for r in doc["routes"]:
        kind = " shadow" if r.get("shadow") else " canary" if r.get("canary") else ""
        console.print(f"  {r['model']} ({r.get('version')}) weight {r['weight']:g}{kind}")


def _parse_tags(tags: list[str]) -> dict[str, str]:
    out = {}
    for t in tags:
        if "=" not in t:
            raise InvalidInputError(f"--tag {t!r} is not KEY=VALUE")
        k, v = t.split("=", 1)
        out[k] = v
    return out


@app.command("create")
@handle_errors
def create(
    name: str = typer.Argument(..., help="Deployment name (the `model` clients send)."),
    model: str = typer.Option(..., "--model", help="Model version or alias: NAME@V or NAME@ALIAS."),
    min_replicas: int = typer.Option(1, "--min-replicas", min=0, help="0 allows scale to zero."),
    max_replicas: int = typer.Option(None, "--max-replicas", min=1, help="Upper bound for autoscaling."),
    target_in_flight: float = typer.Option(4.0, "--target-in-flight", help="In-flight requests per replica."),
    scale_up_delay_s: float = typer.Option(0.0, "--scale-up-delay-s", min=0),
    scale_down_delay_s: float = typer.Option(30.0, "--scale-down-delay-s", min=0),
    cold_start_timeout_s: float = typer.Option(120.0, "--cold-start-timeout-s", min=0.1),
    tag: list[str] = typer.Option([], "--tag", help="KEY=VALUE attributed to every request (repeatable)."),
    engine: str = typer.Option(
        "transformers", "--engine", help="Inference engine: transformers (built in) or vllm (if installed)."
    ),
    wait: bool = typer.Option(False, "--wait", help="Wait until the deployment serves."),
    as_json: bool = typer.Option(False, "--json", help="Print the deployment as JSON."),
) -> None:
    """Deploy a registered model version (or follow an alias)."""
    with client() as c:
        doc = c.create_deployment(
            name,
            model,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            target_in_flight=target_in_flight,
            scale_up_delay_s=scale_up_delay_s,
            scale_down_delay_s=scale_down_delay_s,
            cold_start_timeout_s=cold_start_timeout_s,
            tags=_parse_tags(tag),
            engine=engine,
        )
        if wait:
            doc = c.wait_deployment(name, timeout_s=max(120.0, cold_start_timeout_s))
    if as_json:
        print_json(_contract(doc))
    else:
        _print(doc)


@app.command("get")
@handle_errors
def get(
    name: str = typer.Argument(..., help="Deployment name."),
    as_json: bool = typer.Option(False, "--json", help="Print the deployment as JSON."),
) -> None:
    """Show a deployment (`state: ready` once it serves)."""
    with client() as c:
        doc = c.get_deployment(name)
    if as_json:
        print_json(_contract(doc))
    else:
        _print(doc)


@app.command("list")
@handle_errors
def list_(as_json: bool = typer.Option(False, "--json", help="Print {deployments} as JSON.")) -> None:
    """List the tenant's deployments."""
    with client() as c:
        doc = c.list_deployments()
    if as_json:
        print_json({"deployments": [_contract(d) for d in doc["deployments"]]})
        return
    rows = []
    for d in doc["deployments"]:
        routes = ", ".join(
            f"{r['model']}={r['weight']:g}{'(shadow)' if r['shadow'] else ''}" for r in d["routes"]
        )
        rows.append([d["name"], d["state"], d["model"], routes, str(d["replicas"])])
    cols = (Col("NAME", key=True), Col("STATE"), Col("MODEL", key=True), Col("ROUTES"), Col("REPLICAS"))
    print_table(cols, rows)


@app.command("traffic")
@handle_errors
def traffic(
    name: str = typer.Argument(..., help="Deployment name."),
    route: list[str] = typer.Option([], "--route", help="MODEL=WEIGHT (repeatable): weighted A/B routes."),
    shadow: list[str] = typer.Option(
        [], "--shadow", help="MODEL mirrored without being returned (repeatable)."
    ),
    canary: str = typer.Option(None, "--canary", help="MODEL=WEIGHT: a canary rolled back on a breach."),
    max_error_rate: float = typer.Option(0.05, "--max-error-rate", min=0, max=1),
    max_p95_latency_s: float = typer.Option(None, "--max-p95-latency-s", min=0),
    window_s: float = typer.Option(60.0, "--window-s", min=0.1),
    min_requests: int = typer.Option(10, "--min-requests", min=1),
    as_json: bool = typer.Option(False, "--json", help="Print the deployment as JSON."),
) -> None:
    """Set a deployment's routes: weights, shadows and a canary with automatic rollback."""
    routes: list[dict[str, Any]] = []
    for spec in route:
        model, sep, weight = spec.rpartition("=")
        if not sep or not model:
            raise InvalidInputError(
                f"--route {spec!r} is not MODEL=WEIGHT", hint="Example: --route tiny@2=10"
            )
        try:
            routes.append({"model": model, "weight": float(weight)})
        except ValueError:
            raise InvalidInputError(f"--route {spec!r}: weight {weight!r} is not a number") from None
    canary_doc = None
    if canary:
        model, sep, weight = canary.rpartition("=")
        if not sep or not model:
            raise InvalidInputError(f"--canary {canary!r} is not MODEL=WEIGHT")
        routes.append({"model": model, "weight": float(weight), "canary": True})
        canary_doc = {
            "max_error_rate": max_error_rate,
            "max_p95_latency_s": max_p95_latency_s,
            "window_s": window_s,
            "min_requests": min_requests,
        }
    routes += [{"model": m, "weight": 0, "shadow": True} for m in shadow]
    if not routes:
        raise InvalidInputError("give at least one --route MODEL=WEIGHT")
    with client() as c:
        doc = c.set_traffic(name, routes, canary=canary_doc)
    if as_json:
        print_json(_contract(doc))
    else:
        _print(doc)


@app.command("delete")
@handle_errors
def delete(
    name: str = typer.Argument(..., help="Deployment name."),
    as_json: bool = typer.Option(False, "--json", help="Print {name, deleted} as JSON."),
) -> None:
    """Delete a deployment; replicas no other deployment needs stop."""
    with client() as c:
        c.delete_deployment(name)
    if as_json:
        print_json({"name": name, "deleted": True})
    else:
        console.print(f"deployment {name} deleted")
