"""The pieces of the Ray walls that need no cluster: what a sandboxed replica's staged model holds, when a
node's Ray token file would be inside a sandbox, the token mode the executor requires of itself, and
its check for metrics exporters that answer without credentials."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainyard.executors.ray import unauthenticated_cluster
from trainyard.executors.ray_actor import exposed_token
from trainyard.executors.sandbox import SANDBOX_UID, Mounts, Sandbox
from trainyard.serving.staging import stage_tree


def test_a_staged_model_holds_its_regular_files_and_no_link(tmp_path: Path) -> None:
    secret = tmp_path / "home" / "api_key"
    secret.parent.mkdir()
    secret.write_text("the server's key")
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "weights.bin").write_bytes(b"\0" * 8)
    (model / "stolen").symlink_to(secret)
    (model / "sub" / "stolen-dir").symlink_to(secret.parent, target_is_directory=True)
    staged = stage_tree(model, tmp_path / "staged", Sandbox())
    files = sorted(str(p.relative_to(staged)) for p in staged.rglob("*"))
    assert files == ["config.json", "sub", "sub/weights.bin"]
    assert not any(p.is_symlink() for p in staged.rglob("*"))
    assert "the server's key" not in "".join(p.read_text(errors="replace") for p in staged.rglob("*.json"))
    if os.geteuid() == 0:  # the sandbox uid reads the copies
        assert (staged / "config.json").stat().st_uid == SANDBOX_UID
    # a model path that is itself a link is not followed
    link = tmp_path / "link-model"
    link.symlink_to(secret.parent, target_is_directory=True)
    assert list(stage_tree(link, tmp_path / "staged-link", Sandbox()).iterdir()) == []


def test_a_token_file_inside_a_mount_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox = Sandbox()
    token = tmp_path / "data" / "auth_token"
    token.parent.mkdir()
    token.write_text("t")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    assert sandbox.exposes(token, Mounts(ro=(token.parent,)))
    assert "auth_token would be visible inside the sandbox" in str(
        exposed_token(sandbox, Mounts(ro=(token.parent,)))
    )
    assert exposed_token(sandbox, Mounts(rw=(tmp_path / "elsewhere",))) is None


def test_the_executor_requires_token_mode_of_its_own_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert unauthenticated_cluster("127.0.0.1:1") == "this server does not run with RAY_AUTH_MODE=token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert unauthenticated_cluster("127.0.0.1:1") == "this server does not run with RAY_AUTH_MODE=token"
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    # nothing listens there: said as such (the executor reports an unreachable cluster before this)
    assert unauthenticated_cluster("127.0.0.1:1", timeout_s=2) == "its GCS did not answer (UNAVAILABLE)"
    assert unauthenticated_cluster("ray://head:10001") is None  # a Ray Client address: the mode only


def test_exporters_that_answer_without_credentials_are_found_and_warned_about(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Prometheus exporter on loopback (as Ray's answer: no credential asked) is reported, a closed
    port and an exporter that is off (port -1, as NO_EXPORTERS_ENV leaves the head's) are not; the
    executor warns at connect about the cluster's open ones."""
    import logging
    import socket

    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    from trainyard.executors import ray as ray_executor
    from trainyard.executors.ray import RayExecutor, open_metrics_exporters
    from trainyard.executors.sandbox import SandboxSpec

    registry = CollectorRegistry()
    Gauge("ray_actors", "actors", ["name"], registry=registry).labels("other-tenant/job").set(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        addresses = [f"127.0.0.1:{port}", f"127.0.0.1:{closed}", "127.0.0.2:-1"]
        assert open_metrics_exporters(addresses, timeout_s=2.0) == [f"127.0.0.1:{port}"]
        monkeypatch.setattr(ray_executor, "metrics_exporter_addresses", lambda: addresses)
        ex = RayExecutor("127.0.0.1:1", connect=False, sandbox=SandboxSpec())
        with caplog.at_level(logging.WARNING, logger="trainyard.executors.ray"):
            ex._check_exporters()
        assert ex.open_exporters == [f"127.0.0.1:{port}"]
        assert f"127.0.0.1:{port} answer without credentials" in caplog.text, caplog.text
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
