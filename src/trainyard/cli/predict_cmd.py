"""`trainyard predict`: step time, memory and plan per accelerator (DESIGN §3.3)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from trainyard.catalog.accelerators import get_accelerator, load_accelerators
from trainyard.cli.common import console, handle_errors, print_json
from trainyard.errors import InvalidInputError, TrainyardError
from trainyard.predict import Calibration, Prediction, default_calibration, predict
from trainyard.settings import load_settings
from trainyard.spec.loader import load_spec, spec_from_dict


def resolve_calibration(calibration_file: Path | None, use_profiles: bool) -> Calibration:
    """The packaged calibration, or a file's, plus this machine's CPU profiles when there are any — the
    same calibration ``trainyard quote`` and the server start from."""
    from trainyard.services.profiles import profile_calibration

    if calibration_file is not None:
        try:
            cal = Calibration.from_document(json.loads(calibration_file.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError, ValueError, TypeError) as exc:
            raise InvalidInputError(
                f"{calibration_file}: not a calibration document ({exc.__class__.__name__}: {exc})",
                hint="Pass a JSON file written from Calibration.to_document().",
            ) from None
    else:
        cal = default_calibration()
    return profile_calibration(load_settings().home if use_profiles else None, base=cal)


def _fmt_s(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def _plan_text(plan: dict[str, Any]) -> str:
    if not plan:
        return "-"
    parts = [f"dp{plan['data']}"]
    if plan.get("fsdp"):
        parts.append(f"fsdp({plan.get('fsdp_scope')})")
    if plan["tensor"] > 1:
        parts.append(f"tp{plan['tensor']}")
    if plan["pipeline"] > 1:
        parts.append(f"pp{plan['pipeline']}")
    if plan.get("expert", 1) > 1:
        parts.append(f"ep{plan['expert']}")
    parts.append(f"mb{plan['micro_batch']}x{plan['grad_accum']}")
    if plan["activation_checkpointing"] != "none":
        parts.append(f"ckpt:{plan['activation_checkpointing']}")
    return " ".join(parts)


def _one(spec_doc: Any, accelerator: str, devices: Any, cal: Calibration) -> dict[str, Any]:
    if not isinstance(accelerator, str):
        raise InvalidInputError("accelerator must be a name")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise InvalidInputError("devices must be a positive integer")
    spec = load_spec(spec_doc) if isinstance(spec_doc, str) else spec_from_dict(spec_doc)
    return predict(spec, get_accelerator(accelerator), devices, calibration=cal).to_contract()


def _batch(path: Path, cal: Calibration) -> None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read ({exc.__class__.__name__})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            if not isinstance(item, dict):
                raise InvalidInputError("each line must be a JSON object")
            missing = [k for k in ("spec", "accelerator", "devices") if k not in item]
            if missing:
                raise InvalidInputError(f"missing {', '.join(missing)}")
            doc = _one(item["spec"], item["accelerator"], item["devices"], cal)
        except json.JSONDecodeError as exc:
            doc = {"error": f"line {n}: malformed JSON: {exc.msg}"}
        except TrainyardError as exc:
            doc = {"error": f"line {n}: {exc.message}"}
        except ValueError as exc:
            doc = {"error": f"line {n}: {exc}"}
        print_json(_finite(doc))


def _finite(doc: dict[str, Any]) -> dict[str, Any]:
    """JSON has no Infinity: an impossible plan reports null step time and memory."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in doc.items()}


