"""The model registry: immutable versions with lineage, aliases with an append-only history, the gate.

Consumers (deployments, evaluations, the trainer's launch) use four calls:

- ``RegistryService.resolve(tenant_id, "NAME@V" | "NAME@ALIAS") -> ModelVersion``: the tenant's own
  version, else a public base model; unknown or another tenant's → ``NotFoundError`` (404).
- ``ModelVersion.artefacts``: ``{"weights": dir | None, "adapter": dir | None, "tokenizer": dir,
  "base": "NAME@V" | None}`` — a full model has ``weights``; a LoRA version has ``adapter`` and ``base``.
- ``RegistryService.local_weights_dir(version) -> Path``: a directory ``from_pretrained`` loads; for an
  adapter it is the adapter merged into its base with ``peft`` on first use (cached beside it).
- ``RegistryService.add_alias_listener(fn)``: ``fn(AliasChange)`` after every alias move is committed
  (``tenant_id, name, alias, from_version, to_version, actor, evaluation_id, forced, reason``).

Storage: ``<storage root>/tenants/<tenant>/models/<name>/<version>/{weights,adapter,tokenizer}/``
(the root is ``TRAINYARD_STORAGE_URL`` or ``file://$TRAINYARD_HOME/storage``; local files only here).
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from trainyard.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    PromotionBlockedError,
    StorageError,
)
from trainyard.services.domain import Principal, iso
from trainyard.store.db import Database
from trainyard.store.registry_models import (
    EvaluationRow,
    ModelAliasEventRow,
    ModelAliasRow,
    ModelVersionRow,
)
from trainyard.store.repositories import TenantRepo

log = structlog.get_logger("trainyard.registry")

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
ALIAS_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
GATED_ALIASES = frozenset({"production"})
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)
MODEL_FILES = ("config.json", "generation_config.json")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MAX_IMPORT_FILES = 200
# merges load models with transformers, whose loading switches process-wide state (the default dtype,
# meta-device initialisation): two at once in one process, say the control loop and an API request
# launching evaluations of the same adapter, can leave tied weights on the meta device. One at a time.
_MERGE_LOCK = threading.Lock()


# ---- storage ------------------------------------------------------------------------------------------


def storage_root(home: Path, storage_url: str | None = None) -> Path:
    """The local directory of the storage root (``file://`` URLs only for the registry today)."""
    url = storage_url or os.environ.get("TRAINYARD_STORAGE_URL") or (home / "storage").resolve().as_uri()
    if url.startswith("file://"):
        return Path(url[len("file://") :])
    if url.startswith("/"):
        return Path(url)
    raise StorageError(
        f"the model registry needs a local storage root (file://), not {url.split('://')[0]}://",
        hint="Set TRAINYARD_STORAGE_URL to a file:// URL.",
    )


def tenant_area(root: Path, tenant: str, kind: str) -> Path:
    """``<root>/tenants/<tenant>/<kind>`` (kind: models | evaluations)."""
    return root / "tenants" / tenant / kind


# ---- records ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelVersion:
    tenant_id: str
    tenant_name: str
    name: str
    version: int
    public: bool
    kind: str  # base | full | adapter
    sha256: str
    base: str | None
    source_job: str | None
    datasets: list[str]
    doc: dict[str, Any]
    created_by: str
    created_at_s: float
    aliases: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def root(self) -> Path:
        return Path(self.doc["root"])

    @property
    def artefacts(self) -> dict[str, Any]:
        r = self.root
        return {
            "weights": str(r / "weights") if self.kind != "adapter" else None,
            "adapter": str(r / "adapter") if self.kind == "adapter" else None,
            "tokenizer": str(r / "tokenizer"),
            "base": self.base,
        }

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.doc.get("config") or {})

    def document(self) -> dict[str, Any]:
        """The model document of DESIGN §3.8 plus lineage and artefacts."""
        return {
            "id": self.id,
            "name": self.name,
            "version": self.version,
            "sha256": self.sha256,
            "base": self.base,
            "source_job": self.source_job,
            "datasets": list(self.datasets),
            "adapter": self.kind == "adapter",
            "aliases": sorted(self.aliases),
            "created_at": iso(self.created_at_s),
            "kind": self.kind,
            "public": self.public,
            "owner": self.tenant_name,
            "created_by": self.created_by,
            "metrics": self.doc.get("metrics") or {},
            "run_record": self.doc.get("run_record"),
            "evaluation": self.doc.get("evaluation"),
            "sweep": self.doc.get("sweep"),
            "architecture": (self.doc.get("config") or {}).get("architectures"),
            "shape": self.doc.get("shape"),
            "files": self.doc.get("files") or {},
            "artefacts": self.artefacts,
        }


