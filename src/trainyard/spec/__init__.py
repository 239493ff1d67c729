"""JobSpec and friends: the device-agnostic workload contract (DESIGN §3.2)."""

from trainyard.spec.loader import load_spec, load_spec_text, spec_from_dict
from trainyard.spec.models import (
    Architecture,
    JobSpec,
    Market,
    Method,
    ModelSpec,
    Optimizer,
    Precision,
    WorkloadSpec,
    parse_duration_s,
)

__all__ = [
    "Architecture",
    "JobSpec",
    "Market",
    "Method",
    "ModelSpec",
    "Optimizer",
    "Precision",
    "WorkloadSpec",
    "load_spec",
    "load_spec_text",
    "parse_duration_s",
    "spec_from_dict",
]
