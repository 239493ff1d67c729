"""What a sandboxed replica serves (serving/staging.py, shared by the local and the Ray launcher): copies
of the model, tokenizer and adapter files, no symbolic link followed, readable by the sandbox uid only;
and the local launcher's mount of those copies at /replica, checked in a real bubblewrap sandbox."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.errors import SandboxUnavailableError
from trainyard.executors.sandbox import SANDBOX_GID, SANDBOX_PATH, SANDBOX_UID, Mounts, Sandbox, SandboxSpec
from trainyard.serving.replicas import REPLICA_ROOT, SANDBOX_RECORD, LaunchSpec, LocalLauncher
from trainyard.serving.staging import adapter_dir_name, safe_name, stage_adapter, stage_replica


def _model(root: Path, secret: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    (root / "sub" / "weights.bin").write_bytes(b"\0" * 8)
    (root / "stolen-key").symlink_to(secret)
    (root / "sub" / "stolen-home").symlink_to(secret.parent, target_is_directory=True)
    return root


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "home" / "api_key"
    secret.parent.mkdir()
    secret.write_text("the server's key")
    secret.chmod(0o600)
    return secret


def test_a_staged_replica_holds_regular_copies_named_as_the_sandbox_sees_them(tmp_path: Path) -> None:
    secret = _secret(tmp_path)
    model = _model(tmp_path / "model", secret)
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    (tok / "stolen").symlink_to(secret)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "stolen").symlink_to(secret)
    spec = LaunchSpec("rep-1", str(model), str(tok), {"../evil/a": str(adapter)}, "tiny@1")
    staged = tmp_path / "staged" / "rep-1"
    out = stage_replica(Sandbox(), spec, staged, inside=REPLICA_ROOT)

    assert out.model_path == "/replica/model" and out.tokenizer_path == "/replica/tokenizer"
    evil = adapter_dir_name("../evil/a")  # one path component, no '..'
    assert evil.startswith("_evil_a-") and "/" not in evil
    assert out.adapters == {"../evil/a": f"/replica/adapters/{evil}"}
    files = sorted(str(p.relative_to(staged)) for p in staged.rglob("*"))
    assert files == [
        "adapters",
        f"adapters/{evil}",
        f"adapters/{evil}/adapter_config.json",
        "model",
        "model/config.json",
        "model/sub",
        "model/sub/weights.bin",
        "model/tokenizer_config.json",
        "tokenizer",
        "tokenizer/tokenizer.json",
    ]
    assert not any(p.is_symlink() for p in staged.rglob("*"))
    assert all(
        "the server's key" not in p.read_text(errors="replace") for p in staged.rglob("*") if p.is_file()
    )
    for p in [staged, *staged.rglob("*")]:
        st = p.stat()
        if p.is_dir():  # the sandbox reads, but cannot add, replace or remove entries
            assert stat.S_IMODE(st.st_mode) == 0o750, p
            if os.geteuid() == 0:
                assert (st.st_uid, st.st_gid) == (0, SANDBOX_GID), p
        else:  # the copies are the sandbox uid's, readable by nobody else
            assert stat.S_IMODE(st.st_mode) == 0o600, p
            if os.geteuid() == 0:
                assert st.st_uid == SANDBOX_UID, p
    # without a mount point the copies are named where they lie (the Ray actor's node directory)
    again = stage_replica(Sandbox(), spec, tmp_path / "staged2")
    assert again.model_path == str(tmp_path / "staged2" / "model")
    # a tokenizer that is the model's directory is staged once
    same = stage_replica(Sandbox(), LaunchSpec("r", str(model), str(model), {}, "m"), tmp_path / "s3")
    assert same.tokenizer_path == same.model_path
    assert safe_name("..") == "adapter" and safe_name("a/b") == "a_b"


def test_adapters_whose_names_have_one_safe_form_get_copies_of_their_own(tmp_path: Path) -> None:
    """``a/b`` and ``a_b`` reduce to the same path component; each must still serve its own files."""
    spec_adapters = {}
    for i, name in enumerate(("a/b", "a_b")):
        d = tmp_path / f"adapter{i}"
        d.mkdir()
        (d / "adapter_config.json").write_text(f'{{"which": {i}}}')
        spec_adapters[name] = str(d)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec = LaunchSpec("rep-1", str(model), str(model), spec_adapters, "tiny@1")
    staged = tmp_path / "staged"
    out = stage_replica(Sandbox(), spec, staged, inside=REPLICA_ROOT)
    assert len(set(out.adapters.values())) == 2
    for i, name in enumerate(("a/b", "a_b")):
        copy = staged / Path(out.adapters[name]).relative_to(REPLICA_ROOT) / "adapter_config.json"
        assert copy.read_text() == f'{{"which": {i}}}'


def test_re_staging_an_adapter_leaves_exactly_the_new_versions_files(tmp_path: Path) -> None:
    """A new version of an adapter staged over the copy of the old one: the copy holds the new files
    only (none the new version dropped, no staging leftovers), the new contents, the same place."""
    staged = tmp_path / "staged"
    old = tmp_path / "v1"
    (old / "extra").mkdir(parents=True)
    (old / "adapter_config.json").write_text('{"version": 1}')
    (old / "adapter_model.safetensors").write_bytes(b"v1-weights")
    (old / "extra" / "notes.txt").write_text("only in v1")
    new = tmp_path / "v2"
    new.mkdir()
    (new / "adapter_config.json").write_text('{"version": 2}')
    (new / "adapter_model.bin").write_bytes(b"v2-weights")
    first = stage_adapter(Sandbox(), staged, "tiny-a", str(old))
    assert (first / "extra" / "notes.txt").is_file()
    again = stage_adapter(Sandbox(), staged, "tiny-a", str(new))
    assert again == first
    files = sorted(str(p.relative_to(again)) for p in again.rglob("*"))
    assert files == ["adapter_config.json", "adapter_model.bin"], files
    assert (again / "adapter_config.json").read_text() == '{"version": 2}'
    assert sorted(p.name for p in (staged / "adapters").iterdir()) == [again.name]  # nothing left beside it
    st = again.stat()
    assert stat.S_IMODE(st.st_mode) == 0o750
    # a re-staged replica's model is exactly the new model's files too
    spec = LaunchSpec("rep-1", str(old), str(old), {}, "m")
    stage_replica(Sandbox(), spec, staged)
    stage_replica(Sandbox(), dataclasses.replace(spec, model_path=str(new), tokenizer_path=str(new)), staged)
    model = sorted(p.name for p in (staged / "model").iterdir())
    assert model == ["adapter_config.json", "adapter_model.bin"], model


def test_a_model_path_that_is_a_link_stages_nothing(tmp_path: Path) -> None:
    secret = _secret(tmp_path)
    link = tmp_path / "link-model"
    link.symlink_to(secret.parent, target_is_directory=True)
    out = stage_replica(Sandbox(), LaunchSpec("r", str(link), str(link), {}, "m"), tmp_path / "staged")
    assert list((tmp_path / "staged" / "model").iterdir()) == [] and out.model_path == str(
        tmp_path / "staged" / "model"
    )


def test_the_staged_copies_are_mounted_at_replica_and_the_server_home_does_not_exist(tmp_path: Path) -> None:
    """A real bubblewrap sandbox with the local launcher's mount: the payload reads its copies at
    /replica as the sandbox uid, and neither the staging directory's own path nor the key exists."""
    secret = _secret(tmp_path)
    model = _model(tmp_path / "model", secret)
    sandbox = Sandbox()
    sandbox.probe()  # fails loudly where bubblewrap cannot start
    staged = secret.parent / "serving" / "replicas" / "rep-1"  # inside the server's home
    stage_replica(sandbox, LaunchSpec("rep-1", str(model), str(model), {}, "m"), staged, inside=REPLICA_ROOT)
    mounts = Mounts(ro_at=((staged, REPLICA_ROOT),), chdir=REPLICA_ROOT, share_net=False)
    script = (
        "import os, sys; print(os.getuid()); print(os.getcwd()); print(sorted(os.listdir('model')));"
        f"print(os.path.exists({str(secret.parent)!r}), os.path.exists({str(staged)!r}));"
        "open('model/config.json').read()"
    )
    cmd = sandbox.command([sys.executable, "-c", script], mounts)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={"PATH": SANDBOX_PATH})
    assert r.returncode == 0, r.stderr
    uid, cwd, listing, exists = r.stdout.strip().splitlines()
    assert uid == str(SANDBOX_UID if os.geteuid() == 0 else os.getuid())
    assert cwd == "/replica" and listing == "['config.json', 'sub', 'tokenizer_config.json']"
    assert exists == "False False"
    assert sandbox.exposes(staged / "model" / "config.json", mounts)
    assert not sandbox.exposes(secret, mounts)


