"""Versioned, sharded, atomically committed checkpoints (DESIGN §3.4).

Layout: ``<storage>/<job_id>/step-<N>/`` holds the shards written by ``torch.distributed.checkpoint``
(``__<rank>_<i>.distcp`` files, i < WRITE_THREADS, written in parallel by each rank, plus ``.metadata``)
and ``manifest.json``, written LAST by an atomic rename. The manifest records the step, world size,
precision policy, layout, the sha256 and size of every other file, the config and code hashes, every
rank's RNG state and the data-loader position. A step directory without a manifest does not exist for
loading; one whose files do not match their recorded sha256 is skipped with an event and never loaded.

Saving is asynchronous by default: a background thread copies the state into reused CPU buffers while
training runs the next forward/backward pass (the trainer waits for the copy only before its next
optimizer update), then writes the copy (every file hashed while it is written, then fsynced); rank 0
commits the manifest once every rank's shards are durable. Retention keeps the last ``keep_last``
committed steps plus the best (lowest-loss) one. A second root (``fallback_url``, a local directory)
receives an emergency save when the primary storage fails, and loading considers both.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from trainyard.runtime.storage import (
    atomic_write_bytes,
    fsync_dir,
    is_local,
    join_url,
    sha256_file,
    url_to_fs,
)

MANIFEST = "manifest.json"
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of the shards
FORMAT = "trainyard-checkpoint/1"
STEP_RE = re.compile(r"^step-(\d+)$")
REQUIRED_FIELDS = ("format", "job_id", "step", "world_size", "precision", "layout", "files")

EmitFn = Callable[..., Any]

# single-process saves and loads are intended; DCP warns about them on every call
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


class CheckpointWriteError(RuntimeError):
    """The checkpoint storage refused a write (unwritable, full, gone)."""


@dataclass(frozen=True)
class CheckpointRef:
    step: int
    url: str  # the step directory
    manifest: dict[str, Any]

    @property
    def world_size(self) -> int:
        return int(self.manifest["world_size"])


@dataclass
class SaveResult:
    step: int
    url: str
    bytes_written: int
    stage_s: float  # the time training waited (staging; the whole save when synchronous)
    total_s: float  # from the save call to the committed manifest
    emergency: bool = False
    files: dict[str, Any] = field(default_factory=dict)


class ReusedBufferStager:
    """DCP async stager that copies the state into CPU buffers kept from the previous save.

    Staging is the part of an asynchronous save that training waits for. Allocating fresh memory for
    every save costs page faults that dwarf the copy itself; reusing buffers (one save in flight at a
    time, which the manager guarantees) leaves a plain memory copy.
    """

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self._cache: Any = None
        self._signature: Any = None

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    @staticmethod
    def _sig(obj: Any) -> Any:
        import torch

        if isinstance(obj, torch.Tensor):
            return ("t", tuple(obj.shape), obj.dtype)
        if isinstance(obj, dict):
            return ("d", tuple((k, ReusedBufferStager._sig(v)) for k, v in obj.items()))
        if isinstance(obj, list | tuple):
            return ("l", type(obj).__name__, tuple(ReusedBufferStager._sig(v) for v in obj))
        return ("o",)

    @staticmethod
    def _copy(src: Any, dst: Any) -> Any:
        import copy

        import torch

        if isinstance(src, torch.Tensor):
            if dst is None:
                return src.detach().to("cpu", copy=True)
            dst.copy_(src.detach())
            return dst
        if isinstance(src, dict):
            return {
                k: ReusedBufferStager._copy(v, None if dst is None else dst.get(k)) for k, v in src.items()
            }
        if isinstance(src, list | tuple):
            items = [ReusedBufferStager._copy(v, None if dst is None else dst[i]) for i, v in enumerate(src)]
            return items if isinstance(src, list) else type(src)(items)
        return copy.deepcopy(src)

    def stage(self, state_dict: Any) -> Any:
        sig = self._sig(state_dict)
        reuse = self._cache if sig == self._signature else None
        self._cache = self._copy(state_dict, reuse)
        self._signature = sig
        return self._cache

    def synchronize_staging(self) -> None:
        return None

    def close(self) -> None:
        return None


class _HashingStream:
    """A write stream that hashes (sha256) and counts what passes through it on its way to the file."""

    def __init__(self, raw: Any, on_close: Callable[[str, int], None]) -> None:
        self._raw = raw
        self._h = hashlib.sha256()
        self._n = 0
        self._on_close = on_close

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._h.update(view)
        self._n += view.nbytes
        return int(self._raw.write(data) or view.nbytes)

    def seek(self, *args: Any) -> Any:  # a seek would make the running hash wrong: refuse it
        raise OSError("checkpoint streams are written sequentially")

    def seekable(self) -> bool:
        return False

    def finish(self) -> None:
        self._on_close(self._h.hexdigest(), self._n)

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno (fsync), ...
        return getattr(self._raw, name)


# Parallel shard writes: a rank's state is split into up to WRITE_THREADS files (``__<rank>_<i>.distcp``,
# balanced by bytes), each written, hashed and fsynced by its own thread; hashlib and file writes release
# the GIL, so the threads overlap hashing with writing. Small states stay in one file.
WRITE_THREADS = max(
    1, int(os.environ.get("TRAINYARD_CHECKPOINT_WRITE_THREADS", "") or min(4, os.cpu_count() or 1))
)
MIN_BYTES_PER_WRITE_THREAD = 16 * 2**20

_crc_lock = threading.Lock()
_crc_users = 0


@contextlib.contextmanager
def _without_zip_crc32() -> Any:
    """torch.save computes a CRC32 of every record while holding the GIL; the manifest's sha256 already
    covers every byte, so DCP shard writes skip it (torch.load does not need it). Reference-counted, so
    overlapping saves restore the setting only when the last one ends."""
    import torch.serialization as ser

    global _crc_users
    with _crc_lock:
        if _crc_users == 0:
            _without_zip_crc32.saved = ser.get_crc32_options()  # type: ignore[attr-defined]
            ser.set_crc32_options(False)
        _crc_users += 1
    try:
        yield
    finally:
        with _crc_lock:
            _crc_users -= 1
            if _crc_users == 0:
                ser.set_crc32_options(_without_zip_crc32.saved)  # type: ignore[attr-defined]


def write_thread_count(item_bytes: list[int], max_threads: int = WRITE_THREADS) -> int:
    """How many shard files (one writer thread each) a rank's write items are split into."""
    if not item_bytes:
        return 1
    by_size = sum(item_bytes) // MIN_BYTES_PER_WRITE_THREAD
    return max(1, min(max_threads, len(item_bytes), by_size))


