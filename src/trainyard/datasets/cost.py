"""What one epoch over a dataset version costs: its train tokens as optimizer steps of a model, the
predicted step time and the price of the cheapest feasible placement.

The estimate is the quote of a one-epoch fine-tune (``workload.epochs: 1``) of ``model`` on the version,
priced exactly as a submission would be: the dataset fills ``dataset_tokens``
(:meth:`DatasetService.resolve_spec_document`), the registry fills the model's shape, and the
platform's quoter (the predictor, calibrated on measured step times, and the cost model) prices it on
the live pools and the packaged catalog. The cheapest feasible option is reported.
"""

from __future__ import annotations

from typing import Any

from trainyard.errors import InvalidInputError

DEFAULT_SEQ_LEN = 2048
DEFAULT_GLOBAL_BATCH = 16


def epoch_spec(dataset_id: str, model: str, seq_len: int, global_batch: int) -> dict[str, Any]:
    """The spec document of a one-epoch fine-tune of ``model`` on ``dataset_id``."""
    return {
        "apiVersion": "trainyard/v1",
        "kind": "TrainingJob",
        "name": "epoch-estimate",
        "model": {"base": model},
        "workload": {"dataset": dataset_id, "epochs": 1, "seq_len": seq_len, "global_batch": global_batch},
    }


def epoch_cost(
    platform: Any,
    principal: Any,
    ref: str,
    *,
    model: str | None = None,
    seq_len: int = DEFAULT_SEQ_LEN,
    global_batch: int = DEFAULT_GLOBAL_BATCH,
) -> dict[str, Any]:
    """``{dataset, model, seq_len, global_batch, train_tokens, steps_per_epoch, step_time_s,
    usd_per_hour, usd_per_epoch, hours_per_epoch, placement}``; ``model`` defaults to the base model
    whose tokenizer counted the version's tokens."""
    from trainyard.services.quoting import cost_quote, quote_pools
    from trainyard.spec.loader import spec_from_dict

    v = platform.datasets.resolve(principal.tenant_id, ref)
    model = model or (v.tokenizer if v.tokenizer != "bytes" else None)
    if model is None:
        raise InvalidInputError(
            f"{v.id} was counted in bytes: name the model an epoch is priced for",
            hint="Pass --model NAME@V (a registered model), or upload with --base NAME@V.",
            details={"errors": [{"field": "model", "message": "required for a byte-counted dataset"}]},
        )
    doc = platform.datasets.resolve_spec_document(principal, epoch_spec(v.id, model, seq_len, global_batch))
    spec = platform.registry.resolve_spec(principal.tenant_id, spec_from_dict(doc))
    pools = quote_pools(platform.pools.pools(), with_catalog=platform.options.with_catalog)
    options = [o for o in (platform.options.quoter or cost_quote)(spec, pools) if o.feasible]
    if not options:
        raise InvalidInputError(
            f"no placement can train {model} on {v.id}",
            hint="See `trainyard quote` with this spec for each option's reason.",
            details={"errors": [{"field": "model", "message": "no feasible placement"}]},
        )
    best = min(options, key=lambda o: o.expected_cost_usd)
    return {
        "dataset": v.id,
        "model": spec.model.base or model,
        "seq_len": seq_len,
        "global_batch": global_batch,
        "train_tokens": v.train.tokens,
        "train_rows": v.train.rows,
        "steps_per_epoch": int(best.total_steps),
        "step_time_s": float(best.step_time_s),
        "usd_per_hour": float(best.price_usd_per_hour),
        "usd_per_epoch": float(best.expected_cost_usd),
        "hours_per_epoch": float(best.expected_hours),
        "placement": {
            "pool": best.pool or None,
            "accelerator": best.accelerator,
            "devices": int(best.devices),
            "market": best.market,
            "cloud": best.cloud,
            "region": best.region,
            "instance_type": best.instance_type,
        },
    }
