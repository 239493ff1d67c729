"""Markets, preemption, checkpoint intervals and quotes: expected dollars and wall time per option (pure)."""

from trainyard.cost.model import CostParams
from trainyard.cost.quote import QuoteOption, candidate_device_counts, option_for, quote

__all__ = ["CostParams", "QuoteOption", "candidate_device_counts", "option_for", "quote"]
