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
    with fs.open(path, "rb") as fh:
        while True:
            chunk = fh.read(HASH_CHUNK_BYTES)
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def atomic_write_bytes(fs: Any, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees either nothing or all of it (write temp, rename)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    if is_local(fs):
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return
    fs.pipe_file(tmp, data)
    fs.mv(tmp, path)
