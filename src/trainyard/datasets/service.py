"""DatasetService: upload, read and resolve tenant-scoped, immutable dataset versions.

See the package docstring for the API other services use (:meth:`DatasetService.resolve`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from trainyard.datasets.formats import SCHEMA_VERSION
from trainyard.datasets.ingest import DEFAULT_MAX_BYTES, IngestOptions, ingest
from trainyard.datasets.tokens import BYTES, TokenizerSpec, token_counters
from trainyard.errors import InvalidInputError, NotFoundError, SpecError, UnknownDatasetError
from trainyard.services.domain import Principal, iso
from trainyard.store.datasets_models import DatasetVersionRow
from trainyard.store.db import Database

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
REF_RE = re.compile(r"^(?:ds://)?(?P<name>[^@/]+)(?:@(?P<version>[^@/]+))?$")
MAX_ROWS_PAGE = 1000
# the formats each kind of model can learn from (the runtime masks the loss to answers for these)
FORMATS_FOR_TASK = {"causal-lm": {"text", "completion", "chat"}, "other": {"text"}}

TokenizerResolver = Callable[[Principal, str], TokenizerSpec]


def dataset_area(storage_url: str, tenant: str) -> str:
    """``<storage root>/tenants/<tenant>/datasets`` (DESIGN §3.6)."""
    return f"{storage_url.rstrip('/')}/tenants/{tenant}/datasets"


@dataclass(frozen=True)
class SplitRef:
    rows: int
    sha256: str
    bytes: int
    tokens: int
    url: str  # fsspec URL of the split's canonical JSONL file


@dataclass(frozen=True)
class DatasetVersion:
    id: str  # ds://NAME@VERSION
    tenant_id: str
    name: str
    version: int
    sha256: str
    format: str
    rows: int
    bytes: int
    duplicates_removed: int
    eval_fraction: float
    seed: int
    tokenizer: str
    train: SplitRef
    eval: SplitRef
    storage_url: str
    derived_from: str | None
    created_at_s: float
    stats: dict[str, Any] = field(default_factory=dict)

    def split(self, name: str) -> SplitRef:
        if name not in ("train", "eval"):
            raise InvalidInputError(
                f"no split {name!r}", details={"errors": [{"field": "split", "message": "train or eval"}]}
            )
        return self.train if name == "train" else self.eval

    def to_document(self) -> dict[str, Any]:
        """The document of DESIGN §3.7 (plus token counts and the split settings)."""

        def side(s: SplitRef) -> dict[str, Any]:
            return {"rows": s.rows, "sha256": s.sha256, "bytes": s.bytes, "tokens": s.tokens}

        return {
            "id": self.id,
            "name": self.name,
            "version": self.version,
            "sha256": self.sha256,
            "format": self.format,
            "rows": self.rows,
            "bytes": self.bytes,
            "duplicates_removed": self.duplicates_removed,
            "splits": {"train": side(self.train), "eval": side(self.eval)},
            "derived_from": self.derived_from,
            "created_at": iso(self.created_at_s),
            "eval_fraction": self.eval_fraction,
            "seed": self.seed,
            "tokenizer": self.tokenizer,
            "schema_version": SCHEMA_VERSION,
            "near_duplicates_kept_in_train": self.stats.get("near_duplicates_kept_in_train", 0),
        }

    def runtime_manifest(self) -> dict[str, Any]:
        """What a training process needs to read this version (passed in its launch request)."""
        return {
            "id": self.id,
            "sha256": self.sha256,
            "format": self.format,
            "splits": {
                n: {"url": s.url, "sha256": s.sha256, "rows": s.rows, "tokens": s.tokens}
                for n, s in (("train", self.train), ("eval", self.eval))
            },
        }


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``ds://name@3`` → ("name", 3); ``ds://name`` or ``@latest`` → ("name", None)."""
    m = REF_RE.match(ref.strip())
    if m is None or not NAME_RE.match(m.group("name")):
        raise InvalidInputError(
            f"{ref!r} is not a dataset reference",
            hint="Name a dataset version as ds://NAME@VERSION, e.g. ds://support-chats@3.",
            details={"errors": [{"field": "dataset", "message": "expected ds://NAME@VERSION"}]},
        )
    v = m.group("version")
    if v is None or v == "latest":
        return m.group("name"), None
    if not v.isdigit() or int(v) < 1:
        raise InvalidInputError(
            f"{ref!r}: the version must be a positive number or 'latest'",
            details={"errors": [{"field": "dataset", "message": "bad version"}]},
        )
    return m.group("name"), int(v)


