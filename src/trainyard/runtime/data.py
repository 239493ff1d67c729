"""Training data: text/JSONL corpora or a seeded synthetic corpus, tokenised, with a resumable sampler.

Sample ``g`` of the run (``g = step · global_batch + j``) is a pure function of the seed and ``g``, so
the sampler's whole state is the step counter: resuming at step ``s`` replays exactly the batches an
uninterrupted run would have seen, for any world size. Rank ``r`` of ``W`` takes positions
``j = r, r + W, ...`` of each global batch.

Tokens: the base model's tokenizer when it ships one; otherwise bytes. Byte ids are ``4 + byte``
(0 pad, 1 bos, 2 eos, 3 mask), folded into the vocabulary when it is smaller than 260.

Registered datasets (``ds://NAME@V``): the launch request carries the version's manifest
(``TRAINYARD_DATASET_MANIFEST``: split URLs and sha256s); the train split is read through fsspec and
checked against its sha256. ``text`` rows are packed into windows as a corpus; ``completion`` and
``chat`` rows are one sample each (``BOS`` + prompt + answer, padded or cut to ``seq_len``) whose labels
cover only the completion / the assistant turns (``-100`` elsewhere), so the loss is masked to answers.
The eval split is read the same way and scored at checkpoints and at the end.

Synthetic corpus (no ``workload.dataset``): a random first-order Markov chain over the vocabulary
whose transition table (4 successors per token) and per-sample start token and choices come from the
seed, so the model has structure to learn and every run with the same seed sees the same tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from trainyard.runtime.determinism import derive_seed

PAD_ID, BOS_ID, EOS_ID, MASK_ID = 0, 1, 2, 3
N_SPECIAL = 4
SYNTHETIC_SUCCESSORS = 4


class DataError(ValueError):
    """The dataset cannot be read or tokenised (a user error)."""


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class ByteTokenizer:
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        span = max(1, self.vocab_size - N_SPECIAL)
        return [N_SPECIAL + (b % span) for b in text.encode("utf-8")]


class HFTokenizer:
    """The base model's own tokenizer, loaded from its local directory."""

    def __init__(self, path: str, vocab_size: int):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        ids = self._tok(text, add_special_tokens=False)["input_ids"]
        return [int(i) % self.vocab_size for i in ids]


def resolve_path(url_or_path: str) -> Path:
    if url_or_path.startswith("file://"):
        return Path(url_or_path[len("file://") :])
    if "://" in url_or_path:
        raise DataError(
            f"dataset {url_or_path!r} is not a local file; registered datasets (ds://) and remote URLs "
            "must be resolved to a file before the job starts (TRAINYARD_DATASET_PATH)"
        )
    return Path(url_or_path)


def read_documents(path: Path) -> list[str]:
    if not path.exists():
        raise DataError(f"dataset file {path} does not exist")
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    docs: list[str] = []
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        if f.suffix in (".jsonl", ".json"):
            for lineno, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except ValueError as exc:
                    raise DataError(f"{f}:{lineno}: not valid JSON ({exc})") from None
                docs.append(_json_text(doc))
        else:
            docs.extend(p for p in text.split("\n\n") if p.strip())
    if not docs:
        raise DataError(f"dataset {path} holds no text")
    return docs


def _json_text(doc: Any) -> str:
    if isinstance(doc, str):
        return doc
    if isinstance(doc, dict):
        for key in ("text", "content", "prompt"):
            if isinstance(doc.get(key), str):
                extra = doc.get("completion") or doc.get("response") or ""
                return doc[key] + (("\n" + extra) if isinstance(extra, str) and extra else "")
        return " ".join(str(v) for v in doc.values() if isinstance(v, str))
    return json.dumps(doc)


DATASET_MANIFEST_ENV = "TRAINYARD_DATASET_MANIFEST"
IGNORE_INDEX = -100


def read_split(manifest: dict[str, Any], split: str) -> list[dict[str, Any]]:
    """The canonical rows of one split of a registered version, verified against its sha256."""
    import fsspec

    info = (manifest.get("splits") or {}).get(split)
    if not info:
        raise DataError(f"dataset {manifest.get('id')} has no {split} split")
    h = hashlib.sha256()
    rows: list[dict[str, Any]] = []
    try:
        with fsspec.open(info["url"], "rb") as fh:
            for line in fh:
                h.update(line)
                rows.append(json.loads(line))
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read the {split} split of {manifest.get('id')}: {exc}") from None
    if info.get("sha256") and h.hexdigest() != info["sha256"]:
        raise DataError(
            f"the {split} split of {manifest.get('id')} does not match its sha256 (storage was changed)"
        )
    return rows


