"""The sandbox every worker runs in: bubblewrap, an unprivileged uid, a scrubbed environment.

A worker (the built-in trainer, or the user's ``entrypoint`` command it ``exec``-s) sees only:

- the Python installation and trainyard's own code, read-only;
- its run directory (launch request, event files, local fallback checkpoints), read-write;
- its checkpoint location ``<storage>/<job_id>`` when the storage is local, read-write;
- its dataset, base model and unpacked code archive, read-only;
- a private ``/tmp`` (its ``HOME``), a minimal ``/dev``, its own ``/proc`` (new pid namespace),
  ``/sys`` read-only (CPU topology and network interfaces for the collectives).

Nothing else of the machine's file system exists inside: not ``TRAINYARD_HOME`` (database, API keys,
logs), not other jobs' run directories, not other tenants' storage. A single-rank job with local
storage also gets its own network namespace (no route to the server or other local services); the
ranks of a gang on one machine share one network namespace of the gang's own (:meth:`Sandbox.
gang_network`), whose loopback carries their collectives and reaches nothing else. Only a job that
needs the network (remote storage, a remote dataset or model, a gang across Ray nodes) keeps the
host's.

When the server runs as root, bubblewrap runs privileged (no user namespace needed) and the payload
drops to ``SANDBOX_UID`` with ``setpriv`` (no capabilities, empty bounding set, ``no_new_privs``);
otherwise bubblewrap uses an unprivileged user namespace and the payload keeps the server's uid. The
environment is rebuilt from an allow-list: no ``TRAINYARD_*`` server setting, database URL or key
reaches a worker (workers hold no credential at all: they report through files in their run
directory). A machine where bubblewrap cannot start fails the launch with ``SandboxUnavailableError``;
nothing ever runs unsandboxed by accident (``TRAINYARD_SANDBOX=none`` is the explicit opt-out).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import shutil
import signal
import site
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.errors import SandboxUnavailableError, StorageNotAllowedError
from trainyard.executors.base import LaunchRequest, event_file_name, launch_file_name

SANDBOX_UID = 65534  # nobody
SANDBOX_GID = 65534
# environment variables a worker may inherit from the server's environment (nothing secret)
PASS_ENV = ("LANG", "LANGUAGE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TRAINYARD_NUM_THREADS")
PASS_ENV_PREFIXES = ("LC_",)
# TRAINYARD_* names a job may carry in its launch environment (job knobs, no server settings)
JOB_ENV = (
    "TRAINYARD_NUM_THREADS",
    "TRAINYARD_HEARTBEAT_S",
    "TRAINYARD_CHECKPOINT_EVERY_STEPS",
    "TRAINYARD_PRECISION",
    "TRAINYARD_DATASET_PATH",
    "TRAINYARD_DATASET_MANIFEST",
    "TRAINYARD_BASE_MODEL_PATH",
    "TRAINYARD_CHECKPOINT_COMMIT_DELAY_S",
    "TRAINYARD_CHECKPOINT_INTERVAL_S",
    "TRAINYARD_EVAL_REQUEST",  # an evaluation job's request (the staged copy inside the sandbox)
    "TRAINYARD_TRACEPARENT",  # the attempt's W3C trace context (also as TRACEPARENT): worker spans join it
)
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "DATABASE", "DSN")
ETC_FILES = ("passwd", "group", "hosts", "nsswitch.conf", "ld.so.cache", "localtime", "resolv.conf")
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
CODE_ARCHIVE_MAX_BYTES = 256 * 1024 * 1024


def job_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a launch environment a worker may see: no server setting, nothing secret-looking."""
    out: dict[str, str] = {}
    for k, v in env.items():
        if k.startswith("TRAINYARD_") and k not in JOB_ENV:
            continue
        if any(m in k.upper() for m in SECRET_MARKERS):
            continue
        out[k] = v
    return out


