"""Step-time and memory prediction per accelerator type and device count (pure)."""

from trainyard.predict.model import Prediction, predict

__all__ = ["Prediction", "predict"]
