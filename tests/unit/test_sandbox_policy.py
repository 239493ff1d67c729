"""The sandbox's policy without a server (DESIGN §3.6, docs/security.md §2): the environment a worker
inherits, the bubblewrap command line (namespaces, mounts, the drop to the sandbox uid), what a run
directory hands to the sandbox uid, the inputs staged for it and the unpacking of a code archive; and
the wall itself, checked in real bubblewrap sandboxes (no network, no path outside the mounts, no
privileges)."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import termios
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import trainyard.executors.sandbox as sb
from trainyard.errors import SandboxUnavailableError, StorageNotAllowedError
from trainyard.executors.base import LaunchRequest
from trainyard.executors.sandbox import (
    SANDBOX_GID,
    SANDBOX_PATH,
    SANDBOX_UID,
    Mounts,
    Sandbox,
    SandboxSpec,
    job_env,
    local_path,
    prepare_run_dir,
    scrubbed_env,
    stage_inputs,
    unpack_code,
)

ROOT = os.geteuid() == 0
SHELL = ["/bin/sh", "-c", 'trap \'\' TERM INT; exec "$0" "$@"']


def _sandbox(**kw: Any) -> Sandbox:
    """A sandbox whose Python installation is one known directory (the command line is then exact)."""
    s = Sandbox(bwrap="/opt/bwrap", **kw)
    s._python = [Path("/opt/py")]
    return s


def _host_part() -> list[str]:
    """/usr, the top-level links or directories into it, /etc's name service files, /sys, /proc, /dev,
    a private /tmp and the GPUs' device nodes: the same in every sandbox."""
    out = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "sbin"):
        link = Path("/") / name
        if link.is_symlink():  # a merged /usr: the link again, not the host's directory
            out += ["--symlink", os.readlink(link), f"/{name}"]
        elif link.is_dir():
            out += ["--ro-bind", f"/{name}", f"/{name}"]
    for name in ("passwd", "group", "hosts", "nsswitch.conf", "ld.so.cache", "localtime", "resolv.conf"):
        out += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    out += ["--ro-bind-try", "/sys", "/sys", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]
    out += ["--perms", "1777", "--tmpfs", "/tmp"]
    for dev in sorted(Path("/dev").glob("nvidia*")):
        out += ["--dev-bind-try", str(dev), str(dev)]
    return out


def _drop() -> list[str]:
    """As root: bubblewrap keeps only what setpriv needs, and setpriv drops to the sandbox uid for good."""
    if not ROOT:
        return []
    return [
        "--cap-add",
        "CAP_SETUID",
        "--cap-add",
        "CAP_SETGID",
        "--",
        str(shutil.which("setpriv")),
        f"--reuid={SANDBOX_UID}",
        f"--regid={SANDBOX_GID}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
    ]


# ---- the environment ---------------------------------------------------------------------------------


def test_a_job_keeps_its_own_variables_and_no_server_setting_or_secret() -> None:
    env = {
        "TRAINYARD_HOME": "/srv/home",
        "TRAINYARD_DATABASE_URL": "postgresql://u:pw@db/x",
        "TRAINYARD_API_KEY": "ty_key",
        "TRAINYARD_PRECISION": "bf16",
        "TRAINYARD_DATASET_PATH": "/data/x",
        "TRAINYARD_TRACEPARENT": "00-ab-cd-01",
        "HF_TOKEN": "hf_x",
        "my_api_key": "k",
        "aws_secret_access_key": "s",
        "DB_PASSWORD": "p",
        "PGPASSWD": "p",
        "GCP_CREDENTIALS": "c",
        "APP_DSN": "d",
        "OTHER_DATABASE": "d",
        "SEED": "7",
        "LR": "0.1",
    }
    assert job_env(env) == {
        "TRAINYARD_PRECISION": "bf16",
        "TRAINYARD_DATASET_PATH": "/data/x",
        "TRAINYARD_TRACEPARENT": "00-ab-cd-01",
        "SEED": "7",
        "LR": "0.1",
    }


def test_a_worker_environment_is_rebuilt_from_the_allow_list() -> None:
    server = {
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TZ": "UTC",
        "OMP_NUM_THREADS": "2",
        "PATH": "/srv/bin",
        "HOME": "/root",
        "TRAINYARD_HOME": "/srv/home",
        "AWS_ACCESS_KEY_ID": "x",
        "PYTHONPATH": "/srv/lib",
        "LD_PRELOAD": "/srv/evil.so",
    }
    extra = {"PATH": "/evil", "HOME": "/root", "SEED": "1", "TRAINYARD_API_KEY": "ty", "PYTHONPATH": "/x"}
    expected = {
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TZ": "UTC",
        "OMP_NUM_THREADS": "2",
        "SEED": "1",
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    src = sb.trainyard_source_dir()
    # trainyard's source tree when it is not installed in site-packages (else the job's own, if any)
    expected["PYTHONPATH"] = "/x" if src is None else str(src)
    assert scrubbed_env(server, extra) == expected


def test_the_source_tree_is_on_the_path_only_outside_site_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainyard

    pkg = Path(trainyard.__file__).resolve().parent.parent
    monkeypatch.setattr(sb, "_site_dirs", lambda: [tmp_path])
    assert sb.trainyard_source_dir() == pkg
    monkeypatch.setattr(sb, "_site_dirs", lambda: [tmp_path, pkg])
    assert sb.trainyard_source_dir() is None
    monkeypatch.setattr(sb, "_site_dirs", lambda: [pkg.parent])
    assert sb.trainyard_source_dir() is None
    monkeypatch.setattr(sb, "_site_dirs", lambda: [pkg / "trainyard"])  # below it: not a site directory of it
    assert sb.trainyard_source_dir() == pkg
    env = scrubbed_env({}, {})
    assert "PYTHONPATH" in env and env["PYTHONPATH"] == str(pkg)


def test_site_directories_are_the_existing_ones_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "u").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    monkeypatch.setattr(
        sb.site, "getsitepackages", lambda: [str(tmp_path / "link"), str(tmp_path / "gone"), ""]
    )
    monkeypatch.setattr(sb.site, "getusersitepackages", lambda: str(tmp_path / "u"))
    assert sb._site_dirs() == [(tmp_path / "a").resolve(), (tmp_path / "u").resolve()]


