"""fsspec storage helpers for checkpoints: URL → filesystem, atomic small writes, streaming sha256."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

HASH_CHUNK_BYTES = 4 * 1024 * 1024


def url_to_fs(url: str) -> tuple[Any, str]:
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path.rstrip("/") or "/"


def join_url(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])


def is_local(fs: Any) -> bool:
    return isinstance(fs, LocalFileSystem)


def sha256_file(fs: Any, path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    if is_local(fs):  # one reused buffer, no per-chunk allocation; hashlib releases the GIL meanwhile
        buf = bytearray(HASH_CHUNK_BYTES)
        view = memoryview(buf)
        with open(fs._strip_protocol(path), "rb", buffering=0) as raw:
            while got := raw.readinto(buf):
                h.update(view[:got])
                n += got
        return h.hexdigest(), n
    with fs.open(path, "rb") as fh:
        while True:
            chunk = fh.read(HASH_CHUNK_BYTES)
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def fsync_dir(path: str) -> None:
    """Make a local directory's entries (files created or renamed in it) durable."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_bytes(fs: Any, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees either nothing or all of it (write temp, rename)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    if is_local(fs):
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path) or ".")
        return
    fs.pipe_file(tmp, data)
    fs.mv(tmp, path)
