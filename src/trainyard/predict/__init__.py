"""Step-time and memory prediction per accelerator type and device count (pure)."""

from trainyard.predict.model import Prediction, predict, predict_grouped, predict_many
from trainyard.predict.params import Calibration, EfficiencyParams, default_calibration

__all__ = [
    "Calibration",
    "EfficiencyParams",
    "Prediction",
    "default_calibration",
    "predict",
    "predict_grouped",
    "predict_many",
]
