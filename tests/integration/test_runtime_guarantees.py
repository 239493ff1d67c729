"""Runtime guarantees with real worker processes on the local executor (DESIGN §3.4, §3.5 determinism).

Every scenario trains the same tiny Llama-style model (2 layers, d_model 32) with a fixed seed and
compares the sha256 of the final weights with an uninterrupted run: kill -9 at random steps, a kill
while a checkpoint is being written, a corrupted shard, a SIGTERM preemption notice, checkpoint storage
that becomes unwritable, two ranks, and a bf16 two-rank run resumed on one rank in fp32.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainyard.executors.base import ExecutorEvent, LaunchRequest, WorkerInfo
from trainyard.executors.local import LocalExecutor
from trainyard.runtime.checkpoint import MANIFEST, CheckpointManager

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

STEPS = 40
EVERY = 4


def spec(*, steps: int = STEPS, precision: str = "fp32", dataset: str | None = None) -> dict[str, Any]:
    workload: dict[str, Any] = {
        "seq_len": 16,
        "global_batch": 4,
        "steps": steps,
        "precision": precision,
        "seed": 11,
        "learning_rate": 0.003,
    }
    if dataset:
        workload["dataset"] = dataset
    return {
        "name": "tiny",
        "model": {"architecture": "decoder", "n_layers": 2, "d_model": 32, "n_heads": 4, "vocab_size": 64},
        "workload": workload,
        "checkpoint": {"keep_last": 3},
    }


class Harness:
    def __init__(self, ex: LocalExecutor, root: Path):
        self.ex = ex
        self.root = root

    def request(
        self,
        job_id: str,
        attempt: int,
        *,
        world_size: int = 1,
        job_spec: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        storage: str | None = None,
    ) -> LaunchRequest:
        return LaunchRequest(
            job_id=job_id,
            attempt=attempt,
            spec=job_spec or spec(),
            world_size=world_size,
            pool="local-cpu",
            market="spot",
            checkpoint_url=storage or f"file://{self.root / 'store'}",
            checkpoint_interval_s=None,
            run_dir=str(self.root / "runs" / job_id),
            notice_s=30.0,
            env={"TRAINYARD_CHECKPOINT_EVERY_STEPS": str(EVERY), "TRAINYARD_HEARTBEAT_S": "0", **(env or {})},
        )

    def drive(
        self,
        job_id: str,
        *,
        world_size: int = 1,
        job_spec: dict[str, Any] | None = None,
        actions: dict[tuple[int, int], Callable[[list[WorkerInfo]], None]] | None = None,
        env_for: Callable[[int], dict[str, str]] | None = None,
        watch: Callable[[int, list[WorkerInfo]], bool] | None = None,
        stop_on_failure: bool = True,
        timeout_s: float = 150.0,
        after_checkpoint: bool = False,
    ) -> list[ExecutorEvent]:
        """Run attempts until success: relaunch after ``lost``/``preempted``.

        ``actions[(attempt, step)]`` fires once when rank 0 of that attempt reports ``step``; ``watch``
        is called on every poll and may act (it returns True once it has). With ``after_checkpoint`` an
        action waits, past its step, until its attempt has committed a checkpoint.
        """
        actions = dict(actions or {})
        events: list[ExecutorEvent] = []
        attempt = 0

        def launch() -> list[WorkerInfo]:
            env = env_for(attempt) if env_for else None
            return self.ex.launch(
                self.request(job_id, attempt, world_size=world_size, job_spec=job_spec, env=env)
            )

        workers = launch()
        watched = False
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for e in self.ex.poll():
                if e.job_id != job_id:
                    continue
                events.append(e)
                committed = any(x.kind == "checkpoint" and x.attempt == e.attempt for x in events)
                if e.kind == "heartbeat" and e.data["rank"] == 0 and (committed or not after_checkpoint):
                    for key in [k for k in actions if k[0] == e.attempt and e.data["step"] >= k[1]]:
                        actions.pop(key)(workers)
                if e.kind == "succeeded":
                    return events
                if e.kind == "failed" and stop_on_failure:
                    return events
                if e.kind in ("lost", "preempted", "failed"):
                    attempt += 1
                    workers = launch()
                    watched = False
            if watch is not None and not watched:
                watched = watch(attempt, workers)
            time.sleep(0.02)
        raise AssertionError(
            f"{job_id} did not finish in {timeout_s} s: {[(e.kind, e.data) for e in events][-5:]}"
        )


def final(events: list[ExecutorEvent]) -> ExecutorEvent:
    done = [e for e in events if e.kind == "succeeded"]
    assert done, [(e.kind, e.data) for e in events if e.kind not in ("heartbeat",)]
    return done[-1]


def started(events: list[ExecutorEvent], attempt: int) -> dict[str, Any]:
    return next(
        e.data for e in events if e.kind == "started" and e.attempt == attempt and e.data["rank"] == 0
    )


def kill(rank: int = 0, sig: int = signal.SIGKILL) -> Callable[[list[WorkerInfo]], None]:
    def act(workers: list[WorkerInfo]) -> None:
        pid = next(w.pid for w in workers if w.rank == rank)
        assert pid is not None
        os.kill(pid, sig)

    return act


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    ex = LocalExecutor(heartbeat_timeout_s=60.0, failure_grace_s=1.0)
    assert ex.wait_until_warm(180)
    h = Harness(ex, tmp_path_factory.mktemp("runtime"))
    yield h
    ex.shutdown(kill_workers=True)


@pytest.fixture(scope="module")
def reference(harness: Harness) -> str:
    """sha256 of the weights of the uninterrupted single-rank run."""
    events = harness.drive("ref")
    assert [e.kind for e in events].count("lost") == 0
    return str(final(events).data["model_sha256"])


@pytest.mark.parametrize("seed", [1, 2])
def test_kill_9_at_random_steps_resumes_bit_identically(harness: Harness, reference: str, seed: int) -> None:
    rng = random.Random(seed)
    # each kill lands after a checkpoint of its attempt has committed, so every resume is a real one
    first = rng.randint(2, STEPS // 2)
    second = rng.randint(first + EVERY, STEPS - 2)
    actions = {(0, first): kill(), (1, second): kill()}
    events = harness.drive(f"kill-{seed}", actions=actions, after_checkpoint=True)
    assert [e.kind for e in events].count("lost") == 2
    lost = [e for e in events if e.kind == "lost"]
    assert "SIGKILL" in lost[0].data["reason"]
    for attempt in (1, 2):
        resumed = started(events, attempt)["resumed_from_step"]
        # the newest step committed before the kill (a commit whose event the kill cut off counts too)
        seen = [e.data["step"] for e in events if e.kind == "checkpoint" and e.attempt < attempt]
        killed_at = max(e.data["step"] for e in events if e.kind == "heartbeat" and e.attempt == attempt - 1)
        assert seen and max(seen) <= resumed <= killed_at, (attempt, resumed, seen, killed_at)
    assert final(events).data["model_sha256"] == reference
    assert final(events).data["final_step"] == STEPS


def test_kill_during_checkpoint_write_never_loads_that_step(harness: Harness, reference: str) -> None:
    store = harness.root / "store" / "torn"
    torn: list[int] = []

    def watch(attempt: int, workers: list[WorkerInfo]) -> bool:
        if attempt != 0 or not store.exists():
            return False
        for d in store.glob("step-*"):
            if (d / ".metadata").exists() and not (d / MANIFEST).exists() and int(d.name[5:]) >= 2 * EVERY:
                torn.append(int(d.name[5:]))
                kill()(workers)
                return True
        return False

    # attempt 0 holds every commit for 1.5 s so the kill lands between the shards and the manifest
    events = harness.drive(
        "torn",
        watch=watch,
        env_for=lambda a: {"TRAINYARD_CHECKPOINT_COMMIT_DELAY_S": "1.5"} if a == 0 else {},
    )
    assert torn, "the watcher never saw a step being written"
    resumed = started(events, 1)["resumed_from_step"]
    assert resumed is not None and resumed < torn[0]
    skipped = [e.data for e in events if e.kind == "log" and e.data.get("skipped_step") == torn[0]]
    assert skipped and "torn" in skipped[0]["why"]
    assert final(events).data["model_sha256"] == reference


def test_corrupted_shard_is_detected_and_the_previous_step_used(harness: Harness, reference: str) -> None:
    src = harness.root / "store" / "ref"
    dst = harness.root / "store" / "corrupt"
    shutil.copytree(src, dst)
    shutil.rmtree(dst / "model")
    steps = sorted(int(p.name[5:]) for p in dst.glob("step-*"))
    shutil.rmtree(dst / f"step-{steps[-1]}")
    victim_step, previous = steps[-2], steps[-3]
    shard = next((dst / f"step-{victim_step}").glob("*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    events = harness.drive("corrupt")
    assert started(events, 0)["resumed_from_step"] == previous
    why = next(e.data["why"] for e in events if e.kind == "log" and e.data.get("skipped_step") == victim_step)
    assert "sha256" in why
    assert final(events).data["model_sha256"] == reference


def test_sigterm_notice_commits_an_emergency_checkpoint(harness: Harness, reference: str) -> None:
    def preempt(workers: list[WorkerInfo]) -> None:
        harness.ex.preempt("notice", notice_s=20.0)

    # no regular checkpoint in the first attempt (wherever the notice lands, a checkpoint at the
    # preempted step can only be the emergency one); the second attempt checkpoints every EVERY steps
    def env_for(attempt: int) -> dict[str, str]:
        return {"TRAINYARD_CHECKPOINT_EVERY_STEPS": "100000"} if attempt == 0 else {}

    events = harness.drive("notice", actions={(0, 2 * EVERY + 2): preempt}, env_for=env_for)
    pre = next(e for e in events if e.kind == "preempted")
    # at most the step in progress is lost
    assert pre.data["checkpoint_step"] == pre.data["step"] >= 2 * EVERY + 2
    assert not [e for e in events if e.kind == "checkpoint" and e.attempt == 0 and not e.data["emergency"]]
    ckpt = [e.data for e in events if e.kind == "checkpoint" and e.data["step"] == pre.data["step"]]
    assert ckpt and ckpt[0]["emergency"] is True
    assert started(events, 1)["resumed_from_step"] == pre.data["step"]
    assert final(events).data["model_sha256"] == reference


def test_unwritable_storage_fails_clearly_without_losing_training_state(
    harness: Harness, reference: str
) -> None:
    job = harness.root / "store" / "readonly"
    moved = harness.root / "store" / "readonly.moved"

    def break_storage(workers: list[WorkerInfo]) -> None:
        job.rename(moved)
        job.write_text("not a directory: checkpoint writes under here fail")

    # no outage budget: the second failed save in a row ends the attempt
    events = harness.drive(
        "readonly",
        actions={(0, EVERY + 1): break_storage},
        env_for=lambda attempt: {"TRAINYARD_STORAGE_OUTAGE_BUDGET_S": "0"},
    )
    failed = next(e for e in events if e.kind == "failed")
    assert failed.data["classification"] == "infra"
    assert "checkpoint storage failed" in failed.data["reason"]
    fallback = failed.data["fallback_checkpoint"]
    assert fallback and CheckpointManager.verify(fallback)[0]
    assert f"step {failed.data['step']}" in failed.data["reason"]
    # the operator repairs the storage; the retry resumes from the state saved at failure time
    job.unlink()
    moved.rename(job)
    attempt = failed.attempt + 1
    harness.ex.launch(harness.request("readonly", attempt))
    rest = harness.ex.wait("readonly", 120)
    assert started(rest, attempt)["resumed_from_step"] == failed.data["step"]
    assert final(rest).data["model_sha256"] == reference


def test_storage_outage_is_ridden_out_inside_the_attempt_without_spending_restarts(
    harness: Harness, reference: str
) -> None:
    """Checkpoint storage unwritable for a while (default outage budget): saves go to the local fallback
    and primary is retried with backoff; the job finishes in its first attempt with the same weights."""
    job = harness.root / "store" / "outage"
    moved = harness.root / "store" / "outage.moved"
    outage_s = 8.0
    restored: list[float] = []

    def restore() -> None:
        job.unlink()
        moved.rename(job)
        restored.append(time.monotonic())

    def break_storage(workers: list[WorkerInfo]) -> None:
        job.rename(moved)
        job.write_text("not a directory: checkpoint writes under here fail")
        threading.Timer(outage_s, restore).start()

    events = harness.drive("outage", actions={(0, EVERY + 1): break_storage}, timeout_s=150.0)
    done = final(events)
    kinds = [e.kind for e in events]
    story = "\n".join(f"{e.kind} {e.attempt} {str(e.data)[:300]}" for e in events if e.kind != "heartbeat")
    assert "failed" not in kinds and "lost" not in kinds, story
    assert {e.attempt for e in events} == {0}  # no restart was spent
    assert done.data["model_sha256"] == reference
    assert restored and time.monotonic() - restored[0] < 60  # retried soon after storage came back
    logs = [str(e.data.get("message")) for e in events if e.kind == "log"]
    assert any("saving to the local fallback meanwhile" in m for m in logs), logs
    assert any("writable again" in m for m in logs), logs
    # work done during the outage was kept on the fallback, and the last step is on primary storage
    saved = [e.data["path"] for e in events if e.kind == "checkpoint"]
    assert [p for p in saved if "/runs/outage/checkpoints/" in p], saved
    assert CheckpointManager.verify(f"file://{job}/step-{STEPS}")[0]


def test_two_ranks_bf16_kill_resume_then_convert_to_one_rank_fp32(harness: Harness) -> None:
    bf16 = spec(precision="bf16-mixed")
    clean = harness.drive("bf16-ref", world_size=2, job_spec=bf16)
    killed = harness.drive("bf16", world_size=2, job_spec=bf16, actions={(0, STEPS // 2 + 1): kill(rank=1)})
    assert [e.kind for e in killed].count("lost") == 1
    assert final(killed).data["model_sha256"] == final(clean).data["model_sha256"]
    shards = {p.name for p in (harness.root / "store" / "bf16" / f"step-{STEPS}").iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp"} <= shards  # both ranks wrote shards
    # the same step-40 checkpoint continued two ways for ten more steps: as it was (two ranks, bf16) and
    # converted on load (one rank, fp32); both see the same batches, so their losses must agree closely
    shutil.copytree(
        harness.root / "store" / "bf16",
        harness.root / "store" / "bf16-cont",
        ignore=shutil.ignore_patterns("model"),
    )
    harness.ex.launch(
        harness.request("bf16-cont", 0, world_size=2, job_spec=spec(steps=STEPS + 10, precision="bf16-mixed"))
    )
    same = harness.ex.wait("bf16-cont", 120)
    loss_initial = next(e.data["loss"] for e in clean if e.kind == "heartbeat" and e.data["step"] == 1)
    attempt = max(e.attempt for e in killed) + 1
    harness.ex.launch(harness.request("bf16", attempt, job_spec=spec(steps=STEPS + 10, precision="fp32")))
    rest = harness.ex.wait("bf16", 120)
    st = started(rest, attempt)
    assert st["resumed_from_step"] == STEPS and st["world_size"] == 1 and st["precision"] == "fp32"
    note = next(
        e.data["message"] for e in rest if e.kind == "log" and "converted" in e.data.get("message", "")
    )
    assert "world size 2 → 1" in note and "bf16-mixed → fp32" in note
    for step in (STEPS + 1, STEPS + 10):
        bf16_loss = next(e.data["loss"] for e in same if e.kind == "heartbeat" and e.data["step"] == step)
        fp32_loss = next(e.data["loss"] for e in rest if e.kind == "heartbeat" and e.data["step"] == step)
        # the loss continues (within 2 % of the unconverted run) instead of restarting near loss_initial
        assert abs(fp32_loss - bf16_loss) <= 0.02 * bf16_loss, (step, fp32_loss, bf16_loss)
        assert fp32_loss < 0.85 * loss_initial
    assert final(rest).data["final_step"] == STEPS + 10
