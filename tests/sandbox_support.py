"""Shared parts of the sandbox attack tests (the local executor's in test_sandbox.py, the Ray executor's
in test_ray_executor.py): a server home with a key and a database to steal, the first attacks of the
user's script, and the checks on what it printed; a deployment replica seen from outside its sandbox."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


# What tenant code tries against a Ray cluster whose network it shares: read the cluster's token (its
# environment, the token files, every process it can see), connect as a driver (ray.init, with and
# without token mode), and call every RPC method of Ray's services on every socket that listens on the
# nodes' addresses, without a token. It prints one ``RAY-ATTACK {json}`` line.
_RAY_CLIENT_ATTACK = r"""
import glob, json, os, socket, subprocess, sys, urllib.error, urllib.request
import grpc
GCS, TOKEN_FILES, HOSTS, EXPORTERS = __ARGS__
out = {"env": sorted(k for k in os.environ if k.startswith("RAY_")), "files": {}, "environ": []}
for p in [*TOKEN_FILES, os.path.expanduser("~/.ray/auth_token"), "/root/.ray/auth_token"]:
    try:
        out["files"][p] = open(p).read()
    except OSError as exc:
        out["files"][p] = type(exc).__name__
for d in glob.glob("/proc/[0-9]*/environ"):
    try:
        text = open(d, "rb").read().decode(errors="replace")
    except OSError:
        continue
    if "RAY_AUTH" in text:
        out["environ"].append(text)
out["pids"] = sorted(int(p.split("/")[2]) for p in glob.glob("/proc/[0-9]*"))
init = "import ray; ray.init(address=%r); print('RAY-CONNECTED', ray.cluster_resources())" % GCS
out["ray_init"] = {}
for mode in ("unset", "token"):
    env = dict(os.environ)
    if mode == "token":
        env["RAY_AUTH_MODE"] = "token"
    try:
        r = subprocess.run([sys.executable, "-c", init], env=env, capture_output=True, text=True, timeout=120)
        out["ray_init"][mode] = {"connected": "RAY-CONNECTED" in r.stdout, "rc": r.returncode,
                                 "tail": (r.stdout + r.stderr)[-400:]}
    except subprocess.TimeoutExpired:
        out["ray_init"][mode] = {"connected": False, "rc": None, "tail": "timed out"}
methods = set()
import ray.core.generated as gen
for f in glob.glob(os.path.join(list(gen.__path__)[0], "*_pb2_grpc.py")):
    for line in open(f):
        if "'/ray." in line:
            methods.add(line.split("'")[1])
methods |= {"/ray.rpc.ObjectManagerService/Push", "/ray.rpc.ObjectManagerService/Pull",
            "/ray.rpc.ObjectManagerService/FreeObjects", "/grpc.health.v1.Health/Check"}
out["methods"] = len(methods)
def listening():
    found = set()
    for f, fam in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 6)):
        try:
            lines = open(f).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            p = line.split()
            if p[3] != "0A":
                continue
            hexip, hexport = p[1].split(":")
            ip = socket.inet_ntoa(bytes.fromhex(hexip)[::-1]) if fam == 4 else (
                "::" if set(hexip) == {"0"} else "v6")
            if ip in HOSTS or ip in ("0.0.0.0", "::"):
                for h in (HOSTS if ip in ("0.0.0.0", "::") else [ip]):
                    found.add((h, int(hexport, 16)))
    return sorted(found)
out["ports"], out["http"] = {}, {}
for host, port in (listening() if os.environ.get("RANK", "0") == "0" else []):  # one rank scans
    codes = {}
    with grpc.insecure_channel(f"{host}:{port}") as ch:
        for m in sorted(methods):
            try:
                ch.unary_unary(m, request_serializer=lambda b: b, response_deserializer=lambda b: b)(
                    b"", timeout=3)
                codes["OK"] = codes.get("OK", []) + [m]
            except grpc.RpcError as exc:
                codes.setdefault(exc.code().name, []).append(m)
            if set(codes) <= {"UNAVAILABLE", "DEADLINE_EXCEEDED"}:
                break  # not a gRPC server
    out["ports"][f"{host}:{port}"] = {k: (len(v) if k == "UNIMPLEMENTED" else v) for k, v in codes.items()}
    try:  # the HTTP servers (dashboard agent, runtime-env agent, metrics)
        with urllib.request.urlopen(f"http://{host}:{port}/", timeout=3) as resp:
            out["http"][f"{host}:{port}"] = resp.status
    except urllib.error.HTTPError as exc:
        out["http"][f"{host}:{port}"] = exc.code
    except Exception as exc:
        out["http"][f"{host}:{port}"] = type(exc).__name__
