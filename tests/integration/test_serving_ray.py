"""Deployments on a Ray cluster: `trainyard up --executor ray` against a real one-node Ray cluster on
loopback (node IP 127.0.0.2, see executors/ray_cluster.py), a tiny random Llama, and the official `openai`
client against /openai/v1. The replica must run under the Ray node (not as a child of the server), on the
pool's resources, be re-adopted after the server is killed, and be stopped when the deployment is deleted.
It runs in the workers' sandbox: the model version it serves carries symbolic links to the server's key
and database (as a model directory a tenant's job wrote could), and the running replica is inspected
from outside: the sandbox uid, no server setting or Ray token in its environment, and a file system where
the key, the database, the cluster's token and the server's storage do not exist. A cluster that cannot
start fails the test (never skips it)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from tests.controlplane_support import ServerProcess
from tests.sandbox_support import sandboxed_replica
from tests.tiny_models import build_tiny_llama, place_model_version

from trainyard.client import TrainyardClient
from trainyard.executors.ray import pool_resource
from trainyard.executors.ray_cluster import LOOPBACK_ENV, LoopbackRayCluster, _descendants

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

PROMPT = [{"role": "user", "content": "hello world"}]
READY_TIMEOUT_S = 120.0
POOL = "ray-cpu"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_deployment_serves_from_a_ray_actor_survives_a_server_crash_and_stops_on_delete(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    cluster = LoopbackRayCluster()
    srv: ServerProcess | None = None
    try:
        with ThreadPoolExecutor(1) as pool:  # the model is built while the Ray node starts
            built = pool.submit(build_tiny_llama, tmp_path / "models" / "base", seed=0)
            node = cluster.add_node("head", resources={pool_resource(POOL): 2}, num_cpus=2)
            version_dir = place_model_version(home / "storage", "default", "tiny", 1, built.result())
        # the tenant's model directory points at the server's secrets
        (version_dir / "stolen-key").symlink_to(home / "api_key")
        (version_dir / "extra").mkdir()
        (version_dir / "extra" / "stolen-db").symlink_to(home / "trainyard.db")
        srv = ServerProcess(home, executor="ray")
        srv.env.update({**LOOPBACK_ENV, **cluster.client_env, "TRAINYARD_RAY_ADDRESS": cluster.address})
        srv.start(timeout_s=READY_TIMEOUT_S)
        with TrainyardClient(srv.url, srv.api_key, timeout_s=60) as tc:
            tc.put_pool(
                {
                    "name": POOL,
                    "accelerator": "cpu",
                    "devices_per_node": 2,
                    "nodes": 1,
                    "market": "on_demand",
                    "region": "loopback",
                    "price_usd_per_device_hour": 0.25,
                    "backend": "ray",
                }
            )
            tc.create_deployment("chat", "tiny@1")
            doc = tc.wait_deployment("chat", timeout_s=READY_TIMEOUT_S)
            assert doc["state"] == "ready" and doc["replicas"] == 1
            rep = doc["replica_set"][0]
            assert rep["backend"] == "ray"
            assert rep["url"].startswith("http://127.0.0.2:")  # the Ray node's address, not the server's
            assert rep["placement"]["pool"] == POOL and rep["placement"]["price_usd_per_hour"] == 0.25
            assert rep["placement"]["resources"] == {pool_resource(POOL): 1.0, "CPU": 1.0}
            node_pid = node.proc.pid
            assert rep["pid"] in _descendants(node_pid)  # started by the Ray node's worker, not the server
            assert rep["pid"] not in _descendants(srv.proc.pid)
            _assert_walled_in(rep["pid"], home, version_dir, cluster, srv.api_key)

            oai = openai.OpenAI(
                base_url=f"{srv.url}/openai/v1", api_key=srv.api_key, max_retries=0, timeout=60
            )
            r = oai.chat.completions.create(model="chat", messages=PROMPT, max_tokens=6, temperature=0)
            text = r.choices[0].message.content
            assert r.model == "chat" and text and r.usage is not None and r.usage.completion_tokens == 6
            chunks = list(
                oai.chat.completions.create(
                    model="chat", messages=PROMPT, max_tokens=6, temperature=0, stream=True
                )
            )
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6

            # the control plane dies; the replica keeps running on the cluster and is adopted again
            srv.kill9()
            assert _alive(rep["pid"])
            srv.start(timeout_s=READY_TIMEOUT_S)
            again = tc.wait_deployment("chat", timeout_s=READY_TIMEOUT_S)
            assert [(x["id"], x["pid"]) for x in again["replica_set"]] == [(rep["id"], rep["pid"])]
            oai = openai.OpenAI(
                base_url=f"{srv.url}/openai/v1", api_key=srv.api_key, max_retries=0, timeout=60
            )
            r2 = oai.chat.completions.create(model="chat", messages=PROMPT, max_tokens=6, temperature=0)
            assert r2.choices[0].message.content == text

            tc.delete_deployment("chat")
            deadline = time.monotonic() + 30
            while _alive(rep["pid"]) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not _alive(rep["pid"]), "the replica outlived its deleted deployment"
            # its actor is gone too: the node's workers hold no replica process any more
            assert not any("trainyard.serving.replica" in _cmdline(p) for p in _descendants(node_pid))
    finally:
        if srv is not None and srv.proc is not None and srv.proc.poll() is None:
            srv.stop()
        cluster.stop()


def _assert_walled_in(
    pid: int, home: Path, version_dir: Path, cluster: LoopbackRayCluster, api_key: str
) -> None:
    """The replica process under ``pid`` (its sandbox's launcher) seen from outside."""
    replica, environ = sandboxed_replica(sorted(_descendants(pid)), _cmdline)
    for name in ("TRAINYARD_HOME", "TRAINYARD_DATABASE_URL", "TRAINYARD_API_KEY", "RAY_AUTH"):
        assert name not in environ, (name, environ)
    assert api_key not in environ and cluster.token_path.read_text() not in environ
    root = Path(f"/proc/{replica}/root")  # the replica's own file system
    for path in (home / "api_key", home / "trainyard.db", home, cluster.token_path, version_dir):
        assert not (root / str(path).lstrip("/")).exists(), f"{path} is visible to the replica"
    model = _cmdline(replica).split("--model-path ", 1)[1].split(" ", 1)[0]
    staged = root / model.lstrip("/")
    assert (staged / "config.json").is_file(), model  # what it serves: a copy of the model's files
    assert not (staged / "stolen-key").exists() and not (staged / "stolen-key").is_symlink()
    assert (staged / "extra").is_dir() and not (staged / "extra" / "stolen-db").is_symlink()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