def test_the_local_launcher_stages_adapters_and_removes_its_copies_on_stop(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    bare = LocalLauncher(tmp_path / "logs")
    assert bare.adapter_path("rep-1", "a", str(adapter)) == str(adapter)  # no sandbox: the original
    launcher = LocalLauncher(tmp_path / "logs", sandbox=SandboxSpec(), work_dir=tmp_path / "replicas")
    # a replica without staged copies (started unsandboxed) reads the original
    assert launcher.adapter_path("rep-1", "a", str(adapter)) == str(adapter)
    launcher.staged_dir("rep-1").mkdir(parents=True)
    assert launcher.adapter_path("rep-1", "a", str(adapter)) == f"/replica/adapters/{adapter_dir_name('a')}"
    assert (
        tmp_path / "replicas" / "rep-1" / "adapters" / adapter_dir_name("a") / "adapter_config.json"
    ).is_file()
    launcher.stop("rep-1", None)
    assert not (tmp_path / "replicas" / "rep-1").exists()
    assert launcher.staged_dir("../x") == tmp_path / "replicas" / "_x"


def test_a_launcher_without_the_sandbox_stages_adapters_for_a_replica_started_in_it(tmp_path: Path) -> None:
    """A server restarted with TRAINYARD_SANDBOX=none adopts a replica a sandboxed server started: the
    replica's record says how it runs, so its adapters are still staged into /replica, for its uid."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "stolen").symlink_to(_secret(tmp_path))
    uid = 12345 if os.geteuid() == 0 else None  # a sandbox uid other than the default one
    started_by = LocalLauncher(
        tmp_path / "logs", sandbox=SandboxSpec(uid=uid, gid=uid), work_dir=tmp_path / "replicas"
    )
    staged = started_by.staged_dir("rep-1")
    staged.mkdir(parents=True)
    started_by._record_sandbox(staged)
    assert stat.S_IMODE((staged / SANDBOX_RECORD).stat().st_mode) == 0o600
    adopter = LocalLauncher(tmp_path / "logs", sandbox=None, work_dir=tmp_path / "replicas")
    path = adopter.adapter_path("rep-1", "a", str(adapter))
    assert path == f"/replica/adapters/{adapter_dir_name('a')}"
    copy = staged / "adapters" / adapter_dir_name("a")
    assert sorted(p.name for p in copy.iterdir()) == ["adapter_config.json"]
    if uid is not None:
        assert (copy / "adapter_config.json").stat().st_uid == uid
    # a replica started bare (no staging directory) still gets the original path
    assert adopter.adapter_path("rep-2", "a", str(adapter)) == str(adapter)
    # one whose record is missing or unreadable (started before records existed) is staged all the same
    (staged / SANDBOX_RECORD).write_text("[]")
    assert adopter.adapter_path("rep-1", "b", str(adapter)) == f"/replica/adapters/{adapter_dir_name('b')}"


def test_a_launcher_whose_sandbox_cannot_start_fails_clearly_and_starts_nothing(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    missing = SandboxSpec(bwrap=str(tmp_path / "no-bwrap"))
    launcher = LocalLauncher(tmp_path / "logs", sandbox=missing, work_dir=tmp_path / "replicas")
    with pytest.raises(SandboxUnavailableError, match="replicas run only inside the sandbox"):
        launcher.start(LaunchSpec("rep-1", str(model), str(model), {}, "m"))
    assert not launcher.staged_dir("rep-1").exists()
    assert not list((tmp_path / "logs").glob("*.log"))  # no replica process was started