def scrubbed_env(server_env: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """A worker's whole environment: a fixed PATH and HOME, the harmless locale/thread settings of the
    server's environment and the job's own variables (``job_env``)."""
    env = {k: v for k, v in server_env.items() if k in PASS_ENV or k.startswith(PASS_ENV_PREFIXES)}
    env.update(job_env(extra))
    env.update({"PATH": f"{Path(sys.executable).parent}:{SANDBOX_PATH}", "HOME": "/tmp"})
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    src = trainyard_source_dir()
    if src is not None:
        env["PYTHONPATH"] = str(src)
    return env


def trainyard_source_dir() -> Path | None:
    """The directory that holds the ``trainyard`` package when it is not inside site-packages."""
    import trainyard

    pkg = Path(trainyard.__file__).resolve().parent.parent
    for sp in _site_dirs():
        if pkg == sp or sp in pkg.parents:
            return None
    return pkg


def _site_dirs() -> list[Path]:
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return [Path(d).resolve() for d in dirs if d and Path(d).is_dir()]


def python_paths() -> list[Path]:
    """What the worker's interpreter needs to start, read-only: the interpreter's installation, the
    virtual environment, site-packages and trainyard's source tree."""
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix)
    paths = {Path(p).resolve() for p in prefixes}
    # a virtual environment reached through a symlink is also mounted where the interpreter sees it, so
    # the worker finds pyvenv.cfg next to its bin/ and starts inside the same environment
    paths.update(Path(p).absolute() for p in prefixes)
    paths.add(Path(sys.executable).parent)  # a venv's bin (links to the base interpreter)
    paths.update(_site_dirs())
    src = trainyard_source_dir()
    if src is not None:
        paths.add(src)
    return _outermost(p for p in paths if p.exists() and p != Path("/"))


