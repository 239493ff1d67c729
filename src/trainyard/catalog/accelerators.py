"""Accelerator hardware: memory, bandwidths, peak throughput per precision, software stack, compile needs.

Source: ``data/accelerators.csv`` (copied from the project's reference data; each row cites its
datasheet). Values the CSV does not hold (inter-node network, compile behaviour, the ``cpu`` entry)
are set here with their justification next to them.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from trainyard.catalog.names import ACCELERATOR_FAMILY, normalize_accelerator_name
from trainyard.errors import UnknownAcceleratorError


@dataclass(frozen=True)
class Accelerator:
    name: str
    family: str
    vendor: str
    memory_gib: float
    mem_bw_gbs: float  # HBM/DRAM bandwidth, GB/s
    peak_tflops: dict[str, float]  # dense peak by compute dtype: "bf16", "fp16", "fp32", "fp8"
    intra_node_gbs: float  # per-device intra-node interconnect, GB/s bidirectional aggregate
    inter_node_gbps: float  # per-device share of the inter-node network, Gbit/s
    software_stack: str
    compile_required: bool  # needs an ahead-of-time graph compile (XLA for TPU, Neuron for Trainium)
    first_compile_s: float  # typical first-compile time of a transformer training step, seconds
    max_devices_per_node: int
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for a compute dtype, falling back to the nearest supported one."""
        order = {
            "fp8": ["fp8", "bf16", "fp16", "fp32"],
            "bf16": ["bf16", "fp16", "fp32"],
            "fp16": ["fp16", "bf16", "fp32"],
            "fp32": ["fp32", "bf16"],
        }[dtype]
        for d in order:
            v = self.peak_tflops.get(d)
            if v:
                return v * 1e12
        raise ValueError(f"{self.name} has no peak throughput for {dtype}")

    def supports_dtype(self, dtype: str) -> bool:
        return bool(self.peak_tflops.get(dtype))


# Inter-node network per device (Gbit/s): AWS p4d 400 Gbps EFA / 8 GPUs = 50; p5/p5en 3200 Gbps / 8 = 400;
# GCP a3 (H100) 8 x 200 Gbps = 200; TPU slices use ICI inside the slice (the intra-node figure) and
# DCN between slices (v5p doc: 50 Gbps per chip, used for all TPUs); trn1n 1600 Gbps / 16 chips = 100;
# PCIe-only GPUs in cloud VMs get 25-100 Gbps per VM: 25 / device assumed.
_INTER_NODE_GBPS = {
    "k80": 10.0,
    "p100": 25.0,
    "v100": 25.0,
    "t4": 25.0,
    "a10g": 25.0,
    "l4": 25.0,
    "a100-40gb": 50.0,
    "a100-80gb": 50.0,
    "h100": 400.0,
    "h200": 400.0,
    "tpu-v4": 50.0,
    "tpu-v5e": 50.0,
    "tpu-v5p": 50.0,
    "tpu-v6e": 50.0,
    "trn1": 100.0,
    "trn2": 200.0,
    "mi250": 100.0,
    "mi300x": 400.0,
    "gaudi2": 300.0,
    "cpu": 25.0,
}
# Devices per node as sold: 8-GPU HGX boards; TPU hosts carry 4 chips (v5e/v6e: 8 per host for 1-8 slices,
# 4 on v4/v5p); trn1.32xlarge has 16 chips; trn2.48xlarge 16.
_MAX_DEVICES_PER_NODE = {
    "tpu-v4": 4,
    "tpu-v5p": 4,
    "tpu-v5e": 8,
    "tpu-v6e": 8,
    "trn1": 16,
    "trn2": 16,
    "cpu": 1,
}
# First compile of a transformer training step: XLA on TPU typically 2-10 min for billion-parameter models
# (MaxText/PyTorch-XLA reports); Neuron (neuronx-cc) 10-40 min cold, cached afterwards (Neuron docs advise
# neuron_parallel_compile because of it). We use 300 s for XLA and 1200 s for Neuron as typical values.
_COMPILE_S = {"google-tpu": 300.0, "aws-trainium": 1200.0}

# The `cpu` accelerator is not in the reference table: a generic 2-socket cloud host of ~64 cores (AVX-512,
# about 2 TFLOP/s fp32 peak, ~200 GB/s DRAM). The local pool overrides it with this machine's profile.
_CPU = Accelerator(
    name="cpu",
    family="cpu",
    vendor="generic",
    memory_gib=256.0,
    mem_bw_gbs=200.0,
    peak_tflops={"fp32": 2.0, "bf16": 2.0},
    intra_node_gbs=50.0,
    inter_node_gbps=25.0,
    software_stack="PyTorch CPU (oneDNN/MKL)",
    compile_required=False,
    first_compile_s=0.0,
    max_devices_per_node=1,
    source="trainyard estimate for a generic cloud CPU host; calibrated by `trainyard profile`",
)


def _num(v: str) -> float | None:
    v = v.strip()
    return float(v) if v else None


@cache
def load_accelerators() -> dict[str, Accelerator]:
    """All accelerators by canonical name."""
    out: dict[str, Accelerator] = {}
    text = resources.files("trainyard.catalog").joinpath("data/accelerators.csv").read_text(encoding="utf-8")
    for row in csv.DictReader(text.splitlines()):
        name = normalize_accelerator_name(row["name"])
        if name is None:
            continue  # variants without a canonical name (H100 PCIe) are not offered by the clouds here
        family = ACCELERATOR_FAMILY[name]
        bf16, fp32, fp8 = _num(row["bf16_tflops"]), _num(row["fp32_tflops"]), _num(row["fp8_tflops"])
        stack = row["software_stack"]
        peaks: dict[str, float] = {}
        if fp32:
            peaks["fp32"] = fp32
        if bf16:
            if "no BF16" in stack or "no tensor cores" in stack:
                peaks["fp16"] = bf16  # V100/T4/P100: the column holds the FP16 peak
            else:
                peaks["bf16"] = bf16
                peaks["fp16"] = bf16
        if fp8:
            peaks["fp8"] = fp8
        if family == "google-tpu" and "fp32" not in peaks:
            # TPU MXUs compute fp32 matmuls as multi-pass bf16 (about 1/3 to 1/6 of the bf16 rate).
            peaks["fp32"] = round(peaks["bf16"] / 4, 2)
        out[name] = Accelerator(
            name=name,
            family=family,
            vendor=row["vendor"],
            memory_gib=float(row["memory_gb"]),
            mem_bw_gbs=float(row["mem_bw_tbps"]) * 1000.0,
            peak_tflops=peaks,
            intra_node_gbs=float(row["intra_node_gbps_per_device"]),
            inter_node_gbps=_INTER_NODE_GBPS.get(name, 25.0),
            software_stack=stack,
            compile_required=family in _COMPILE_S,
            first_compile_s=_COMPILE_S.get(family, 0.0),
            max_devices_per_node=_MAX_DEVICES_PER_NODE.get(name, 8),
            source=row["source"],
        )
    out["cpu"] = _CPU
    return out


def get_accelerator(name: str) -> Accelerator:
    canonical = normalize_accelerator_name(name)
    accs = load_accelerators()
    if canonical is None or canonical not in accs:
        raise UnknownAcceleratorError(
            f"unknown accelerator {name!r}",
            hint=f"Known accelerators: {', '.join(sorted(accs))}.",
        )
    return accs[canonical]