@dataclass(frozen=True)
class AliasChange:
    tenant_id: str
    name: str
    alias: str
    from_version: int | None
    to_version: int
    actor: str
    evaluation_id: str | None
    forced: bool
    reason: str
    time_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "from": f"{self.name}@{self.from_version}" if self.from_version is not None else None,
            "to": f"{self.name}@{self.to_version}",
            "actor": self.actor,
            "evaluation": self.evaluation_id,
            "forced": self.forced,
            "reason": self.reason,
            "at": iso(self.time_s),
        }


def parse_ref(ref: str) -> tuple[str, str]:
    """``NAME@V`` / ``NAME@ALIAS`` → (name, version-or-alias); a malformed reference is a 422."""
    name, sep, tag = ref.partition("@")
    if not sep or not NAME_RE.match(name) or not (tag.isdigit() or ALIAS_RE.match(tag)):
        raise InvalidInputError(
            f"{ref!r} is not a model reference",
            hint="Name a registered model as NAME@VERSION or NAME@ALIAS, e.g. tiny-llama@1.",
            details={"errors": [{"field": "model", "message": "expected NAME@VERSION or NAME@ALIAS"}]},
        )
    return name, tag


def is_registry_ref(base: str) -> bool:
    return "@" in base and "://" not in base and not base.startswith("/")