def _outermost(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for p in sorted(set(paths), key=lambda q: len(q.parts)):
        if not any(q == p or q in p.parents for q in out):
            out.append(p)
    return out


def local_path(url: str | None) -> Path | None:
    """The local path of a ``file://`` URL or absolute path, else None."""
    if not url:
        return None
    if url.startswith("file://"):
        return Path(url[len("file://") :])
    if url.startswith("/"):
        return Path(url)
    return None


@dataclass(frozen=True)
class Mounts:
    """What one worker's sandbox shows besides the Python installation."""

    rw: tuple[Path, ...] = ()
    ro: tuple[Path, ...] = ()
    chdir: Path | None = None
    share_net: bool = True
    # a gang whose ranks need only each other (no remote storage, dataset or model): on one machine they
    # may share a network namespace of their own (Sandbox.gang_network) instead of the host's
    loopback_only: bool = False
    # read-only mounts at another path inside: (the server's directory, where the worker sees it), so
    # that none of the server's own path (e.g. TRAINYARD_HOME) exists in the sandbox
    ro_at: tuple[tuple[Path, Path], ...] = ()


@dataclass(frozen=True)
class SandboxSpec:
    """The sandbox to build on the machine that starts the workers. A Ray node builds its own from
    this (picklable) description: the bubblewrap binary, the privileges it runs with and the Python
    installation it mounts are that node's, not the control plane's."""

    bwrap: str | None = None  # None: the ``bwrap`` on that machine's PATH
    uid: int | None = None
    gid: int | None = None

    def build(self) -> Sandbox:
        """The sandbox on this machine (``SandboxUnavailableError`` where bubblewrap is missing)."""
        return Sandbox(bwrap=self.bwrap, uid=self.uid, gid=self.gid)


@dataclass(frozen=True)
class GangNetwork:
    """A network namespace of one gang's own, held open by file descriptors of the server's: workers
    started with these descriptors (``pass_fds``) and :meth:`Sandbox.command`'s ``net`` join it. It has
    only a loopback interface, and lives as long as one of its workers does."""

    fds: tuple[int, ...]
    enter: tuple[str, ...]  # the nsenter command line in front of bubblewrap


class Sandbox:
    """Builds the bubblewrap command line of a worker and prepares what it mounts."""

    kind = "bwrap"

    def __init__(self, *, bwrap: str | None = None, uid: int | None = None, gid: int | None = None) -> None:
        found = bwrap or shutil.which("bwrap")
        if found is None:
            raise SandboxUnavailableError(
                "bubblewrap (bwrap) is not installed; workers run only inside the sandbox",
            )
        self.bwrap = found
        self.privileged = os.geteuid() == 0
        self.setpriv = shutil.which("setpriv") if self.privileged else None
        if self.privileged and self.setpriv is None:
            raise SandboxUnavailableError("setpriv (util-linux) is needed to drop the sandbox's privileges")
        self.uid = uid if uid is not None else (SANDBOX_UID if self.privileged else os.getuid())
        self.gid = gid if gid is not None else (SANDBOX_GID if self.privileged else os.getgid())
        self._python = python_paths()
        self._probed = False

    def spec(self) -> SandboxSpec:
        """The description another component (the local replica launcher) builds the same sandbox from."""
        return SandboxSpec(bwrap=self.bwrap, uid=self.uid, gid=self.gid)

    def exposes(self, path: Path, mounts: Mounts) -> bool:
        """Whether ``path`` would be visible inside a sandbox with ``mounts`` (a mounted directory holds
        it, or it is one)."""
        target = path.resolve()
        roots = [*self._python, *mounts.rw, *mounts.ro, *(src for src, _ in mounts.ro_at)]
        return any(target == r.resolve() or r.resolve() in target.parents for r in roots)

    # ---- command line ------------------------------------------------------------------------
    def _system_args(self) -> list[str]:
        """``/usr`` and the top-level links or directories into it (``/bin``, ``/lib``, ...), read-only."""
        args = ["--ro-bind", "/usr", "/usr"]
        for name in ("bin", "lib", "lib64", "sbin"):
            link = Path("/") / name
            if link.is_symlink():
                args += ["--symlink", os.readlink(link), str(link)]
            elif link.is_dir():
                args += ["--ro-bind", str(link), str(link)]
        return args

    def command(
        self,
        argv: Sequence[str],
        mounts: Mounts,
        *,
        die_with_parent: bool = False,
        net: GangNetwork | None = None,
    ) -> list[str]:
        """``argv`` wrapped: bubblewrap with the mounts, then (as root) ``setpriv`` to the sandbox uid.

        A shell in front makes bubblewrap's own process ignore SIGTERM (it would die and leave the
        payload running): the notice reaches the payload through the process group, and the payload's
        handlers are its own (``exec`` resets ignored signals only when the worker asks; it does).
        ``die_with_parent``: the payload is killed when bubblewrap is (a Ray actor ties its worker's
        life to its own; the local executor's workers outlive the control plane, to be adopted).
        ``net``: the worker joins that gang network (``nsenter`` in front of bubblewrap; the caller
        passes its descriptors) instead of the host's or a namespace of its own."""
        args = ["/bin/sh", "-c", 'trap \'\' TERM INT; exec "$0" "$@"']
        if net is not None:
            args += list(net.enter)
        args += [self.bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        args += self._system_args()
        for name in ETC_FILES:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        args += ["--ro-bind-try", "/sys", "/sys"]  # CPU topology, network interfaces (gloo)
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]
        args += ["--perms", "1777", "--tmpfs", "/tmp"]
        for dev in sorted(Path("/dev").glob("nvidia*")):  # the GPUs (and their control nodes), when present
            args += ["--dev-bind-try", str(dev), str(dev)]
        if not mounts.share_net and net is None:
            args.append("--unshare-net")
        if die_with_parent:
            args.append("--die-with-parent")
        # (what, where inside, how)
        binds = [(p, p, "--ro-bind") for p in self._python]
        binds += [(p, p, "--ro-bind-try") for p in mounts.ro]  # a missing dataset is the trainer's to report
        binds += [(src, dst, "--ro-bind") for src, dst in mounts.ro_at]
        binds += [(p, p, "--bind") for p in mounts.rw]
        targets = [dst for _, dst, _ in binds]
        made: set[Path] = {Path("/"), Path("/tmp"), Path("/usr"), Path("/dev"), Path("/proc")}
        for src, dst, flag in sorted(binds, key=lambda b: len(b[1].parts)):
            for parent in reversed(dst.parents):
                if parent not in made and not any(parent == m or m in parent.parents for m in targets):
                    args += ["--perms", "0755", "--dir", str(parent)]
                    made.add(parent)
            args += [flag, str(src), str(dst)]
        if mounts.chdir is not None:
            args += ["--chdir", str(mounts.chdir)]
        if self.privileged:
            assert self.setpriv is not None
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", self.setpriv]
            args += [f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]
            args += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
        args += ["--", *argv]
        return args

    def probe(self) -> None:
        """Start one empty sandbox (once): a machine where bubblewrap cannot work fails here, clearly."""
        if self._probed:
            return
        try:
            r = subprocess.run(
                self.command(["/bin/true"], Mounts(share_net=False)),
                capture_output=True,
                text=True,
                timeout=60,
                env={"PATH": SANDBOX_PATH},
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailableError(f"the sandbox (bubblewrap) cannot start: {exc}") from None
        if r.returncode != 0:
            raise SandboxUnavailableError(
                f"the sandbox (bubblewrap) cannot start: {(r.stderr or r.stdout).strip()[:500]}"
            )
        self._probed = True

    @contextlib.contextmanager
    def gang_network(self, timeout_s: float = 30.0) -> Iterator[GangNetwork]:
        """A network namespace for one gang's ranks on this machine, open for the ``with`` block.

        bubblewrap makes it (``--unshare-net`` brings its loopback up) around a placeholder process; the
        server opens the namespace (and, unprivileged, the user namespace that owns it) and stops the
        placeholder. Workers started inside the block with :attr:`GangNetwork.fds` and
        ``command(..., net=...)`` join it; it ends with the last of them. Where it cannot be made the
        launch fails (``SandboxUnavailableError``): a gang never falls back to the host's network."""
        nsenter = shutil.which("nsenter")
        if nsenter is None:
            raise SandboxUnavailableError("nsenter (util-linux) is needed to give a gang its own network")
        info_r, info_w = os.pipe()
        fds: list[int] = []
        holder: subprocess.Popen[bytes] | None = None
        try:
            placeholder = ["/bin/sh", "-c", "echo ready; exec sleep 3600"]
            holder = subprocess.Popen(
                [
                    self.bwrap,
                    "--unshare-net",
                    "--unshare-pid",
                    *self._system_args(),
                    "--info-fd",
                    str(info_w),
                    "--die-with-parent",
                    "--",
                    *placeholder,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(info_w,),
                env={"PATH": SANDBOX_PATH},
                start_new_session=True,
            )
            os.close(info_w)
            info_w = -1
            assert holder.stdout is not None
            info = _read_json_fd(info_r, timeout_s)
            # the placeholder runs only once bubblewrap has set the namespace up (loopback included)
            ready, _, _ = select.select([holder.stdout], [], [], timeout_s)
            if not ready or holder.stdout.readline().strip() != b"ready":
                raise OSError("the placeholder did not start")
            pid = int(info["child-pid"])
            kinds = ["net"] if self.privileged else ["user", "net"]
            enter = [nsenter]
            for kind in kinds:
                fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
                fds.append(fd)
                enter.append(f"--{kind}=/proc/self/fd/{fd}")
            if not self.privileged:
                enter.append("--preserve-credentials")  # stay the server's uid in the entered namespace
        except (OSError, ValueError, KeyError) as exc:
            for fd in fds:
                os.close(fd)
            err = b""
            if holder is not None and holder.stderr is not None:
                # bubblewrap's own complaint: its info descriptor can close before the process is
                # reaped, so wait for it (briefly) and stop it, then read what it wrote without
                # blocking on a write end a stray child might still hold
                try:
                    holder.wait(timeout=min(timeout_s, 2.0))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(holder.pid, signal.SIGKILL)
                    holder.wait()
                os.set_blocking(holder.stderr.fileno(), False)
                with contextlib.suppress(OSError):
                    err = holder.stderr.read() or b""
            detail = err.decode(errors="replace").strip()[:300] or str(exc)
            raise SandboxUnavailableError(f"the gang's network namespace cannot be made: {detail}") from None
        finally:
            if info_w >= 0:
                os.close(info_w)
            os.close(info_r)
            if holder is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(holder.pid, signal.SIGKILL)
                holder.wait()
                for stream in (holder.stdout, holder.stderr):
                    if stream is not None:
                        stream.close()
        try:
            yield GangNetwork(fds=tuple(fds), enter=tuple(enter))
        finally:
            for fd in fds:
                os.close(fd)

    # ---- what a worker may touch -------------------------------------------------------------
    def own(self, path: Path) -> None:
        """Hand ``path`` to the sandbox uid (a directory mode 0700): the worker writes there."""
        if self.privileged:
            os.chown(path, self.uid, self.gid)
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700 if path.is_dir() else 0o600)

    def share_dir(self, path: Path) -> None:
        """A directory the sandbox uid may read but whose entries it cannot create, replace or remove
        (owner root, group the sandbox's, 0750): nothing the server writes or reads there can be swapped
        for a symbolic link by the worker."""
        if self.privileged:
            os.chown(path, 0, self.gid)
        os.chmod(path, 0o750)

    def give_file(self, path: Path) -> None:
        """Create (if needed) a file in a shared directory that only the sandbox uid writes to."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            if self.privileged:
                os.fchown(fd, self.uid, self.gid)
        finally:
            os.close(fd)

    def give_read(self, path: Path) -> None:
        """Let the sandbox uid read a file the server wrote into the worker's run directory."""
        if self.privileged:
            os.chown(path, self.uid, self.gid)
        os.chmod(path, 0o600)


def _read_json_fd(fd: int, timeout_s: float) -> dict[str, Any]:
    """The JSON document bubblewrap writes to its ``--info-fd`` (read until it parses)."""
    data = b""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(0.0, left))
        if not ready:
            raise OSError("bubblewrap reported nothing on its info descriptor")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise OSError("bubblewrap closed its info descriptor before reporting")
        data += chunk
        try:
            doc = json.loads(data)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            raise ValueError("bubblewrap's info is not an object")
        return doc


def prepare_run_dir(
    sandbox: Sandbox, req: LaunchRequest, run_dir: Path, ranks: Iterable[int] | None = None
) -> Mounts:
    """Hand the run directory and the job's local checkpoint directory to the sandbox uid and list
    what a worker's sandbox mounts: those read-write; its dataset, base model and code read-only.

    The attempt's launch file must already be in ``run_dir``; ``ranks`` are the ranks whose event
    files live there (every rank of the gang by default; a Ray node's directory holds one)."""
    sandbox.share_dir(run_dir)
    sandbox.give_read(run_dir / launch_file_name(req.attempt))
    for r in range(req.world_size) if ranks is None else ranks:
        sandbox.give_file(run_dir / event_file_name(req.attempt, r))
    for sub in ("checkpoints", "scratch"):  # the local fallback checkpoints, the model export's temp
        (run_dir / sub).mkdir(exist_ok=True)
        sandbox.own(run_dir / sub)
    rw = [run_dir]
    needs_net = False  # the host's network, for remote storage, datasets or models
    ckpt = local_path(req.checkpoint_url)
    if ckpt is not None:
        job_dir = ckpt / req.job_id
        job_dir.mkdir(parents=True, exist_ok=True)
        sandbox.own(job_dir)
        rw.append(job_dir)
    else:
        needs_net = True  # remote checkpoint storage
    ro: list[Path] = []
    spec = req.spec
    for value in (
        (spec.get("workload") or {}).get("dataset"),
        req.env.get("TRAINYARD_DATASET_PATH"),
        req.env.get("TRAINYARD_BASE_MODEL_PATH"),  # a registered base model's weights (the registry's)
        (spec.get("model") or {}).get("base"),
    ):
        if not value or value.startswith("ds://"):
            continue
        path = local_path(value)
        if path is not None:
            ro.append(path)
        elif "://" in value:
            needs_net = True  # a remote dataset or model
    chdir = run_dir
    if req.code_url:
        code = unpack_code(req.code_url)
        ro.append(code)
        chdir = code
    gang = req.world_size > 1
    return Mounts(
        rw=tuple(rw),
        ro=tuple(ro),
        chdir=chdir,
        share_net=needs_net or gang,  # a gang's ranks reach each other (on one machine: gang_network)
        loopback_only=gang and not needs_net,
    )


def stage_inputs(env: dict[str, str], inputs: Path, sandbox: Sandbox) -> None:
    """Copy what a worker reads from the server's storage (a registered base model's weights, the
    splits of a registered dataset) into ``inputs`` under its run directory, readable by the sandbox
    uid, and point ``env`` at the copies. The server's files stay 0600 in 0700 directories (DESIGN
    §3.6), which the unprivileged sandbox uid cannot read even where they are mounted; the copies are
    the worker's alone and are checked against their sha256 when read. A model directory may be the
    tenant's (a job it ran wrote it), so only its regular files are copied: a symbolic link (to the
    server's key, say) is neither followed nor copied, and a file named alone is never read through one."""
    inputs.mkdir(exist_ok=True)
    sandbox.share_dir(inputs)

    def copy(src: Path, dst: Path) -> Path:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)  # a link swapped in meanwhile fails here (ELOOP)
        with os.fdopen(fd, "rb") as fin, open(dst, "wb") as fout:
            shutil.copyfileobj(fin, fout)
        sandbox.give_read(dst)
        return dst

    base = env.get("TRAINYARD_BASE_MODEL_PATH")
    base_dir = local_path(base) if base else None
    if base_dir is not None and base_dir.is_dir():
        staged = inputs / "base-model"
        staged.mkdir(exist_ok=True)
        sandbox.share_dir(staged)
        for f in regular_files(base_dir):
            copy(f, staged / f.name)
        env["TRAINYARD_BASE_MODEL_PATH"] = str(staged)
    request = env.get("TRAINYARD_EVAL_REQUEST")
    request_file = local_path(request) if request else None
    if request_file is not None and request_file.is_file():
        env["TRAINYARD_EVAL_REQUEST"] = str(stage_evaluation(request_file, inputs, sandbox, copy))
    raw = env.get("TRAINYARD_DATASET_MANIFEST")
    if raw:
        manifest = json.loads(raw)
        for name, split in (manifest.get("splits") or {}).items():
            src = local_path(str(split.get("url") or ""))
            if src is not None and src.is_file():
                split["url"] = copy(src, inputs / f"dataset-{name}.jsonl").as_uri()
        env["TRAINYARD_DATASET_MANIFEST"] = json.dumps(manifest, sort_keys=True)