def test_the_python_installation_is_mounted_where_the_interpreter_sees_it_and_never_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base"
    venv = tmp_path / "real-venv"
    for d in (base, venv / "bin", tmp_path / "site", tmp_path / "src"):
        d.mkdir(parents=True)
    (tmp_path / "venv").symlink_to(venv)  # a virtual environment reached through a link
    monkeypatch.setattr(sb.sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(sb.sys, "exec_prefix", str(tmp_path / "missing"))
    monkeypatch.setattr(sb.sys, "base_prefix", "/")
    monkeypatch.setattr(sb.sys, "executable", str(tmp_path / "bin-elsewhere" / "python"))
    (tmp_path / "bin-elsewhere").mkdir()
    monkeypatch.setattr(sb, "_site_dirs", lambda: [tmp_path / "site", base])
    monkeypatch.setattr(sb, "trainyard_source_dir", lambda: tmp_path / "src")
    got = sb.python_paths()
    assert Path("/") not in got  # "/" would mount the whole machine
    assert sorted(got) == sorted(
        [venv, tmp_path / "venv", tmp_path / "bin-elsewhere", tmp_path / "site", base, tmp_path / "src"]
    )
    monkeypatch.setattr(sb, "trainyard_source_dir", lambda: None)
    assert tmp_path / "src" not in sb.python_paths()
    # a directory inside another is not mounted twice
    monkeypatch.setattr(sb, "_site_dirs", lambda: [venv / "lib", venv])
    (venv / "lib").mkdir()
    assert venv / "lib" not in sb.python_paths() and venv in sb.python_paths()


def test_outermost_keeps_only_the_top_directories() -> None:
    paths = [Path("/a/b"), Path("/c/d/e"), Path("/a"), Path("/c/d"), Path("/a"), Path("/ab")]
    assert sorted(sb._outermost(paths)) == [Path("/a"), Path("/ab"), Path("/c/d")]


def test_local_path_is_only_for_local_urls() -> None:
    assert local_path(None) is None and local_path("") is None
    assert local_path("file:///data/x.jsonl") == Path("/data/x.jsonl")
    assert local_path("/data/x") == Path("/data/x")
    for url in ("s3://bucket/x", "data/x", "hf://gpt2", "ds://x@1", "filex:///y"):
        assert local_path(url) is None, url


# ---- the sandbox itself ----------------------------------------------------------------------------


def test_without_bubblewrap_or_setpriv_the_sandbox_refuses_to_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = shutil.which
    monkeypatch.setattr(sb.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    with pytest.raises(SandboxUnavailableError, match=r"^bubblewrap \(bwrap\) is not installed; workers run"):
        Sandbox()
    assert Sandbox(bwrap="/opt/bwrap").bwrap == "/opt/bwrap"
    monkeypatch.setattr(sb.os, "geteuid", lambda: 0)
    monkeypatch.setattr(sb.shutil, "which", lambda name: "/usr/bin/bwrap" if name == "bwrap" else None)
    with pytest.raises(SandboxUnavailableError, match=r"^setpriv \(util-linux\) is needed to drop"):
        Sandbox()


def test_the_sandbox_uid_is_nobody_as_root_and_the_servers_own_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_which = shutil.which
    monkeypatch.setattr(
        sb.shutil, "which", lambda name: f"/usr/bin/{name}" if name in ("bwrap", "setpriv") else None
    )
    monkeypatch.setattr(sb.os, "geteuid", lambda: 0)
    s = Sandbox()
    assert (s.privileged, s.setpriv, s.uid, s.gid, s.bwrap) == (
        True,
        "/usr/bin/setpriv",
        65534,
        65534,
        "/usr/bin/bwrap",
    )
    s = Sandbox(uid=1234, gid=4321)
    assert (s.uid, s.gid) == (1234, 4321)
    assert s.spec() == SandboxSpec(bwrap="/usr/bin/bwrap", uid=1234, gid=4321)
    monkeypatch.setattr(sb.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sb.os, "getuid", lambda: 1000)
    monkeypatch.setattr(sb.os, "getgid", lambda: 1001)
    s = Sandbox()
    assert (s.privileged, s.setpriv, s.uid, s.gid) == (False, None, 1000, 1001)
    assert s.command(["x"], Mounts())[-2:] == ["--", "x"] and "--cap-add" not in s.command(["x"], Mounts())
    monkeypatch.setattr(sb.shutil, "which", real_which)
    built = SandboxSpec(bwrap="/opt/bwrap", uid=5, gid=6).build()
    assert isinstance(built, Sandbox) and (built.bwrap, built.uid, built.gid) == ("/opt/bwrap", 5, 6)


def test_the_command_line_of_a_single_rank_job() -> None:
    s = _sandbox()
    mounts = Mounts(
        rw=(Path("/runs/job-1"), Path("/store/tenants/t/checkpoints/job-1")),
        ro=(Path("/data/sets/train"), Path("/runs/job-1/inputs/base")),
        ro_at=((Path("/srv/home/replicas/r1"), Path("/replica")),),
        chdir=Path("/runs/job-1"),
        share_net=False,
    )
    # by depth (stable), each after the parents bubblewrap must create for it (0755) unless a mount
    # already holds them: /runs/job-1/inputs lies inside the run directory's mount
    binds = [
        *["--ro-bind", "/srv/home/replicas/r1", "/replica"],
        *["--perms", "0755", "--dir", "/opt", "--ro-bind", "/opt/py", "/opt/py"],
        *["--perms", "0755", "--dir", "/runs", "--bind", "/runs/job-1", "/runs/job-1"],
        *["--perms", "0755", "--dir", "/data", "--perms", "0755", "--dir", "/data/sets"],
        *["--ro-bind-try", "/data/sets/train", "/data/sets/train"],
        *["--ro-bind-try", "/runs/job-1/inputs/base", "/runs/job-1/inputs/base"],
        *["--perms", "0755", "--dir", "/store", "--perms", "0755", "--dir", "/store/tenants"],
        *[
            "--perms",
            "0755",
            "--dir",
            "/store/tenants/t",
            "--perms",
            "0755",
            "--dir",
            "/store/tenants/t/checkpoints",
        ],
        *["--bind", "/store/tenants/t/checkpoints/job-1", "/store/tenants/t/checkpoints/job-1"],
    ]
    got = s.command(["python", "-m", "trainyard.runtime.worker"], mounts)
    head = [*SHELL, "/opt/bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    assert got[: len(head)] == head
    rest = got[len(head) :]
    host = _host_part()
    assert rest[: len(host)] == host
    rest = rest[len(host) :]
    assert rest[0] == "--unshare-net"  # a single rank with local storage has no network at all
    rest = rest[1:]
    tail = ["--chdir", "/runs/job-1", *_drop(), "--", "python", "-m", "trainyard.runtime.worker"]
    assert rest[-len(tail) :] == tail
    assert rest[: -len(tail)] == binds


def test_the_command_line_orders_the_parents_before_the_mounts_below_them() -> None:
    s = _sandbox()
    got = s.command(["true"], Mounts(rw=(Path("/a/b/c"),), ro=(Path("/a/b"),)))
    # /a/b (ro) before /a/b/c (rw, its child); /a made once, /a/b not made (it is a mount)
    i = got.index("/opt/py")
    assert got[i + 2 :] == [
        *["--perms", "0755", "--dir", "/a", "--ro-bind-try", "/a/b", "/a/b"],
        *["--bind", "/a/b/c", "/a/b/c"],
        *_drop(),
        "--",
        "true",
    ]
    assert "--unshare-net" not in got and "--die-with-parent" not in got and "--chdir" not in got
    tied = s.command(["true"], Mounts(share_net=False), die_with_parent=True)
    assert tied.index("--unshare-net") + 1 == tied.index("--die-with-parent") < tied.index("/opt/py")


def test_the_sandbox_exposes_only_what_it_mounts(tmp_path: Path) -> None:
    s = _sandbox()
    mounts = Mounts(
        rw=(tmp_path / "run",), ro=(tmp_path / "data",), ro_at=((tmp_path / "staged", Path("/replica")),)
    )
    for d in ("run", "data", "staged", "home", "runner"):
        (tmp_path / d).mkdir()
    (tmp_path / "home" / "key").write_text("k")
    (tmp_path / "run" / "key-link").symlink_to(tmp_path / "home" / "key")
    assert s.exposes(tmp_path / "run", mounts) and s.exposes(tmp_path / "data" / "x", mounts)
    assert s.exposes(tmp_path / "staged" / "model", mounts) and s.exposes(Path("/opt/py/lib"), mounts)
    assert not s.exposes(tmp_path / "home" / "key", mounts)
    assert not s.exposes(tmp_path / "run" / "key-link", mounts)  # a link is where it leads
    assert not s.exposes(tmp_path / "runner", mounts)  # a sibling with the same prefix
    assert not s.exposes(Path("/replica"), mounts)  # the path inside is not the server's


def test_the_probe_starts_one_empty_sandbox_without_network_once(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _sandbox()
    calls: list[tuple[list[str], dict[str, Any]]] = []
    answers: list[Any] = [
        subprocess.CompletedProcess([], 1, "", "bwrap: No permissions to create new namespace" + "x" * 600)
    ]

    def run(cmd: list[str], **kw: Any) -> Any:
        calls.append((cmd, kw))
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(sb.subprocess, "run", run)
    with pytest.raises(SandboxUnavailableError) as info:
        s.probe()
    said = ("bwrap: No permissions to create new namespace" + "x" * 600)[:500]
    assert str(info.value) == f"the sandbox (bubblewrap) cannot start: {said}"
    cmd, kw = calls[0]
    assert cmd == s.command(["/bin/true"], Mounts(share_net=False)) and "--unshare-net" in cmd
    assert kw == {"capture_output": True, "text": True, "timeout": 60, "env": {"PATH": SANDBOX_PATH}}
    answers.append(subprocess.CompletedProcess([], 1, "  only on stdout \n", ""))
    with pytest.raises(
        SandboxUnavailableError, match=r"^the sandbox \(bubblewrap\) cannot start: only on stdout$"
    ):
        s.probe()
    answers.append(subprocess.TimeoutExpired(["bwrap"], 60))
    with pytest.raises(SandboxUnavailableError, match=r"^the sandbox \(bubblewrap\) cannot start: Command"):
        s.probe()
    answers.append(FileNotFoundError(2, "No such file or directory"))
    with pytest.raises(SandboxUnavailableError, match="No such file or directory"):
        s.probe()
    answers.append(subprocess.CompletedProcess([], 0, "", ""))
    s.probe()
    s.probe()  # once: the second probe starts nothing
    assert len(calls) == 5


# ---- what the sandbox uid may touch ----------------------------------------------------------------


def _mode(p: Path) -> tuple[int, int, int]:
    st = p.lstat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


@pytest.mark.skipif(not ROOT, reason="ownership is handed over only by a server running as root")
def test_ownership_handed_to_the_sandbox_uid(tmp_path: Path) -> None:
    s = Sandbox()
    d, f = tmp_path / "d", tmp_path / "f"
    d.mkdir(mode=0o777)
    f.write_text("x")
    s.own(d)
    s.own(f)
    assert _mode(d) == (SANDBOX_UID, SANDBOX_GID, 0o700) and _mode(f) == (SANDBOX_UID, SANDBOX_GID, 0o600)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    s.share_dir(shared)
    assert _mode(shared) == (0, SANDBOX_GID, 0o750)  # readable, but its entries are the server's
    given = shared / "events.jsonl"
    given.write_text("old\n")
    given.chmod(0o644)
    s.give_file(given)
    assert _mode(given) == (SANDBOX_UID, SANDBOX_GID, 0o644) and given.read_text() == "old\n"  # not truncated
    s.give_file(shared / "new.jsonl")
    assert _mode(shared / "new.jsonl") == (SANDBOX_UID, SANDBOX_GID, 0o600)
    (shared / "link.jsonl").symlink_to(tmp_path / "f")
    with pytest.raises(OSError):  # never through a link
        s.give_file(shared / "link.jsonl")
    launch = shared / "launch-a0.json"
    launch.write_text("{}")
    launch.chmod(0o644)
    s.give_read(launch)
    assert _mode(launch) == (SANDBOX_UID, SANDBOX_GID, 0o600)


def test_an_unprivileged_sandbox_changes_modes_but_no_owner(tmp_path: Path) -> None:
    s = Sandbox()
    s.privileged = False
    d, f = tmp_path / "d", tmp_path / "f"
    d.mkdir(mode=0o777)
    f.write_text("x")
    me = (os.getuid(), os.getgid())
    s.own(d)
    s.own(f)
    s.own(tmp_path / "missing")  # a mode that cannot be set is not an error
    assert _mode(d) == (*me, 0o700) and _mode(f) == (*me, 0o600)
    s.share_dir(d)
    assert _mode(d) == (*me, 0o750)
    s.give_file(d / "e")
    s.give_read(f)
    assert _mode(d / "e") == (*me, 0o600) and _mode(f) == (*me, 0o600)


def _request(tmp_path: Path, **kw: Any) -> LaunchRequest:
    base: dict[str, Any] = {
        "job_id": "job-1",
        "attempt": 2,
        "spec": {"name": "x", "workload": {}, "model": {}},
        "world_size": 1,
        "pool": "local-cpu",
        "market": "on_demand",
        "checkpoint_url": f"file://{tmp_path / 'storage'}",
        "checkpoint_interval_s": None,
        "run_dir": str(tmp_path / "run"),
    }
    base.update(kw)
    return LaunchRequest(**base)


def _run_dir(tmp_path: Path, attempt: int = 2) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / f"launch-a{attempt}.json").write_text("{}")
    return run


def test_a_run_directory_mounts_its_own_checkpoints_and_inputs(tmp_path: Path) -> None:
    s = Sandbox()
    run = _run_dir(tmp_path)
    req = _request(
        tmp_path,
        spec={"workload": {"dataset": "file:///data/train.jsonl"}, "model": {"base": "gpt2"}},
        env={"TRAINYARD_DATASET_PATH": "/data/tokens", "TRAINYARD_BASE_MODEL_PATH": "/models/base"},
    )
    mounts = prepare_run_dir(s, req, run)
    job_dir = tmp_path / "storage" / "job-1"
    assert mounts == Mounts(
        rw=(run, job_dir),
        ro=(Path("/data/train.jsonl"), Path("/data/tokens"), Path("/models/base")),
        chdir=run,
        share_net=False,  # one rank, local storage: no network
    )
    assert job_dir.is_dir() and not (tmp_path / "storage" / "job-2").exists()
    assert sorted(p.name for p in run.iterdir()) == [
        "checkpoints",
        "events-a2-r0.jsonl",
        "launch-a2.json",
        "scratch",
    ]
    if ROOT:
        assert _mode(run) == (0, SANDBOX_GID, 0o750)
        assert _mode(run / "launch-a2.json") == (SANDBOX_UID, SANDBOX_GID, 0o600)
        assert _mode(run / "events-a2-r0.jsonl") == (SANDBOX_UID, SANDBOX_GID, 0o600)
        for owned in (run / "checkpoints", run / "scratch", job_dir):
            assert _mode(owned) == (SANDBOX_UID, SANDBOX_GID, 0o700), owned
    prepare_run_dir(s, req, run)  # again (a relaunch): the directories are there already


@pytest.mark.parametrize(
    ("kw", "net"),
    [
        (
            {"world_size": 2, "checkpoint_url": "s3://bucket/ckpt"},
            True,
        ),  # a gang that needs the host's network
        ({"world_size": 2}, True),  # a gang's collectives
        ({"checkpoint_url": "s3://bucket/ckpt"}, True),  # remote storage
        ({"spec": {"workload": {"dataset": "s3://bucket/train.jsonl"}}}, True),  # a remote dataset
        ({"spec": {"model": {"base": "hf://gpt2"}}}, True),  # a remote base model
        ({"spec": {"workload": {"dataset": "ds://corpus@2"}, "model": {"base": "gpt2"}}}, False),
    ],
)
def test_what_needs_the_network_gets_it(tmp_path: Path, kw: dict[str, Any], net: bool) -> None:
    run = _run_dir(tmp_path)
    mounts = prepare_run_dir(Sandbox(), _request(tmp_path, **kw), run)
    assert mounts.share_net is net and mounts.ro == ()
    # only a gang that needs nothing but its own ranks may get a network namespace of its own
    assert mounts.loopback_only is (kw == {"world_size": 2})
    assert mounts.rw == ((run,) if "checkpoint_url" in kw else (run, tmp_path / "storage" / "job-1"))


def test_event_files_for_every_rank_or_the_ones_named(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    prepare_run_dir(Sandbox(), _request(tmp_path, world_size=3), run)
    assert sorted(p.name for p in run.glob("events-*")) == [f"events-a2-r{r}.jsonl" for r in range(3)]
    other = tmp_path / "other"
    (other / "run").mkdir(parents=True)
    (other / "run" / "launch-a2.json").write_text("{}")
    prepare_run_dir(Sandbox(), _request(other, world_size=3), other / "run", ranks=[1])
    assert sorted(p.name for p in (other / "run").glob("events-*")) == ["events-a2-r1.jsonl"]


def _archive(entries: dict[str, bytes], modes: dict[str, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = (modes or {}).get(name, 0o600)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_code_archives_unpack_read_only_beside_themselves_once(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    archive = code / "abc123.tar.gz"
    archive.write_bytes(_archive({"run.sh": b"echo hi", "pkg/mod.py": b"x = 1"}, {"run.sh": 0o700}))
    target = unpack_code(f"file://{archive}")
    assert target == code / "abc123"
    assert (
        stat.S_IMODE(target.stat().st_mode) == 0o755
        and stat.S_IMODE((target / "pkg").stat().st_mode) == 0o755
    )
    assert stat.S_IMODE((target / "run.sh").stat().st_mode) == 0o755  # executable stays executable
    assert stat.S_IMODE((target / "pkg" / "mod.py").stat().st_mode) == 0o644
    assert (target / "run.sh").read_bytes() == b"echo hi"
    (target / "pkg" / "mod.py").chmod(0o600)
    assert unpack_code(str(archive)) == target  # already unpacked: used as it is
    assert stat.S_IMODE((target / "pkg" / "mod.py").stat().st_mode) == 0o600
    assert sorted(p.name for p in code.iterdir()) == ["abc123", "abc123.tar.gz"]  # no temporary tree left
    # a run directory whose job has code runs in it, read-only
    run = _run_dir(tmp_path)
    mounts = prepare_run_dir(Sandbox(), _request(tmp_path, code_url=f"file://{archive}"), run)
    assert mounts.ro == (target,) and mounts.chdir == target


def test_code_archives_that_escape_or_are_not_archives_are_refused(tmp_path: Path) -> None:
    for url in ("s3://bucket/x.tar.gz", f"file://{tmp_path}/x.zip", "x.tar.gz"):
        with pytest.raises(
            StorageNotAllowedError, match=r"^entrypoint.code: only uploaded code archives can be run$"
        ):
            unpack_code(url)
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(_archive({"../escape.sh": b"id"}))
    with pytest.raises(
        StorageNotAllowedError, match=r"^entrypoint.code: the code archive cannot be unpacked \("
    ):
        unpack_code(str(bad))
    plain = tmp_path / "plain.tar.gz"  # a tar that is not gzip-compressed is not an uploaded archive
    with tarfile.open(plain, "w") as tar:
        info = tarfile.TarInfo("run.sh")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"id"))
    with pytest.raises(StorageNotAllowedError, match="cannot be unpacked"):
        unpack_code(str(plain))
    plain.unlink()
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(StorageNotAllowedError, match="cannot be unpacked"):
        unpack_code(str(broken))
    assert not (tmp_path / "bad").exists() and not (tmp_path / "broken").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bad.tar.gz",
        "broken.tar.gz",
    ]  # nothing half-unpacked


def test_a_code_tree_another_launch_unpacked_first_is_kept(tmp_path: Path) -> None:
    archive = tmp_path / "abc.tar.gz"
    archive.write_bytes(_archive({"run.sh": b"new"}))
    (tmp_path / "abc").write_text("in the way")  # the rename fails: the temporary tree is removed
    assert unpack_code(str(archive)) == tmp_path / "abc"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abc", "abc.tar.gz"]


def test_inputs_from_the_servers_storage_are_staged_as_copies(tmp_path: Path) -> None:
    s = Sandbox()
    base = tmp_path / "srv" / "models" / "base"
    base.mkdir(parents=True)
    (base / "config.json").write_text("{}")
    (base / "weights.bin").write_bytes(b"w")
    (base / "sub").mkdir()  # only the files of the model directory
    split = tmp_path / "srv" / "ds" / "train.jsonl"
    split.parent.mkdir(parents=True)
    split.write_text('{"text": "a"}\n')
    manifest = {
        "name": "corpus",
        "splits": {
            "train": {"url": f"file://{split}", "sha256": "x"},
            "eval": {"url": "s3://bucket/eval.jsonl"},
            "gone": {"url": f"file://{tmp_path}/gone.jsonl"},
        },
    }
    env = {
        "TRAINYARD_BASE_MODEL_PATH": f"file://{base}",
        "TRAINYARD_DATASET_MANIFEST": json.dumps(manifest),
        "SEED": "1",
    }
    inputs = tmp_path / "run" / "inputs-a0"
    inputs.parent.mkdir()
    stage_inputs(env, inputs, s)
    staged = inputs / "base-model"
    assert env["TRAINYARD_BASE_MODEL_PATH"] == str(staged)
    assert sorted(p.name for p in staged.iterdir()) == ["config.json", "weights.bin"]
    assert (staged / "weights.bin").read_bytes() == b"w"
    got = json.loads(env["TRAINYARD_DATASET_MANIFEST"])
    assert got["splits"]["train"] == {"url": (inputs / "dataset-train.jsonl").as_uri(), "sha256": "x"}
    assert (
        got["splits"]["eval"] == manifest["splits"]["eval"]
        and got["splits"]["gone"] == manifest["splits"]["gone"]
    )
    assert (inputs / "dataset-train.jsonl").read_text() == '{"text": "a"}\n'
    assert env["SEED"] == "1" and "TRAINYARD_EVAL_REQUEST" not in env
    if ROOT:
        assert _mode(inputs) == (0, SANDBOX_GID, 0o750) and _mode(staged) == (0, SANDBOX_GID, 0o750)
        assert _mode(staged / "config.json") == (SANDBOX_UID, SANDBOX_GID, 0o600)
        assert _mode(inputs / "dataset-train.jsonl") == (SANDBOX_UID, SANDBOX_GID, 0o600)
    # a base model that is not a local directory (a hub name) is left to the worker
    env = {"TRAINYARD_BASE_MODEL_PATH": "gpt2", "TRAINYARD_DATASET_MANIFEST": json.dumps({"name": "n"})}
    stage_inputs(env, tmp_path / "run" / "inputs-a1", s)
    assert (
        env["TRAINYARD_BASE_MODEL_PATH"] == "gpt2"
        and not (tmp_path / "run" / "inputs-a1" / "base-model").exists()
    )


def test_an_evaluation_request_is_staged_with_a_results_directory_the_worker_owns(tmp_path: Path) -> None:
    s = Sandbox()
    srv = tmp_path / "srv"
    for name in ("model", "baseline"):
        (srv / name).mkdir(parents=True)
        (srv / name / "config.json").write_text(name)
    for name in ("split", "g0", "g1"):
        (srv / f"{name}.jsonl").write_text(name)
    req = {
        "model_dir": str(srv / "model"),
        "baseline_dir": str(srv / "baseline"),
        "split_path": str(srv / "split.jsonl"),
        "guardrail_datasets": [
            {"name": "a", "split_path": str(srv / "g0.jsonl")},
            {"split_path": str(srv / "g1.jsonl")},
        ],
        "results_path": "/srv/elsewhere.json",
        "metric": "loss",
    }
    (srv / "request.json").write_text(json.dumps(req))
    inputs = tmp_path / "run" / "inputs-a3"
    inputs.parent.mkdir()
    env = {"TRAINYARD_EVAL_REQUEST": str(srv / "request.json")}
    stage_inputs(env, inputs, s)
    staged = Path(env["TRAINYARD_EVAL_REQUEST"])
    assert staged == inputs / "eval-request.json"
    outputs = tmp_path / "run" / "outputs-a3"
    assert json.loads(staged.read_text()) == {
        "model_dir": str(inputs / "eval-model"),
        "baseline_dir": str(inputs / "eval-baseline"),
        "split_path": str(inputs / "eval-split.jsonl"),
        "guardrail_datasets": [
            {"name": "a", "split_path": str(inputs / "eval-guardrail-0.jsonl")},
            {"split_path": str(inputs / "eval-guardrail-1.jsonl")},
        ],
        "results_path": str(outputs / "eval-results.json"),
        "metric": "loss",
    }
    assert (inputs / "eval-model" / "config.json").read_text() == "model"
    assert (inputs / "eval-baseline" / "config.json").read_text() == "baseline"
    assert (inputs / "eval-guardrail-1.jsonl").read_text() == "g1" and (
        inputs / "eval-split.jsonl"
    ).read_text() == "split"
    assert outputs.is_dir()
    if ROOT:
        assert _mode(outputs) == (SANDBOX_UID, SANDBOX_GID, 0o700)
        assert _mode(staged) == (SANDBOX_UID, SANDBOX_GID, 0o600)
        assert _mode(inputs / "eval-model") == (0, SANDBOX_GID, 0o750)


def test_archive_digest_is_the_sha256_of_the_bytes() -> None:
    assert sb.archive_digest(b"code") == hashlib.sha256(b"code").hexdigest()


# ---- the wall, in real sandboxes ---------------------------------------------------------------------

_INSIDE = r"""
import json, os, socket, sys
port, secret, rw, ro = sys.argv[1:5]
out = {"uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd()}
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
out["caps"] = {k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapInh", "NoNewPrivs")}
out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
s = socket.socket()
s.settimeout(10)
out["connect"] = s.connect_ex(("127.0.0.1", int(port)))
out["secret"] = os.path.exists(secret)
out["tmp"] = os.listdir("/tmp")
open("/tmp/mine", "w").write("x")
open(os.path.join(rw, "written"), "w").write("ok")
try:
    open(os.path.join(ro, "written"), "w").write("no")
    out["ro"] = "written"
except OSError as exc:
    out["ro"] = exc.errno
out["ns"] = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("pid", "ipc", "uts", "net", "cgroup")}
print(json.dumps(out))
"""


@pytest.mark.parametrize("share_net", [False, True])
def test_in_a_real_sandbox_the_worker_sees_only_its_mounts_and_has_no_privilege(
    tmp_path: Path, share_net: bool
) -> None:
    import errno

    s = Sandbox()
    s.probe()  # fails loudly where bubblewrap cannot start
    secret = tmp_path / "home" / "api_key"
    secret.parent.mkdir()
    secret.write_text("ty_secret")
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    s.own(rw)
    ro.chmod(0o777)  # only the read-only mount stops a write there
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    try:
        cmd = s.command(
            [sys.executable, "-c", _INSIDE, str(port), str(secret), str(rw), str(ro)],
            Mounts(rw=(rw,), ro=(ro,), chdir=rw, share_net=share_net),
        )
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=scrubbed_env({}, {}))
    finally:
        listener.close()
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if ROOT:
        assert (out["uid"], out["gid"]) == (SANDBOX_UID, SANDBOX_GID)
        assert out["caps"] == {
            "CapEff": "0000000000000000",
            "CapPrm": "0000000000000000",
            "CapBnd": "0000000000000000",
            "CapInh": "0000000000000000",
            "NoNewPrivs": "1",
        }
    else:
        assert out["uid"] == os.getuid() and out["caps"]["CapEff"] == "0000000000000000"
    assert out["cwd"] == str(rw)
    assert out["pids"] == sorted(out["pids"]) and max(out["pids"]) < 10  # its own pid namespace
    assert (out["connect"] == 0) is share_net  # the server's loopback only for a job that shares the network
    assert out["secret"] is False  # nothing of the server's home exists inside
    # a private /tmp: only the directories bubblewrap made for the mounts below it
    below_tmp = {p.relative_to("/tmp").parts[0] for p in (*s._python, rw, ro) if p.is_relative_to("/tmp")}
    assert sorted(out["tmp"]) == sorted(below_tmp)
    assert not Path("/tmp/mine").exists()
    assert (rw / "written").read_text() == "ok"
    assert out["ro"] == errno.EROFS and not (ro / "written").exists()
    ours = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("pid", "ipc", "uts", "net", "cgroup")}
    for n in ("pid", "ipc", "uts", "cgroup"):  # namespaces of its own
        assert out["ns"][n] != ours[n], n
    assert (out["ns"]["net"] == ours["net"]) is share_net  # the host's network only when shared


def test_a_link_in_a_tenants_model_directory_is_neither_followed_nor_copied(tmp_path: Path) -> None:
    """A base model or an evaluated model may be a directory a tenant's job wrote: a symbolic link there
    to the server's key must not put the key's bytes into the worker's inputs (nor hand the key to the
    sandbox uid), and a split named alone is never read through a link."""
    s = Sandbox()
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    key = home / "api_key"
    key.write_text("ty_secretadminkey")
    key.chmod(0o600)
    model = tmp_path / "storage" / "tenants" / "t" / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "weights.bin").symlink_to(key)
    (model / "elsewhere").symlink_to(home)
    split = tmp_path / "split.jsonl"
    split.write_text("{}\n")
    req = {
        "model_dir": str(model),
        "baseline_dir": str(model),
        "split_path": str(split),
        "guardrail_datasets": [],
    }
    (tmp_path / "request.json").write_text(json.dumps(req))
    env = {"TRAINYARD_BASE_MODEL_PATH": str(model), "TRAINYARD_EVAL_REQUEST": str(tmp_path / "request.json")}
    inputs = tmp_path / "run" / "inputs-a0"
    inputs.parent.mkdir()
    stage_inputs(env, inputs, s)
    for staged in (inputs / "base-model", inputs / "eval-model", inputs / "eval-baseline"):
        assert sorted(p.name for p in staged.iterdir()) == ["config.json"], staged
    assert not any(b"ty_secretadminkey" in p.read_bytes() for p in inputs.rglob("*") if p.is_file())
    assert _mode(key) == (os.getuid(), os.getgid(), 0o600)  # still the server's alone
    linked = tmp_path / "linked.jsonl"
    linked.symlink_to(key)
    manifest = {"splits": {"train": {"url": f"file://{linked}"}}}
    with pytest.raises(OSError):
        stage_inputs({"TRAINYARD_DATASET_MANIFEST": json.dumps(manifest)}, tmp_path / "run" / "inputs-a1", s)
    assert not (tmp_path / "run" / "inputs-a1" / "dataset-train.jsonl").exists()
    assert _mode(key) == (os.getuid(), os.getgid(), 0o600)


def test_mounts_below_the_sandboxs_own_directories_need_no_parent_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/, /tmp, /usr, /dev and /proc exist in every sandbox: a mount below them makes only what lies
    between; the GPUs' device nodes are bound when the machine has them."""
    real_glob = Path.glob

    def glob(self: Path, pattern: str, *a: Any, **kw: Any) -> Any:
        if self == Path("/dev") and pattern == "nvidia*":
            return iter([Path("/dev/nvidiactl"), Path("/dev/nvidia0")])
        return real_glob(self, pattern, *a, **kw)

    monkeypatch.setattr(Path, "glob", glob)
    s = _sandbox()
    mounts = Mounts(
        ro=(Path("/usr/share/x"), Path("/tmp/a/b"), Path("/dev/x/y"), Path("/proc/x/y"), Path("/top")),
        share_net=True,
    )
    got = s.command(["true"], mounts)
    i = got.index("/tmp", got.index("1777"))
    assert got[i + 1 : i + 7] == [
        *["--dev-bind-try", "/dev/nvidia0", "/dev/nvidia0"],
        *["--dev-bind-try", "/dev/nvidiactl", "/dev/nvidiactl"],
    ]
    made = [got[j + 1] for j, a in enumerate(got) if a == "--dir"]
    assert made == ["/opt", "/usr/share", "/tmp/a", "/dev/x", "/proc/x"]


def test_inputs_are_staged_again_into_the_same_directories(tmp_path: Path) -> None:
    """A relaunch of an attempt stages into the directories it made the first time."""
    s = Sandbox()
    srv = tmp_path / "srv"
    for name in ("base", "model"):
        (srv / name).mkdir(parents=True)
        (srv / name / "config.json").write_text(name)
    (srv / "split.jsonl").write_text("s")
    (srv / "request.json").write_text(
        json.dumps(
            {
                "model_dir": str(srv / "model"),
                "baseline_dir": str(srv / "model"),
                "split_path": str(srv / "split.jsonl"),
            }
        )
    )
    inputs = tmp_path / "run" / "inputs-a0"
    inputs.parent.mkdir()
    for _ in range(2):
        env = {
            "TRAINYARD_BASE_MODEL_PATH": str(srv / "base"),
            "TRAINYARD_EVAL_REQUEST": str(srv / "request.json"),
        }
        stage_inputs(env, inputs, s)
        assert (inputs / "base-model" / "config.json").read_text() == "base"
        assert json.loads(Path(env["TRAINYARD_EVAL_REQUEST"]).read_text())["results_path"] == str(
            tmp_path / "run" / "outputs-a0" / "eval-results.json"
        )


def test_a_code_archive_is_unpacked_beside_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary tree is made in the archive's directory, so the rename that publishes it is atomic
    (never across file systems)."""
    import tempfile

    made: list[dict[str, Any]] = []
    real = tempfile.mkdtemp

    def mkdtemp(**kw: Any) -> str:
        made.append(kw)
        return real(**kw)

    monkeypatch.setattr(sb.tempfile, "mkdtemp", mkdtemp)
    archive = tmp_path / "code" / "c.tar.gz"
    archive.parent.mkdir()
    archive.write_bytes(_archive({"a": b"1"}))
    assert unpack_code(str(archive)) == tmp_path / "code" / "c"
    assert made == [{"prefix": ".unpack-", "dir": archive.parent}]


def test_top_level_directories_that_are_not_links_are_bound_read_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a merged /usr, /bin, /lib, /lib64 and /sbin are the host's directories, bound read-only."""
    real = Path.is_symlink
    tops = {Path(f"/{n}") for n in ("bin", "lib", "lib64", "sbin")}
    monkeypatch.setattr(Path, "is_symlink", lambda self: False if self in tops else real(self))
    got = _sandbox().command(["true"], Mounts())
    start = got.index("/usr") + 2
    expected = [
        a
        for n in ("bin", "lib", "lib64", "sbin")
        if Path(f"/{n}").is_dir()
        for a in ("--ro-bind", f"/{n}", f"/{n}")
    ]
    assert expected and got[start : start + len(expected)] == expected
    assert got[start + len(expected)] == "--ro-bind-try"  # then /etc's files


def test_a_gang_rank_joins_its_gangs_network_instead_of_a_namespace_of_its_own() -> None:
    from trainyard.executors.sandbox import GangNetwork

    net = GangNetwork(fds=(9,), enter=("/usr/bin/nsenter", "--net=/proc/self/fd/9"))
    got = _sandbox().command(["true"], Mounts(share_net=False, loopback_only=True), net=net)
    assert got[: len(SHELL) + 3] == [*SHELL, "/usr/bin/nsenter", "--net=/proc/self/fd/9", "/opt/bwrap"]
    assert "--unshare-net" not in got
    assert "--unshare-net" in _sandbox().command(["true"], Mounts(share_net=False))


def _unread(fd: int) -> int:
    """Bytes written to a pipe that its reader has not read yet."""
    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)


