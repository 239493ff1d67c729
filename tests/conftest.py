"""Shared fixtures. Tests talk only to 127.0.0.1; a missing service fails loudly, never skips."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import Phase, settings

# `mutation`: the same examples on every run (a mutant is killed by a behaviour, not by a lucky draw), no
# example database, and no shrinking: a mutant is killed by the first failing example, and shrinking it
# (up to 30 s a mutant) would change nothing but the report nobody reads
settings.register_profile(
    "mutation",
    derandomize=True,
    deadline=None,
    print_blob=False,
    database=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Ray fixes a process's authentication mode when it first loads ``ray._raylet`` (RayConfig reads
# RAY_AUTH_MODE once), and trainyard's Ray executor only drives clusters in token mode. So the test process
# is a token-mode driver from the start, as `trainyard up --executor ray` must be: otherwise whether the Ray
# tests could connect depended on whether an earlier test had imported ray (under pytest-xdist, another
# order of files). The tests of the mode check set or remove it with their own ``monkeypatch``.
os.environ.setdefault("RAY_AUTH_MODE", "token")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture(scope="session", autouse=True)
def _every_trace_sampled() -> Iterator[None]:
    """Every trace is sampled: the tests read the spans of the requests they make, and the default
    sampler keeps a share of traces. Session-scoped, so that module- and session-scoped fixtures that
    build a platform (and its tracer provider) before any function-scoped fixture runs see it too; the
    tests of sampling itself set or remove ``OTEL_TRACES_SAMPLER`` with their own ``monkeypatch``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
        yield


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the user's ~/.trainyard from a test."""
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path_factory.mktemp("home")))


@pytest.fixture(scope="session", autouse=True)
def _sandbox_installed() -> None:
    """Workers run inside bubblewrap (DESIGN §3.6): a fresh machine gets it here, once (idempotent);
    where it cannot be installed, the tests that start workers through the server fail loudly."""
    import os
    import shutil
    import subprocess

    if shutil.which("bwrap") is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            "apt-get install -y -qq bubblewrap || (apt-get update -qq && apt-get install -y -qq bubblewrap)",
            shell=True,
            check=False,
            capture_output=True,
            timeout=900,
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test has a node id of its own. schemathesis names each operation's test
    ``test_no_server_errors[GET /v1/jobs]`` but gives them all the function's node id, and pytest-xdist
    shares tests out by node id, so under ``make test`` 77 operations ran as one (the fuzzing of all but
    one route silently left out). Its tests get their names as node ids; any other duplicate stops the
    run rather than be dropped the same way."""
    for item in items:
        if type(item).__name__ == "SchemathesisFunction" and not item.nodeid.endswith(f"::{item.name}"):
            # what pytest itself gives a node built without an explicit node id (pytest 9's structured id);
            # if this ever stops working, the duplicate check below fails the run
            item._id = item.parent.id.child(item.name)  # type: ignore[attr-defined,union-attr]
    seen: set[str] = set()
    twice = sorted({i.nodeid for i in items if i.nodeid in seen or seen.add(i.nodeid)})
    if twice:
        raise pytest.UsageError(f"tests sharing a node id (pytest-xdist would run one of each): {twice[:5]}")