def regular_files(directory: Path) -> list[Path]:
    """The regular files directly in ``directory``, by name: no symbolic link, whatever it points to."""
    return sorted(p for p in directory.iterdir() if p.is_file() and not p.is_symlink())


def stage_evaluation(
    request_file: Path, inputs: Path, sandbox: Sandbox, copy: Callable[[Path, Path], Path]
) -> Path:
    """An evaluation job's inputs (both models' weights, the split, each guardrail dataset's split)
    copied under ``inputs``, a request naming the copies, and a directory the worker owns for its
    results (``outputs-a<attempt>`` beside ``inputs``, where the control plane reads them)."""
    req = json.loads(request_file.read_text())
    for key, name in (("model_dir", "eval-model"), ("baseline_dir", "eval-baseline")):
        src = Path(req[key])
        staged = inputs / name
        staged.mkdir(exist_ok=True)
        sandbox.share_dir(staged)
        for f in regular_files(src):
            copy(f, staged / f.name)
        req[key] = str(staged)
    req["split_path"] = str(copy(Path(req["split_path"]), inputs / "eval-split.jsonl"))
    for i, g in enumerate(req.get("guardrail_datasets") or []):  # guardrail datasets' splits
        g["split_path"] = str(copy(Path(g["split_path"]), inputs / f"eval-guardrail-{i}.jsonl"))
    outputs = inputs.with_name(inputs.name.replace("inputs-", "outputs-", 1))
    outputs.mkdir(exist_ok=True)
    sandbox.own(outputs)
    req["results_path"] = str(outputs / "eval-results.json")
    staged_request = inputs / "eval-request.json"
    staged_request.write_text(json.dumps(req, indent=1))
    sandbox.give_read(staged_request)
    return staged_request


