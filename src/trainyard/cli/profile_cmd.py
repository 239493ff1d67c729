"""`trainyard profile SPEC [--steps N]`: time real training steps on this machine and store the profile."""

from __future__ import annotations

from pathlib import Path

import typer

from trainyard.cli.common import console, handle_errors, print_json
from trainyard.errors import InvalidInputError
from trainyard.settings import load_settings
from trainyard.spec.loader import load_spec


@handle_errors
def profile_command(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Job spec (YAML or JSON)."),
    steps: int = typer.Option(5, "--steps", min=1, help="Timed optimizer steps (median is recorded)."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="Untimed warm-up steps."),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: cuda when present)."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch CPU threads."),
    as_json: bool = typer.Option(False, "--json", help="Print the stored profile as JSON."),
    ranks: int = typer.Option(
        1,
        "--ranks",
        min=1,
        help="Ranks of a CPU gang on this host (data parallel over gloo, one process each, as the local "
        "pool runs a multi-device job); quotes for that many cpu devices then use it.",
    ),
) -> None:
    """Profile the spec's model on the local device; predictions for `cpu` then use the stored profiles."""
    from trainyard.runtime.profiler import profile_gang, profile_spec

    if device not in (None, "cpu", "cuda"):
        raise InvalidInputError(f"--device {device!r} is not cpu or cuda")
    if ranks > 1 and device == "cuda":
        raise InvalidInputError("--ranks profiles a CPU gang; it does not combine with --device cuda")
    spec = load_spec(spec_path)
    if ranks > 1:
        doc = profile_gang(spec, ranks=ranks, steps=steps, warmup=warmup, threads=threads or 1)
    else:
        doc = profile_spec(spec, steps=steps, warmup=warmup, device=device, threads=threads)
    from trainyard.services.profiles import store_profile

    path = store_profile(load_settings().home, doc)
    if as_json:
        print_json({**doc, "path": str(path)})
        return
    console.print(
        f"{spec.name}: median step {doc['step_time_s'] * 1000:.1f} ms over {steps} steps on "
        f"{doc['accelerator']} ({doc.get('devices', 1)} x {doc['threads']} threads), "
        f"peak memory {doc['peak_memory_gib']:.2f} GiB"
    )
    console.print(f"stored {path}")
