"""This machine's profiles (``trainyard profile``, or the brief measurement at first start) and the one
calibration built from them.

Profiles live in ``$TRAINYARD_HOME/profiles/*.json``. :func:`profile_calibration` folds the CPU ones
into the packaged calibration; ``trainyard predict``, ``trainyard quote``, the server's quoter and the
scheduler all start from it (the server adds finished jobs' step times on top, see
:mod:`trainyard.services.feedback`), so they agree on the same spec after a profile.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainyard.predict.params import Calibration, default_calibration

PROFILES_DIR = "profiles"
# what `trainyard up` measures at first start: two small decoders, so the fit sees the per-layer
# overhead and the matmul throughput of this CPU (about 10 s on one core)
STARTUP_SPECS: tuple[dict[str, Any], ...] = (
    {
        "name": "startup-small",
        "model": {"architecture": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 256},
        "workload": {"seq_len": 64, "global_batch": 4, "steps": 20, "precision": "fp32"},
    },
    {
        "name": "startup-medium",
        "model": {"architecture": "decoder", "n_layers": 4, "d_model": 256, "n_heads": 4, "vocab_size": 1024},
        "workload": {"seq_len": 128, "global_batch": 4, "steps": 20, "precision": "fp32"},
    },
)


def load_profiles(home: Path) -> list[dict[str, Any]]:
    """Stored profiles of this machine ($TRAINYARD_HOME/profiles/*.json), oldest first."""
    d = Path(home) / PROFILES_DIR
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("*.json")):
        try:
            out.append(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    return out


def profiles_signature(home: Path) -> tuple[int, float]:
    """(count, newest mtime) of the stored profiles: changes when a profile is added."""
    d = Path(home) / PROFILES_DIR
    if not d.is_dir():
        return (0, 0.0)
    files = list(d.glob("*.json"))
    return (len(files), max((f.stat().st_mtime for f in files), default=0.0))


def profile_calibration(home: Path | None, base: Calibration | None = None) -> Calibration:
    """``base`` (the packaged calibration by default) plus this machine's CPU profiles, when any."""
    from trainyard.predict.fit import calibrate_from_profiles

    cal = base if base is not None else default_calibration()
    if home is None:
        return cal
    profiles = [p for p in load_profiles(home) if p.get("accelerator") == "cpu"]
    if not profiles:
        return cal
    try:
        return calibrate_from_profiles(profiles, base=cal)
    except (ValueError, KeyError, TypeError):
        return cal


def store_profile(home: Path, doc: dict[str, Any]) -> Path:
    """Write a profile document under ``$TRAINYARD_HOME/profiles`` (atomically); returns its path."""
    out_dir = Path(home) / PROFILES_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", str(doc.get("name") or "profile"))
    path = out_dir / f"{stem}-{time.strftime('%Y%m%dT%H%M%S')}-{len(load_profiles(home))}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def has_cpu_profile(home: Path) -> bool:
    return any(p.get("accelerator") == "cpu" for p in load_profiles(home))


# ranks of the gang the first start also times (the startup specs again, data parallel over this host's
# cores as the local pool runs a multi-device job), when the machine has that many cores
STARTUP_GANG_RANKS = 2


def startup_gang_ranks(cpu_count: int | None = None) -> int | None:
    """The gang size the first-start measurement times on a machine of ``cpu_count`` cores (None: no
    gang, one core)."""
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return STARTUP_GANG_RANKS if cores >= STARTUP_GANG_RANKS else None


def startup_profile_count(cpu_count: int | None = None) -> int:
    """How many profiles the first-start measurement stores on a machine of ``cpu_count`` cores."""
    return len(STARTUP_SPECS) * (2 if startup_gang_ranks(cpu_count) else 1)


def measure_local_cpu(home: Path, *, steps: int = 5, warmup: int = 2, timeout_s: float = 300.0) -> list[Path]:
    """Profile the startup specs on this machine's CPU (one thread, as workers run) in a subprocess, so
    the server process never imports torch or changes its thread settings; then, on a machine of two
    cores or more, the same specs on a gang of ``STARTUP_GANG_RANKS`` ranks (one process and thread per
    rank, gloo over loopback), so quotes for multi-device CPU jobs use how gangs share this host.
    Returns the stored paths."""
    stored: list[Path] = []
    env = {**os.environ, "TRAINYARD_HOME": str(home), "OMP_NUM_THREADS": "1"}
    gang = startup_gang_ranks()
    runs: list[tuple[dict[str, Any], int | None]] = [(doc, None) for doc in STARTUP_SPECS]
    if gang:
        runs += [(doc, gang) for doc in STARTUP_SPECS]
    for doc, ranks in runs:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
            json.dump({"apiVersion": "trainyard/v1", "kind": "TrainingJob", **doc}, fh)
            spec_path = fh.name
        try:
            proc = subprocess.run(
                [
                    sys.executable, "-m", "trainyard.cli.main", "profile", spec_path, "--device", "cpu",
                    "--threads", "1", "--steps", str(steps), "--warmup", str(warmup), "--json",
                    *(["--ranks", str(ranks)] if ranks else []),
                ],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=env,
                check=False,
            )  # fmt: skip
            if proc.returncode == 0:
                stored.append(Path(json.loads(proc.stdout)["path"]))
        except (OSError, subprocess.SubprocessError, ValueError, KeyError):
            continue
        finally:
            os.unlink(spec_path)
    return stored
