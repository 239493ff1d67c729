"""Seeds and RNG state capture/restore for Python, NumPy and torch (exact resume on CPU)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import random
from typing import Any

import numpy as np
import torch


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed derived from the job seed and any labels (rank, purpose), stable across runs."""
    h = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "little") & (2**63 - 1)


def seed_everything(seed: int, rank: int = 0) -> None:
    s = derive_seed(seed, "rank", rank)
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


def configure_determinism(num_threads: int) -> None:
    """Fixed thread counts and deterministic kernels: bit-identical results run to run on CPU, and on
    CUDA (deterministic cuBLAS workspace, cuDNN without autotuning) — set before CUDA initialises."""
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.set_num_threads(max(1, num_threads))
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)


def capture_rng_state() -> dict[str, Any]:
    py_state = random.getstate()
    np_state: Any = np.random.get_state()
    return {
        "python": [py_state[0], list(py_state[1]), py_state[2]],
        "numpy": {
            "kind": np_state[0],
            "keys": base64.b64encode(np.asarray(np_state[1], dtype=np.uint32).tobytes()).decode(),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        **_cuda_rng_state(),
    }


def _cuda_rng_state() -> dict[str, Any]:
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    return {"cuda": [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]}


def restore_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    keys = np.frombuffer(base64.b64decode(n["keys"]), dtype=np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    raw = np.frombuffer(base64.b64decode(state["torch"]), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(raw))
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(
            [torch.from_numpy(np.frombuffer(base64.b64decode(c), dtype=np.uint8).copy()) for c in cuda]
        )
