"""``$TRAINYARD_HOME/server.json``: where a running ``trainyard up`` serves (url, pid, port, started_at).

The server writes it (mode 0600) once it listens and removes it when it stops; every CLI command reads it
to find the server when neither ``--url`` nor ``TRAINYARD_URL`` names one. Standard library only: this is
read at the start of every command.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"


def home() -> Path:
    return Path(os.environ.get("TRAINYARD_HOME") or Path.home() / ".trainyard")


def server_file(base: Path | None = None) -> Path:
    return (base or home()) / "server.json"


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped) is not serving
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def read(base: Path | None = None) -> dict[str, Any] | None:
    """The recorded server, or None when there is none (or the file is unreadable)."""
    try:
        doc = json.loads(server_file(base).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("url"), str) else None


def read_live(base: Path | None = None) -> dict[str, Any] | None:
    """The recorded server if its process is still alive."""
    doc = read(base)
    if doc is None:
        return None
    try:
        return doc if pid_alive(int(doc.get("pid") or 0)) else None
    except (TypeError, ValueError):
        return None


def write(doc: dict[str, Any], base: Path | None = None) -> Path:
    """Write the server record atomically with mode 0600."""
    path = server_file(base)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".server.json.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def remove_if_mine(pid: int, base: Path | None = None) -> None:
    """Remove server.json when it still records ``pid`` (a newer server's record stays)."""
    doc = read(base)
    if doc is not None and doc.get("pid") == pid:
        with contextlib.suppress(OSError):
            server_file(base).unlink()


def resolve_url(explicit: str | None = None) -> tuple[str, str]:
    """The server URL and where it came from: ``--url``, ``TRAINYARD_URL``, ``server.json`` (a live
    ``trainyard up``), or the default."""
    if explicit:
        return explicit.rstrip("/"), "--url"
    env = os.environ.get("TRAINYARD_URL")
    if env:
        return env.rstrip("/"), "TRAINYARD_URL"
    doc = read_live()
    if doc is not None:
        return str(doc["url"]).rstrip("/"), str(server_file())
    return DEFAULT_URL, "default"