def sha256_path(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def weights_digest(files: dict[str, str]) -> str:
    """One safetensors file: its sha256. Shards: sha256 over the sorted ``name sha256`` lines."""
    st = {k: v for k, v in files.items() if k.endswith(".safetensors")}
    if len(st) == 1:
        return next(iter(st.values()))
    text = "".join(f"{k} {st[k]}\n" for k in sorted(st))
    return hashlib.sha256(text.encode()).hexdigest()


def shape_from_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The JobSpec ``model`` shape fields a Hugging Face config implies (decoders; others best effort)."""
    arch = " ".join(cfg.get("architectures") or [])
    if cfg.get("is_encoder_decoder"):
        architecture = "encoder-decoder"
    elif "MaskedLM" in arch or cfg.get("model_type") == "bert":
        architecture = "encoder"
    else:
        architecture = "decoder"
    d_model = cfg.get("hidden_size") or cfg.get("d_model") or cfg.get("n_embd")
    n_layers = cfg.get("num_hidden_layers") or cfg.get("num_layers") or cfg.get("n_layer")
    n_heads = cfg.get("num_attention_heads") or cfg.get("num_heads") or cfg.get("n_head")
    out: dict[str, Any] = {
        "architecture": architecture,
        "n_layers": n_layers,
        "d_model": d_model,
        "n_heads": n_heads,
        "vocab_size": cfg.get("vocab_size"),
    }
    if cfg.get("num_key_value_heads"):
        out["n_kv_heads"] = cfg["num_key_value_heads"]
    if cfg.get("head_dim") and d_model and n_heads and cfg["head_dim"] * n_heads != d_model:
        out["head_dim"] = cfg["head_dim"]
    if cfg.get("intermediate_size") or cfg.get("d_ff"):
        out["d_ff"] = cfg.get("intermediate_size") or cfg.get("d_ff")
    if cfg.get("hidden_act") in ("silu", "swish") or cfg.get("model_type") in ("llama", "mistral", "qwen2"):
        out["ffn"] = "gated"
    if cfg.get("tie_word_embeddings"):
        out["tie_embeddings"] = True
    if cfg.get("num_local_experts"):
        out["n_experts"] = cfg["num_local_experts"]
        out["experts_per_token"] = cfg.get("num_experts_per_tok") or 1
    return {k: v for k, v in out.items() if v is not None}


SHAPE_FIELDS = (
    "architecture",
    "n_layers",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "d_ff",
    "ffn",
    "vocab_size",
    "n_experts",
    "experts_per_token",
    "tie_embeddings",
)


def _verify_safetensors(path: Path) -> int:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return len(list(f.keys()))
    except Exception as exc:
        raise InvalidInputError(
            f"{path.name} is not a readable safetensors file ({type(exc).__name__})",
            hint="Save the model with save_pretrained(..., safe_serialization=True).",
        ) from exc


def _copy_files(src: Path, names: Iterable[str], dst: Path) -> dict[str, str]:
    dst.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in names:
        s = src / name
        if s.is_file() and not s.is_symlink():
            shutil.copyfile(s, dst / name)
            out[name] = sha256_path(dst / name)
    return out


# ---- the service --------------------------------------------------------------------------------------


class RegistryService:
    def __init__(
        self, db: Database, *, root: Path | Callable[[], Path], clock: Callable[[], float] = time.time
    ) -> None:
        self.db = db
        self._root = root
        self.clock = clock
        self._listeners: list[Callable[[AliasChange], None]] = []

    @property
    def root(self) -> Path:
        return self._root() if callable(self._root) else self._root

    def add_alias_listener(self, fn: Callable[[AliasChange], None]) -> None:
        self._listeners.append(fn)

    # ---- reads -------------------------------------------------------------------------------------
    def _version(self, s: Session, row: ModelVersionRow) -> ModelVersion:
        tenant = TenantRepo(s).by_id(row.tenant_id)
        aliases = s.scalars(
            select(ModelAliasRow.alias).where(
                ModelAliasRow.tenant_id == row.tenant_id,
                ModelAliasRow.name == row.name,
                ModelAliasRow.version == row.version,
            )
        ).all()
        return ModelVersion(
            tenant_id=row.tenant_id,
            tenant_name=tenant.name if tenant else row.tenant_id,
            name=row.name,
            version=row.version,
            public=row.public,
            kind=row.kind,
            sha256=row.sha256,
            base=row.base,
            source_job=row.source_job,
            datasets=list(row.datasets or []),
            doc=dict(row.doc or {}),
            created_by=row.created_by,
            created_at_s=row.created_at_s,
            aliases=list(aliases),
        )

    def _owner_of(self, s: Session, tenant_id: str, name: str) -> str | None:
        """The tenant whose ``name`` a caller means: its own, else the public model of that name."""
        own = s.scalars(
            select(ModelVersionRow.tenant_id)
            .where(ModelVersionRow.tenant_id == tenant_id, ModelVersionRow.name == name)
            .limit(1)
        ).first()
        if own is not None:
            return own
        return s.scalars(
            select(ModelVersionRow.tenant_id)
            .where(ModelVersionRow.public.is_(True), ModelVersionRow.name == name)
            .limit(1)
        ).first()

    def resolve_in(self, s: Session, tenant_id: str, ref: str) -> ModelVersion:
        name, tag = parse_ref(ref)
        owner = self._owner_of(s, tenant_id, name)
        missing = NotFoundError(f"no model {ref!r}", hint="List your models with `trainyard models list`.")
        if owner is None:
            raise missing
        if tag.isdigit():
            version = int(tag)
        else:
            alias = s.scalars(
                select(ModelAliasRow).where(
                    ModelAliasRow.tenant_id == owner, ModelAliasRow.name == name, ModelAliasRow.alias == tag
                )
            ).first()
            if alias is None:
                raise missing
            version = alias.version
        row = s.scalars(
            select(ModelVersionRow).where(
                ModelVersionRow.tenant_id == owner,
                ModelVersionRow.name == name,
                ModelVersionRow.version == version,
            )
        ).first()
        if row is None or (owner != tenant_id and not row.public):
            raise missing
        return self._version(s, row)

    def resolve(self, tenant_id: str, ref: str) -> ModelVersion:
        with self.db.session() as s:
            return self.resolve_in(s, tenant_id, ref)

    def get(self, principal: Principal, ref: str) -> ModelVersion:
        return self.resolve(principal.tenant_id, ref)

    def list(self, principal: Principal, *, name: str | None = None) -> list[ModelVersion]:
        with self.db.session() as s:
            q = select(ModelVersionRow).where(
                (ModelVersionRow.tenant_id == principal.tenant_id) | ModelVersionRow.public.is_(True)
            )
            if name is not None:
                q = q.where(ModelVersionRow.name == name)
            rows = s.scalars(q.order_by(ModelVersionRow.name, ModelVersionRow.version)).all()
            return [self._version(s, r) for r in rows]

    def models_for_dataset(self, principal: Principal, dataset: str) -> builtins.list[ModelVersion]:
        """Lineage the other way: the tenant's versions trained on ``dataset``."""
        return [v for v in self.list(principal) if dataset in v.datasets and not v.public]

    def children(self, principal: Principal, ref: str) -> builtins.list[ModelVersion]:
        """Versions fine-tuned from ``ref`` that the caller can see."""
        target = self.get(principal, ref).id
        return [v for v in self.list(principal) if v.base == target]

    # ---- writes ------------------------------------------------------------------------------------
    def _next_version(self, s: Session, tenant_id: str, name: str) -> int:
        cur = s.scalar(
            select(func.max(ModelVersionRow.version)).where(
                ModelVersionRow.tenant_id == tenant_id, ModelVersionRow.name == name
            )
        )
        return int(cur or 0) + 1

    def _check_name_free(self, s: Session, tenant_id: str, name: str) -> None:
        other = s.scalars(
            select(ModelVersionRow.tenant_id)
            .where(
                ModelVersionRow.public.is_(True),
                ModelVersionRow.name == name,
                ModelVersionRow.tenant_id != tenant_id,
            )
            .limit(1)
        ).first()
        if other is not None:
            raise ConflictError(
                f"{name!r} is the name of a public base model",
                hint="Choose another name; public models cannot be changed by other tenants.",
            )

    def import_directory(
        self, principal: Principal, src: Path, name: str, *, public: bool = False
    ) -> ModelVersion:
        """Import a Hugging Face format directory (config, safetensors weights, tokenizer) as a base model."""
        if not NAME_RE.match(name):
            raise InvalidInputError(
                f"model name {name!r} is not valid",
                hint="Use lower-case letters, digits, '.', '_' or '-' (at most 100 characters).",
                details={"errors": [{"field": "name", "message": "invalid model name"}]},
            )
        if public and not principal.admin:
            raise PermissionDeniedError("only an admin may import a public base model")
        cfg = self._verify_hf_dir(src)
        weights = sorted(p.name for p in src.iterdir() if p.name.endswith(".safetensors"))
        index = [p.name for p in src.iterdir() if p.name.endswith(".safetensors.index.json")]
        with self.db.session() as s:
            self._check_name_free(s, principal.tenant_id, name)
            existing = s.scalars(
                select(ModelVersionRow).where(
                    ModelVersionRow.tenant_id == principal.tenant_id, ModelVersionRow.name == name
                )
            ).first()
            if existing is not None and existing.public != public:
                raise ConflictError(
                    f"model {name!r} exists and is {'public' if existing.public else 'private'}",
                    hint="Import under another name.",
                )
            version = self._next_version(s, principal.tenant_id, name)
        target = tenant_area(self.root, principal.tenant_name, "models") / name / str(version)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-{version}-", dir=self._mkdir(target.parent)))
        files: dict[str, str] = {}
        for n, digest in _copy_files(src, [*MODEL_FILES, *weights, *index], staging / "weights").items():
            files[f"weights/{n}"] = digest
        for n, digest in _copy_files(src, TOKENIZER_FILES, staging / "tokenizer").items():
            files[f"tokenizer/{n}"] = digest
        sha = weights_digest({k.split("/", 1)[1]: v for k, v in files.items() if k.startswith("weights/")})
        size_bytes = _tree_bytes(staging)
        self._publish(staging, target)
        return self._insert(
            principal.tenant_id,
            principal.tenant_name,
            name=name,
            version=version,
            public=public,
            kind="base",
            sha256=sha,
            base=None,
            source_job=None,
            datasets=[],
            doc={
                "root": str(target),
                "config": cfg,
                "shape": shape_from_config(cfg),
                "files": files,
                "bytes": size_bytes,
                "imported_from": src.name,
            },
            created_by=principal.tenant_name,
        )

    def _mkdir(self, p: Path) -> Path:
        p.mkdir(parents=True, exist_ok=True, mode=0o700)
        return p

    def _publish(self, staging: Path, target: Path) -> None:
        if target.exists():  # a torn earlier attempt for a version number that was never committed
            shutil.rmtree(target)
        staging.rename(target)

    def _verify_hf_dir(self, src: Path) -> dict[str, Any]:
        errors = []
        if not src.is_dir():
            raise InvalidInputError(f"{src} is not a directory", hint="Pass a Hugging Face model directory.")
        entries = list(src.iterdir())
        if len(entries) > MAX_IMPORT_FILES:
            errors.append({"field": "files", "message": f"more than {MAX_IMPORT_FILES} files"})
        cfg: dict[str, Any] = {}
        try:
            cfg = json.loads((src / "config.json").read_text())
            if not isinstance(cfg, dict) or "model_type" not in cfg:
                errors.append({"field": "config.json", "message": "no model_type"})
                cfg = cfg if isinstance(cfg, dict) else {}
        except (OSError, ValueError) as exc:
            errors.append({"field": "config.json", "message": f"missing or not JSON ({type(exc).__name__})"})
        weights = [p for p in entries if p.name.endswith(".safetensors")]
        if not weights:
            errors.append(
                {"field": "weights", "message": "no *.safetensors file (pickled weights are refused)"}
            )
        if not any(
            (src / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
        ):
            errors.append(
                {"field": "tokenizer", "message": "no tokenizer (tokenizer.json or tokenizer.model)"}
            )
        if any(p.is_symlink() for p in entries):
            errors.append({"field": "files", "message": "symbolic links are refused"})
        if errors:
            raise InvalidInputError(
                "not an importable Hugging Face model directory: "
                + "; ".join(f"{e['field']}: {e['message']}" for e in errors),
                hint="A model directory holds config.json, *.safetensors and the tokenizer files.",
                details={"errors": errors},
            )
        for w in weights:
            _verify_safetensors(w)
        return cfg

    def _insert(
        self, tenant_id: str, tenant_name: str, *, s: Session | None = None, **fields: Any
    ) -> ModelVersion:
        now = self.clock()
        row = ModelVersionRow(tenant_id=tenant_id, created_at_s=now, **fields)
        try:
            if s is not None:
                s.add(row)
                s.flush()
                return self._version(s, row)
            with self.db.session() as s2:
                s2.add(row)
                s2.flush()
                return self._version(s2, row)
        except IntegrityError as exc:
            raise ConflictError(
                f"model version {fields['name']}@{fields['version']} was registered concurrently",
                hint="Retry the import.",
            ) from exc

    # ---- fine-tunes ---------------------------------------------------------------------------------
    def register_job_output(
        self, s: Session, job: Any, result: dict[str, Any], *, sweep: dict[str, Any] | None = None
    ) -> ModelVersion:
        """Register a finished training job's model (inside the supervisor's transaction); ``sweep`` is the
        lineage of a sweep's best trial (the sweep, the trial, its parameters and value), kept in the
        version's document."""
        spec = job.spec
        tenant = TenantRepo(s).by_id(job.tenant_id)
        tenant_name = tenant.name if tenant else job.tenant_id
        name = _safe_name(job.name)
        model_path = _local(result.get("model_path"))
        if model_path is None or not (model_path / "model.safetensors").is_file():
            raise StorageError("the job's model directory is missing", hint="See the job's logs.")
        base_ref = (spec.get("model") or {}).get("base")
        base: ModelVersion | None = None
        if base_ref and is_registry_ref(base_ref):
            base = self.resolve_in(s, job.tenant_id, base_ref)
        lora = (spec.get("workload") or {}).get("method") == "lora"
        adapter_dir = model_path.parent / "adapter"
        kind = "adapter" if lora and base is not None and adapter_dir.is_dir() else "full"
        self._check_name_free(s, job.tenant_id, name)
        version = self._next_version(s, job.tenant_id, name)
        target = tenant_area(self.root, tenant_name, "models") / name / str(version)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-{version}-", dir=self._mkdir(target.parent)))
        files: dict[str, str] = {}
        if kind == "adapter":
            for n, d in _copy_files(adapter_dir, ADAPTER_FILES, staging / "adapter").items():
                files[f"adapter/{n}"] = d
            sha = files.get("adapter/adapter_model.safetensors", "")
        else:
            names = [*MODEL_FILES, "model.safetensors"]
            for n, d in _copy_files(model_path, names, staging / "weights").items():
                files[f"weights/{n}"] = d
            sha = files["weights/model.safetensors"]
        tok_src = Path(base.artefacts["tokenizer"]) if base is not None else model_path
        for n, d in _copy_files(tok_src, TOKENIZER_FILES, staging / "tokenizer").items():
            files[f"tokenizer/{n}"] = d
        cfg_path = model_path / "config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else (base.config if base else {})
        size_bytes = _tree_bytes(staging)
        self._publish(staging, target)
        dataset = (spec.get("workload") or {}).get("dataset")
        run_record = {
            "job_id": job.id,
            "spec_sha256": job.spec_sha256,
            "spec": spec,
            "attempts": job.attempt,
            "final_step": result.get("final_step"),
            "checkpoint_model_path": result.get("model_path"),
            "merged_sha256": result.get("model_sha256"),
            "base_sha256": base.sha256 if base else None,
        }
        metrics = {k: result[k] for k in ("loss",) if result.get(k) is not None}
        return self._insert(
            job.tenant_id,
            tenant_name,
            s=s,
            name=name,
            version=version,
            public=False,
            kind=kind,
            sha256=sha,
            base=base.id if base else None,
            source_job=job.id,
            datasets=[dataset] if dataset else [],
            doc={
                "root": str(target),
                "config": cfg,
                "shape": shape_from_config(cfg),
                "files": files,
                "bytes": size_bytes,
                "run_record": run_record,
                "metrics": metrics,
                **({"sweep": sweep} if sweep is not None else {}),
            },
            created_by=tenant_name,
        )

    def set_evaluation(self, s: Session, tenant_id: str, ref: str, evaluation: dict[str, Any]) -> None:
        """Attach an evaluation summary to a version (the version's weights and lineage stay immutable)."""
        v = self.resolve_in(s, tenant_id, ref)
        if v.tenant_id != tenant_id:
            return
        row = s.scalars(
            select(ModelVersionRow).where(
                ModelVersionRow.tenant_id == tenant_id,
                ModelVersionRow.name == v.name,
                ModelVersionRow.version == v.version,
            )
        ).one()
        row.doc = {**(row.doc or {}), "evaluation": evaluation}

    # ---- submission ---------------------------------------------------------------------------------
    def resolve_spec(self, tenant_id: str, spec: Any) -> Any:
        """``model.base`` → a concrete ``NAME@V`` of this tenant (or public); shape fields from its config.

        Unknown or foreign bases are 404; shape fields given in the spec that contradict the base's
        config are 422 (every contradiction listed).
        """
        from trainyard.spec.loader import spec_from_dict

        base_ref = spec.model.base
        if not base_ref or not is_registry_ref(base_ref):
            if spec.model.needs_base_shape:
                raise InvalidInputError(
                    "model: a spec without shape fields needs model.base naming a registered model",
                    hint="Give n_layers, d_model, n_heads and vocab_size, or model.base: NAME@VERSION.",
                    details={"errors": [{"field": "model", "message": "shape fields missing"}]},
                )
            return spec
        try:
            base = self.resolve(tenant_id, base_ref)
        except NotFoundError:
            raise NotFoundError(
                f"model.base {base_ref!r} is not a registered model of this tenant",
                hint="Import it with `trainyard models import DIR --name NAME`, or list them with "
                "`trainyard models list`.",
                details={"errors": [{"field": "model.base", "message": "unknown model"}]},
            ) from None
        shape = base.doc.get("shape") or {}
        explicit = spec.model.model_fields_set
        doc = spec.to_document()
        model = dict(doc.get("model") or {})
        contradictions = []
        for k in SHAPE_FIELDS:
            if k not in explicit or k not in model:
                continue
            want = shape.get(k, _SHAPE_DEFAULTS.get(k))
            if model[k] != want:
                contradictions.append(
                    {
                        "field": f"model.{k}",
                        "message": f"{model[k]!r} contradicts the base's config ({want!r})",
                    }
                )
        if contradictions:
            raise InvalidInputError(
                f"the spec's model shape contradicts {base.id}'s config",
                hint="Leave the shape fields out: a spec naming a base takes them from it.",
                details={"errors": contradictions},
            )
        for k in SHAPE_FIELDS:
            model.pop(k, None)
        model.update({k: v for k, v in shape.items() if k in SHAPE_FIELDS})
        model["base"] = base.id
        return spec_from_dict({**doc, "model": model}, source="spec")

    def launch_env(self, job: Any) -> dict[str, str]:
        """Launch-request environment for a job whose ``model.base`` is a registered version."""
        base_ref = ((job.spec or {}).get("model") or {}).get("base")
        if not base_ref or not is_registry_ref(base_ref):
            return {}
        base = self.resolve(job.tenant_id, base_ref)
        return {"TRAINYARD_BASE_MODEL_PATH": str(self.local_weights_dir(base))}

    # ---- artefacts ---------------------------------------------------------------------------------
    def local_weights_dir(self, v: ModelVersion) -> Path:
        """A directory with full weights and the tokenizer that ``from_pretrained`` loads."""
        if v.kind != "adapter":
            weights = Path(v.artefacts["weights"])
            merged = v.root / "loadable"
            if not merged.is_dir():
                tmp = Path(tempfile.mkdtemp(prefix=".loadable-", dir=v.root))
                for p in weights.iterdir():
                    os.link(p, tmp / p.name) if _same_fs(p, tmp) else shutil.copyfile(p, tmp / p.name)
                for p in Path(v.artefacts["tokenizer"]).iterdir():
                    shutil.copyfile(p, tmp / p.name)
                try:
                    tmp.rename(merged)
                except OSError:
                    shutil.rmtree(tmp, ignore_errors=True)
            return merged
        merged = v.root / "merged"
        if merged.is_dir():
            return merged
        with _MERGE_LOCK:
            if merged.is_dir():  # merged by another thread meanwhile
                return merged
            return self._merge_adapter(v, merged)

    def _merge_adapter(self, v: ModelVersion, merged: Path) -> Path:
        assert v.base is not None
        base = self.resolve(v.tenant_id, v.base)
        base_dir = self.local_weights_dir(base)
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base_model = AutoModelForCausalLM.from_pretrained(
            base_dir, local_files_only=True, dtype=torch.float32
        )
        peft_model: Any = PeftModel.from_pretrained(base_model, str(v.artefacts["adapter"]))
        model = peft_model.merge_and_unload()
        if getattr(model.config, "tie_word_embeddings", False):
            model.tie_weights()
        on_meta = [name for name, t in model.state_dict().items() if t.is_meta]
        if on_meta:
            raise RuntimeError(f"merging {v.id} left tensors without data: {on_meta[:5]}")
        tmp = Path(tempfile.mkdtemp(prefix=".merged-", dir=v.root))
        model.save_pretrained(tmp, safe_serialization=True)
        for p in Path(v.artefacts["tokenizer"]).iterdir():
            shutil.copyfile(p, tmp / p.name)
        try:
            tmp.rename(merged)
        except OSError:  # merged concurrently
            shutil.rmtree(tmp, ignore_errors=True)
        return merged

    # ---- aliases -----------------------------------------------------------------------------------
    def promote(
        self,
        principal: Principal,
        ref: str,
        alias: str,
        *,
        force: bool = False,
        reason: str = "",
        evaluation_id: str | None = None,
    ) -> dict[str, Any]:
        """Point ``alias`` at ``ref``. ``production`` needs a passing evaluation of that version against
        the current production (or, when none, its base); an admin may force it with a reason."""
        if not ALIAS_RE.match(alias) or alias.isdigit():
            raise InvalidInputError(
                f"alias {alias!r} is not valid",
                hint="Aliases start with a letter: staging, production, canary ...",
                details={"errors": [{"field": "alias", "message": "invalid alias"}]},
            )
        if force and not principal.admin:
            raise PermissionDeniedError("only an admin may force a promotion")
        if force and not reason.strip():
            raise InvalidInputError(
                "a forced promotion needs a reason",
                hint="Pass --reason TEXT; it is kept in the alias history.",
                details={"errors": [{"field": "reason", "message": "required with force"}]},
            )
        with self.db.session() as s:
            v = self.resolve_in(s, principal.tenant_id, ref)
            if v.tenant_id != principal.tenant_id:
                raise PermissionDeniedError(
                    f"{v.id} is a public base model; no tenant can change it",
                    hint="Fine-tune it and promote your own version.",
                )
            current = s.scalars(
                select(ModelAliasRow).where(
                    ModelAliasRow.tenant_id == v.tenant_id,
                    ModelAliasRow.name == v.name,
                    ModelAliasRow.alias == alias,
                )
            ).first()
            from_version = current.version if current is not None else None
            used_eval = evaluation_id
            if alias in GATED_ALIASES and not force and from_version != v.version:
                baseline = f"{v.name}@{from_version}" if from_version is not None else v.base
                used_eval = self._gate(s, v, baseline, evaluation_id)
            now = self.clock()
            if current is None:
                s.add(
                    ModelAliasRow(
                        tenant_id=v.tenant_id, name=v.name, alias=alias, version=v.version, updated_at_s=now
                    )
                )
            else:
                current.version = v.version
                current.updated_at_s = now
            change = AliasChange(
                tenant_id=v.tenant_id,
                name=v.name,
                alias=alias,
                from_version=from_version,
                to_version=v.version,
                actor=principal.tenant_name + (" (admin)" if principal.admin else ""),
                evaluation_id=used_eval,
                forced=force,
                reason=reason[:2000],
                time_s=now,
            )
            s.add(
                ModelAliasEventRow(
                    tenant_id=change.tenant_id,
                    name=change.name,
                    alias=change.alias,
                    from_version=change.from_version,
                    to_version=change.to_version,
                    actor=change.actor,
                    evaluation_id=change.evaluation_id,
                    forced=change.forced,
                    reason=change.reason,
                    time_s=change.time_s,
                )
            )
            s.flush()
            doc = self._version(
                s,
                s.scalars(
                    select(ModelVersionRow).where(
                        ModelVersionRow.tenant_id == v.tenant_id,
                        ModelVersionRow.name == v.name,
                        ModelVersionRow.version == v.version,
                    )
                ).one(),
            ).document()
        for fn in self._listeners:
            try:
                fn(change)
            except Exception:
                log.exception("alias_listener_failed", alias=alias, model=v.id)
        return {**doc, "promotion": change.to_dict()}

    def _gate(self, s: Session, v: ModelVersion, baseline: str | None, evaluation_id: str | None) -> str:
        if baseline is None:
            raise PromotionBlockedError(
                f"{v.id} has no production version or base to be compared with",
                hint="An admin may promote it with --force --reason TEXT.",
                details={"model": v.id, "baseline": None},
            )
        q = select(EvaluationRow).where(
            EvaluationRow.tenant_id == v.tenant_id,
            EvaluationRow.model == v.id,
            EvaluationRow.baseline == baseline,
            EvaluationRow.state == "succeeded",
        )
        if evaluation_id is not None:
            q = q.where(EvaluationRow.id == evaluation_id)
        evals = s.scalars(q.order_by(EvaluationRow.seq.desc())).all()
        for e in evals:
            if (e.doc or {}).get("passed") is True:
                return e.id
        latest = evals[0] if evals else None
        reasons = list((latest.doc or {}).get("reasons") or []) if latest is not None else []
        why = (
            f"its latest evaluation against {baseline} ({latest.id}) says {(latest.doc or {}).get('verdict')}"
            if latest is not None
            else f"it has no finished evaluation against {baseline}"
        )
        if reasons:  # the failing conditions come first
            why += f"; {reasons[0]}"
        raise PromotionBlockedError(
            f"{v.id} cannot become production: {why}",
            hint=f"Run `trainyard eval run --model {v.id} --baseline {baseline} --dataset ds://NAME@V`; "
            "only a passing (significantly better) evaluation opens the gate.",
            details={
                "model": v.id,
                "baseline": baseline,
                "evaluation": latest.id if latest is not None else None,
                "verdict": (latest.doc or {}).get("verdict") if latest is not None else None,
                "reasons": reasons,
            },
        )

    def aliases(self, principal: Principal, name: str) -> dict[str, Any]:
        with self.db.session() as s:
            owner = self._owner_of(s, principal.tenant_id, name)
            if owner is None:
                raise NotFoundError(
                    f"no model {name!r}", hint="List your models with `trainyard models list`."
                )
            current = s.scalars(
                select(ModelAliasRow)
                .where(ModelAliasRow.tenant_id == owner, ModelAliasRow.name == name)
                .order_by(ModelAliasRow.alias)
            ).all()
            events = s.scalars(
                select(ModelAliasEventRow)
                .where(ModelAliasEventRow.tenant_id == owner, ModelAliasEventRow.name == name)
                .order_by(ModelAliasEventRow.id)
            ).all()
        return {
            "name": name,
            "aliases": {a.alias: f"{name}@{a.version}" for a in current},
            "history": [
                AliasChange(
                    tenant_id=e.tenant_id,
                    name=e.name,
                    alias=e.alias,
                    from_version=e.from_version,
                    to_version=e.to_version,
                    actor=e.actor,
                    evaluation_id=e.evaluation_id,
                    forced=e.forced,
                    reason=e.reason,
                    time_s=e.time_s,
                ).to_dict()
                for e in events
            ],
        }


_SHAPE_DEFAULTS: dict[str, Any] = {"architecture": "decoder", "ffn": "mlp", "tie_embeddings": False}


def _safe_name(job_name: str) -> str:
    n = re.sub(r"[^a-z0-9._-]+", "-", job_name.lower()).strip("-._")[:100]
    return n or "model"


def _local(url: Any) -> Path | None:
    if not url:
        return None
    u = str(url)
    if u.startswith("file://"):
        return Path(u[len("file://") :])
    return Path(u) if u.startswith("/") else None


def _same_fs(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_dev == b.stat().st_dev
    except OSError:
        return False


def _tree_bytes(root: Path) -> int:
    """Bytes of the files under a version's staging directory (measured once, at registration; storage
    metering reads this number instead of the storage)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())
