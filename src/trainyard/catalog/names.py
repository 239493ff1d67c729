"""Canonical accelerator names, families and aliases (DESIGN §3.2).

Kept separate from the data tables so the spec can validate names without loading prices.
"""

from __future__ import annotations

import re

# Canonical name -> family.
ACCELERATOR_FAMILY: dict[str, str] = {
    "k80": "nvidia",
    "p100": "nvidia",
    "v100": "nvidia",
    "t4": "nvidia",
    "a10g": "nvidia",
    "l4": "nvidia",
    "a100-40gb": "nvidia",
    "a100-80gb": "nvidia",
    "h100": "nvidia",
    "h200": "nvidia",
    "tpu-v4": "google-tpu",
    "tpu-v5e": "google-tpu",
    "tpu-v5p": "google-tpu",
    "tpu-v6e": "google-tpu",
    "trn1": "aws-trainium",
    "trn2": "aws-trainium",
    "mi250": "amd",
    "mi300x": "amd",
    "gaudi2": "intel-gaudi",
    "cpu": "cpu",
}
ACCELERATOR_NAMES: tuple[str, ...] = tuple(ACCELERATOR_FAMILY)
FAMILIES: tuple[str, ...] = ("nvidia", "google-tpu", "aws-trainium", "amd", "intel-gaudi", "cpu")

# Frameworks a job may require (escape hatches) -> the families that provide them.
FRAMEWORKS: dict[str, frozenset[str]] = {
    "cuda-kernels": frozenset({"nvidia"}),
    "cuda": frozenset({"nvidia"}),
    "triton": frozenset({"nvidia", "amd"}),
    "rocm": frozenset({"amd"}),
    "xla": frozenset({"google-tpu", "aws-trainium", "nvidia", "amd", "cpu"}),
    "jax": frozenset({"google-tpu", "nvidia", "amd", "cpu"}),
    "neuron": frozenset({"aws-trainium"}),
    "pytorch": frozenset(FAMILIES),
}

_ALIASES: dict[str, str] = {
    "a100": "a100-40gb",
    "a100-40g": "a100-40gb",
    "a100-sxm4-40gb": "a100-40gb",
    "a100-80g": "a100-80gb",
    "a100-sxm4-80gb": "a100-80gb",
    "h100-80gb": "h100",
    "h100-sxm5-80gb": "h100",
    "h100-sxm": "h100",
    "h100-mega": "h100",
    "h200-141gb": "h200",
    "h200-sxm-141gb": "h200",
    "v100-sxm2-32gb": "v100",
    "v100-32gb": "v100",
    "trainium": "trn1",
    "trainium1": "trn1",
    "trainium2": "trn2",
    "trn1n": "trn1",
    "tpu-v5litepod": "tpu-v5e",
    "tpu-v5-lite": "tpu-v5e",
    "tpuv4": "tpu-v4",
    "p100-pcie-16gb": "p100",
    "gaudi-2": "gaudi2",
    "mi250x": "mi250",
}


def normalize_accelerator_name(name: str) -> str | None:
    """Map a user's or a data source's spelling to the canonical name, or None if unknown."""
    key = re.sub(r"[\s_]+", "-", name.strip().lower())
    key = re.sub(r"\(.*?\)", "", key).strip("-")
    if key in ACCELERATOR_FAMILY:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    return None


def family_of(accelerator: str) -> str:
    return ACCELERATOR_FAMILY[accelerator]