def test_bubblewraps_info_written_in_two_pieces_while_it_is_read_is_read_whole() -> None:
    """A writer racing the reader: the first piece is read (and does not parse) before the second is
    written, 0.2 s later; the reader waits for it within its timeout and parses both pieces together."""
    r, w = os.pipe()

    def write() -> None:
        os.write(w, b'{"child-pid": ')
        give_up = time.monotonic() + 5.0
        while _unread(r) and time.monotonic() < give_up:  # until the reader has taken the first piece
            time.sleep(0.001)
        time.sleep(0.2)
        os.write(w, b"42}")

    writer = threading.Thread(target=write)
    try:
        writer.start()
        assert sb._read_json_fd(r, 5.0) == {"child-pid": 42}
    finally:
        writer.join()
        os.close(r)
        os.close(w)


def test_bubblewraps_info_is_waited_for_no_longer_than_the_timeout() -> None:
    r, w = os.pipe()
    try:
        start = time.monotonic()
        with pytest.raises(OSError, match=r"^bubblewrap reported nothing on its info descriptor$"):
            sb._read_json_fd(r, 0.01)
        assert time.monotonic() - start < 0.9
    finally:
        os.close(r)
        os.close(w)


def test_bubblewraps_info_is_read_until_it_parses() -> None:
    r, w = os.pipe()
    try:
        os.write(w, b'{"child-pid": ')
        os.write(w, b"42}")
        assert sb._read_json_fd(r, 5.0) == {"child-pid": 42}
        with pytest.raises(OSError, match=r"^bubblewrap reported nothing on its info descriptor$"):
            sb._read_json_fd(r, 0.01)
        os.write(w, b"[1]")
        with pytest.raises(ValueError, match=r"^bubblewrap's info is not an object$"):
            sb._read_json_fd(r, 5.0)
        os.write(w, b'{"a"')
        os.close(w)
        w = -1
        with pytest.raises(OSError, match=r"^bubblewrap closed its info descriptor before reporting$"):
            sb._read_json_fd(r, 5.0)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