def _table(spec_path: Path, devices: int | None, cal: Calibration) -> None:
    spec = load_spec(spec_path)
    table = Table(
        title=f"{spec.name}: {spec.params / 1e9:.2f} B parameters, {spec.tokens_per_step:,} tokens/step"
    )
    for col in (
        "accelerator",
        "devices",
        "step time",
        "p10-p90",
        "MFU",
        "GiB/device",
        "fits",
        "plan",
        "basis",
    ):
        table.add_column(col, overflow="fold")
    start = spec.resources.min_devices or 1
    for acc in load_accelerators().values():
        if devices is not None:
            p = predict(spec, acc, devices, calibration=cal)
        else:
            p = predict(spec, acc, start, calibration=cal)
            n = start
            while not p.fits and n < 512:
                n = p.min_devices_to_fit if p.min_devices_to_fit and p.min_devices_to_fit <= 512 else n * 2
                p = predict(spec, acc, min(n, 512), calibration=cal)
        table.add_row(
            acc.name,
            str(p.devices),
            _fmt_s(p.step_time_s),
            f"{_fmt_s(p.step_time_p10_s)}-{_fmt_s(p.step_time_p90_s)}" if p.fits else "-",
            f"{p.mfu:.0%}" if p.fits else "-",
            f"{p.memory_per_device_gib:.1f}/{p.memory_capacity_gib:.0f}"
            if math.isfinite(p.memory_per_device_gib)
            else "-",
            "[green]yes[/]" if p.fits else "[red]no[/]",
            _plan_text(p.plan),
            p.source,
        )
    console.print(table)
    console.print(
        "[dim]basis: calibrated = fitted to measurements of this accelerator or its group; "
        "family-fallback / prior = no measurements of its own (wider p10-p90)[/]"
    )


def _show(p: Prediction) -> None:
    console.print(
        f"[bold]{p.accelerator}[/] x {p.devices}: step {_fmt_s(p.step_time_s)} "
        f"(p10 {_fmt_s(p.step_time_p10_s)}, p90 {_fmt_s(p.step_time_p90_s)}), "
        f"{p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.1%}, "
        f"{p.memory_per_device_gib:.1f} of {p.memory_capacity_gib:.1f} GiB per device, "
        + ("[green]fits[/]" if p.fits else "[red]does not fit[/]")
    )
    console.print(f"  plan: {_plan_text(p.plan)}  [dim]({p.source}; {p.calibration_key})[/]")
    if p.reason:
        console.print(f"  reason: {p.reason}")
    for n in p.notes:
        console.print(f"  [dim]note: {n}[/]")


@handle_errors
def predict_command(
    spec_path: Path | None = typer.Argument(None, metavar="SPEC", help="Job spec (YAML or JSON)."),
    accelerator: str | None = typer.Option(None, "--accelerator", "-a", help="Accelerator name."),
    devices: int | None = typer.Option(None, "--devices", "-n", min=1, help="Device count."),
    batch: Path | None = typer.Option(
        None, "--batch", help='JSON Lines of {"spec", "accelerator", "devices"}.'
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (one document, or one per batch line)."),
    calibration_file: Path | None = typer.Option(None, "--calibration", help="Calibration JSON to use."),
    use_profiles: bool = typer.Option(True, "--profiles/--no-profiles", help="Use stored CPU profiles."),
) -> None:
    """Predict step time, memory per device and the parallelism plan of a job."""
    cal = resolve_calibration(calibration_file, use_profiles)
    if batch is not None:
        if spec_path is not None:
            raise InvalidInputError("give either SPEC or --batch, not both")
        _batch(batch, cal)
        return
    if spec_path is None:
        raise InvalidInputError(
            "give a job spec (or --batch FILE)", hint="trainyard predict SPEC --accelerator h100"
        )
    if accelerator is None:
        if as_json:
            spec = load_spec(spec_path)
            n = devices or 1
            print_json(
                {
                    "predictions": [
                        _finite(predict(spec, a, n, calibration=cal).to_contract())
                        for a in load_accelerators().values()
                    ]
                }
            )
            return
        _table(spec_path, devices, cal)
        return
    spec = load_spec(spec_path)
    p = predict(spec, get_accelerator(accelerator), devices or 1, calibration=cal)
    if as_json:
        print_json(_finite(p.to_contract()))
    else:
        _show(p)
