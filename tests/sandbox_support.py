"""Shared parts of the sandbox attack tests (the local executor's in test_sandbox.py, the Ray executor's
in test_ray_executor.py): a server home with a key and a database to steal, the first attacks of the
user's script, and the checks on what it printed."""

from __future__ import annotations

import os
from pathlib import Path

from trainyard.executors.sandbox import SANDBOX_UID

SECRET = "ty_secretadminkey_0123456789"
DATABASE = "every tenant's jobs"
# server settings and credentials that must not reach user code (given to the executor or the job)
SERVER_SETTINGS = {"TRAINYARD_HOME": "", "TRAINYARD_DATABASE_URL": "sqlite:///x.db"}
CREDENTIALS = {"TRAINYARD_API_KEY": SECRET, "DATABASE_URL": "postgresql://u:pw@127.0.0.1/db"}


def server_home(home: Path) -> dict[str, str]:
    """Fill ``home`` as a server's TRAINYARD_HOME (0700; key and database 0600); the server settings."""
    home.mkdir(mode=0o700, exist_ok=True)
    home.chmod(0o700)
    for name, text in (("api_key", SECRET), ("trainyard.db", DATABASE)):
        (home / name).write_text(text)
        (home / name).chmod(0o600)
    return {**SERVER_SETTINGS, "TRAINYARD_HOME": str(home)}


def first_attacks(home: Path, other: Path) -> str:
    """Shell: who am I, what is in my environment, the server's key and database, another job's files."""
    return f"id -u; echo env:; env; echo :env; cat {home}/api_key; cat {home}/trainyard.db; ls {other}; "


def assert_walled_in(log: str, other: Path) -> str:
    """What ``first_attacks`` printed (rank 0 of attempt 0): not root (the sandbox uid when the server is
    root), no server setting or credential in the environment, neither the key nor the database, and
    no other job's run directory. The environment the script saw."""
    uid = log.split("--- attempt 0 rank 0 ---\n", 1)[1].splitlines()[0]
    assert uid != "0", log
    if os.geteuid() == 0:
        assert uid == str(SANDBOX_UID), log
    env = log.split("env:\n", 1)[1].split(":env", 1)[0]
    for name in (*SERVER_SETTINGS, *CREDENTIALS):
        assert f"{name}=" not in env, (name, env)
    assert SECRET not in log and DATABASE not in log, log
    assert f"ls: cannot access '{other}'" in log, log  # another job's run directory does not exist here
    return env
