"""The plan's FSDP executed (FSDP2 ``fully_shard`` over gloo on CPU) with real worker processes: a
2-rank sharded job killed with SIGKILL resumes bit-identically, its checkpoints record the sharded
layout, and a 2-rank sharded checkpoint loads onto 1 unsharded rank with exactly the same weights."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_runtime_guarantees import Harness, final, kill, spec, started

from trainyard.executors.base import LaunchRequest, WorkerInfo
from trainyard.executors.local import LocalExecutor
from trainyard.executors.sandbox import Sandbox

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

STEPS = 16
SHARDED = {"fsdp": True, "tensor": 1, "pipeline": 1}


class PlannedHarness(Harness):
    """Launches carry the placement's plan, as the supervisor's do."""

    plan: dict[str, Any] | None = SHARDED

    def request(self, job_id: str, attempt: int, **kw: Any) -> LaunchRequest:
        return dataclasses.replace(super().request(job_id, attempt, **kw), plan=self.plan, accelerator="cpu")


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlannedHarness]:
    ex = LocalExecutor(heartbeat_timeout_s=60.0, failure_grace_s=1.0, gpus=[])
    assert ex.wait_until_warm(180)
    h = PlannedHarness(ex, tmp_path_factory.mktemp("fsdp"))
    yield h
    ex.shutdown(kill_workers=True)


def test_two_rank_fsdp_killed_resumes_bit_identically_then_loads_onto_one_rank(
    harness: PlannedHarness,
) -> None:
    job = spec(steps=STEPS)
    clean = harness.drive("fsdp-ref", world_size=2, job_spec=job, timeout_s=300)
    assert started(clean, 0)["plan"]["fsdp"] is True
    killed = harness.drive(
        "fsdp", world_size=2, job_spec=job, actions={(0, STEPS // 2 + 1): kill(rank=1)}, timeout_s=300
    )
    assert [e.kind for e in killed].count("lost") == 1
    resumed = started(killed, 1)["resumed_from_step"]
    assert resumed is not None and 0 < resumed <= STEPS // 2  # the newest committed step before the kill
    assert final(killed).data["model_sha256"] == final(clean).data["model_sha256"]
    manifest = json.loads((harness.root / "store" / "fsdp" / f"step-{STEPS}" / "manifest.json").read_text())
    assert manifest["layout"]["sharding"] == "fsdp" and manifest["layout"]["replicated"] is False
    assert manifest["world_size"] == 2

    # the sharded step-16 checkpoint onto one unsharded rank: the weights it loads are exactly the ones
    # the two ranks gathered and exported
    harness.plan = None
    attempt = max(e.attempt for e in killed) + 1
    harness.ex.launch(harness.request("fsdp", attempt, world_size=1, job_spec=job))
    rest = harness.ex.wait("fsdp", 120)
    st = started(rest, attempt)
    assert st["resumed_from_step"] == STEPS and st["world_size"] == 1 and st["plan"]["fsdp"] is False
    note = next(
        e.data["message"] for e in rest if e.kind == "log" and "converted" in e.data.get("message", "")
    )
    assert "world size 2 → 1" in note and "layout fsdp → replicated" in note
    assert final(rest).data["model_sha256"] == final(clean).data["model_sha256"]


def test_a_sandboxed_gang_trains_in_a_network_of_its_own_to_the_same_weights(
    harness: PlannedHarness, tmp_path: Path
) -> None:
    """The same 2-rank FSDP job in the sandbox: both ranks are in one network namespace that is not the
    host's (gloo's rendezvous and collectives run on its loopback) and train to the weights the
    unsandboxed ranks train to."""
    job = spec(steps=STEPS)
    harness.plan = SHARDED
    reference = harness.drive("fsdp-open", world_size=2, job_spec=job, timeout_s=300)
    ex = LocalExecutor(heartbeat_timeout_s=60.0, failure_grace_s=1.0, gpus=[], sandbox=Sandbox())
    walled = PlannedHarness(ex, tmp_path)
    host_net = os.readlink("/proc/self/ns/net")
    seen: dict[int, str] = {}

    def gang_net(attempt: int, workers: list[WorkerInfo]) -> bool:
        # a rank's process is in the host's namespace for the moment before nsenter joins the gang's:
        # watch until each has left it (a rank that never does is never seen, and the test fails)
        for w in workers:
            assert w.pid is not None
            try:
                net = os.readlink(f"/proc/{w.pid}/ns/net")
            except OSError:
                return False  # done
            if net != host_net:
                seen[w.rank] = net
        return len(seen) == 2

    try:
        events = walled.drive("fsdp-walled", world_size=2, job_spec=job, watch=gang_net, timeout_s=300)
    finally:
        ex.shutdown(kill_workers=True)
    assert len(seen) == 2 and seen[0] == seen[1] != host_net, (seen, host_net)
    assert final(events).data["model_sha256"] == final(reference).data["model_sha256"]