def hashing_writer(url: str, hashes: dict[str, tuple[str, int]], *, thread_count: int | None = None) -> Any:
    """A DCP ``FsspecWriter`` that hashes every file it writes while writing it (``hashes``: path →
    (sha256, bytes), for the files this rank wrote), so committing a step need not read them back.
    Shards are written by parallel threads (``thread_count``, default: by size, up to WRITE_THREADS)."""
    from torch.distributed.checkpoint._fsspec_filesystem import FileSystem, FsspecWriter
    from torch.distributed.checkpoint.filesystem import _item_size
    from torch.distributed.checkpoint.planner import WriteItemType

    lock = threading.Lock()

    def record(key: str, digest: str, n: int) -> None:
        with lock:
            hashes[key] = (digest, n)

    class _HashingFileSystem(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path: Any, mode: str) -> Any:
            with super().create_stream(path, mode) as raw:
                if "w" not in mode:
                    yield raw
                    return
                key = os.fspath(path)
                stream = _HashingStream(raw, lambda d, n: record(key, d, n))
                yield stream
                stream.finish()

        def rename(self, path: Any, new_path: Any) -> None:
            super().rename(path, new_path)
            with lock:
                got = hashes.pop(os.fspath(path), None)
                if got is not None:
                    hashes[os.fspath(new_path)] = got

    class _ParallelHashingWriter(FsspecWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            if thread_count is None:
                sizes = [_item_size(i) for i in plan.items if i.type != WriteItemType.BYTE_IO]
                self.thread_count = write_thread_count(sizes)
            with _without_zip_crc32():
                return super().write_data(plan, planner)

    writer = _ParallelHashingWriter(url, sync_files=True, thread_count=thread_count or 1)
    fs: Any = _HashingFileSystem()
    fs.fs = cast(Any, writer.fs).fs  # the fsspec filesystem init_path resolved for ``url``
    writer.fs = fs
    return writer


def code_hash() -> str:
    """sha256 over the runtime's source files: which code wrote a checkpoint."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for p in sorted(root.glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def config_hash(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _noop_emit(kind: str, **data: Any) -> None:
    return None


class CheckpointManager:
    def __init__(
        self,
        storage_url: str,
        job_id: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        keep_last: int = 3,
        keep_best: bool = True,
        process_group: Any = None,
        emit: EmitFn | None = None,
        fallback_url: str | None = None,
        write_threads: int | None = None,
    ):
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1")
        self.storage_url = storage_url
        self.job_id = job_id
        self.rank = rank
        self.world_size = world_size
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.pg = process_group
        self.emit: EmitFn = emit or _noop_emit
        self.job_url = join_url(storage_url, job_id)
        self.fallback_job_url = join_url(fallback_url, job_id) if fallback_url else None
        self.commit_delay_s = float(os.environ.get("TRAINYARD_CHECKPOINT_COMMIT_DELAY_S", "0") or 0)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt")
        self._pending: Future[SaveResult] | None = None
        self._stager = ReusedBufferStager()
        self._staged: threading.Event | None = None
        self._stall_s = 0.0
        self.last_save: SaveResult | None = None
        self._code_hash = code_hash()
        self.write_threads = write_threads  # shard files (writer threads) per rank; None: by size

    # ---- listing and verification ---------------------------------------------------------------
    def roots(self) -> list[str]:
        return [self.job_url] + ([self.fallback_job_url] if self.fallback_job_url else [])

    def step_url(self, step: int, root: str | None = None) -> str:
        return join_url(root or self.job_url, f"step-{step}")

    @staticmethod
    def list_step_dirs(job_url: str) -> list[tuple[int, str]]:
        """(step, url) of every ``step-N`` directory under a job URL, newest first."""
        fs, root = url_to_fs(job_url)
        try:
            entries = fs.ls(root, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for e in entries:
            m = STEP_RE.match(str(e).rstrip("/").rsplit("/", 1)[-1])
            if m:
                out.append((int(m.group(1)), join_url(job_url, f"step-{m.group(1)}")))
        return sorted(out, reverse=True)

    @staticmethod
    def read_manifest(step_url: str) -> dict[str, Any] | None:
        fs, path = url_to_fs(step_url)
        try:
            with fs.open(f"{path}/{MANIFEST}", "rb") as fh:
                doc = json.loads(fh.read())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except ValueError:
            return {"_unreadable": True}
        return doc if isinstance(doc, dict) else {"_unreadable": True}

    @staticmethod
    def verify(step_url: str) -> tuple[bool, str, dict[str, Any] | None]:
        """(ok, why, manifest): the manifest parses, names every field, and every file matches its sha256."""
        manifest = CheckpointManager.read_manifest(step_url)
        if manifest is None:
            return False, "torn: no manifest.json (the write never committed)", None
        if manifest.get("_unreadable"):
            return False, "corrupt: manifest.json is not valid JSON", None
        missing = [f for f in REQUIRED_FIELDS if f not in manifest]
        if missing:
            return False, f"corrupt: manifest lacks {', '.join(missing)}", None
        if manifest["format"] != FORMAT:
            return False, f"unknown checkpoint format {manifest['format']!r}", None
        fs, path = url_to_fs(step_url)
        # both ways: nothing on disk that the manifest does not list (a shard written after, or left out
        # of, the manifest), and every shard the checkpoint's own index refers to is listed
        try:
            on_disk = {str(full)[len(path) :].lstrip("/") for full in fs.find(path)}
        except OSError as exc:
            return False, f"unreadable: listing the step failed ({exc.__class__.__name__})", manifest
        listed = set(manifest["files"])
        # the manifest itself and the temporary files of atomic writes (``manifest.json.tmp-<pid>``), named
        # within the step as the commit names them: a ``.tmp-`` in the storage path above must not hide a file
        unlisted = sorted(rel for rel in on_disk - listed if rel != MANIFEST and ".tmp-" not in rel)
        if unlisted:
            return False, f"corrupt: {unlisted[0]} is on disk but not in the manifest", manifest
        is_dcp = (manifest.get("layout") or {}).get("format", "torch-dcp") == "torch-dcp"
        if is_dcp and DCP_METADATA not in listed:
            return False, f"corrupt: the manifest does not list {DCP_METADATA}", manifest
        files = sorted(manifest["files"].items())

        def digest_of(rel: str) -> tuple[str, int] | None:
            try:
                return sha256_file(fs, f"{path}/{rel}")
            except FileNotFoundError:
                return None

        # the files are hashed in parallel (hashlib and reads release the GIL)
        workers = max(1, min(WRITE_THREADS, len(files)))
        if workers == 1:
            digests = [digest_of(rel) for rel, _ in files]
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-verify") as ex:
                digests = list(ex.map(digest_of, [rel for rel, _ in files]))
        for (rel, info), got in zip(files, digests, strict=True):
            if got is None:
                return False, f"corrupt: {rel} is missing", manifest
            digest, size = got
            if size != info["bytes"]:
                return False, f"corrupt: {rel} has {size} bytes, the manifest says {info['bytes']}", manifest
            if digest != info["sha256"]:
                return False, f"corrupt: sha256 of {rel} does not match the manifest", manifest
        if DCP_METADATA in listed:
            needed = _dcp_shard_files(step_url)
            if needed is None:
                return False, f"corrupt: {DCP_METADATA} cannot be read", manifest
            absent = sorted(needed - listed)
            if absent:
                return False, f"corrupt: shard {absent[0]} is not in the manifest", manifest
        return True, "ok", manifest

    def quarantine(self, ref: CheckpointRef, why: str) -> str | None:
        """Move a step that verified but failed to load out of the ``step-N`` namespace (renamed to
        ``quarantined-step-N-<time>``), so no later attempt picks it again; the files stay for a post-mortem.
        Returns the new URL, or None when the step could not be moved (it is then removed)."""
        fs, path = url_to_fs(ref.url)
        parent, name = path.rstrip("/").rsplit("/", 1)
        target = f"{parent}/quarantined-{name}-{int(time.time() * 1000)}"
        try:
            fs.mv(path, target, recursive=True)
            moved: str | None = join_url(ref.url.rstrip("/").rsplit("/", 1)[0], target.rsplit("/", 1)[-1])
        except OSError:
            self._delete_step(fs, ref.url)
            moved = None
        self.emit(
            "log",
            message=f"quarantined checkpoint step {ref.step}: {why}",
            quarantined_step=ref.step,
            why=why[:500],
            path=moved or ref.url,
        )
        return moved

    def committed(self) -> list[CheckpointRef]:
        """Steps with a manifest in the primary root (not hash-verified), newest first."""
        out = []
        for step, url in self.list_step_dirs(self.job_url):
            man = self.read_manifest(url)
            if man is not None and not man.get("_unreadable"):
                out.append(CheckpointRef(step, url, man))
        return out

    def latest_valid(self, *, report: bool = True) -> CheckpointRef | None:
        """The newest step whose manifest verifies, across the primary and fallback roots.

        Torn or corrupted steps are skipped (with a ``log`` event when ``report``), never loaded.
        """
        candidates: list[tuple[int, int, str]] = []
        for prio, root in enumerate(self.roots()):
            candidates.extend((step, -prio, url) for step, url in self.list_step_dirs(root))
        for step, _prio, url in sorted(candidates, reverse=True):
            ok, why, manifest = self.verify(url)
            if ok and manifest is not None:
                return CheckpointRef(step, url, manifest)
            if report:
                self.emit(
                    "log",
                    message=f"skipping checkpoint step {step}: {why}",
                    skipped_step=step,
                    why=why,
                    path=url,
                )
        return None

    def remove_newer_than(self, step: int) -> None:
        """Delete step directories above ``step`` in the primary root (torn or failed-verification
        leftovers of an earlier attempt), so the steps this attempt writes start from clean directories."""
        fs, _ = url_to_fs(self.job_url)
        for s, url in self.list_step_dirs(self.job_url):
            if s > step:
                self._delete_step(fs, url)
                self.emit("log", message=f"removed unusable checkpoint directory step-{s}", removed_step=s)

    # ---- saving ----------------------------------------------------------------------------------
    def _ensure_dir(self, url: str) -> None:
        fs, path = url_to_fs(url)
        try:
            fs.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise CheckpointWriteError(f"cannot create {url}: {exc.__class__.__name__}: {exc}") from exc

    def save(
        self,
        step: int,
        state: dict[str, Any],
        meta: dict[str, Any],
        *,
        blocking: bool = False,
        emergency: bool = False,
        root: str | None = None,
        overlap_staging: bool = False,
    ) -> Future[SaveResult]:
        """Save ``state`` (a DCP state dict) as ``step``; ``meta`` goes into the manifest.

        Returns a future; with ``blocking`` it is already done. Only one save is in flight at a time:
        a new save first waits for the previous one. An asynchronous save returns once the state has
        been copied, unless ``overlap_staging``: then it returns at once and the caller must call
        ``wait_staged()`` before it modifies any tensor of ``state``.
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

        self.wait()
        url = self.step_url(step, root)
        t0 = time.perf_counter()
        try:
            self._ensure_dir(url)
            hashes: dict[str, tuple[str, int]] = {}
            writer = hashing_writer(url, hashes, thread_count=self.write_threads)
            if blocking:
                dcp.save(state, storage_writer=writer, process_group=self.pg, no_dist=_no_dist())
        except CheckpointWriteError:
            raise
        except (Exception, CheckpointException) as exc:
            raise CheckpointWriteError(f"writing {url} failed: {exc.__class__.__name__}: {exc}") from exc
        self._stall_s = time.perf_counter() - t0

        def commit() -> SaveResult:
            result = SaveResult(step, url, 0, self._stall_s, 0.0, emergency)
            removed_steps: list[int] = []
            if self.rank == 0:
                self._commit(url, step, meta, result, written=hashes)
                with contextlib.suppress(Exception):
                    removed_steps = self.apply_retention(current_step=step, root=root)
            result.total_s = time.perf_counter() - t0
            result.stage_s = self._stall_s
            if self.rank == 0:
                self.emit(
                    "checkpoint",
                    step=step,
                    path=url,
                    save_s=round(result.total_s, 6),
                    stall_s=round(result.stage_s, 6),
                    bytes=result.bytes_written,
                    emergency=emergency,
                    removed_steps=sorted(removed_steps),
                )
            self.last_save = result
            return result

        if blocking:
            fut: Future[SaveResult] = Future()
            try:
                fut.set_result(commit())
            except (Exception, CheckpointException) as exc:
                fut.set_exception(exc)
                raise
            return fut

        staged = threading.Event()
        self._staged = staged

        def background() -> SaveResult:
            # 1. copy the state into reused buffers while training runs its next forward/backward
            #    (which only reads parameters); the trainer calls wait_staged() before it updates them
            try:
                snapshot = self._stager.stage(state)
            finally:
                staged.set()
            # 2. write the snapshot, 3. hash and commit
            try:
                dcp.save(snapshot, storage_writer=writer, process_group=self.pg, no_dist=_no_dist())
            except (Exception, CheckpointException) as exc:
                raise CheckpointWriteError(f"writing {url} failed: {_root_cause(exc)}") from exc
            return commit()

        self._pending = self._pool.submit(background)
        if not overlap_staging:
            self.wait_staged()
        return self._pending

    def wait_staged(self) -> None:
        """Block until the in-flight save has copied the state (call before changing parameters)."""
        staged = self._staged
        if staged is None:
            return
        if not staged.is_set():
            t0 = time.perf_counter()
            staged.wait()
            self._stall_s += time.perf_counter() - t0
        self._staged = None

    def _commit(
        self,
        url: str,
        step: int,
        meta: dict[str, Any],
        result: SaveResult,
        written: dict[str, tuple[str, int]] | None = None,
    ) -> None:
        """Hash the step's files (those this rank wrote were hashed while being written; other ranks'
        are read back) and commit the manifest."""
        fs, path = url_to_fs(url)
        files: dict[str, Any] = {}
        known = {str(url_to_fs(k)[1]) if "://" in k else k: v for k, v in (written or {}).items()}
        try:
            for full in sorted(fs.find(path)):
                rel = str(full)[len(path) :].lstrip("/")
                if rel == MANIFEST or ".tmp-" in rel:
                    continue
                got = known.get(str(full))
                if got is not None and fs.size(full) == got[1]:
                    digest, size = got
                else:
                    digest, size = sha256_file(fs, full)
                files[rel] = {"sha256": digest, "bytes": size}
        except OSError as exc:
            raise CheckpointWriteError(f"hashing the shards of {url} failed: {_root_cause(exc)}") from exc
        if not files:
            raise CheckpointWriteError(f"{url} holds no shard files after the save")
        result.bytes_written = sum(f["bytes"] for f in files.values())
        result.files = files
        manifest = {
            "format": FORMAT,
            "job_id": self.job_id,
            "step": step,
            "world_size": self.world_size,
            "files": files,
            "code_hash": self._code_hash,
            "created_time_s": time.time(),
            "emergency": result.emergency,
            **meta,
        }
        manifest.setdefault("precision", {})
        manifest.setdefault("layout", {"format": "torch-dcp"})
        if self.commit_delay_s > 0:  # drills: widen the window between the shards and the commit
            time.sleep(self.commit_delay_s)
        try:
            atomic_write_bytes(
                fs, f"{path}/{MANIFEST}", json.dumps(manifest, indent=1, sort_keys=True).encode()
            )
            if is_local(fs):  # the step directory's own entry in the job directory
                fsync_dir(path.rstrip("/").rsplit("/", 1)[0] or "/")
        except OSError as exc:
            raise CheckpointWriteError(f"committing {url}/{MANIFEST} failed: {exc}") from exc

    def wait(self) -> SaveResult | None:
        """Block until the in-flight save (if any) has committed; re-raise its error."""
        self.wait_staged()
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        return pending.result()

    @property
    def save_in_flight(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def apply_retention(self, *, current_step: int, root: str | None = None) -> list[int]:
        """Keep the last ``keep_last`` committed steps and the best one; delete older and torn ones."""
        job_url = root or self.job_url
        fs, _ = url_to_fs(job_url)
        committed: list[tuple[int, str, float]] = []
        torn: list[tuple[int, str]] = []
        for step, url in self.list_step_dirs(job_url):
            if step > current_step:
                continue
            man = self.read_manifest(url)
            if man is None or man.get("_unreadable"):
                if step < current_step:
                    torn.append((step, url))
                continue
            loss = man.get("loss")
            committed.append((step, url, float(loss) if isinstance(loss, int | float) else float("inf")))
        keep = {s for s, _, _ in committed[: self.keep_last]}
        if self.keep_best and committed:
            keep.add(min(committed, key=lambda c: (c[2], -c[0]))[0])
        removed = []
        for step, url, _ in committed:
            if step not in keep:
                self._delete_step(fs, url)
                removed.append(step)
        for step, url in torn:
            self._delete_step(fs, url)
            removed.append(step)
        return removed

    @staticmethod
    def _delete_step(fs: Any, url: str) -> None:
        _, path = url_to_fs(url)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(f"{path}/{MANIFEST}")  # uncommit first: a half-deleted step is torn, never loadable
        with contextlib.suppress(FileNotFoundError):
            fs.rm(path, recursive=True)

    # ---- loading ---------------------------------------------------------------------------------
    def load(self, ref: CheckpointRef, state: dict[str, Any]) -> None:
        """Load ``ref`` into ``state`` in place (DCP reshards across world sizes, casts dtypes)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        dcp.load(state, storage_reader=FsspecReader(ref.url), process_group=self.pg, no_dist=_no_dist())

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)


def _dcp_shard_files(step_url: str) -> set[str] | None:
    """The data files a torch-dcp checkpoint's own index (``.metadata``) refers to; None if unreadable."""
    try:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        metadata = FsspecReader(step_url).read_metadata()
        return {str(info.relative_path) for info in (metadata.storage_data or {}).values()}
    except Exception:
        return None


def _no_dist() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized())


def _root_cause(exc: BaseException) -> str:
    seen = exc
    while seen.__cause__ is not None or seen.__context__ is not None:
        seen = seen.__cause__ or seen.__context__  # type: ignore[assignment]
    msg = str(exc).strip().splitlines()
    head = msg[0] if msg else exc.__class__.__name__
    if seen is exc:
        return f"{exc.__class__.__name__}: {head}"
    return f"{seen.__class__.__name__}: {seen} ({head})"
