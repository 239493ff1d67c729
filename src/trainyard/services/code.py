"""Code archives for ``entrypoint`` jobs: `trainyard submit --workdir DIR` uploads the directory as a
gzip-compressed tar; it is checked member by member (tarfile's ``data`` filter: no absolute paths,
``..``, links leading out of the tree, devices or set-uid bits), stored content-addressed as
``<tenant code area>/<sha256>.tar.gz`` and named in the spec as ``entrypoint.code``. The executor
unpacks it once, read-only, and the sandbox mounts it as the command's working directory."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from trainyard.errors import InvalidInputError
from trainyard.runtime.storage import atomic_write_bytes, url_to_fs
from trainyard.services.domain import Principal
from trainyard.tenancy.storage import StoragePolicy

MAX_MEMBERS = 20_000
MAX_UNPACKED_BYTES = 512 * 1024 * 1024
EXCLUDED = {".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"}


@dataclass(frozen=True)
class CodeArchive:
    url: str
    sha256: str
    bytes: int

    def to_dict(self) -> dict[str, object]:
        return {"url": self.url, "sha256": self.sha256, "bytes": self.bytes}


def _bad(message: str) -> InvalidInputError:
    return InvalidInputError(
        f"code archive: {message}",
        hint="Upload a gzip-compressed tar of your code directory (`trainyard submit --workdir DIR`).",
        details={"errors": [{"field": "body", "message": message}]},
    )


def check_archive(data: bytes) -> None:
    """Raise InvalidInputError unless ``data`` is a gzip tar whose every member is safe to unpack."""
    if not data:
        raise _bad("the request body is empty")
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            total = 0
            for n, member in enumerate(tar, 1):
                if n > MAX_MEMBERS:
                    raise _bad(f"more than {MAX_MEMBERS} files")
                try:
                    tarfile.data_filter(member, "/unpack")
                except tarfile.FilterError as exc:
                    raise _bad(
                        f"{member.name!r} cannot be unpacked safely ({exc.__class__.__name__})"
                    ) from None
                total += max(0, member.size)
                if total > MAX_UNPACKED_BYTES:
                    raise _bad(f"unpacks to more than {MAX_UNPACKED_BYTES // 2**20} MiB")
    except (tarfile.TarError, EOFError, OSError, ValueError):
        raise _bad("not a gzip-compressed tar archive") from None


def store_archive(policy: StoragePolicy, principal: Principal, data: bytes) -> CodeArchive:
    """Check and store an archive in the tenant's code area, content-addressed (a resend is a no-op)."""
    check_archive(data)
    digest = hashlib.sha256(data).hexdigest()
    area = policy.area(principal.tenant_name, "code")
    url = f"{area}/{digest}.tar.gz"
    fs, path = url_to_fs(url)
    if not fs.exists(path):
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        atomic_write_bytes(fs, path, data)
    return CodeArchive(url=url, sha256=digest, bytes=len(data))


def pack_directory(root: Path) -> bytes:
    """A reproducible gzip tar of ``root`` (sorted names, zero times and owners; caches left out)."""
    if not root.is_dir():
        raise InvalidInputError(f"--workdir {root} is not a directory")
    buf = io.BytesIO()
    import gzip

    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED)
            for name in sorted(filenames):
                full = Path(dirpath) / name
                if full.is_symlink() or not full.is_file():
                    continue
                info = tar.gettarinfo(str(full), arcname=str(full.relative_to(root)))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                info.mode = 0o755 if os.access(full, os.X_OK) else 0o644
                with open(full, "rb") as fh:
                    tar.addfile(info, fh)
    return buf.getvalue()
