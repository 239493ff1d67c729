"""The Python client finds the server the way the CLI does: url, TRAINYARD_URL, the live `trainyard up`
of $TRAINYARD_HOME (server.json), the default."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainyard import serverfile
from trainyard.client import AsyncTrainyardClient, TrainyardClient


def test_client_uses_the_live_server_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path))
    monkeypatch.delenv("TRAINYARD_URL", raising=False)
    with TrainyardClient(api_key="k") as c:
        assert c.url == serverfile.DEFAULT_URL  # no server recorded
    serverfile.write({"url": "http://127.0.0.1:33038/", "pid": os.getpid(), "port": 33038})
    with TrainyardClient(api_key="k") as c:
        assert c.url == "http://127.0.0.1:33038"
    assert AsyncTrainyardClient(api_key="k").url == "http://127.0.0.1:33038"
    monkeypatch.setenv("TRAINYARD_URL", "http://127.0.0.1:9999")
    with TrainyardClient(api_key="k") as c:
        assert c.url == "http://127.0.0.1:9999"  # the environment wins over the record
    with TrainyardClient("http://127.0.0.1:7777", api_key="k") as c:
        assert c.url == "http://127.0.0.1:7777"


def test_a_record_of_a_dead_server_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path))
    monkeypatch.delenv("TRAINYARD_URL", raising=False)
    serverfile.write({"url": "http://127.0.0.1:33038", "pid": 2**22 + 12345, "port": 33038})
    with TrainyardClient(api_key="k") as c:
        assert c.url == serverfile.DEFAULT_URL
