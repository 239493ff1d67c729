"""The run record a training process writes for each attempt: what data, code, spec and environment
produced the model. Rank 0 emits it as a ``record`` event; the server stores it once, immutably.

Fields: ``spec_sha256`` (the resolved spec as run), ``datasets`` (version ids with the split sha256s
and row counts), ``code`` (the trainyard version and a sha256 over its source files, the git SHA of the
checkout it runs from when there is one, and the user's code archive sha256 when the job brought code),
``environment`` (Python, platform, every installed distribution and the sha256 of that lock, torch and
CUDA versions, the device), ``seeds`` and ``world_size``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainyard.executors.base import LaunchRequest
from trainyard.runtime.data import DATASET_MANIFEST_ENV

RECORD_SCHEMA = "trainyard/run-record/v1"


def spec_sha256(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@lru_cache(maxsize=1)
def installed_lock() -> tuple[str, ...]:
    """``name==version`` of every installed distribution, sorted (the lock of the environment)."""
    from importlib import metadata

    seen: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.name
        if name:
            seen.setdefault(name.lower().replace("_", "-"), dist.version)
    return tuple(f"{n}=={v}" for n, v in sorted(seen.items()))


@lru_cache(maxsize=1)
def source_sha256() -> str:
    """sha256 over the trainyard package's Python sources (relative path + bytes, sorted)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


@lru_cache(maxsize=1)
def git_sha() -> str | None:
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) == 40 else None


def environment() -> dict[str, Any]:
    import torch

    from trainyard import __version__

    lock = installed_lock()
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "trainyard": __version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "device_count": torch.cuda.device_count() if cuda else os.cpu_count(),
        "threads": torch.get_num_threads(),
        "executable": sys.executable,
        "packages": list(lock),
        "lock_sha256": hashlib.sha256("\n".join(lock).encode()).hexdigest(),
    }


def run_record(req: LaunchRequest, dataset: dict[str, Any]) -> dict[str, Any]:
    workload = req.spec.get("workload") or {}
    datasets: list[dict[str, Any]] = []
    manifest_doc = req.env.get(DATASET_MANIFEST_ENV) or os.environ.get(DATASET_MANIFEST_ENV)
    if manifest_doc:
        m = json.loads(manifest_doc)
        datasets.append(
            {
                "id": m.get("id"),
                "sha256": m.get("sha256"),
                "format": m.get("format"),
                "splits": {
                    k: {"sha256": v.get("sha256"), "rows": v.get("rows")}
                    for k, v in (m.get("splits") or {}).items()
                },
            }
        )
    elif workload.get("dataset"):
        datasets.append({"id": workload["dataset"], "sha256": None})
    return {
        "schema": RECORD_SCHEMA,
        "job_id": req.job_id,
        "attempt": req.attempt,
        "spec": req.spec,
        "spec_sha256": spec_sha256(req.spec),
        "datasets": datasets,
        "data": dataset,
        "code": {
            "trainyard_source_sha256": source_sha256(),
            "git_sha": git_sha(),
            "archive_sha256": req.env.get("TRAINYARD_CODE_SHA256"),
            "entrypoint": (req.spec.get("entrypoint") or {}).get("command"),
        },
        "environment": environment(),
        "seeds": {"workload": int(workload.get("seed", 0))},
        "world_size": req.world_size,
        "pool": req.pool,
        "precision": req.env.get("TRAINYARD_PRECISION") or workload.get("precision"),
    }