def _version(row: DatasetVersionRow) -> DatasetVersion:
    def side(name: str) -> SplitRef:
        s = row.splits[name]
        return SplitRef(
            rows=int(s["rows"]),
            sha256=str(s["sha256"]),
            bytes=int(s["bytes"]),
            tokens=int(s["tokens"]),
            url=f"{row.storage_url}/{name}.jsonl",
        )

    return DatasetVersion(
        id=f"ds://{row.name}@{row.version}",
        tenant_id=row.tenant_id,
        name=row.name,
        version=row.version,
        sha256=row.sha256,
        format=row.format,
        rows=row.rows,
        bytes=row.bytes,
        duplicates_removed=row.duplicates_removed,
        eval_fraction=row.eval_fraction,
        seed=row.seed,
        tokenizer=row.tokenizer,
        train=side("train"),
        eval=side("eval"),
        storage_url=row.storage_url,
        derived_from=row.derived_from,
        created_at_s=row.created_at_s,
        stats=dict(row.stats or {}),
    )


class DatasetService:
    def __init__(
        self,
        db: Database,
        *,
        storage_url: str,
        spool_dir: Path,
        max_bytes: int = DEFAULT_MAX_BYTES,
        tokenizers: TokenizerResolver | None = None,
        clock: Callable[[], float] = time.time,
        storage_area: Callable[[str], str] | None = None,
    ) -> None:
        self.db = db
        self.storage_url = storage_url
        self.spool_dir = spool_dir
        self.max_bytes = max_bytes
        self.tokenizers = tokenizers
        self.clock = clock
        self._area = storage_area or (lambda tenant: dataset_area(self.storage_url, tenant))

    # ---- upload --------------------------------------------------------------------------------
    def upload(
        self,
        principal: Principal,
        lines: Iterable[bytes],
        *,
        name: str,
        format: str = "auto",
        eval_fraction: float = 0.1,
        seed: int = 0,
        base: str | None = None,
        max_tokens: int | None = None,
        derived_from: str | None = None,
    ) -> tuple[DatasetVersion, bool]:
        """Validate and store one upload; returns (version, created). Identical content with the same
        split settings returns the existing version; nothing is stored for a rejected upload."""
        if not NAME_RE.match(name):
            raise InvalidInputError(
                f"{name!r} is not a dataset name",
                hint="Use 1-100 characters: lower-case letters, digits, '.', '_' or '-'.",
                details={"errors": [{"field": "name", "message": "lower-case letters, digits, . _ -"}]},
            )
        parent = self.resolve(principal.tenant_id, derived_from).id if derived_from else None
        tok = BYTES
        if base is not None:
            if self.tokenizers is None:
                raise InvalidInputError(
                    f"base model {base!r} is unknown to this server",
                    hint="Leave out --base to count tokens in bytes, or register the base model first.",
                    details={"errors": [{"field": "base", "message": "unknown base model"}]},
                )
            try:
                tok = self.tokenizers(principal, base)
            except NotFoundError:
                raise InvalidInputError(
                    f"base model {base!r} is not a model version of yours or a public base model",
                    hint="Name a registered version (`trainyard models list`), or leave out --base to "
                    "count tokens in bytes.",
                    details={"errors": [{"field": "base", "message": "unknown base model"}]},
                ) from None
        context = max_tokens if max_tokens is not None else tok.context_tokens
        count, count_batch = token_counters(tok)
        options = IngestOptions(
            format=format,
            eval_fraction=eval_fraction,
            seed=seed,
            max_bytes=self.max_bytes,
            max_tokens=context,
            count_tokens=count,
            count_tokens_batch=count_batch,
            tokenizer=tok.name,
        )
        options.check()
        ing = ingest(lines, options, self.spool_dir)
        try:
            existing = self._by_split_key(principal.tenant_id, name, ing.split_key)
            if existing is not None:
                return existing, False
            if parent is None:
                parent = self._same_content(principal.tenant_id, name, ing.sha256)  # a re-split
            dest = f"{self._area(principal.tenant_name)}/{ing.split_key}"
            manifest = ing.write(dest)
            for _ in range(5):
                try:
                    return self._insert(principal, name, ing, manifest, dest, parent), True
                except IntegrityError:
                    found = self._by_split_key(principal.tenant_id, name, ing.split_key)
                    if found is not None:
                        return found, False
            raise InvalidInputError(f"could not allocate a version of {name!r}; retry the upload")
        finally:
            ing.close()

    def _insert(
        self,
        principal: Principal,
        name: str,
        ing: Any,
        manifest: dict[str, Any],
        dest: str,
        parent: str | None,
    ) -> DatasetVersion:
        with self.db.session() as s:
            top = s.scalar(
                select(func.max(DatasetVersionRow.version)).where(
                    DatasetVersionRow.tenant_id == principal.tenant_id, DatasetVersionRow.name == name
                )
            )
            row = DatasetVersionRow(
                tenant_id=principal.tenant_id,
                name=name,
                version=int(top or 0) + 1,
                sha256=ing.sha256,
                split_key=ing.split_key,
                format=ing.format,
                rows=ing.rows,
                bytes=ing.bytes,
                duplicates_removed=ing.duplicates_removed,
                eval_fraction=ing.eval_fraction,
                seed=ing.seed,
                tokenizer=ing.tokenizer,
                splits=manifest["splits"],
                stats={
                    "lines": ing.lines,
                    "near_duplicates_kept_in_train": ing.near_duplicates_kept_in_train,
                },
                storage_url=dest,
                derived_from=parent,
                created_at_s=self.clock(),
            )
            s.add(row)
            s.flush()
            return _version(row)

    def _by_split_key(self, tenant_id: str, name: str, split_key: str) -> DatasetVersion | None:
        with self.db.session() as s:
            row = s.scalar(
                select(DatasetVersionRow).where(
                    DatasetVersionRow.tenant_id == tenant_id,
                    DatasetVersionRow.name == name,
                    DatasetVersionRow.split_key == split_key,
                )
            )
            return _version(row) if row is not None else None

    def _same_content(self, tenant_id: str, name: str, sha256: str) -> str | None:
        with self.db.session() as s:
            row = s.scalar(
                select(DatasetVersionRow)
                .where(
                    DatasetVersionRow.tenant_id == tenant_id,
                    DatasetVersionRow.name == name,
                    DatasetVersionRow.sha256 == sha256,
                )
                .order_by(DatasetVersionRow.version)
                .limit(1)
            )
            return f"ds://{row.name}@{row.version}" if row is not None else None

    # ---- reads ---------------------------------------------------------------------------------
    def resolve(self, tenant: str | Principal, ref: str, *, session: Session | None = None) -> DatasetVersion:
        """The version ``ref`` (``ds://NAME@V``, ``ds://NAME`` = latest) of tenant ``tenant`` (a tenant id
        or a Principal). Another tenant's version is as unknown as a missing one. ``session``: read in
        that (open) session instead of a new one, e.g. inside a write transaction on SQLite, where a
        second connection would wait for the first one's lock."""
        tenant_id = tenant.tenant_id if isinstance(tenant, Principal) else tenant
        name, version = parse_ref(ref)
        q = select(DatasetVersionRow).where(
            DatasetVersionRow.tenant_id == tenant_id, DatasetVersionRow.name == name
        )
        if version is None:
            q = q.order_by(DatasetVersionRow.version.desc()).limit(1)
        else:
            q = q.where(DatasetVersionRow.version == version)
        if session is not None:
            row = session.scalar(q)
            if row is None:
                raise UnknownDatasetError(f"no dataset version {ref!r}")
            return _version(row)
        with self.db.session() as s:
            row = s.scalar(q)
            if row is None:
                raise UnknownDatasetError(f"no dataset version {ref!r}")
            return _version(row)

    def get(self, principal: Principal, ref: str) -> DatasetVersion:
        return self.resolve(principal.tenant_id, ref)

    def list(
        self, principal: Principal, *, name: str | None = None, limit: int = 500
    ) -> list[DatasetVersion]:
        with self.db.session() as s:
            q = select(DatasetVersionRow).where(DatasetVersionRow.tenant_id == principal.tenant_id)
            if name is not None:
                q = q.where(DatasetVersionRow.name == name)
            q = q.order_by(DatasetVersionRow.name, DatasetVersionRow.version.desc()).limit(limit)
            return [_version(r) for r in s.scalars(q)]

    def rows(
        self, principal: Principal, ref: str, *, split: str = "train", offset: int = 0, limit: int = 100
    ) -> dict[str, Any]:
        """A page of one split's canonical rows: ``{id, split, offset, rows, next_offset}``."""
        import fsspec

        v = self.resolve(principal.tenant_id, ref)
        side = v.split(split)
        limit = max(1, min(limit, MAX_ROWS_PAGE))
        out: list[Any] = []
        with fsspec.open(side.url, "rb") as fh:
            for i, line in enumerate(fh):
                if i < offset:
                    continue
                if len(out) >= limit:
                    break
                out.append(json.loads(line))
        end = offset + len(out)
        return {
            "id": v.id,
            "split": split,
            "offset": offset,
            "rows": out,
            "next_offset": end if end < side.rows else None,
            "total": side.rows,
        }

    # ---- launch ---------------------------------------------------------------------------------
    def launch_env(self, job: Any) -> dict[str, str]:
        """The environment a job's workers need to read its registered dataset (its manifest)."""
        ref = ((job.spec or {}).get("workload") or {}).get("dataset")
        if not isinstance(ref, str) or not ref.startswith("ds://"):
            return {}
        v = self.resolve(job.tenant_id, ref)
        return {"TRAINYARD_DATASET_MANIFEST": json.dumps(v.runtime_manifest(), sort_keys=True)}

    # ---- submission ----------------------------------------------------------------------------
    def resolve_spec_document(self, principal: Principal, doc: dict[str, Any]) -> dict[str, Any]:
        """Pin ``workload.dataset: ds://…`` of a spec document to an existing version of the caller's,
        check that the model can learn from its format, and fill ``dataset_tokens`` (for ``epochs``).
        Raises a 422 SpecError naming ``workload.dataset``; returns the updated document."""
        workload = doc.get("workload") or {}
        ref = workload.get("dataset")
        if not isinstance(ref, str) or not ref.startswith("ds://"):
            return doc
        try:
            v = self.resolve(principal.tenant_id, ref)
        except (UnknownDatasetError, InvalidInputError) as exc:
            raise SpecError(
                f"workload.dataset: {exc.message}",
                hint="Upload the data first (`trainyard datasets upload`) and name a version you own.",
                details={"errors": [{"field": "workload.dataset", "message": exc.message}]},
            ) from None
        model = doc.get("model") or {}
        task = "causal-lm" if model.get("architecture", "decoder") == "decoder" else "other"
        if v.format not in FORMATS_FOR_TASK[task]:
            msg = (
                f"{v.id} is {v.format} data, which a {model.get('architecture')} model cannot learn from "
                "(prompt/answer data needs a decoder)"
            )
            raise SpecError(
                f"workload.dataset: {msg}",
                hint="Use text data for this model, or a decoder model for completion/chat data.",
                details={"errors": [{"field": "workload.dataset", "message": msg}]},
            )
        if v.train.rows == 0:
            msg = f"{v.id} has no training rows"
            raise SpecError(
                f"workload.dataset: {msg}",
                details={"errors": [{"field": "workload.dataset", "message": msg}]},
            )
        new_workload = {**workload, "dataset": v.id}
        if workload.get("epochs") is not None and workload.get("dataset_tokens") is None:
            seq_len = int(workload.get("seq_len") or 1)
            per_example = v.format in ("completion", "chat")
            new_workload["dataset_tokens"] = v.train.rows * seq_len if per_example else max(1, v.train.tokens)
        return {**doc, "workload": new_workload}