def unpack_code(code_url: str) -> Path:
    """The unpacked tree of an uploaded code archive (``<sha256>.tar.gz`` in a tenant's code area),
    extracted once beside it with tarfile's ``data`` filter (no absolute paths, ``..``, links out of
    the tree, devices or set-uid bits) and made read-only."""
    archive = local_path(code_url)
    if archive is None or not archive.name.endswith(".tar.gz"):
        raise StorageNotAllowedError("entrypoint.code: only uploaded code archives can be run")
    target = archive.with_name(archive.name[: -len(".tar.gz")])
    if target.is_dir():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=archive.parent))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(tmp, filter="data")
        for root, dirs, files in os.walk(tmp):
            for d in dirs:
                os.chmod(Path(root) / d, 0o755)
            for f in files:
                p = Path(root) / f
                if not p.is_symlink():
                    os.chmod(p, 0o755 if os.access(p, os.X_OK) else 0o644)
        os.chmod(tmp, 0o755)
        try:
            tmp.rename(target)
        except OSError:  # another launch unpacked it first
            shutil.rmtree(tmp, ignore_errors=True)
    except (tarfile.TarError, OSError, EOFError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise StorageNotAllowedError(
            f"entrypoint.code: the code archive cannot be unpacked ({exc})"
        ) from None
    return target


def archive_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