def example_tokens(row: dict[str, Any], tok: Tokenizer) -> tuple[list[int], list[int]]:
    """(tokens, labels) of one completion or chat row; labels are IGNORE_INDEX outside the answers."""
    ids = [BOS_ID]
    labels = [IGNORE_INDEX]
    if "prompt" in row:
        p = tok.encode(row["prompt"])
        c = [*tok.encode(row["completion"]), EOS_ID]
        return ids + p + c, labels + [IGNORE_INDEX] * len(p) + c
    for m in row["messages"]:
        head = tok.encode(f"{m['role']}: ")
        body = [*tok.encode(m["content"]), EOS_ID]
        learn = m["role"] == "assistant" and m.get("weight", 1) != 0
        ids += head + body
        labels += [IGNORE_INDEX] * len(head) + (body if learn else [IGNORE_INDEX] * len(body))
    return ids, labels


class ExampleDataset:
    """One completion/chat row per sample, loss masked to the answers, reshuffled every epoch."""

    def __init__(
        self, rows: list[dict[str, Any]], tokenizer: Tokenizer, seq_len: int, seed: int, source: str
    ):
        if not rows:
            raise DataError(f"dataset {source} holds no rows")
        n = len(rows)
        self.tokens = np.full((n, seq_len), PAD_ID, dtype=np.int64)
        self.label_ids = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int64)
        for i, row in enumerate(rows):
            ids, labels = example_tokens(row, tokenizer)
            first = next((k for k, v in enumerate(labels) if v != IGNORE_INDEX), 0)
            start = 0 if first < seq_len else max(0, len(ids) - seq_len)  # keep some answer in the window
            ids, labels = ids[start : start + seq_len], labels[start : start + seq_len]
            self.tokens[i, : len(ids)] = ids
            self.label_ids[i, : len(labels)] = labels
        self.seq_len = seq_len
        self.n_windows = n
        self.seed = seed
        self.source = source
        self.n_tokens = int((self.tokens != PAD_ID).sum())
        self.n_label_tokens = int((self.label_ids != IGNORE_INDEX).sum())
        self._perms: OrderedDict[int, np.ndarray] = OrderedDict()

    def _perm(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng(derive_seed(self.seed, "epoch", epoch)).permutation(self.n_windows)
            self._perms[epoch] = perm
            while len(self._perms) > 2:
                self._perms.popitem(last=False)
        return perm

    def _row(self, index: int) -> int:
        epoch, pos = divmod(index, self.n_windows)
        return int(self._perm(epoch)[pos])

    def sample(self, index: int) -> np.ndarray:
        return self.tokens[self._row(index)]

    def sample_labels(self, index: int) -> np.ndarray:
        return self.label_ids[self._row(index)]

    def position(self, samples_seen: int) -> dict[str, int]:
        epoch, pos = divmod(samples_seen, self.n_windows)
        return {"epoch": epoch, "position": pos}

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "examples",
            "source": self.source,
            "examples": self.n_windows,
            "tokens": self.n_tokens,
            "label_tokens": self.n_label_tokens,
        }


class TokenDataset(Protocol):
    seq_len: int

    def sample(self, index: int) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]: ...


