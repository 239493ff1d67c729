"""`trainyard up`: the platform in the foreground on embedded defaults."""

from __future__ import annotations

import typer

from trainyard.cli.common import handle_errors
from trainyard.settings import load_settings


@handle_errors
def up(
    port: int = typer.Option(
        None, "--port", help="TCP port (default 8080, or TRAINYARD_PORT).", min=0, max=65535
    ),
    host: str = typer.Option(None, "--host", help="Interface to bind (default 127.0.0.1)."),
    executor: str = typer.Option(
        None,
        "--executor",
        help="Executor backend: local (default), ray, or none (queue jobs without running).",
    ),
    ray_address: str = typer.Option(
        None, "--ray-address", help="Ray cluster to run on with --executor ray (or TRAINYARD_RAY_ADDRESS)."
    ),
    ray_shared_paths: str = typer.Option(
        None,
        "--ray-shared-paths",
        help="Comma-separated local paths every Ray node mounts (or TRAINYARD_RAY_SHARED_PATHS); "
        "file:// checkpoint storage must lie under one of them.",
    ),
    loop_interval_s: float = typer.Option(
        0.5, "--loop-interval-s", min=0.05, max=60.0, help="Seconds between control-loop ticks."
    ),
) -> None:
    """Start the API, the scheduler loop and the executor (Ctrl-C stops gracefully)."""
    from trainyard.server import serve

    settings = load_settings()
    updates: dict[str, str] = {}
    if ray_address:
        updates["ray_address"] = ray_address
    if ray_shared_paths:
        updates["ray_shared_paths"] = ray_shared_paths
    if updates:
        settings = settings.model_copy(update=updates)
    serve(
        settings,
        host=host or settings.host,
        port=settings.port if port is None else port,
        executor=executor,
        loop_interval_s=loop_interval_s,
    )
