"""What a sandboxed replica serves: copies of the tenant's model, tokenizer and adapter files, shared by
both launchers (``replicas.LocalLauncher`` and ``ray_replicas.ReplicaActor``).

A model directory is the tenant's (a job it ran wrote it), so it may hold symbolic links to the
server's key or database, and the server's own files stay 0600 in 0700 directories (DESIGN §3.6),
which the sandbox uid cannot read anyway. The replica therefore reads a per-replica copy: regular files
and directories only (a link is neither followed nor copied), the directories ``root:<sandbox gid>
0750`` and the files the sandbox uid's (:meth:`Sandbox.share_dir`, :meth:`Sandbox.give_read`), mounted
read-only into its sandbox. The layout under a replica's directory is ``model/``, ``tokenizer/`` (when
it is not the model's) and ``adapters/<name>/``.

Each of those is staged into a fresh directory beside it and then renamed into its place
(:func:`replace_tree`), so a copy holds exactly the files of what was staged last: re-staging an
adapter whose new version lacks a file of the old one leaves no trace of that file, and a copy is never
seen half-written."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.executors.sandbox import Sandbox

if TYPE_CHECKING:
    from trainyard.serving.replicas import LaunchSpec


def stage_tree(src: Path, dst: Path, sandbox: Sandbox) -> Path:
    """A copy of the files under ``src`` at ``dst`` that the sandbox uid reads: regular files and
    directories only (a symbolic link is neither followed nor copied), the directories the server's."""
    dst.mkdir(parents=True, exist_ok=True)
    sandbox.share_dir(dst)
    if src.is_symlink() or not src.is_dir():
        return dst
    for entry in sorted(src.iterdir()):
        if entry.is_symlink():
            continue
        if entry.is_dir():
            stage_tree(entry, dst / entry.name, sandbox)
        elif entry.is_file():
            target = dst / entry.name
            shutil.copyfile(entry, target, follow_symlinks=False)
            sandbox.give_read(target)
    return dst


_REPLACING = threading.Lock()  # one swap at a time: two stagings of one name must not interleave


def replace_tree(src: Path, dst: Path, sandbox: Sandbox) -> Path:
    """:func:`stage_tree` of ``src`` into a new directory beside ``dst``, renamed into ``dst``'s place
    (the previous copy, if any, is removed): ``dst`` ends up with exactly ``src``'s regular files.
    The staging directory's name starts with a dot, which no staged name (:func:`safe_name`) does."""
    parent = dst.parent
    parent.mkdir(parents=True, exist_ok=True)
    fresh = parent / f".{dst.name}.new-{secrets.token_hex(6)}"
    old = parent / f".{dst.name}.old-{secrets.token_hex(6)}"
    moved = False
    try:
        stage_tree(src, fresh, sandbox)
        with _REPLACING:
            if dst.exists() or dst.is_symlink():
                os.rename(dst, old)
                moved = True
            try:
                os.rename(fresh, dst)
            except BaseException:
                if moved:
                    os.rename(old, dst)
                raise
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    if moved:
        shutil.rmtree(old, ignore_errors=True)
    return dst


def safe_name(name: str, default: str = "adapter") -> str:
    """``name`` as one path component (no separator, no leading dot)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).lstrip(".") or default


def adapter_dir_name(name: str) -> str:
    """The directory adapter ``name`` is staged into: its :func:`safe_name` and a digest of the name
    itself, so that two names with the same safe form (``a/b`` and ``a_b``) never share a copy."""
    return f"{safe_name(name)}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def stage_adapter(sandbox: Sandbox, staged: Path, name: str, path: str) -> Path:
    """A copy of adapter ``name`` (the directory ``path``) under ``staged/adapters``; where it is."""
    adapters = staged / "adapters"
    adapters.mkdir(parents=True, exist_ok=True)
    sandbox.share_dir(adapters)
    return replace_tree(Path(path), adapters / adapter_dir_name(name), sandbox)


def seen_at(path: Path, staged: Path, inside: Path | None) -> str:
    """Where the sandbox sees ``path`` (under ``staged``) when ``staged`` is mounted at ``inside``
    (None: at its own path)."""
    return str(path if inside is None else inside / path.relative_to(staged))


def stage_replica(
    sandbox: Sandbox, spec: LaunchSpec, staged: Path, *, inside: Path | None = None
) -> LaunchSpec:
    """``spec`` with the model, tokenizer and adapters replaced by copies under ``staged``, named as the
    sandbox sees them when ``staged`` is mounted at ``inside`` (None: at its own path)."""
    staged.mkdir(parents=True, exist_ok=True)
    sandbox.share_dir(staged)
    model = replace_tree(Path(spec.model_path), staged / "model", sandbox)
    tokenizer = model
    if spec.tokenizer_path and spec.tokenizer_path != spec.model_path:
        tokenizer = replace_tree(Path(spec.tokenizer_path), staged / "tokenizer", sandbox)
    adapters = {
        name: seen_at(stage_adapter(sandbox, staged, name, path), staged, inside)
        for name, path in spec.adapters.items()
    }
    return dataclasses.replace(
        spec,
        model_path=seen_at(model, staged, inside),
        tokenizer_path=seen_at(tokenizer, staged, inside),
        adapters=adapters,
    )