class CorpusDataset:
    """Non-overlapping ``seq_len`` windows of the tokenised corpus, reshuffled every epoch."""

    def __init__(self, docs: list[str], tokenizer: Tokenizer, seq_len: int, seed: int, source: str):
        ids: list[int] = []
        for d in docs:
            ids.extend(tokenizer.encode(d))
            ids.append(EOS_ID)
        stream = np.asarray(ids, dtype=np.int64)
        if stream.size < seq_len:
            stream = np.tile(stream, -(-seq_len // stream.size))
        self.seq_len = seq_len
        self.n_windows = stream.size // seq_len
        self.windows = stream[: self.n_windows * seq_len].reshape(self.n_windows, seq_len)
        self.seed = seed
        self.source = source
        self.n_tokens = int(stream.size)
        self._perms: OrderedDict[int, np.ndarray] = OrderedDict()

    def _perm(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng(derive_seed(self.seed, "epoch", epoch)).permutation(self.n_windows)
            self._perms[epoch] = perm
            while len(self._perms) > 2:
                self._perms.popitem(last=False)
        return perm

    def sample(self, index: int) -> np.ndarray:
        epoch, pos = divmod(index, self.n_windows)
        return self.windows[self._perm(epoch)[pos]]

    def position(self, samples_seen: int) -> dict[str, int]:
        epoch, pos = divmod(samples_seen, self.n_windows)
        return {"epoch": epoch, "position": pos}

    def describe(self) -> dict[str, Any]:
        return {"kind": "corpus", "source": self.source, "tokens": self.n_tokens, "windows": self.n_windows}


class SyntheticDataset:
    """An endless seeded Markov-chain corpus (see the module docstring)."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        self.seq_len = seq_len
        self.seed = seed
        lo = N_SPECIAL if vocab_size > N_SPECIAL + 1 else 0
        self.lo, self.hi = lo, vocab_size
        rng = np.random.default_rng(derive_seed(seed, "synthetic-table"))
        self.table = rng.integers(lo, vocab_size, size=(vocab_size, SYNTHETIC_SUCCESSORS), dtype=np.int64)

    def sample(self, index: int) -> np.ndarray:
        rng = np.random.default_rng(derive_seed(self.seed, "synthetic", index))
        choices = rng.integers(0, SYNTHETIC_SUCCESSORS, size=self.seq_len)
        out = np.empty(self.seq_len, dtype=np.int64)
        tok = int(rng.integers(self.lo, self.hi))
        table = self.table
        for t in range(self.seq_len):
            out[t] = tok
            tok = int(table[tok, choices[t]])
        return out

    def position(self, samples_seen: int) -> dict[str, int]:
        return {"epoch": 0, "position": samples_seen}

    def describe(self) -> dict[str, Any]:
        return {"kind": "synthetic-markov", "successors": SYNTHETIC_SUCCESSORS, "seed": self.seed}


class Sampler:
    """Deterministic, resumable: the batch of step ``s`` for rank ``r`` depends only on (seed, s, r, W)."""

    def __init__(self, dataset: TokenDataset, global_batch: int, rank: int, world_size: int):
        if global_batch < world_size:
            raise DataError(f"global_batch {global_batch} is smaller than the world size {world_size}")
        self.dataset = dataset
        self.global_batch = global_batch
        self.rank = rank
        self.world_size = world_size

    def indices(self, step: int) -> list[int]:
        base = step * self.global_batch
        return [base + j for j in range(self.rank, self.global_batch, self.world_size)]

    def batch(self, indices: list[int]) -> np.ndarray:
        return np.stack([self.dataset.sample(i) for i in indices])

    def labels(self, indices: list[int]) -> np.ndarray | None:
        """Per-token labels when the dataset masks its loss (completion/chat), else None."""
        fn = getattr(self.dataset, "sample_labels", None)
        return None if fn is None else np.stack([fn(i) for i in indices])

    def state(self, step: int) -> dict[str, Any]:
        """The data-loader state after ``step`` optimizer steps (stored in checkpoint manifests)."""
        seen = step * self.global_batch
        pos = getattr(self.dataset, "position", None)
        where = pos(seen) if pos is not None else {}
        return {"step": step, "samples_seen": seen, "global_batch": self.global_batch, **where}


def mlm_mask(
    tokens: np.ndarray, indices: list[int], seed: int, vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Mask 15 % of positions (at least one per sample); the choice depends only on the sample index."""
    inputs = tokens.copy()
    labels = np.full_like(tokens, -100)
    mask_id = MASK_ID if vocab_size > MASK_ID else vocab_size - 1
    for row, idx in enumerate(indices):
        rng = np.random.default_rng(derive_seed(seed, "mlm", idx))
        m: np.ndarray = np.asarray(rng.random(tokens.shape[1]) < 0.15)
        if not m.any():
            m[int(rng.integers(0, tokens.shape[1]))] = True
        labels[row, m] = tokens[row, m]
        inputs[row, m] = mask_id
    return inputs, labels


def build_datasets(
    dataset: str | None, *, vocab_size: int, seq_len: int, seed: int, tokenizer_path: str | None = None
) -> tuple[TokenDataset, TokenDataset | None]:
    """(train, eval or None). A registered version is read from storage; anything else as before."""
    manifest_doc = os.environ.get(DATASET_MANIFEST_ENV)
    if dataset is not None and dataset.startswith("ds://") and manifest_doc:
        manifest = json.loads(manifest_doc)
        if manifest.get("id") != dataset:
            raise DataError(f"the launch carries dataset {manifest.get('id')}, not {dataset}")
        tok: Any
        tok = (
            HFTokenizer(tokenizer_path, vocab_size)
            if tokenizer_path is not None
            else ByteTokenizer(vocab_size)
        )
        out: list[TokenDataset | None] = []
        for split in ("train", "eval"):
            if split == "eval" and not (manifest["splits"].get("eval") or {}).get("rows"):
                out.append(None)
                continue
            rows = read_split(manifest, split)
            source = f"{dataset}#{split}"
            if manifest.get("format") == "text":
                out.append(CorpusDataset([r["text"] for r in rows], tok, seq_len, seed, source))
            else:
                out.append(ExampleDataset(rows, tok, seq_len, seed, source))
        train = out[0]
        assert train is not None
        return train, out[1]
    return build_dataset(
        dataset, vocab_size=vocab_size, seq_len=seq_len, seed=seed, tokenizer_path=tokenizer_path
    ), None


def build_dataset(
    dataset: str | None, *, vocab_size: int, seq_len: int, seed: int, tokenizer_path: str | None = None
) -> TokenDataset:
    if dataset is None:
        return SyntheticDataset(vocab_size, seq_len, seed)
    if dataset.startswith("ds://"):
        resolved = os.environ.get("TRAINYARD_DATASET_PATH")
        if not resolved:
            raise DataError(
                f"registered dataset {dataset} was not resolved to a file (TRAINYARD_DATASET_PATH)"
            )
        path = resolve_path(resolved)
    else:
        path = resolve_path(dataset)
    tok: Any
    tok = HFTokenizer(tokenizer_path, vocab_size) if tokenizer_path is not None else ByteTokenizer(vocab_size)
    return CorpusDataset(read_documents(path), tok, seq_len, seed, str(path))
