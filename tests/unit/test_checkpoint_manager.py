"""Checkpoint manager: atomic commit, sha256 verification, skipping torn/corrupt steps, retention."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.runtime.checkpoint import MANIFEST, CheckpointManager, CheckpointWriteError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

_ROOTS = itertools.count()


def _state(value: float) -> dict[str, torch.Tensor]:
    return {"model": {"w": torch.full((64, 8), value), "b": torch.arange(8, dtype=torch.float32) * value}}


def _manager(root: Path, events: list | None = None, **kw) -> CheckpointManager:
    def emit(kind: str, **data) -> None:
        if events is not None:
            events.append((kind, data))

    return CheckpointManager(f"file://{root}", "job", emit=emit, **kw)


def _save(mgr: CheckpointManager, step: int, *, loss: float | None = None, blocking: bool = True) -> None:
    mgr.save(step, _state(float(step)), {"loss": loss, "precision": {"name": "fp32"}}, blocking=blocking)


def _load(mgr: CheckpointManager) -> tuple[int, float]:
    ref = mgr.latest_valid()
    assert ref is not None
    target = _state(0.0)
    mgr.load(ref, target)
    return ref.step, float(target["model"]["w"][0, 0])


def test_async_and_sync_saves_commit_a_verifiable_manifest(tmp_path: Path) -> None:
    events: list = []
    mgr = _manager(tmp_path, events)
    _save(mgr, 1, blocking=False)
    assert mgr.wait() is not None
    _save(mgr, 2)
    step_dir = tmp_path / "job" / "step-2"
    man = json.loads((step_dir / MANIFEST).read_text())
    assert man["step"] == 2 and man["world_size"] == 1 and man["format"] == "trainyard-checkpoint/1"
    assert set(man["files"]) == {p.name for p in step_dir.iterdir() if p.name != MANIFEST}
    assert all(len(f["sha256"]) == 64 for f in man["files"].values())
    assert _load(mgr) == (2, 2.0)
    kinds = [k for k, _ in events]
    assert kinds.count("checkpoint") == 2
    mgr.close()


def test_torn_step_without_manifest_is_never_loaded(tmp_path: Path) -> None:
    events: list = []
    mgr = _manager(tmp_path, events)
    _save(mgr, 3)
    _save(mgr, 4)
    (tmp_path / "job" / "step-4" / MANIFEST).unlink()  # the writer died before committing
    assert _load(mgr) == (3, 3.0)
    assert any("torn" in d.get("why", "") and d.get("skipped_step") == 4 for _, d in events)


@given(data=st.data())
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_flipped_byte_in_any_shard_is_detected(tmp_path: Path, data: st.DataObject) -> None:
    root = tmp_path / f"r{next(_ROOTS)}"
    mgr = _manager(root)
    _save(mgr, 5)
    _save(mgr, 6)
    step6 = root / "job" / "step-6"
    files = sorted(p for p in step6.iterdir() if p.name != MANIFEST)
    victim = data.draw(st.sampled_from(files))
    raw = bytearray(victim.read_bytes())
    # a position relative to the file's length: lengths vary with the directory's name (the metadata
    # holds paths), and a draw must not depend on them
    pos = min(len(raw) - 1, int(data.draw(st.floats(0.0, 1.0, exclude_max=True)) * len(raw)))
    raw[pos] ^= data.draw(st.integers(1, 255))
    victim.write_bytes(bytes(raw))
    ok, why, _ = CheckpointManager.verify(f"file://{step6}")
    assert not ok and "sha256" in why
    assert _load(mgr) == (5, 5.0)


def test_truncated_shard_and_garbled_manifest_are_skipped(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    for s in (1, 2, 3):
        _save(mgr, s)
    shard = next(p for p in (tmp_path / "job" / "step-3").iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:10])
    (tmp_path / "job" / "step-2" / MANIFEST).write_text("{not json")
    assert _load(mgr) == (1, 1.0)


def test_retention_keeps_last_k_and_the_best(tmp_path: Path) -> None:
    events: list = []
    mgr = _manager(tmp_path, events, keep_last=2)
    losses = {1: 5.0, 2: 1.0, 3: 4.0, 4: 3.0, 5: 2.5}
    for step, loss in losses.items():
        _save(mgr, step, loss=loss)
    assert sorted(int(p.name.split("-")[1]) for p in (tmp_path / "job").iterdir()) == [2, 4, 5]
    # each checkpoint event names its size and the steps retention deleted (storage metering reads both)
    ck = [d for k, d in events if k == "checkpoint"]
    assert [d["removed_steps"] for d in ck] == [[], [], [1], [], [3]]  # 2 is the best, kept
    for d in ck:
        step_dir = tmp_path / "job" / f"step-{d['step']}"
        if step_dir.exists():
            on_disk = sum(p.stat().st_size for p in step_dir.iterdir() if p.name != MANIFEST)
            assert d["bytes"] == on_disk > 0


def test_unwritable_storage_raises_a_clear_error_and_keeps_old_steps(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    (tmp_path / "job" / "step-2").write_text("a file where the step directory should go")
    with pytest.raises(CheckpointWriteError, match="step-2"):
        _save(mgr, 2)
    assert _load(mgr) == (1, 1.0)


@pytest.mark.parametrize("blocking", [True, False])
def test_a_write_that_fails_inside_dcp_is_a_checkpoint_write_error(tmp_path: Path, blocking: bool) -> None:
    """DCP reports a failed write as CheckpointException, a BaseException: it must still surface as the
    CheckpointWriteError the trainer retries, not escape the worker's error handling."""
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    (tmp_path / "job" / "step-2" / ".metadata.tmp").mkdir(parents=True)  # the metadata file can't be opened
    with pytest.raises(CheckpointWriteError, match="step-2"):
        _save(mgr, 2, blocking=blocking)
        mgr.wait()
    assert _load(mgr) == (1, 1.0)


