"""Local deployment replicas run in the workers' sandbox: `trainyard up` (local executor, bubblewrap as
by default) serves a tiny random Llama whose model directory carries symbolic links to the server's key
and database (as a model directory a tenant's job wrote could). The replica must serve chat completions
and, inspected from outside, run as the sandbox uid without capabilities, with no server setting, key or
database URL in its environment, and in a file system where the server's home does not exist and the
staged model holds no link or copy of the key. An adapter loaded at run time is staged into the
sandbox first, the replica is adopted again after the server is killed, by a server run with
TRAINYARD_SANDBOX=none that still stages the next adapter into the replica's /replica, and deleting the
deployments stops it and removes its staged copies. Bubblewrap that cannot start fails the test (never
skips it)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest
from tests.controlplane_support import ServerProcess
from tests.sandbox_support import sandboxed_replica
from tests.tiny_models import build_lora_adapter, build_tiny_llama, place_model_version

from trainyard.client import TrainyardClient
from trainyard.executors.sandbox import Sandbox

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT: Any = [{"role": "user", "content": "hello world"}]
READY_TIMEOUT_S = 240.0


def test_a_local_replica_serves_from_the_sandbox_and_sees_none_of_the_server(tmp_path: Path) -> None:
    Sandbox().probe()  # bubblewrap must work here: fail loudly, never skip
    home = tmp_path / "home"
    base = build_tiny_llama(tmp_path / "models" / "base", seed=0)
    adapter = build_lora_adapter(base, tmp_path / "models" / "a", seed=1)
    version_dir = place_model_version(home / "storage", "default", "tiny", 1, base)
    adapter_dir = place_model_version(home / "storage", "default", "tiny-a", 1, adapter, base="tiny@1")
    later = build_lora_adapter(base, tmp_path / "models" / "b", seed=2)
    later_dir = place_model_version(home / "storage", "default", "tiny-b", 1, later, base="tiny@1")
    # the tenant's model directory points at the server's secrets
    (version_dir / "stolen-key").symlink_to(home / "api_key")
    (version_dir / "extra").mkdir()
    (version_dir / "extra" / "stolen-db").symlink_to(home / "trainyard.db")
    (adapter_dir / "stolen-key").symlink_to(home / "api_key")
    srv = ServerProcess(home, executor="local")
    srv.env["TRAINYARD_METRICS_TOKEN"] = "metrics-secret-token"
    srv.env.pop("TRAINYARD_SANDBOX", None)  # the default: bubblewrap
    pids: list[int] = []
    try:
        srv.start(timeout_s=READY_TIMEOUT_S)
        api_key = srv.api_key
        with TrainyardClient(srv.url, api_key, timeout_s=120) as tc:
            tc.create_deployment("chat", "tiny@1")
            doc = tc.wait_deployment("chat", timeout_s=READY_TIMEOUT_S)
            assert doc["state"] == "ready" and doc["replicas"] == 1
            rep = doc["replica_set"][0]
            assert rep["backend"] == "local"
            pids.append(rep["pid"])
            staged = home / "serving" / "replicas" / rep["id"]
            assert (staged / "model" / "config.json").is_file()
            replica = _assert_walled_in(rep["pid"], home, api_key)

            oai = openai.OpenAI(base_url=f"{srv.url}/openai/v1", api_key=api_key, max_retries=0, timeout=120)
            text = _chat(oai, "chat")
            assert text

            # an adapter over the same base is loaded into the running replica at run time: a copy
            tc.create_deployment("fa", "tiny-a@1")
            fa = tc.wait_deployment("fa", timeout_s=READY_TIMEOUT_S)
            assert [x["id"] for x in fa["replica_set"]] == [rep["id"]]  # one replica for base and adapter
            assert _chat(oai, "fa")
            root = Path(f"/proc/{replica}/root")
            adapters = list((root / "replica" / "adapters").iterdir())
            assert len(adapters) == 1 and (adapters[0] / "adapter_config.json").is_file()
            assert not (adapters[0] / "stolen-key").exists() and not (adapters[0] / "stolen-key").is_symlink()

            # the server dies; the sandboxed replica keeps running and is adopted again, by a server
            # that now runs without the sandbox: it still stages what it loads into that replica
            srv.kill9()
            assert _alive(rep["pid"])
            srv.env["TRAINYARD_SANDBOX"] = "none"
            srv.start(timeout_s=READY_TIMEOUT_S)
            again = tc.wait_deployment("chat", timeout_s=READY_TIMEOUT_S)
            assert [(x["id"], x["pid"]) for x in again["replica_set"]] == [(rep["id"], rep["pid"])]
            oai = openai.OpenAI(base_url=f"{srv.url}/openai/v1", api_key=api_key, max_retries=0, timeout=120)
            assert _chat(oai, "chat") == text
            (later_dir / "stolen-key").symlink_to(home / "api_key")
            tc.create_deployment("fb", "tiny-b@1")
            fb = tc.wait_deployment("fb", timeout_s=READY_TIMEOUT_S)
            assert [x["id"] for x in fb["replica_set"]] == [rep["id"]]  # loaded into the adopted replica
            assert _chat(oai, "fb")
            adapters = sorted((root / "replica" / "adapters").iterdir())
            assert len(adapters) == 2, adapters  # the new one staged into its /replica as well
            for a in adapters:
                assert not (a / "stolen-key").exists() and not (a / "stolen-key").is_symlink()

            tc.delete_deployment("fb")
            tc.delete_deployment("fa")
            tc.delete_deployment("chat")
            deadline = time.monotonic() + 60
            while (_alive(rep["pid"]) or _alive(replica) or staged.exists()) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not _alive(rep["pid"]) and not _alive(replica), "the replica outlived its deployments"
            assert not staged.exists(), "the staged copies outlived the replica"
    finally:
        srv.stop()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def _chat(oai: openai.OpenAI, model: str) -> str:
    r = oai.chat.completions.create(model=model, messages=PROMPT, max_tokens=6, temperature=0)
    assert r.model == model and r.usage is not None and r.usage.completion_tokens == 6
    return r.choices[0].message.content or ""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _assert_walled_in(pid: int, home: Path, api_key: str) -> int:
    """The replica process under ``pid`` (its sandbox's launcher) seen from outside; its pid."""
    children = [p.pid for p in psutil.Process(pid).children(recursive=True)]
    replica, environ = sandboxed_replica(children, lambda p: " ".join(psutil.Process(p).cmdline()))
    names = [kv.split("=", 1)[0] for kv in environ.split("\0") if kv]
    assert not [n for n in names if n.startswith("TRAINYARD_") and n != "TRAINYARD_NUM_THREADS"], names
    for secret in (api_key, "metrics-secret-token", str(home)):
        assert secret not in environ, (secret, environ)
    root = Path(f"/proc/{replica}/root")  # the replica's own file system
    for path in (home, home / "api_key", home / "trainyard.db", home / "storage"):
        assert not (root / str(path).lstrip("/")).exists(), f"{path} is visible to the replica"
    cmdline = " ".join(psutil.Process(replica).cmdline())
    model = cmdline.split("--model-path ", 1)[1].split(" ", 1)[0]
    assert model == "/replica/model", cmdline
    staged = root / model.lstrip("/")
    assert (staged / "config.json").is_file()  # what it serves: a copy of the model's files
    assert not (staged / "stolen-key").exists() and not (staged / "stolen-key").is_symlink()
    assert (staged / "extra").is_dir() and not (staged / "extra" / "stolen-db").is_symlink()
    for f in staged.rglob("*"):
        assert not f.is_symlink(), f
        if f.is_file():
            assert api_key.encode() not in f.read_bytes(), f
    return replica