out["exporters"] = {}
for where in EXPORTERS:  # where Ray's Prometheus exporters listen when they run (no token needed)
    try:
        with urllib.request.urlopen(f"http://{where}/metrics", timeout=3) as resp:
            out["exporters"][where] = [resp.status, resp.read(200).decode(errors="replace")]
    except urllib.error.HTTPError as exc:
        out["exporters"][where] = [exc.code, ""]
    except Exception as exc:
        out["exporters"][where] = [type(getattr(exc, "reason", exc)).__name__, ""]
print("RAY-ATTACK " + json.dumps(out), flush=True)
"""


HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def ray_client_attack(gcs: str, token_files: list[str], hosts: list[str], exporters: list[str]) -> str:
    """Python source of the attack on the Ray cluster (see above); it also reads ``/metrics`` at every
    ``host:port`` of ``exporters``."""
    return _RAY_CLIENT_ATTACK.replace("__ARGS__", repr((gcs, token_files, hosts, exporters)))


def ray_attack_report(log: str) -> list[dict[str, Any]]:
    """Every ``RAY-ATTACK`` report in a log."""
    import json

    return [json.loads(line.split(" ", 1)[1]) for line in log.splitlines() if line.startswith("RAY-ATTACK ")]


def assert_not_a_ray_client(report: dict[str, Any], token: str, gcs: str, scanned: bool = True) -> None:
    """The attack got nothing: no token anywhere, no driver connection, no metrics from any address a
    Ray exporter would listen on (nothing listens there), no RPC answered without a token (every gRPC
    service refused it as unauthenticated), no HTTP server of the cluster answered, and it did reach
    the GCS's port."""
    blob = repr(report)
    assert token not in blob, report
    assert not [k for k in report["env"] if k.startswith("RAY_AUTH")], report["env"]
    assert not report["environ"], report["environ"]
    for mode, r in report["ray_init"].items():
        assert not r["connected"], (mode, r)
    exporters: dict[str, list[Any]] = report["exporters"]
    assert exporters, report  # it tried them
    read = {where: got for where, got in exporters.items() if got[0] != "ConnectionRefusedError"}
    assert not read, read
    ports: dict[str, dict[str, Any]] = report["ports"]
    if not scanned:
        return
    assert gcs in ports and "UNAUTHENTICATED" in ports[gcs], ports.get(gcs)
    for where, codes in ports.items():
        # gRPC's health check is all that answers without a token ("SERVING": nothing of the cluster's)
        assert codes.get("OK", [HEALTH_CHECK]) == [HEALTH_CHECK], (where, codes)
        # a gRPC server either refuses every method it has (unauthenticated) or is not one of Ray's
        assert set(codes) <= {"OK", "UNAUTHENTICATED", "UNIMPLEMENTED", "UNAVAILABLE", "DEADLINE_EXCEEDED"}, (
            where,
            codes,
        )
    http: dict[str, Any] = report["http"]
    answered = {where for where, status in http.items() if isinstance(status, int) and status < 400}
    assert not answered, (sorted(answered), http)
    assert 401 in http.values(), http  # the agents' HTTP servers were reached, and refused it


def sandboxed_replica(pids: list[int], cmdline: Callable[[int], str]) -> tuple[int, str]:
    """The replica process among ``pids`` (the one in a pid namespace other than ours) and its
    environment; as root, asserts it runs as the sandbox uid without capabilities."""
    ours = os.readlink("/proc/self/ns/pid")
    inside = [
        p
        for p in pids
        if "trainyard.serving.replica" in cmdline(p) and os.readlink(f"/proc/{p}/ns/pid") != ours
    ]
    assert inside, f"no replica process in a pid namespace of its own among {pids}"
    replica = inside[-1]
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{replica}/status").read_text().splitlines() if ":" in line
    )
    if os.geteuid() == 0:
        assert status["Uid"].split()[0] == str(SANDBOX_UID), status["Uid"]
        assert status["CapEff"].strip() == "0000000000000000", status["CapEff"]
    return replica, Path(f"/proc/{replica}/environ").read_bytes().decode(errors="replace")