def test_fallback_root_is_considered_when_loading(tmp_path: Path) -> None:
    mgr = _manager(tmp_path / "primary", fallback_url=f"file://{tmp_path / 'fallback'}")
    _save(mgr, 1)
    mgr.save(2, _state(2.0), {}, blocking=True, root=mgr.fallback_job_url)
    assert _load(mgr) == (2, 2.0)


def test_remove_newer_than_clears_leftovers(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    os.makedirs(tmp_path / "job" / "step-7")
    mgr.remove_newer_than(1)
    assert not (tmp_path / "job" / "step-7").exists() and (tmp_path / "job" / "step-1").exists()


def test_dtype_conversion_on_load(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    ref = mgr.latest_valid()
    assert ref is not None
    target = {
        "model": {"w": torch.zeros((64, 8), dtype=torch.bfloat16), "b": torch.zeros(8, dtype=torch.bfloat16)}
    }
    mgr.load(ref, target)
    assert target["model"]["w"].dtype == torch.bfloat16 and float(target["model"]["b"][3]) == 3.0


def test_storage_vanishing_between_write_and_commit_is_a_checkpoint_write_error(tmp_path: Path) -> None:
    # a shard that can be listed but not read (storage went away after the write) must surface as
    # CheckpointWriteError, which the trainer turns into "checkpoint storage failed" and a fallback save
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    step_dir = tmp_path / "job" / "step-2"
    step_dir.mkdir(parents=True)
    (step_dir / "__0_0.distcp").symlink_to(tmp_path / "gone" / "__0_0.distcp")
    with pytest.raises(CheckpointWriteError, match="hashing the shards"):
        mgr._commit(f"file://{step_dir}", 2, {}, mgr.last_save)  # type: ignore[arg-type]
    assert not (step_dir / MANIFEST).exists()
    assert _load(mgr) == (1, 1.0)
    mgr.close()


def test_manifest_that_omits_a_damaged_shard_fails_verification_and_the_previous_step_is_used(
    tmp_path: Path,
) -> None:
    events: list = []
    mgr = _manager(tmp_path, events)
    _save(mgr, 1)
    _save(mgr, 2)
    step2 = tmp_path / "job" / "step-2"
    shard = next(p for p in step2.iterdir() if p.suffix == ".distcp")
    shard.write_bytes(b"damaged")
    man = json.loads((step2 / MANIFEST).read_text())
    del man["files"][shard.name]
    (step2 / MANIFEST).write_text(json.dumps(man))
    ok, why, _ = CheckpointManager.verify(mgr.step_url(2))
    assert not ok and shard.name in why
    # the same when the damaged shard is gone from disk too: the index still needs it
    shard.unlink()
    ok, why, _ = CheckpointManager.verify(mgr.step_url(2))
    assert not ok and f"shard {shard.name} is not in the manifest" in why
    assert _load(mgr) == (1, 1.0)
    assert any(d.get("skipped_step") == 2 for k, d in events if k == "log")
    mgr.close()


def test_a_file_on_disk_that_the_manifest_does_not_list_fails_verification(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    (tmp_path / "job" / "step-1" / "__1_0.distcp").write_bytes(b"stray")
    ok, why, _ = CheckpointManager.verify(mgr.step_url(1))
    assert not ok and "__1_0.distcp is on disk but not in the manifest" in why
    mgr.close()


def test_quarantined_step_is_never_chosen_again(tmp_path: Path) -> None:
    events: list = []
    mgr = _manager(tmp_path, events)
    _save(mgr, 1)
    _save(mgr, 2)
    ref = mgr.latest_valid()
    assert ref is not None and ref.step == 2
    moved = mgr.quarantine(ref, "loading failed: test")
    assert moved is not None and "quarantined-step-2-" in moved
    assert _load(mgr) == (1, 1.0)
    assert [s for s, _ in mgr.list_step_dirs(mgr.job_url)] == [1]
    assert any(d.get("quarantined_step") == 2 for k, d in events if k == "log")
    mgr.close()


def test_write_thread_count_splits_by_bytes_and_items() -> None:
    from trainyard.runtime.checkpoint import MIN_BYTES_PER_WRITE_THREAD as M
    from trainyard.runtime.checkpoint import write_thread_count

    assert write_thread_count([]) == 1
    assert write_thread_count([M - 1, 100]) == 1  # small states stay in one file
    assert write_thread_count([M, M, M], max_threads=4) == 3
    assert write_thread_count([M * 10], max_threads=4) == 1  # one tensor, one file
    assert write_thread_count([M] * 10, max_threads=4) == 4


def test_parallel_shards_are_hashed_while_written_and_a_corrupt_one_is_detected(tmp_path: Path) -> None:
    import hashlib

    gen = torch.Generator().manual_seed(0)
    state = {"model": {f"w{i}": torch.randn(1024, 1024, generator=gen) for i in range(12)}}  # 48 MiB
    events: list = []
    mgr = _manager(tmp_path, events, write_threads=3)
    crc_before = torch.serialization.get_crc32_options()
    mgr.save(1, state, {}, blocking=True)
    assert torch.serialization.get_crc32_options() == crc_before  # restored after the save
    step_dir = tmp_path / "job" / "step-1"
    shards = sorted(p.name for p in step_dir.glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__0_1.distcp", "__0_2.distcp"]
    man = json.loads((step_dir / MANIFEST).read_text())
    for name in [*shards, ".metadata"]:  # the hash taken while writing is the hash of the bytes on disk
        data = (step_dir / name).read_bytes()
        assert man["files"][name] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    target = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
    ref = mgr.latest_valid()
    assert ref is not None
    mgr.load(ref, target)
    assert all(torch.equal(target["model"][k], v) for k, v in state["model"].items())
    # by default the split follows the size (48 MiB: at most 3 files of 16 MiB), up to WRITE_THREADS
    from trainyard.runtime.checkpoint import WRITE_THREADS

    mgr_default = _manager(tmp_path / "default")
    mgr_default.save(1, state, {}, blocking=True)
    written = len(list((tmp_path / "default" / "job" / "step-1").glob("*.distcp")))
    assert written == min(3, WRITE_THREADS)
    mgr_default.close()
    mgr.save(2, state, {}, blocking=True)
    victim = tmp_path / "job" / "step-2" / "__0_2.distcp"
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 3] ^= 0x01
    victim.write_bytes(bytes(raw))
    ok, why, _ = CheckpointManager.verify(f"file://{tmp_path}/job/step-2")
    assert not ok and why == "corrupt: sha256 of __0_2.distcp does not match the manifest"
    ref = mgr.latest_valid()
    assert ref is not None and ref.step == 1
    assert any(d.get("skipped_step") == 2 for k, d in events if k == "log")
    mgr.close()
