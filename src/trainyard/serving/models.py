"""Where deployments find their models: one small interface, :class:`ModelSource`, that turns a tenant's
model reference (``NAME@VERSION`` or ``NAME@ALIAS``) into the directories a replica loads.

:class:`StorageModelSource` reads registered versions from the tenant's model area of the storage root
(DESIGN §3.6): ``tenants/<tenant>/models/<NAME>/<VERSION>/`` holds a Hugging Face directory (full weights
and tokenizer) or a LoRA adapter directory (``adapter_config.json``) whose ``trainyard-model.json`` names
its base version (``{"base": "NAME@V"}``); ``tenants/<tenant>/models/<NAME>/aliases.json`` maps alias to
version. A reference is only ever a name, never a path, so a tenant can reach nothing but its own area.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trainyard.errors import InvalidInputError, NotFoundError

REF_RE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,99})@(?P<tag>[A-Za-z0-9][A-Za-z0-9._-]{0,62})$")


@dataclass(frozen=True)
class ResolvedModel:
    version_id: str  # "NAME@V": the version the reference points at now
    path: str  # full-weights directory (the base's for an adapter)
    tokenizer_path: str
    adapter_path: str | None = None
    base_ref: str | None = None  # the base version of a LoRA adapter

    @property
    def base_version(self) -> str:
        """The version whose weights a replica holds resident (the model itself, or an adapter's base)."""
        return self.base_ref or self.version_id


class ModelSource(Protocol):
    def resolve(self, tenant: str, ref: str) -> ResolvedModel: ...


def parse_ref(ref: str) -> tuple[str, str]:
    m = REF_RE.match(ref)
    if m is None:
        raise InvalidInputError(
            f"{ref!r} is not a model reference",
            hint="Name a registered model version or alias: NAME@VERSION or NAME@ALIAS (e.g. tiny@1).",
            details={"errors": [{"field": "model", "message": "expected NAME@VERSION or NAME@ALIAS"}]},
        )
    return m["name"], m["tag"]


class StorageModelSource:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _area(self, tenant: str) -> Path:
        return self.root / "tenants" / tenant / "models"

    def resolve(self, tenant: str, ref: str, _depth: int = 0) -> ResolvedModel:
        name, tag = parse_ref(ref)
        model_dir = self._area(tenant) / name
        version = tag
        if not tag.isdigit():
            try:
                aliases = json.loads((model_dir / "aliases.json").read_text())
            except (OSError, ValueError):
                aliases = {}
            if tag not in aliases:
                raise NotFoundError(f"no model version or alias {ref!r}")
            version = str(aliases[tag])
        vdir = model_dir / version
        if not vdir.is_dir():
            raise NotFoundError(f"no model version or alias {ref!r}")
        version_id = f"{name}@{version}"
        if (vdir / "adapter_config.json").is_file():
            try:
                base = str(json.loads((vdir / "trainyard-model.json").read_text())["base"])
            except (OSError, ValueError, KeyError) as exc:
                raise NotFoundError(f"adapter {version_id} does not name its base version") from exc
            if _depth > 0:
                raise InvalidInputError(f"the base of {version_id} is itself an adapter")
            base_model = self.resolve(tenant, base, _depth + 1)
            tokenizer = str(vdir) if (vdir / "tokenizer_config.json").is_file() else base_model.tokenizer_path
            return ResolvedModel(
                version_id=version_id,
                path=base_model.path,
                tokenizer_path=tokenizer,
                adapter_path=str(vdir),
                base_ref=base_model.version_id,
            )
        return ResolvedModel(version_id=version_id, path=str(vdir), tokenizer_path=str(vdir))


class RegistryModelSource:
    """Registered versions from the model registry (``RegistryService.resolve``): a full model serves its
    ``weights`` directory; a LoRA version its ``adapter`` over its base's weights."""

    def __init__(self, registry: Any, tenant_id_of: Callable[[str], str | None]) -> None:
        self.registry = registry
        self.tenant_id_of = tenant_id_of

    def resolve(self, tenant: str, ref: str) -> ResolvedModel:
        tenant_id = self.tenant_id_of(tenant)
        if tenant_id is None:
            raise NotFoundError(f"no model version or alias {ref!r}")
        v = self.registry.resolve(tenant_id, ref)
        art = v.artefacts
        if art.get("adapter"):
            base = self.registry.resolve(tenant_id, str(art["base"]))
            return ResolvedModel(
                version_id=v.id,
                path=str(base.artefacts["weights"]),
                tokenizer_path=str(art.get("tokenizer") or base.artefacts["tokenizer"]),
                adapter_path=str(art["adapter"]),
                base_ref=base.id,
            )
        return ResolvedModel(version_id=v.id, path=str(art["weights"]), tokenizer_path=str(art["tokenizer"]))


class ChainedModelSource:
    """The first source that knows the reference answers (registry first, then the storage area)."""

    def __init__(self, *sources: ModelSource) -> None:
        self.sources = sources

    def resolve(self, tenant: str, ref: str) -> ResolvedModel:
        last: NotFoundError | None = None
        for src in self.sources:
            try:
                return src.resolve(tenant, ref)
            except NotFoundError as exc:
                last = exc
        raise last or NotFoundError(f"no model version or alias {ref!r}")
