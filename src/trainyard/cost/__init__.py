"""Markets, preemption, checkpoint intervals and quotes: expected dollars and wall time per option (pure).

The names below are imported on first use, so that ``trainyard.cost.money`` (the display formatter every
CLI command uses) does not pull in the quote model and NumPy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.cost.model import CostParams
    from trainyard.cost.quote import QuoteOption, candidate_device_counts, option_for, quote

__all__ = ["CostParams", "QuoteOption", "candidate_device_counts", "option_for", "quote"]

_HOME = {
    "CostParams": "trainyard.cost.model",
    "QuoteOption": "trainyard.cost.quote",
    "candidate_device_counts": "trainyard.cost.quote",
    "option_for": "trainyard.cost.quote",
    "quote": "trainyard.cost.quote",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'trainyard.cost' has no attribute {name!r}")
